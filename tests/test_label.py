"""Teacher labelling jobs and the training sets built from them, against the fake OpenAI-compatible
server (real HTTP on loopback) with injected faults: every item accounted for, reruns free, a kill -9
midway changes nothing, the API key is written nowhere, the gold test split stays out."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from memdistill.core.config import load_config
from memdistill.data import label
from memdistill.data.build import DataConfig, build
from memdistill.data.fake_teacher import FakeOpenAI, answer, content_hash, type_decision
from memdistill.data.sources import SourceError, load
from memdistill.spec import extractor, query_parser, router
from tests.conftest import FIXTURES, REPO

KEY = "sk-label-test-SECRET-31415926"
TASK_FILES = [
    f"{task}/{split}.jsonl" for task in ("extractor", "router", "planner", "gate") for split in ("train", "dev", "test")
]


def _cfg_dict(tmp: Path, url: str, **over) -> dict:
    d = yaml.safe_load((REPO / "configs/data/teacher_fake.yaml").read_text())
    d.update(
        output_dir=str(tmp / "out"), cache_dir=str(tmp / "cache"), seed_dir=str(REPO / "data/seed"), progress=False
    )
    for src in d["sources"]:
        src["path"] = str(REPO / src["path"])
    d["teacher"].update(base_urls=[url], timeout_s=0.5, backoff_s=0.01, backoff_max_s=0.05)
    d.update(over)
    return d


def _cfg(tmp: Path, url: str, **over) -> DataConfig:
    p = tmp / "teacher.yaml"
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(yaml.safe_dump(_cfg_dict(tmp, url, **over)))
    return load_config(DataConfig, p)


def _labels(out: Path, job: str) -> list[dict]:
    return [json.loads(x) for x in (out / "labels" / job / "labels.jsonl").read_text().splitlines()]


def _built(out: Path) -> dict[str, bytes]:
    return {f: (out / f).read_bytes() for f in TASK_FILES}


def _extraction_messages(cfg: DataConfig) -> dict[str, list[dict]]:
    items = label.extraction_items(label.load_sources(cfg.sources), cfg.windows)
    return {it.item_id: extractor.chat_messages(it.window, "teacher", it.input["style"]) for it in items}


def _plan_faults(fake: FakeOpenAI, cfg: DataConfig) -> dict[str, str]:
    """Content-keyed faults (the same in every run); returns {extraction item id: expected outcome}."""
    msgs = _extraction_messages(cfg)
    # windows the fake teacher answers with records, so a cut-off answer is salvageable (and still rejected)
    ids = sorted(
        i
        for i, m in msgs.items()
        if i.startswith(("locomo", "chat", "seed|mp03")) and json.loads(answer(m))["memories"]
    )
    plan = {ids[0]: "malformed", ids[1]: "truncated", ids[2]: "500", ids[3]: "drop", ids[4]: "hang"}
    for item_id, fault in plan.items():
        fake.add_fault(fault, content=msgs[item_id], times=None if fault == "500" else 1)
    return plan


def test_job_accounts_for_every_item_under_faults_and_reruns_for_free(tmp_path, monkeypatch, capfd):
    monkeypatch.setenv("FAKE_TEACHER_KEY", KEY)
    with FakeOpenAI(api_key=KEY, hang_s=1.0, retry_after="0.2") as fake:
        cfg = _cfg(tmp_path, fake.url)
        for i, f in enumerate(["429", "500", "hang", "drop", "bad_body", "503"]):
            fake.add_fault(f, index=3 * i)
        plan = _plan_faults(fake, cfg)
        q_item = next(it for it in label.question_items("query_parser", label.load_sources(cfg.sources)))
        fake.add_fault(
            "400",
            content=query_parser.chat_messages(q_item.input["question"], q_item.input["question_date"], "teacher"),
            times=None,
        )
        stats = build(cfg)
        first_requests = fake.requests
        out = Path(cfg.output_dir)

        # every item labelled or rejected with a reason, exactly once
        lab = stats["labelling"]["jobs"]
        for job in label.check_jobs(cfg.jobs):
            rows = _labels(out, job)
            assert len(rows) == len({r["item_id"] for r in rows}) == lab[job]["items"] > 0, job
            assert lab[job]["unaccounted"] == 0 and lab[job]["ok"] + lab[job]["rejected"] == lab[job]["items"]
            assert all(r["reasons"] for r in rows if r["status"] == "rejected")
        items = label.extraction_items(label.load_sources(cfg.sources), cfg.windows)
        ext = {r["item_id"]: r for r in _labels(out, "extractor")}
        assert set(ext) == {it.item_id for it in items}
        ids = sorted(plan)
        assert ext[ids[0]]["reasons"] == ["invalid_json"]
        assert {"truncated_output", "teacher_max_tokens"} <= set(ext[ids[1]]["reasons"])
        assert ext[ids[2]]["reasons"] == ["transport_http_500"]
        assert ext[ids[3]]["status"] == ext[ids[4]]["status"] == "ok"  # a drop and a hang, then an answer
        assert {r["item_id"]: r["reasons"] for r in _labels(out, "query_parser") if r["status"] == "rejected"} == {
            q_item.item_id: ["transport_http_400"]
        }
        rejects = [json.loads(x) for x in (out / "labels/extractor/rejects.jsonl").read_text().splitlines()]
        assert {r["item_id"] for r in rejects if r["level"] == "item"} == set(ids[:3])
        retried = lab["extractor"]["this_run"]["retry_codes"]
        assert {"http_429", "http_500", "timeout", "connection", "bad_response", "http_503"} <= {
            c for j in lab.values() for c in j["this_run"]["retry_codes"]
        }, retried

        # labels are what the fake teacher answered, combined per label for the binary type job
        for r in _labels(out, "router"):
            assert r["label"]["labels"] == [
                x for x in router.LABELS if type_decision(x, router.encoder_text(r["input"]["text"]))
            ]
        # gate candidates are that conversation's extracted memories, at most gate_candidates of them
        mems: dict = {}
        for r in ext.values():
            if r["status"] == "ok":
                mems.setdefault((r["source"], r["conversation_id"]), set()).update(
                    m["content"] for m in r["label"]["records"]
                )
        gates = _labels(out, "gate")
        for g in gates:
            assert set(g["input"]["candidates"]) <= mems[(g["source"], g["conversation_id"])]
            assert len(g["input"]["candidates"]) <= cfg.gate_candidates
        assert any(g["status"] == "ok" and g["label"]["kept_ids"] for g in gates)
        # consolidation pairs: two extracted records of one conversation, the new one said later, and the
        # action the fake teacher gives that pair
        from memdistill.data.fake_teacher import answer
        from memdistill.spec import consolidator

        pairs = _labels(out, "consolidator")
        for p in pairs:
            new, old = (consolidator.StoredRecord.from_json(p["input"][k]) for k in ("new", "existing"))
            assert {new.content, old.content} <= mems[(p["source"], p["conversation_id"])]
            assert new.source_timestamp >= old.source_timestamp
            assert new.dimension.memory_type == old.dimension.memory_type
            if p["status"] == "ok":
                expected = json.loads(answer(consolidator.chat_messages(new, old, "teacher")))["action"]
                assert p["label"]["action"] == expected
        built = [json.loads(x) for x in (out / "consolidator/train.jsonl").read_text().splitlines()]
        assert {r["label_source"] for r in built} == {"gold", "teacher"}
        # topic decisions and hypothetical memories: what the fake teacher answered, built into their sets
        from memdistill.spec import querytyper, segmenter

        segs = _labels(out, "segmenter")
        assert len(segs) == len(label.segment_items(label.load_sources(cfg.sources)))
        for s in segs:
            if s["status"] == "ok":
                i = s["input"]
                asked = segmenter.chat_messages(i["before"], i["target"], i["after"], "teacher")
                assert s["label"]["intent"] == json.loads(answer(asked))["intent"]
        hyps = [h for h in _labels(out, "querytyper") if h["status"] == "ok"]
        assert hyps and all(len(h["label"]["memories"]) == querytyper.K for h in hyps)
        for task in ("segmenter", "querytyper"):
            built = [json.loads(x) for x in (out / task / "train.jsonl").read_text().splitlines()]
            assert {r["label_source"] for r in built} == {"gold", "teacher"}, task
        summary = json.loads((out / "labels/run_summary.json").read_text())
        assert summary["jobs"]["extractor"]["this_run"]["prompt_tokens"] > 0
        assert summary["jobs"]["extractor"]["this_run"]["cost_usd"] > 0

        # a rerun makes no request and writes the same dataset
        before = _built(out)
        build(cfg)
        assert fake.requests == first_requests
        assert _built(out) == before
        for job in label.check_jobs(cfg.jobs):  # nothing appended twice
            assert len(_labels(out, job)) == lab[job]["items"]

        # once the teacher is healthy again, retry_transport asks again for what ran out of retries only
        fake.clear_faults()
        failed = {ids[2], q_item.item_id}
        sent = fake.requests
        build(_cfg(tmp_path, fake.url, retry_transport=True))
        asked = {e["hash"] for e in fake.log[sent:]}
        msgs = _extraction_messages(cfg)
        assert content_hash(msgs[ids[2]]) in asked and content_hash(msgs[ids[0]]) not in asked
        now = {
            r["item_id"]: r for job in ("extractor", "query_parser") for r in _labels(out, job)
        }  # the newer line wins
        assert all(now[i]["status"] == "ok" for i in failed)
        rejects = [json.loads(x) for x in (out / "labels/extractor/rejects.jsonl").read_text().splitlines()]
        assert {r["item_id"] for r in rejects if r["level"] == "item"} == set(ids[:2])
        sent = fake.requests
        build(_cfg(tmp_path, fake.url, retry_transport=True))
        assert fake.requests == sent

    # the key is in no file written and in no output printed
    captured = capfd.readouterr()
    assert KEY not in captured.out + captured.err
    written = [f for f in tmp_path.rglob("*") if f.is_file() and f.name != "teacher.yaml"]
    assert len(written) > 20 and not [f for f in written if KEY.encode() in f.read_bytes()]


def _subprocess_env():
    env = dict(os.environ, FAKE_TEACHER_KEY=KEY, PYTHONPATH=str(REPO), HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1")
    return env


def _count_lines(p: Path) -> int:
    return p.read_bytes().count(b"\n") if p.exists() else 0


def test_kill_9_midway_then_rerun_gives_the_uninterrupted_dataset(tmp_path, monkeypatch):
    env = _subprocess_env()
    with FakeOpenAI(api_key=KEY, hang_s=1.0, latency=0.02) as fake:
        cfg_path = tmp_path / "killed" / "teacher.yaml"
        cfg_path.parent.mkdir()
        d = _cfg_dict(tmp_path / "killed", fake.url)
        d["teacher"]["concurrency"] = 3
        cfg_path.write_text(yaml.safe_dump(d))
        _plan_faults(fake, load_config(DataConfig, cfg_path))
        cmd = [sys.executable, "-m", "memdistill", "data", "--config", str(cfg_path)]
        out = Path(d["output_dir"])
        watched = out / "labels/router/labels.jsonl"
        with open(tmp_path / "killed.log", "wb") as log:
            proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
            deadline = time.time() + 300
            while _count_lines(watched) < 40 and proc.poll() is None and time.time() < deadline:
                time.sleep(0.05)
            proc.send_signal(signal.SIGKILL)
            proc.wait()
        assert proc.returncode == -signal.SIGKILL, (tmp_path / "killed.log").read_text()[-2000:]
        done_before = _count_lines(watched)
        assert done_before >= 40 and not (out / "extractor/train.jsonl").exists()
        killed_requests = fake.requests
        with open(tmp_path / "rerun.log", "wb") as log:
            r = subprocess.run(cmd, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT, timeout=600)
        assert r.returncode == 0, (tmp_path / "rerun.log").read_text()[-2000:]
        rerun_requests = fake.requests - killed_requests

    monkeypatch.setenv("FAKE_TEACHER_KEY", KEY)
    with FakeOpenAI(api_key=KEY, hang_s=1.0) as fake2:  # the same run, never interrupted
        cfg = _cfg(tmp_path / "whole", fake2.url)
        _plan_faults(fake2, cfg)
        build(cfg)
        assert rerun_requests < fake2.requests  # the rerun only asked for what the killed run had not finished

    assert _built(out) == _built(Path(cfg.output_dir))
    for job in label.check_jobs(cfg.jobs):
        killed, whole = _labels(out, job), _labels(Path(cfg.output_dir), job)
        assert len(killed) == len({r["key"] for r in killed}) == len(whole)  # no duplicates, nothing missing

        def strip(rows):
            return sorted(
                (r["item_id"], r["status"], r["reasons"], json.dumps(r["label"], sort_keys=True)) for r in rows
            )

        assert strip(killed) == strip(whole), job
    for f in list((tmp_path / "killed").rglob("*")) + [tmp_path / "killed.log", tmp_path / "rerun.log"]:
        if f.is_file() and f.name != "teacher.yaml":
            assert KEY.encode() not in f.read_bytes(), f


def test_torn_last_line_is_cut_and_relabelled(tmp_path, monkeypatch):
    monkeypatch.setenv("FAKE_TEACHER_KEY", KEY)
    with FakeOpenAI(api_key=KEY) as fake:
        cfg = _cfg(
            tmp_path,
            fake.url,
            jobs=["extractor"],
            tasks=["extractor"],
            sources=[{"format": "chat-jsonl", "path": str(FIXTURES / "chat_sample.jsonl"), "name": "chat"}],
        )
        build(cfg)
        p = Path(cfg.output_dir) / "labels/extractor/labels.jsonl"
        lines = p.read_bytes().splitlines(keepends=True)
        p.write_bytes(b"".join(lines[:-1]) + lines[-1][:25])  # a kill in the middle of the last write
        n = fake.requests
        build(cfg)
        assert fake.requests == n  # the reply is in the cache: relabelled for free
        rows = _labels(Path(cfg.output_dir), "extractor")
        assert [r["key"] for r in rows] == [json.loads(x)["key"] for x in lines] and rows[-1]["cached"]


def test_built_sets_load_keep_the_gold_test_split_out_and_drop_duplicates(tmp_path, monkeypatch):
    import datasets

    from memdistill.data import seed as seedlib

    seed = seedlib.load(REPO / "data/seed")
    test_convs = {c for c, s in seed.split.items() if s == "test"}
    long_test_turn = next(
        t.text for c in sorted(test_convs) for t in seed.conversations[c].turns if len(t.text.split()) > 25
    )
    msgs = [
        {
            "role": "user",
            "content": "I finally repainted the whole kitchen in a pale green colour last weekend with my brother.",
        },
        {
            "role": "assistant",
            "content": "Pale green is a calm choice for a kitchen; two coats usually cover older paint well.",
        },
        {
            "role": "user",
            "content": "We used two coats and it took the whole of Saturday and most of Sunday afternoon.",
        },
        {
            "role": "assistant",
            "content": "That sounds like a proper weekend project, and the result will last for years.",
        },
    ]
    near = [dict(m) for m in msgs]
    near[3]["content"] = near[3]["content"].replace("years", "many years")
    chat = tmp_path / "chat.jsonl"
    chat.write_text(
        "\n".join(
            json.dumps(r)
            for r in [
                {"id": "a", "timestamp": "2024-03-01T10:00:00", "messages": msgs},
                {"id": "b", "timestamp": "2024-03-01T10:00:00", "messages": near},
                {
                    "id": "leak",
                    "messages": [
                        {"role": "user", "content": long_test_turn + " anyway"},
                        {"role": "assistant", "content": "Thanks for telling me all of that today."},
                    ],
                },
            ]
        )
        + "\n"
    )
    monkeypatch.setenv("FAKE_TEACHER_KEY", KEY)
    with FakeOpenAI(api_key=KEY) as fake:
        cfg = _cfg(
            tmp_path,
            fake.url,
            jobs=["extractor", "router"],
            tasks=["extractor", "router"],
            dev_fraction=0.0,
            windows={"multi-party": [[6, 1]], "user-assistant": [[4, 1]]},
            sources=[
                {"format": "chat-jsonl", "path": str(chat), "name": "chat"},
                {
                    "format": "seed",
                    "path": str(REPO / "data/seed/conversations.jsonl"),
                    "name": "seed",
                    "max_conversations": 2,
                },
            ],
        )
        stats = build(cfg)
    out = Path(cfg.output_dir)
    removed = stats["removed"]
    assert removed["extractor"]["near_test_text"] == 1 and removed["extractor"]["near_duplicate"] == 1
    assert removed["extractor"]["gold_test_conversation"] >= 1  # mp01 is a test conversation
    assert removed["router"]["near_test_text"] == 1 and removed["router"]["exact_duplicate"] >= 3
    card = (out / "DATASET_CARD.md").read_text()
    assert "| extractor | " in card and "reject reasons" in card and "Jaccard >= 0.9" in card
    for task in ("extractor", "router"):
        for split in ("train", "dev"):
            for line in (out / task / f"{split}.jsonl").read_text().splitlines():
                row = json.loads(line)
                text = row["prompt"][1]["content"] if task == "extractor" else row["text"]
                assert " ".join(long_test_turn.split()) not in text
                assert not (row["conversation_id"] in test_convs and row["source"].startswith("seed"))
        teacher_rows = [json.loads(x) for x in (out / task / "train.jsonl").read_text().splitlines()]
        assert {r["label_source"] for r in teacher_rows} == {"gold", "teacher"}
        for split in ("train", "dev", "test"):
            ds = datasets.load_dataset("json", data_files=str(out / task / f"{split}.jsonl"), split="train")
            assert len(ds) == stats["tasks"][task][split]["rows"] > 0
    ext = [json.loads(x) for x in (out / "extractor/train.jsonl").read_text().splitlines()]
    row = next(r for r in ext if r["label_source"] == "teacher" and r["task"] == "extractor")
    assert (
        row["chat_template_kwargs"] == {"enable_thinking": False}
        and row["prompt"][0]["content"] == extractor.STUDENT_SYSTEM
    )
    assert (
        row["source"] == "chat"
        and row["window"] == [4, 1]
        and row["schema_version"]
        and row["teacher"] == "fake-teacher"
    )
    assert extractor.parse(row["completion"][0]["content"]).ok


def test_single_prompt_type_mode_makes_one_request_per_snippet(tmp_path, monkeypatch):
    monkeypatch.setenv("FAKE_TEACHER_KEY", KEY)
    src = [{"format": "chat-jsonl", "path": str(FIXTURES / "chat_sample.jsonl"), "name": "chat"}]
    counts = {}
    for mode in ("single", "binary"):
        with FakeOpenAI(api_key=KEY) as fake:
            cfg = _cfg(tmp_path / mode, fake.url, jobs=["router"], tasks=["router"], type_mode=mode, sources=src)
            build(cfg)
            rows = _labels(Path(cfg.output_dir), "router")
            counts[mode] = (fake.requests, len(rows))
            for r in rows:
                assert r["label"]["labels"] == [
                    x for x in router.LABELS if type_decision(x, router.encoder_text(r["input"]["text"]))
                ]
    assert counts["single"][0] == counts["single"][1] and counts["binary"][0] == 3 * counts["binary"][1]


def test_gate_without_enough_memories_is_rejected_without_a_request(tmp_path, monkeypatch):
    monkeypatch.setenv("FAKE_TEACHER_KEY", KEY)
    with FakeOpenAI(api_key=KEY) as fake:
        cfg = _cfg(
            tmp_path,
            fake.url,
            gate_min_candidates=1000,
            tasks=["gate"],
            sources=[{"format": "locomo", "path": str(FIXTURES / "locomo_sample.json"), "name": "locomo"}],
        )
        build(cfg)
        gates = _labels(Path(cfg.output_dir), "gate")
        assert gates and all(g["reasons"] == ["too_few_candidates"] for g in gates)
        # .get: once in CI a POST without messages reached this fake server (another test's stray request on a
        # reused port); what matters here is that no gate prompt was sent
        prompts = [m.get("content", "") for e in fake.log for m in e["body"].get("messages", [])]
        assert not any("Candidates (" in p for p in prompts)


def test_config_errors(tmp_path):
    with FakeOpenAI() as fake:
        with pytest.raises(Exception, match="gate needs extractor"):
            build(_cfg(tmp_path, fake.url, jobs=["gate"]))
        with pytest.raises(Exception, match=r"sources\[0\]: unknown key\(s\) \['paht'\]"):
            build(_cfg(tmp_path, fake.url, sources=[{"format": "seed", "path": "x", "paht": "y"}]))


# The loaders' malformed-input tests live in tests/test_sources.py; the hf loader's was missing.
def test_hf_loader_malformed(tmp_path):
    import datasets

    p = tmp_path / "rows.jsonl"
    p.write_text(
        json.dumps({"messages": [{"role": "user", "content": "hi there"}]})
        + "\n"
        + json.dumps({"text": "no messages"})
        + "\n"
    )
    with pytest.raises(SourceError) as e:
        load("hf", p)
    assert str(p) in str(e.value) and "row 1: expected 'messages'" in str(e.value)
    d = tmp_path / "saved"
    datasets.Dataset.from_list([{"messages": [{"role": "robot", "content": "beep"}]}]).save_to_disk(str(d))
    with pytest.raises(SourceError, match=r"saved: row 0: message 1: role 'robot'"):
        load("hf", d)
    bad = tmp_path / "broken.json"
    bad.write_text('{"messages": [')
    with pytest.raises(SourceError, match="broken.json: cannot load as a Hugging Face dataset"):
        load("hf", bad)


def test_a_teacher_that_never_answers_stops_the_command_with_exit_1(tmp_path, monkeypatch, capsys):
    """The fake-teacher config pointed at a port where nothing listens: before issue 15 this wrote gold-only
    training sets and exited 0 ("labels extractor: 0 ok, 1178 rejected of 1178")."""
    import socket

    from memdistill.cli import main

    monkeypatch.setenv("FAKE_TEACHER_KEY", KEY)
    with socket.socket() as s:  # a port that was free a moment ago: nothing listens there
        s.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{s.getsockname()[1]}/v1"
    p = tmp_path / "teacher.yaml"
    p.write_text(yaml.safe_dump(_cfg_dict(tmp_path, url)))
    assert main(["data", "--config", str(p)]) == 1
    err = capsys.readouterr().err
    n_items = len(_extraction_messages(load_config(DataConfig, p)))
    assert (
        f"teacher job extractor: 0 of {n_items} items labelled ok (0%), below min_ok_share 0.5; endpoint {url}" in err
    )
    assert "requests whose retries ran out: transport_connection " in err and "Connect" in err
    rows = _labels(tmp_path / "out", "extractor")
    # requests in flight when the 16th failure came back still finish: at most `concurrency - 1` more
    assert label.NO_ANSWER_STOP <= len(rows) < label.NO_ANSWER_STOP + 8 < n_items
    assert f"stopped after the first {len(rows)} items of this run got no answer" in err
    assert {tuple(r["reasons"]) for r in rows} == {("transport_connection",)}
    assert f"retry_transport=true asks again for the {len(rows)} items whose retries ran out" in err
    assert not (tmp_path / "out" / "extractor").exists()  # no gold-only training sets passed off as a build


def test_a_job_below_min_ok_share_stops_keeps_its_labels_and_a_rerun_asks_only_for_the_failed(tmp_path, monkeypatch):
    monkeypatch.setenv("FAKE_TEACHER_KEY", KEY)
    src = [
        {"format": "seed", "path": str(REPO / "data/seed/conversations.jsonl"), "name": "seed", "max_conversations": 3}
    ]
    with FakeOpenAI(api_key=KEY) as fake:
        cfg = _cfg(tmp_path, fake.url, jobs=["extractor"], tasks=["extractor"], sources=src)
        msgs = _extraction_messages(cfg)
        # two items in three fail on every retry (33% ok < 0.5), spread out so answers keep coming: not a dead endpoint
        failing = [i for k, i in enumerate(sorted(msgs)) if k % 3]
        for item_id in failing:
            fake.add_fault("500", content=msgs[item_id], times=None)
        with pytest.raises(label.TeacherShortfall) as e:
            build(cfg)
        ok = len(msgs) - len(failing)
        assert f"teacher job extractor: {ok} of {len(msgs)} items labelled ok" in str(e.value)
        assert f"endpoint {fake.url}" in str(e.value)
        assert f"transport_http_500 {len(failing)}" in str(e.value)
        out = Path(cfg.output_dir)
        rows = {r["item_id"]: r for r in _labels(out, "extractor")}
        assert {i for i, r in rows.items() if r["status"] == "ok"} == set(msgs) - set(failing)  # the labels it got
        assert not (out / "extractor").exists()

        # a plain rerun asks nothing again (every item has its line) and still refuses to build
        sent = fake.requests
        with pytest.raises(label.TeacherShortfall):
            build(cfg)
        assert fake.requests == sent

        # the teacher is healthy again: retry_transport asks for the failed items and nothing else (a slow reply
        # on a loaded machine may be asked twice: the set is the claim)
        fake.clear_faults()
        stats = build(
            _cfg(tmp_path, fake.url, jobs=["extractor"], tasks=["extractor"], sources=src, retry_transport=True)
        )
        asked = [e["hash"] for e in fake.log[sent:]]
        assert set(asked) == {content_hash(msgs[i]) for i in failing}
    assert stats["labelling"]["jobs"]["extractor"]["ok"] == len(msgs)
    assert (out / "extractor" / "train.jsonl").exists()
