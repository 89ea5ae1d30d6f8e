"""The end-to-end job (memdistill.eval.e2e) and the QA / judge contract (memdistill.spec.qa)."""

import json
import re

import pytest

from memdistill.core.config import ConfigError, load_config
from memdistill.data import seed as seedlib
from memdistill.eval.e2e import NO_MEMORY, E2EConfig, run
from memdistill.spec import qa
from tests.conftest import REPO

# --- memdistill.spec.qa ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "raw, correct, code",
    [
        ('{"reason": "same date", "verdict": "correct"}', True, None),
        ('<think>the dates differ, so wrong</think>\n{"reason": "x", "verdict": "wrong"}', False, None),
        ('```json\n{"label": "CORRECT"}\n```', True, None),
        ('Here you go: {"verdict": "Wrong."} done', False, "prose_around_json"),
        ('{"is_correct": true}', True, None),
        ('{"answer": "yes"}', True, None),  # LongMemEval-style yes / no judges
        ("CORRECT", True, "verdict_from_text"),
        ("The generated answer names another city. WRONG", False, "verdict_from_text"),
        ("The answer is not correct.", False, "verdict_from_text"),
        ("incorrect", False, "verdict_from_text"),
        ("The answer is correct. No issues found.", True, "verdict_from_text"),  # "no" is weaker than "correct"
        ("no", False, "verdict_from_text"),
        ("Correct at first sight, but the year is wrong.", False, "conflicting_verdict"),
        ('{"reason": "hmm"}', None, "unreadable_verdict"),
        ("I cannot tell.", None, "unreadable_verdict"),
        ("", None, "unreadable_verdict"),
        (None, None, "unreadable_verdict"),
    ],
)
def test_verdict_parser_on_ugly_outputs(raw, correct, code):
    v = qa.parse_verdict(raw)
    assert v.correct is correct and v.ok == (correct is not None)
    codes = [p.code for p in v.problems]
    assert (code in codes) if code else codes == []


@pytest.mark.parametrize(
    "raw, answer, code",
    [
        ('{"answer": "On 2023-05-06."}', "On 2023-05-06.", None),
        ('<think>...</think>```json\n{"answer": "Biscuit"}\n```', "Biscuit", None),
        ("Answer: Biscuit", "Biscuit", "answer_from_text"),
        ('{"answer": ""}', None, "empty_answer"),
        ("<think>only thoughts</think>", None, "empty_output"),
    ],
)
def test_answer_parser_on_ugly_outputs(raw, answer, code):
    a = qa.parse_answer(raw)
    assert a.answer == answer
    codes = [p.code for p in a.problems]
    assert (code in codes) if code else codes == []


def test_prompts_carry_the_inputs_and_category_rules():
    msgs = qa.answer_messages(
        "When did Tom adopt Biscuit?", "2023-07-01T10:00:00", "1. [2023-05-08] Tom adopted Biscuit."
    )
    assert (
        "1. [2023-05-08] Tom adopted Biscuit." in msgs[1]["content"]
        and "2023-07-01T10:00:00, Sat" in msgs[1]["content"]
    )
    plain = qa.judge_messages("Where?", "Leeds", "In Leeds", "single-hop")[0]["content"]
    temporal = qa.judge_messages("When?", "May 2023", "last May", "temporal-reasoning")[0]["content"]
    assert qa.JUDGE_NOTES["temporal"] in temporal and not any(n in plain for n in qa.JUDGE_NOTES.values())
    assert qa.judge_note("knowledge-update") == "update" and qa.judge_note("single-hop", "e47_abs") == "abstention"
    assert qa.judge_note("adversarial") == "abstention" and qa.judge_note(None) is None
    assert set(qa.judge_schema()["properties"]["verdict"]["enum"]) == {"correct", "wrong"}


# --- the job ------------------------------------------------------------------------------------


def test_every_e2e_config_parses():
    paths = sorted((REPO / "configs/eval").glob("e2e_*.yaml"))
    assert len(paths) >= 3
    for p in paths:
        assert p.read_text().startswith("#")
        cfg = load_config(E2EConfig, p)
        assert cfg.dataset in ("seed", "locomo", "longmemeval")


@pytest.fixture(scope="module")
def seed():
    return seedlib.load(REPO / "data/seed")


def _cfg(tmp_path, **kw):
    base = {
        "banks": ["gold"],
        "labels": None,
        "variants": ["question", "gold+route"],
        "max_conversations": 1,
        "ks": [1, 5, 20],
        "fusions": ["rrf"],
        "recall_modes": None,
        "hooks_models": {},
        "output_dir": str(tmp_path / "runs"),
    }
    return load_config(
        E2EConfig, REPO / "configs/eval/e2e_cpu.yaml", [f"{k}={json.dumps(v)}" for k, v in {**base, **kw}.items()]
    )


def test_job_on_gold_and_a_records_file(tmp_path, seed):
    """A records bank lacking the evidence records of one question can never recall it; the gold bank
    can. Everything the report needs is written."""
    qs = seed.rows("questions", "test")
    cid = qs[0]["conversation_id"]
    target = qs[0]
    rows = [
        {**m, "turn_id": m["source_turn_id"]}
        for m in seed.memories_of(cid)
        if m["source_turn_id"] not in target["evidence"]
    ]
    (tmp_path / "partial.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = _cfg(
        tmp_path,
        banks=["gold", f"records:{tmp_path / 'partial.jsonl'}"],
        labels=["gold", "partial"],
        variants=["question", "gold", "gold+route", "model"],
    )
    out = run(cfg)
    res = json.loads((out / "results.json").read_text())
    assert res["meta"]["conversations"] == 1 and res["results"]["partial"]["stats"]["records"] == len(rows)
    assert set(res["results"]["gold"]["variants"]) == {"question", "gold", "gold+route"}
    assert any("model: no query parser" in s for s in res["meta"]["skipped"])
    per_q = [json.loads(x) for x in (out / "per_question.jsonl").read_text().splitlines()]
    n_q = sum(1 for q in qs if q["conversation_id"] == cid)
    assert len(per_q) == 2 * 3 * n_q
    for r in per_q:
        if r["bank"] == "partial" and r["question_id"] == target["question_id"]:
            assert r["recall@20"] == 0.0 and not set(r["ranked_turns"]) & set(target["evidence"])
        if r["bank"] == "gold":
            assert len(r["tokens_at"]) == 3 and r["tokens_at"]["1"] <= r["tokens_at"]["5"] <= r["tokens_at"]["20"]
    g = res["results"]["gold"]["variants"]["gold+route"]["recall"]["overall"]
    p = res["results"]["partial"]["variants"]["gold+route"]["recall"]["overall"]
    assert g["recall@20"] > p["recall@20"] and g["questions"] == n_q
    report = (out / "report.md").read_text()
    assert "| gold | gold+route |" in report and "R@20" in report and "No QA / judge endpoints" in report
    for png in ("recall_at_k.png", "tokens_per_query.png"):
        assert (out / png).read_bytes()[:4] == b"\x89PNG"


def test_report_sets_planner_and_gate_on_and_off_side_by_side_under_both_fusions(tmp_path, monkeypatch):
    """TiMem Table 3 grid from in-process hooks: a planner that says "simple" (budget 8) and a gate that keeps
    the first candidate. Every rate carries an interval that holds its point estimate; tokens name the
    tokenizer; DimMem's union is read whole."""
    import memdistill.eval.e2e as e2e

    def fake_hooks(cfg):
        return {"planner": lambda q: "simple", "gate": lambda q, c, cands: [1]}

    monkeypatch.setattr(e2e, "build_hooks", fake_hooks)
    modes = ["default", "default+gate", "planned", "planned+gate"]
    out = run(_cfg(tmp_path, variants=["question"], fusions=["rrf", "dimmem_union"], recall_modes=modes))
    res = json.loads((out / "results.json").read_text())
    vs = res["results"]["gold"]["variants"]
    assert sorted((v["fusion"], v["recall_mode"]) for v in vs.values()) == sorted(
        (f, m) for f in ("rrf", "dimmem_union") for m in modes
    )
    per_q = [json.loads(x) for x in (out / "per_question.jsonl").read_text().splitlines()]
    for r in per_q:  # the gold bank holds more than 20 records per conversation
        gated, planned = r["recall_mode"].endswith("+gate"), r["recall_mode"].startswith("planned")
        assert r["kept"] == (1 if gated else r["budget"])
        if planned:
            assert r["complexity"] == "simple" and r["budget"] == 8
        elif r["fusion"] == "rrf":
            assert r["complexity"] is None and r["budget"] == 10
        else:  # the whole union: at least the dense route's top 20
            assert r["budget"] >= 20
    o = {(v["fusion"], v["recall_mode"]): v["recall"]["overall"] for v in vs.values()}
    assert o[("rrf", "default+gate")]["tokens_per_query"] < o[("rrf", "default")]["tokens_per_query"]
    assert o[("dimmem_union", "default")]["kept_per_query"] > o[("rrf", "default")]["kept_per_query"]
    for summ in [x for v in vs.values() for x in [v["recall"]["overall"], *v["recall"]["by_category"].values()]]:
        rates = [k[: -len("_ci95")] for k in summ if k.endswith("_ci95")]
        expected = {f"{m}@{k}" for m in ("recall", "hit") for k in (1, 5, 20)} | {"kept_recall", "kept_hit"}
        assert set(rates) == expected | ({"answer_coverage"} & set(summ))
        for k in rates:
            assert summ[f"{k}_ci95"][0] <= summ[k] <= summ[f"{k}_ci95"][1]
    report = (out / "report.md").read_text()
    section = report.split("## Accuracy-cost trade-off (TiMem Table 3 layout)")[1].split("\n## ")[0]
    lines = [line for line in section.splitlines() if line.startswith("| gold")]
    grid = {tuple(c.strip() for c in line.split("|")[3:6]) for line in lines}
    assert grid == {(f, p, g) for f in ("rrf", "dimmem_union") for p in ("no", "yes") for g in ("no", "yes")}
    assert "tokens/query (embedded:smollm2-135m-instruct tokenizer)" in report
    row = next(line for line in report.splitlines() if line.startswith("| gold | question | rrf | default |"))
    assert re.search(r"\| \d\.\d{3} \[\d\.\d{2}, \d\.\d{2}\] \|", row)  # R@1 with its interval
    tables = re.findall(r"(?:^\|.*\n)+", report, re.M)
    assert len(tables) >= 4 and all(len({t.count("|") for t in tab.splitlines()}) == 1 for tab in tables)


def test_tree_rows_recall_a_banks_memory_tree_flat_and_hierarchically(tmp_path, monkeypatch):
    """TiMem Table 3 / 4 rows over the gold bank's tree (nodes by the no-model lead writer): summaries hold no
    evidence turns but cover answers; the planner's scope and the gate apply; Table 5's calls are counted."""
    import memdistill.eval.e2e as e2e

    monkeypatch.setattr(e2e, "build_hooks", lambda cfg: {"planner": lambda q: "simple", "gate": lambda q, c, x: [1]})
    specs = [
        "hierarchical L1-L5 hybrid",
        "flat L1-L5 hybrid",
        "hierarchical L1 planned+gate",
        "flat L2-L5 complex",
        "flat L1 hybrid@5",
    ]
    out = run(_cfg(tmp_path, variants=["question"], trees=specs, tree_writer="lead"))
    res = json.loads((out / "results.json").read_text())
    gold = res["results"]["gold"]
    assert list(gold["trees"]) == specs and res["meta"]["tree_writer"] == "lead"
    calls = gold["tree_calls"]
    assert calls["conversations"] == 1 and calls["tree_calls"] == calls["l1_calls"] + calls["nodes"] > calls["l1_calls"]
    o = {s: gold["trees"][s]["recall"]["overall"] for s in specs}
    assert o["flat L2-L5 complex"]["recall@20"] == 0.0 and o["flat L2-L5 complex"]["answer_coverage"] > 0
    assert o["hierarchical L1-L5 hybrid"]["recall@20"] > 0 and o["hierarchical L1 planned+gate"]["kept_per_query"] == 1
    assert o["flat L1 hybrid@5"]["kept_per_query"] == 5 and o["flat L1-L5 hybrid"]["kept_per_query"] == 20
    for summ in o.values():
        assert summ["answer_coverage_ci95"][0] <= summ["answer_coverage"] <= summ["answer_coverage_ci95"][1]
        assert 0 <= summ["recall_p50_s"] <= summ["recall_p95_s"]
    per_q = [json.loads(x) for x in (out / "per_question.jsonl").read_text().splitlines() if '"tree"' in x]
    assert {r["complexity"] for r in per_q if r["tree"].endswith("planned+gate")} == {"simple"}
    assert len(per_q) == len(specs) * o[specs[0]]["questions"]
    report = (out / "report.md").read_text()
    assert "## Memory tree (TiMem Tables 3-6 layouts)" in report and "| gold | flat L2-L5 complex |" in report
    with pytest.raises(ConfigError, match="expected '<recall> <levels> <scope>"):
        run(_cfg(tmp_path, trees=["hierarchical L1 sometimes"], tree_writer="lead"))
    with pytest.raises(ConfigError, match="needs the gate hook"):
        monkeypatch.setattr(e2e, "build_hooks", lambda cfg: {})
        run(_cfg(tmp_path, trees=["flat L1 simple+gate"], tree_writer="lead"))


def test_gold_tree_nodes_must_cover_the_runs_conversations(tmp_path):
    with pytest.raises(ConfigError, match="conversation_length=long"):
        run(_cfg(tmp_path, conversation_length="short", trees=["flat L1-L5 simple"], tree_writer="gold"))


def test_raw_turn_bank_holds_every_message_and_reports_no_token_cap(tmp_path, seed):
    qs = seed.rows("questions", "test")
    cid = qs[0]["conversation_id"]
    out = run(_cfg(tmp_path, banks=["turns"], labels=["raw turns"], variants=["question"]))
    res = json.loads((out / "results.json").read_text())
    assert res["results"]["raw turns"]["stats"]["records"] == len(seed.conversations[cid].turns)
    turn_ids = {t.turn_id for t in seed.conversations[cid].turns}
    per_q = [json.loads(x) for x in (out / "per_question.jsonl").read_text().splitlines()]
    assert len(per_q) == sum(q["conversation_id"] == cid for q in qs)
    assert all(
        set(r["ranked_turns"]) <= turn_ids and len(set(r["ranked_turns"])) == len(r["ranked_turns"]) for r in per_q
    )
    row = next(
        line for line in (out / "report.md").read_text().splitlines() if line.startswith("| raw turns | turns |")
    )
    assert row.split("|")[5].strip() == "-"  # "at token cap": no model wrote this bank


def _records(path, cid, rows):
    dim = {"memory_type": "episodic", "time": "", "location": "", "reason": "", "purpose": "", "keywords": []}
    path.write_text(
        "".join(
            json.dumps({"conversation_id": cid, "turn_id": t, "content": c, "dimension": dim}) + "\n" for t, c in rows
        )
    )
    return f"records:{path}"


@pytest.mark.parametrize(
    "fmt, fixture, cid, rows, expect",
    [
        (
            "locomo",
            "locomo_sample.json",
            "conv-26",
            [
                ("D1:3", "Caroline went to an LGBTQ support group on 2023-05-07."),
                ("D1:6", "Melanie painted a lake sunrise in 2022."),
                ("D1:9", "Caroline is looking into counseling certification programs starting in June 2023."),
                ("D2:10", "Caroline's counseling program was moved to start in September 2023."),
                ("D2:1", "Melanie went camping at the beach with her kids."),
                ("D2:4", "Caroline signed up for a weekly pottery class."),
                ("D3:3", "Caroline's mentor runs a youth center in Boston."),
            ],
            {"recall@1": 0.8333, "recall@5": 1.0, "categories": ["multi-hop", "temporal"]},
        ),
        (
            "longmemeval",
            "longmemeval_sample.json",
            "e47becba",
            [
                ("sharegpt_yywfv_0:1", "The user asked for podcasts about history."),
                ("answer_280352e9:1", "The user graduated with a degree in Business Administration."),
                ("answer_280352e9:2", "The assistant suggested a digital marketing certificate."),
            ],
            {"recall@1": 1.0, "recall@5": 1.0, "categories": ["single-session-user"]},
        ),
    ],
)
def test_job_on_locomo_and_longmemeval_formats(tmp_path, fmt, fixture, cid, rows, expect):
    bank = _records(tmp_path / "bank.jsonl", cid, rows)
    out = run(
        _cfg(
            tmp_path,
            dataset=fmt,
            data_path=str(REPO / "tests/fixtures" / fixture),
            banks=[bank],
            labels=["hand"],
            variants=["question"],
            max_conversations=None,
        )
    )
    r = json.loads((out / "results.json").read_text())["results"]["hand"]["variants"]["question"]["recall"]
    # LoCoMo: the two single-evidence questions at k=1, and one of the two turns of the third (1 + 1 + 1/2) / 3
    assert r["overall"]["recall@1"] == expect["recall@1"] and r["overall"]["recall@5"] == expect["recall@5"]
    assert sorted(r["by_category"]) == expect["categories"]


def test_job_resumes_from_a_cached_bank_without_a_server(tmp_path, seed):
    """A model bank whose records are already in the run directory is not extracted again (no server)."""
    run_dir = tmp_path / "run"
    (run_dir / "banks").mkdir(parents=True)
    cid = seed.rows("questions", "test")[0]["conversation_id"]
    rows = [{**m, "turn_id": m["source_turn_id"]} for m in seed.memories_of(cid)][:10]
    (run_dir / "banks" / "cached-model.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (run_dir / "banks" / "cached-model.json").write_text(json.dumps({"records": 10, "windows": 3}))
    cfg = _cfg(
        tmp_path,
        banks=["embedded:smollm2-135m-instruct"],
        labels=["cached model"],
        variants=["question"],
        run_dir=str(run_dir),
    )
    res = json.loads((run(cfg) / "results.json").read_text())
    assert res["results"]["cached model"]["stats"] == {"records": 10, "windows": 3}
    with pytest.raises(ConfigError, match=rf"made with other max_new_tokens \({cfg.max_new_tokens}, now 99\)"):
        run(
            _cfg(
                tmp_path,
                banks=["embedded:smollm2-135m-instruct"],
                labels=["cached model"],
                variants=["question"],
                run_dir=str(run_dir),
                max_new_tokens=99,
            )
        )


def test_job_config_errors(tmp_path):
    with pytest.raises(ConfigError, match="variants: unknown"):
        run(_cfg(tmp_path, variants=["bm25-only"]))
    with pytest.raises(ConfigError, match="qa and judge go together"):
        run(_cfg(tmp_path, qa={"base_url": "http://127.0.0.1:9/v1", "model": "m"}))
    with pytest.raises(ConfigError, match=r"qa: unknown key\(s\) \['url'\]"):
        run(_cfg(tmp_path, qa={"url": "x"}, judge={"base_url": "x", "model": "m"}))
    with pytest.raises(ConfigError, match="judge.model is required"):
        run(_cfg(tmp_path, qa={"base_url": "x", "model": "m"}, judge={"base_url": "x"}))
    with pytest.raises(ConfigError, match="hooks need hooks_url"):
        run(_cfg(tmp_path, hooks=["router"]))
    with pytest.raises(ConfigError, match="needs dataset=seed"):
        run(_cfg(tmp_path, dataset="locomo", data_path=str(REPO / "tests/fixtures/locomo_sample.json")))


@pytest.mark.vllm
def test_endpoint_bank_queries_hooks_and_judge_through_a_live_server(tmp_path, server):
    """The whole served path on one conversation: the untrained model extracts the bank, parses the
    queries, serves the hooks and answers and judges. Its answers are poor; what is checked is that every
    step ran and every output went through the spec's parsers."""
    url = f"{server.urls[0]}/v1"
    endpoint = {"base_url": url, "model": server.cfg.served_model_name, "max_tokens": 64, "concurrency": 4}
    cfg = _cfg(
        tmp_path,
        banks=["gold", url],
        labels=["gold", "served"],
        variants=["question", "model+route"],
        max_questions=2,
        max_new_tokens=160,
        hooks_url=url,
        hooks=["router", "planner", "gate"],
        qa=endpoint,
        judge=endpoint,
    )
    out = run(cfg)
    results = json.loads((out / "results.json").read_text())["results"]
    res = results["served"]
    assert res["stats"]["windows"] > 0 and res["stats"]["completion_tokens"] > 0
    assert len((out / "queries" / "served.jsonl").read_text().splitlines()) == 2
    rows = [json.loads(x) for x in (out / "qa.jsonl").read_text().splitlines()]
    assert len(rows) == 8 and all(r["correct"] is not None or r["verdict_problems"] for r in rows)
    # judge accuracy's trivial baseline: the same two questions answered with no memory at all
    base = [x for x in rows if x["bank"] == NO_MEMORY]
    meta = json.loads((out / "results.json").read_text())["meta"]
    assert len(base) == 2 and meta["qa_baseline"]["overall"]["questions"] == 2
    assert meta["qa_baseline"]["overall"]["accuracy"] == sum(bool(x["correct"]) for x in base) / 2
    # each accuracy is the share of that row's two judged answers marked correct, inside its interval
    for bank, r in (("served", res), ("gold", results["gold"])):
        for name, v in r["variants"].items():
            mine = [x for x in rows if x["bank"] == bank and x["variant"] == name]
            acc = v["qa"]["overall"]
            assert len(mine) == 2 and acc["questions"] == 2
            assert acc["accuracy"] == sum(bool(x["correct"]) for x in mine) / 2
            assert acc["accuracy_ci95"][0] <= acc["accuracy"] <= acc["accuracy_ci95"][1]
    # the gold bank has candidates, so planner and gate ran over the SDK: a complexity (or a note why not),
    # and what the gate kept stays inside the planner's budget
    for r in (json.loads(x) for x in (out / "per_question.jsonl").read_text().splitlines()):
        if r["bank"] == "gold":
            assert r["complexity"] in ("simple", "hybrid", "complex") or any("planner" in n for n in r["notes"])
            assert r["kept"] <= r["budget"]
    assert "LLM-judge accuracy" in (out / "report.md").read_text()


def test_extraction_resumes_from_finished_chunks(tmp_path, seed):
    """Chunks already in the partial file are not sent again: the client points at a closed port, so any
    request would raise EndpointUnavailable."""
    from memdistill.eval.e2e import extract_bank
    from memdistill.serve.client import MemoryModels
    from memdistill.serve.server import free_port

    cfg = _cfg(tmp_path, windows={"multi-party": [6, 1], "user-assistant": [4, 1]})
    conv = seed.conversations["mp01"]
    mm = MemoryModels(f"http://127.0.0.1:{free_port()}/v1", max_concurrency=1, max_retries=0, timeout=5)
    n = 14  # mp01 (69 turns) in windows of 6 with 1 of context
    dim = {"memory_type": "fact", "time": "", "location": "", "reason": "", "purpose": "", "keywords": []}
    partial = tmp_path / "bank.partial.jsonl"
    partial.write_text(
        "".join(
            json.dumps(
                {
                    "start": i,
                    "of": n,
                    "windows": min(2, n - i),
                    "prompt_tokens": 100,
                    "completion_tokens": 10,
                    "seconds": 1.5,
                    "problems": {"no_json": 1},
                    "items": [
                        {
                            "conversation_id": "mp01",
                            "turn_id": f"D1:{i + 1}",
                            "content": f"fact {i}",
                            "dimension": dim,
                            "memory_id": f"m{i}",
                        }
                    ],
                }
            )
            + "\n"
            for i in range(0, n, 2)
        )
    )
    bank, stats = extract_bank(mm, {"mp01": conv}, cfg, "resumed", partial)
    assert [it.memory_id for it in bank.items] == [f"m{i}" for i in range(0, n, 2)]
    assert stats == {
        "windows": n,
        "records": 7,
        "problems": {"no_json": 7},
        "prompt_tokens": 700,
        "completion_tokens": 70,
        "extraction_seconds": 10.5,
    }
    partial.write_text(partial.read_text().replace(f'"of": {n}', '"of": 99', 1))
    with pytest.raises(ConfigError, match="written for other windows"):
        extract_bank(mm, {"mp01": conv}, cfg, "resumed", partial)


def test_seed_questions_leave_out_the_unanswerable_and_split_by_conversation_length():
    """Unanswerable questions (adversarial / abstention) list only look-alike turns as evidence: they stay out of
    evidence recall unless asked for; `conversation_length` keeps the long or the short conversations."""
    from memdistill.data import seed as seedlib
    from memdistill.data.questions import load_questions
    from memdistill.eval.e2e import E2EConfig, _questions

    _, kept, notes, seed = load_questions("seed", REPO / "data/seed", "test")
    _, every, _, _ = load_questions("seed", REPO / "data/seed", "test", include_adversarial=True)
    left_out = [q for q in every if q.category in seedlib.UNANSWERABLE]
    out_ids = {q.question_id for q in left_out}
    assert out_ids and len(kept) == len(every) - len(out_ids) and not {q.question_id for q in kept} & out_ids
    assert f"{len(left_out)} unanswerable questions" in notes[0]
    for length in ("long", "short"):
        convs, qs, _, _ = _questions(E2EConfig(data_path=str(REPO / "data/seed"), conversation_length=length))
        assert convs and {seedlib.length(c) for c in convs.values()} == {length}
        assert {q.conversation_id for q in qs} == set(convs)
