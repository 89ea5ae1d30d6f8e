"""Extraction metrics against hand-computed expectations on small fixtures."""

import json
from datetime import datetime

import evaluate
import pytest

from memdistill.metrics.extraction import ExtractionScores, keyword_f1, match, token_f1
from memdistill.spec.extraction import Dimension, MemoryRecord, render_completion
from tests.conftest import REPO


def rec(sid, content, mt="episodic", time="", location="", kws=()):
    return MemoryRecord(
        source_id=sid,
        content=content,
        dimension=Dimension(memory_type=mt, time=time, location=location, keywords=list(kws)),
    )


GOLD = [
    rec(1, "Maya adopted a puppy named Biscuit", "episodic", "2023-05-06", kws=["puppy", "Biscuit"]),
    rec(2, "Tom works as a nurse in Leeds", "fact", location="Leeds", kws=["nurse", "Leeds"]),
    rec(3, "Maya prefers tea over coffee", "profile", kws=["tea"]),
]


def score(pred, gold=GOLD, raw=None):
    s = ExtractionScores(threshold=0.5, similarity="token_f1")
    raw = raw if raw is not None else render_completion(pred)
    s.add(raw, pred, gold, json_ok=True)
    return s.summary()


def test_perfect_output():
    out = score(GOLD)
    assert out["memory_precision"] == out["memory_recall"] == out["memory_f1"] == 1.0
    assert out["type_accuracy"] == out["time_exact"] == out["keyword_f1"] == out["source_accuracy"] == 1.0
    assert out["location_agreement"] == 1.0 and out["overfill_rate"] == 0.0 and out["schema_valid_rate"] == 1.0


def test_empty_output():
    out = score([])
    assert out["memory_precision"] == out["memory_recall"] == out["memory_f1"] == 0.0 and out["matched"] == 0
    assert out["schema_valid_rate"] == 1.0  # {"memories": []} is valid


def test_swapped_types_and_overfill():
    pred = [
        rec(1, GOLD[0].content, "fact", "2023-05-06", kws=["puppy", "Biscuit"]),
        rec(2, GOLD[1].content, "fact", "2023", "Leeds", kws=["nurse"]),
        rec(3, GOLD[2].content, "episodic", location="home", kws=["tea"]),
    ]
    out = score(pred)
    assert out["memory_f1"] == 1.0
    assert out["type_accuracy"] == round(1 / 3, 4)  # only Tom's record keeps its type
    assert out["time_exact"] == round(2 / 3, 4)  # "2023" where gold is empty
    assert out["location_agreement"] == round(2 / 3, 4)  # "home" where gold is empty
    assert out["keyword_f1"] == round((1 + 2 * 1 / 3 + 1) / 3, 4)
    # gold-empty dims: rec1 loc/reason/purpose (3) + rec2 time/reason/purpose (3) + rec3 time/loc/reason/purpose (4)
    assert out["overfill_rate"] == round(2 / 10, 4)


def test_partial_match_and_pointer():
    pred = [
        rec(2, "Maya adopted a puppy called Biscuit", "episodic", "2023-05-06", kws=["puppy", "Biscuit"]),
        rec(3, "The weather was nice", "fact"),
    ]
    out = score(pred)
    assert out["matched"] == 1 and out["memory_precision"] == 0.5 and out["memory_recall"] == round(1 / 3, 4)
    assert out["memory_f1"] == round(2 * 0.5 * (1 / 3) / (0.5 + 1 / 3), 4)
    assert out["source_accuracy"] == 0.0  # matched the right memory, pointed at the wrong message


def test_invalid_output_counts_against_validity():
    s = ExtractionScores(threshold=0.5, similarity="token_f1")
    s.add('{"memories": [{"source_id": 1, "content": "x", "dimension": {"memory_type": "Event"}}]}', [], GOLD, True)
    s.add("not json", [], GOLD, False)
    out = s.summary()
    assert out["json_valid_rate"] == 0.5 and out["schema_valid_rate"] == 0.0


def test_matching_is_one_to_one():
    pred = [rec(1, "Maya adopted a puppy named Biscuit"), rec(1, "Maya adopted a puppy named Biscuit today")]
    pairs = match(pred, GOLD, 0.5, "token_f1")
    assert len(pairs) == 1 and pairs[0][:2] == (0, 0)


def test_helpers():
    assert token_f1("a b c", "a b d") == pytest.approx(2 / 3)
    assert keyword_f1([], []) == 1.0 and keyword_f1(["A"], []) == 0.0 and keyword_f1(["Tea "], ["tea"]) == 1.0


def test_embedding_similarity_matches_paraphrases_only():
    para = [rec(1, "Maya got a puppy called Biscuit"), rec(2, "Tom is employed as a nurse in Leeds")]
    pairs = match(para, GOLD, 0.7, "embedding")
    assert sorted((i, j) for i, j, _ in pairs) == [(0, 0), (1, 1)]
    assert match([rec(1, "Maya enjoys long walks on the beach")], GOLD, 0.7, "embedding") == []


def test_local_evaluate_module_loads_offline():
    m = evaluate.load(str(REPO / "memdistill/metrics/dimmem_extraction"))
    gold = json.dumps({"memories": [r.model_dump() for r in GOLD]})
    out = m.compute(predictions=["```json\n" + gold + "\n```", ""], references=[gold, gold], similarity="token_f1")
    assert out["memory_recall"] == 0.5 and out["memory_precision"] == 1.0 and out["json_valid_rate"] == 0.5


def test_reason_purpose_agreement_and_tokens_per_window():
    def full(sid, content, reason="", purpose=""):
        return MemoryRecord(
            source_id=sid, content=content, dimension=Dimension(memory_type="episodic", reason=reason, purpose=purpose)
        )

    gold = [
        full(1, "Maya moved to Oslo for a new job", reason="new job", purpose=""),
        full(2, "Tom bought a bike to commute to work", reason="", purpose="commute to work"),
    ]
    pred = [
        full(1, "Maya moved to Oslo for a new job", reason="New  Job", purpose="career"),  # case/space folded
        full(2, "Tom bought a bike to commute to work", reason="", purpose="Commute to work"),
    ]
    s = ExtractionScores(threshold=0.5, similarity="token_f1")
    s.add(render_completion(pred), pred, gold, True, prompt_tokens=300, output_tokens=40)
    s.add('{"memories": []}', [], [], True, prompt_tokens=100, output_tokens=6)  # a window with nothing to say
    out = s.summary()
    assert out["reason_agreement"] == 1.0  # "New  Job" = "new job"; "" = "" (empty against empty agrees)
    assert out["purpose_agreement"] == 0.5  # "career" where gold is empty disagrees; "Commute to work" agrees
    # gold-empty dims: rec1 time/location/purpose, rec2 time/location/reason = 6, one filled ("career")
    assert out["overfill_rate"] == round(1 / 6, 4)
    assert out["prompt_tokens_per_window"] == 200.0 and out["output_tokens_per_window"] == 23.0
    assert out["windows"] == 2 and out["memory_f1"] == 1.0


def test_matching_stays_inside_a_window():
    s = ExtractionScores(threshold=0.5, similarity="token_f1")
    s.add(render_completion([GOLD[0]]), [GOLD[0]], [], True)  # right record, wrong window: unmatched
    s.add(render_completion([]), [], [GOLD[0]], True)
    out = s.summary()
    assert out["matched"] == 0 and out["predicted"] == 1 and out["gold"] == 1 and out["memory_f1"] == 0.0


def test_local_evaluate_module_token_counts_and_bad_reference():
    m = evaluate.load(str(REPO / "memdistill/metrics/dimmem_extraction"))
    gold = json.dumps({"memories": [r.model_dump() for r in GOLD]})
    out = m.compute(
        predictions=[gold, gold],
        references=[gold, gold],
        similarity="token_f1",
        prompt_tokens=[100, 300],
        output_tokens=[50, 70],
    )
    assert out["prompt_tokens_per_window"] == 200.0 and out["output_tokens_per_window"] == 60.0
    assert out["memory_f1"] == 1.0 and out["match_threshold"] == 0.5
    with pytest.raises(ValueError, match=r"references\[0\] is not a valid"):
        m.compute(predictions=[gold], references=['{"memories": [{"content": "x"}]}'], similarity="token_f1")
    with pytest.raises(ValueError, match="prompt_tokens: 1 counts for 2 predictions"):
        m.compute(predictions=[gold, gold], references=[gold, gold], similarity="token_f1", prompt_tokens=[1])


def test_eval_job_reports_and_resumes_from_its_generation_log(tmp_path, monkeypatch):
    """The gold-set eval end to end on the real base model (in-process, a few tokens); a rerun after
    a kill regenerates only the prompts that had not finished, and a full rerun generates nothing."""
    from memdistill.core.config import load_config
    from memdistill.eval import extractor as extractor_eval
    from memdistill.eval import generate

    cfg = load_config(
        extractor_eval.EvalConfig,
        REPO / "configs/eval/extractor_cpu.yaml",
        [
            "models=[embedded:smollm2-135m-instruct]",
            "labels=[base]",
            "backend=hf",
            "max_windows=2",
            "max_questions=1",
            "max_new_tokens=12",
            "query_max_new_tokens=8",
            "similarity=token_f1",
            f"output_dir={tmp_path}",
        ],
    )
    out = extractor_eval.run(cfg)
    metrics = json.loads((out / "metrics.json").read_text())
    ext = metrics["results"]["base"]["extraction"]
    assert (metrics["windows"], metrics["questions"]) == (2, 1) and ext["windows"] == 2
    assert ext["output_tokens_per_window"] <= 12 and ext["prompt_tokens_per_window"] > 100
    assert (out / "report.md").read_text().count("| memory_f1 |") == 1 and (out / "extraction.png").stat().st_size
    log = tmp_path / "generations.jsonl"
    lines = log.read_text().splitlines()
    assert len(lines) == 3

    log.write_text("\n".join(lines[:2]) + "\n" + lines[2][:25])  # killed while writing the third
    calls = []
    real = generate.HFGenerator.__call__
    monkeypatch.setattr(
        generate.HFGenerator,
        "__call__",
        lambda self, convs, *a, **k: calls.append(len(convs)) or real(self, convs, *a, **k),
    )
    again = json.loads((extractor_eval.run(cfg) / "metrics.json").read_text())
    assert calls == [1]
    assert again["results"]["base"]["extraction"] == ext

    monkeypatch.setattr(generate.HFGenerator, "__init__", lambda *a, **k: pytest.fail("generated again"))
    third = json.loads((extractor_eval.run(cfg) / "metrics.json").read_text())
    assert third["results"]["base"]["extraction"] == ext


def test_parser_repairs_and_token_cap_are_counted_over_records_written():
    from memdistill.spec.dialogue import Turn, Window
    from memdistill.spec.extraction import parse

    ts = datetime(2024, 1, 1, 9, 0)
    w = Window("c", 0, [Turn("t1", "Ann", "user", "hi", ts), Turn("t2", "Bob", "user", "I moved to Oslo.", ts)], 2)
    rec = {"source_id": 2, "content": "Bob moved to Oslo.", "dimension": {"memory_type": "fact"}}
    raw = json.dumps({"memories": [dict(rec, source_speaker="Ann"), rec, rec, dict(rec, content="Bob likes fjords.")]})
    res = parse(raw, w)  # 4 written: one speaker fixed, two repeats dropped
    s = ExtractionScores(threshold=0.5, similarity="token_f1")
    s.add(raw, res.records, [], res.ok, parsed=res, capped=True)
    s.add('{"memories": []}', [], [], True, parsed=parse('{"memories": []}', w), capped=False)
    out = s.summary()
    assert out["records_written"] == 4 and out["predicted"] == 2
    assert out["duplicate_rate"] == 0.5 and out["speaker_fix_rate"] == 0.25
    assert out["capped_outputs"] == 1 and out["capped_rate"] == 0.5
