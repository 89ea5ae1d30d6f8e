"""Clean at-scale sources: persona dialogues written by the teacher (memdistill.data.synth, against the
fake OpenAI-compatible server on loopback) and UltraChat rows in their own layout."""

import asyncio
import json
import socket
from datetime import datetime
from pathlib import Path

import jsonschema
import pytest
import yaml

from memdistill.core.config import load_config
from memdistill.data import hygiene, label, synth
from memdistill.data.build import DataConfig
from memdistill.data.fake_teacher import FakeOpenAI, answer
from memdistill.data.sources import SourceError, load
from memdistill.data.teacher import settings_from_dict
from memdistill.spec import dialogue_synthesis as ds
from tests.conftest import FIXTURES, REPO

PERSONAS = REPO / "data/personas/personas.jsonl"


def _spec(n: int = 3, **over) -> dict:
    d = {
        "format": "persona-synth",
        "path": str(PERSONAS),
        "name": "personas",
        "conversations": n,
        "sessions": [2, 3],
        "turns": [4, 6],
        "questions": 3,
        "max_tokens": 2048,
    }
    return d | over


def _settings(url: str, **over):
    return settings_from_dict(
        {
            "base_urls": [url],
            "model": "fake-teacher",
            "concurrency": 4,
            "timeout_s": 2,
            "max_retries": 1,
            "backoff_s": 0.01,
            "backoff_max_s": 0.02,
        }
        | over
    )


def _write(specs: list, url: str, tmp: Path, **over):
    return asyncio.run(synth.write_sources(specs, _settings(url, **over), tmp / "cache", tmp / "synth", progress=False))


def _requests(spec: dict) -> list[tuple[str, ds.Request]]:
    src = synth.source_from_dict(spec, "test")
    return synth.plan(src, synth.load_personas(src.path))


def test_written_conversations_read_back_with_speakers_sessions_dates_and_questions(tmp_path):
    spec = _spec()
    with FakeOpenAI() as fake:
        specs, summary = _write([spec], fake.url, tmp_path)
        assert fake.requests == 3
    assert specs == [
        {"format": "seed", "path": str(tmp_path / "synth/personas/conversations.jsonl"), "name": "personas"}
    ]
    assert summary["personas"]["ok"] == 3 and summary["personas"]["rejected"] == 0
    convs = {c.conversation_id: c for c in load("seed", specs[0]["path"])}
    plan = dict(_requests(spec))
    assert sorted(convs) == sorted(plan)
    for cid, req in plan.items():
        conv = convs[cid]
        assert conv.style == "multi-party" and conv.speakers == list(req.names)
        assert len(conv.sessions) == req.sessions
        dates = [s.date_time for s in conv.sessions]
        assert dates[0] == req.start and dates == sorted(set(dates))  # the asked start, then strictly later
        assert {t.speaker for t in conv.turns} == set(req.names)
        assert all(t.timestamp == s.date_time for s in conv.sessions for t in s.turns)
        assert [t.turn_id for t in conv.sessions[1].turns][:2] == ["D2:1", "D2:2"]
        assert sum(t.image_caption is not None for t in conv.turns) == 1
    # the questions reach the question jobs through the labelling sources, dated after the last session
    scs = label.load_sources(specs)
    assert {sc.source for sc in scs} == {"personas"} and len(scs) == 3
    for sc in scs:
        assert len(sc.questions) == 3
        assert all(q["question_date"] > sc.conv.turns[-1].timestamp.isoformat() for q in sc.questions)


def test_a_rerun_makes_no_request_from_the_log_nor_from_the_cache_alone(tmp_path):
    with FakeOpenAI() as fake:
        _write([_spec()], fake.url, tmp_path)
        out = tmp_path / "synth/personas/conversations.jsonl"
        first = out.read_bytes()
        _, summary = _write([_spec()], fake.url, tmp_path)
        assert fake.requests == 3 and summary["personas"]["this_run"]["requests"] == 0
        (tmp_path / "synth/personas/items.jsonl").unlink()  # only the reply cache is left
        _, summary = _write([_spec()], fake.url, tmp_path)
        assert fake.requests == 3
        assert summary["personas"]["this_run"]["cache_hits"] == 3
        assert out.read_bytes() == first


def test_a_malformed_answer_is_rejected_with_its_code_and_the_job_goes_on(tmp_path):
    spec = _spec()
    (bad_id, bad_req), *_ = _requests(spec)
    with FakeOpenAI() as fake:
        fake.add_fault("malformed", content=ds.chat_messages(bad_req), times=None)
        specs, summary = _write([spec], fake.url, tmp_path)
    assert summary["personas"]["ok"] == 2 and summary["personas"]["reject_reasons"] == {"invalid_json": 1}
    rejects = [json.loads(x) for x in (tmp_path / "synth/personas/rejects.jsonl").read_text().splitlines()]
    assert rejects == [{"item_id": bad_id, "reasons": ["invalid_json"], "detail": ""}]
    assert bad_id not in {c.conversation_id for c in load("seed", specs[0]["path"])}
    assert len(load("seed", specs[0]["path"])) == 2


def test_no_answer_at_all_stops_with_an_error_naming_the_endpoint(tmp_path):
    with socket.socket() as s:  # a port where nothing listens
        s.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{s.getsockname()[1]}/v1"
    with pytest.raises(synth.SynthError, match=rf"{url}.*no usable conversation out of 2.*transport_connection"):
        _write([_spec(2)], url, tmp_path, max_retries=0)
    assert len((tmp_path / "synth/personas/items.jsonl").read_text().splitlines()) == 2


def test_a_data_build_writes_the_dialogues_then_labels_them_as_a_source(tmp_path):
    d = yaml.safe_load((REPO / "configs/data/teacher_fake.yaml").read_text())
    with FakeOpenAI() as fake:
        d.update(
            output_dir=str(tmp_path / "out"),
            cache_dir=str(tmp_path / "cache"),
            progress=False,
            seed_dir=str(REPO / "data/seed"),
            eval_configs=str(REPO / "configs/eval"),
            sources=[_spec(2)],
            jobs=["extractor", "query_parser", "planner"],
        )
        d["teacher"].update(base_urls=[fake.url], api_key_env=None)
        (tmp_path / "cfg.yaml").write_text(yaml.safe_dump(d))
        results, summary = label.run(load_config(DataConfig, tmp_path / "cfg.yaml"))
    assert summary["sources"] == {"personas": 2} and summary["synthesis"]["personas"]["ok"] == 2
    ext = [r for r in results["extractor"].values() if r["status"] == "ok" and r["label"]["records"]]
    assert ext and all(r["source"] == "personas" for r in results["extractor"].values())
    assert len(results["query_parser"]) == 6 and all(r["status"] == "ok" for r in results["planner"].values())


def test_the_fake_answer_fits_the_schema_and_the_parser_accepts_it():
    for _, req in _requests(_spec(4)):
        text = answer(ds.chat_messages(req))
        jsonschema.validate(json.loads(text), ds.json_schema(req))
        res = ds.parse(text, req)
        assert res.ok and res.problems == [] and len(res.questions) == req.questions


def _req() -> ds.Request:
    a, b, *_ = synth.load_personas(PERSONAS)
    return ds.Request(a, b, datetime(2023, 5, 1, 10, 0), sessions=3, turns=(2, 6), questions=3)


def _reply(req, sessions=None, questions=None) -> str:
    a, b = req.names
    turns = [{"speaker": a, "text": "I got a puppy.", "image_caption": ""}, {"speaker": b, "text": "Lovely!"}]
    sessions = (
        sessions
        if sessions is not None
        else [
            {"date_time": req.start.strftime("%Y-%m-%dT%H:%M"), "turns": turns},
            {"date_time": req.start.replace(year=req.start.year + 1).isoformat(), "turns": turns},
        ]
    )
    return json.dumps({"sessions": sessions, "questions": questions or [{"question": "Q?", "answer": "A."}]})


@pytest.mark.parametrize(
    "mutate, code",
    [
        (lambda r, req: None, "empty_output"),
        (lambda r, req: "I cannot write that.", "no_json"),
        (lambda r, req: r[: len(r) // 2], "invalid_json"),
        (lambda r, req: json.dumps({"sessions": "many"}), "wrong_shape"),
        (lambda r, req: json.dumps({"sessions": [], "questions": []}), "no_sessions"),
        (lambda r, req: r.replace(req.start.strftime("%Y-%m-%dT%H:%M"), "someday"), "bad_date"),
        (lambda r, req: r.replace(str(req.start.year + 1), str(req.start.year - 1)), "dates_out_of_order"),
        (lambda r, req: r.replace(f'"speaker": "{req.names[1]}"', '"speaker": "Zed"'), "unknown_speaker"),
        (lambda r, req: r.replace(f'"speaker": "{req.names[1]}"', f'"speaker": "{req.names[0]}"'), "one_speaker"),
        (lambda r, req: r.replace('"Lovely!"', '"  "'), "short_session"),
    ],
)
def test_the_parser_rejects_bad_dialogues_with_a_problem_instead_of_raising(mutate, code):
    req = _req()
    raw = mutate(_reply(req), req)
    res = ds.parse(raw, req)
    assert not res.ok and code in {p.code for p in res.problems}


def test_the_parser_keeps_a_dialogue_whose_flaws_are_repairable():
    req = _req()
    res = ds.parse(_reply(req, questions=[{"question": "Q?", "answer": ""}, {"question": "Q2?", "answer": "A2."}]), req)
    assert res.ok and [q["question"] for q in res.questions] == ["Q2?"]
    assert {"bad_question", "wrong_question_count", "wrong_session_count"} <= {p.code for p in res.problems}
    assert res.sessions[1]["turns"][1] == {"speaker": req.names[1], "text": "Lovely!", "image_caption": ""}


def test_persona_seeds_are_valid_and_a_bad_line_is_named(tmp_path):
    personas = synth.load_personas(PERSONAS)
    assert len(personas) == 50 and len({p.name for p in personas}) == 50
    bad = tmp_path / "p.jsonl"
    bad.write_text(PERSONAS.read_text().splitlines()[0] + "\n" + json.dumps({"persona_id": "x", "name": "Al"}) + "\n")
    with pytest.raises(synth.SynthError, match=rf"{bad}:2: not a persona seed"):
        synth.load_personas(bad)


def test_ultrachat_rows_load_as_user_assistant_conversations():
    convs = load("chat-jsonl", FIXTURES / "ultrachat_sample.jsonl")
    assert [c.conversation_id for c in convs] == ["0", "1"]
    assert [t.role for t in convs[0].turns] == ["user", "assistant", "user", "assistant"]
    assert (
        convs[0].style == "user-assistant" and convs[0].turns[2].text == "It gets afternoon sun only. Should I move it?"
    )
    assert convs[1].meta["synthetic_time"] and len(convs[1].turns) == 2


@pytest.mark.parametrize(
    "row, message",
    [
        ({"id": "2", "data": ["hello", 5]}, "message 2: content should be a string"),
        ({"id": "2", "data": "hello"}, "field 'data' should be list"),
    ],
)
def test_a_bad_ultrachat_row_names_file_and_line(tmp_path, row, message):
    p = tmp_path / "ultra.jsonl"
    p.write_text((FIXTURES / "ultrachat_sample.jsonl").read_text().splitlines()[0] + "\n" + json.dumps(row) + "\n")
    with pytest.raises(SourceError, match=rf"^{p}:2: {message}"):
        load("chat-jsonl", p)


def test_the_at_scale_recipe_names_no_benchmark_source():
    cfg = load_config(DataConfig, REPO / "configs/data/teacher_vllm_qwen3.yaml")
    evaluated = {str(yaml.safe_load(p.read_text()).get("data_path")) for p in (REPO / "configs/eval").glob("*.yaml")}
    assert {s["format"] for s in cfg.sources} == {"persona-synth", "chat-jsonl", "seed"}
    assert not {s["format"] for s in cfg.sources} & set(hygiene.BENCHMARK_FORMATS)
    assert not {Path(s["path"]).name for s in cfg.sources} & {Path(p).name for p in evaluated}
    assert Path(REPO / synth.source_from_dict(cfg.sources[0], "sources[0]").path) == PERSONAS
