"""Extraction metrics against hand-computed expectations on small fixtures."""

import json
from datetime import datetime

import evaluate
import pytest

from memdistill.metrics.extraction import ExtractionScores, keyword_f1, match, query_scores, token_f1
from memdistill.metrics.stats import bootstrap_ci, percentile
from memdistill.spec.extractor import Dimension, MemoryRecord, render_completion
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
    ext = metrics["results"]["base"]["extractor"]
    assert (metrics["windows"], metrics["questions"]) == (2, 1) and ext["windows"] == 2
    assert ext["output_tokens_per_window"] <= 12 and ext["prompt_tokens_per_window"] > 100
    assert (out / "report.md").read_text().count("| memory_f1 |") == 1 and (out / "extractor.png").stat().st_size
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
    assert again["results"]["base"]["extractor"] == ext

    monkeypatch.setattr(generate.HFGenerator, "__init__", lambda *a, **k: pytest.fail("generated again"))
    third = json.loads((extractor_eval.run(cfg) / "metrics.json").read_text())
    assert third["results"]["base"]["extractor"] == ext


def test_parser_repairs_and_token_cap_are_counted_over_records_written():
    from memdistill.spec.dialogue import Turn, Window
    from memdistill.spec.extractor import parse

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


def _question(need=False, time="", location="", types=(), answer_dim=""):
    query = {
        "query_anchor": "what the user asked",
        "need_assistant_context": need,
        "dimension": {"target_memory_type": list(types), "keywords": [], "time": time, "location": location},
        "answer_dim": answer_dim,
    }
    return {"query": query}


def _reply(**kw) -> str:
    return json.dumps(_question(**kw)["query"])


QUESTIONS = [
    _question(True, time="on 2023-05-06", types=["episodic"], answer_dim="time"),
    _question(True, location="Leeds", types=["fact"]),
    _question(False, types=["episodic"]),
    _question(False, time="after 2023-01"),
    _question(False, types=["episodic", "profile"]),
    _question(False, types=["episodic"]),
]
REPLIES = [
    _reply(need=True, time="on 2023-05-06", types=["episodic"]),  # true positive, time and types exact
    "not json",  # invalid: a missed trigger, wrong wherever scored, fills nothing
    _reply(need=True, time="before 2024", types=["episodic"]),  # false positive, a time where gold has none
    _reply(time="after 2023-02", location="home", types=["fact"]),  # wrong time; location and types filled
    _reply(types=["profile", "episodic"]),  # types compared as a set
    _reply(types=["fact"]),
]


def test_query_scores_trigger_and_field_rates_by_hand():
    out = query_scores(REPLIES, QUESTIONS)
    assert out["assistant_trigger_confusion"] == {"tp": 1, "fp": 1, "fn": 1, "tn": 3}
    assert out["assistant_trigger_precision"] == out["assistant_trigger_recall"] == out["assistant_trigger_f1"] == 0.5
    assert out["assistant_trigger_rate"] == out["assistant_trigger_gold_rate"] == round(2 / 6, 4)
    assert out["assistant_trigger_f1_baseline"] == 0.5  # always trigger: P = 2/6, R = 1, F1 = 2 * 2 / (6 + 2)
    assert out["valid_rate"] == round(5 / 6, 4)
    assert out["need_assistant_context_acc"] == round(4 / 6, 4)  # q1, q4, q5, q6
    assert out["need_assistant_context_acc_baseline"] == round(4 / 6, 4)
    assert out["baseline_of"]["need_assistant_context_acc"] == "always false"
    # time: gold sets one on q1 and q4 (q1 exact); gold empty on q2, q3, q5, q6 (q3 filled)
    assert (out["time_gold_questions"], out["time_exact_where_gold"]) == (2, 0.5)
    assert out["time_filled_where_gold_empty"] == 0.25
    assert out["time_exact_where_gold_baseline"] == 0.5  # two gold times, one each: the tie goes to the first
    assert out["baseline_of"]["time_exact_where_gold"] == 'always "after 2023-01"'
    # location: only q2 sets one (its output is invalid); "home" on q4 is filled over 5 gold-empty questions
    assert (out["location_gold_questions"], out["location_exact_where_gold"]) == (1, 0.0)
    assert out["location_filled_where_gold_empty"] == 0.2 and out["location_exact_where_gold_baseline"] == 1.0
    # target types: gold sets them on q1, q2, q3, q5, q6 (q1, q3, q5 exact); q4 has none and gets [fact]
    assert (out["target_type_gold_questions"], out["target_type_exact_where_gold"]) == (5, 0.6)
    assert out["target_type_filled_where_gold_empty"] == 1.0
    assert out["target_type_exact_where_gold_baseline"] == 0.6  # {episodic} on q1, q3, q6
    assert out["baseline_of"]["target_type_exact_where_gold"] == 'always ["episodic"]'
    assert out["answer_dim_acc"] == round(4 / 6, 4) and out["answer_dim_acc_baseline"] == round(5 / 6, 4)
    assert out["keyword_f1"] == round(5 / 6, 4) and out["keyword_f1_baseline"] == 1.0
    lo, hi = out["assistant_trigger_f1_ci95"]
    assert 0.0 <= lo < 0.5 < hi <= 1.0


def test_query_scores_always_false_model_scores_its_baseline_and_never_triggers():
    """The failure the old accuracy hid: a model that never triggers matches the majority baseline."""
    questions = [_question(True)] * 2 + [_question(False)] * 8
    out = query_scores([_reply()] * 10, questions)
    assert out["need_assistant_context_acc"] == out["need_assistant_context_acc_baseline"] == 0.8
    assert out["assistant_trigger_rate"] == 0.0 and out["assistant_trigger_gold_rate"] == 0.2
    assert out["assistant_trigger_recall"] == out["assistant_trigger_f1"] == 0.0
    assert out["assistant_trigger_f1_ci95"] == [0.0, 0.0]


def _window_scores(windows) -> ExtractionScores:
    s = ExtractionScores(threshold=0.5, similarity="token_f1")
    for pred, gold in windows:
        s.add(render_completion(pred), pred, gold, True)
    return s


def test_extraction_interval_resamples_windows_and_pools_counts():
    other = [rec(2, "Ann plays the cello"), rec(2, "Ann lives in Oslo"), rec(3, "Ann likes jazz")]
    windows = [
        ([GOLD[0]], [GOLD[0]]),  # matched 1 of predicted 1, gold 1: F1 1 on its own
        (other, []),  # 3 predicted, nothing to match
        ([], GOLD[1:] + other[:2]),  # 4 gold, nothing predicted
    ]
    out = _window_scores(windows).summary()
    counts = [(1, 1, 1), (0, 3, 0), (0, 0, 4)]  # (matched, predicted, gold) per window

    def pooled_f1(idx):
        m, p, g = (sum(counts[i][k] for i in idx) for k in range(3))
        return 2 * m / (p + g)  # F1 = 2PR / (P + R) = 2m / (p + g)

    assert out["memory_f1"] == round(2 / 9, 4)  # pooled: P = 1/4, R = 1/5; the per-window mean would be 1/3
    assert out["memory_f1_ci95"] == bootstrap_ci(pooled_f1, 3)
    assert out["memory_precision_ci95"] == bootstrap_ci(
        lambda idx: sum(counts[i][0] for i in idx) / max(1, sum(counts[i][1] for i in idx)), 3
    )


def test_extraction_baselines_on_matched_pairs():
    window1 = [
        rec(1, "Maya adopted a puppy named Biscuit", "episodic", "2023-05-06", kws=["puppy"]),
        rec(1, "Maya went hiking in the Alps", "episodic"),
        rec(2, "Tom works as a nurse in Leeds", "fact", location="Leeds", kws=["nurse"]),
    ]
    window2 = [rec(2, "Ann plays the cello", "profile"), rec(2, "Ann lives in Oslo", "profile")]
    window2.append(rec(2, "Ann likes jazz", "profile"))
    pred = [r.model_copy(update={"dimension": r.dimension.model_copy(update={"memory_type": "fact"})}) for r in window1]
    out = _window_scores([(pred, window1), ([], window2)]).summary()
    assert out["matched"] == 3 and out["type_accuracy"] == round(1 / 3, 4)
    # majority over all gold records is profile (3 of 6), which no matched pair has
    assert out["type_accuracy_baseline"] == 0.0 and out["baseline_of"]["type_accuracy"].startswith('always "profile"')
    assert out["source_accuracy_baseline"] == round(1 / 3, 4)  # majority source_id 2 (4 of 6); 1 matched pair
    assert out["time_exact_baseline"] == round(2 / 3, 4) and out["location_agreement_baseline"] == round(2 / 3, 4)
    assert out["keyword_f1_baseline"] == round(1 / 3, 4)  # only the hiking record has no keywords
    assert out["time_exact"] == out["keyword_f1"] == out["source_accuracy"] == 1.0


def test_bootstrap_ci_contains_estimate_shrinks_with_n_and_is_seeded():
    def interval(n, seed=0):
        data = [i % 10 < 3 for i in range(n)]  # a rate of 0.3
        return bootstrap_ci(lambda idx: sum(data[i] for i in idx) / len(idx), n, seed=seed)

    small, large = interval(50), interval(800)
    assert small[0] < 0.3 < small[1] and large[0] < 0.3 < large[1]
    assert large[1] - large[0] < (small[1] - small[0]) / 2.5  # width ~ 1 / sqrt(n): 16x the items, ~1/4 the width
    assert interval(50) == small
    spread = [(i * 37 % 101) / 101 for i in range(50)]  # many distinct values, so another seed moves the ends
    mean = lambda seed: bootstrap_ci(lambda idx: sum(spread[i] for i in idx) / len(idx), 50, seed=seed)  # noqa: E731
    assert mean(0) == mean(0) != mean(1)
    assert bootstrap_ci(lambda idx: 1.0, 0) == [0.0, 0.0]


def test_percentile_is_the_nearest_rank_without_interpolation():
    lat = [0.4, 0.1, 0.3, 0.2, 1.7]
    assert percentile(lat, 0.5) == 0.3  # the middle value, not a mean of two
    assert percentile(lat, 0.95) == 1.7
    assert percentile([0.1, 0.2, 0.3, 0.4], 0.5) == 0.3  # even count: a value that was measured, not 0.25
    assert percentile([1.23456], 0.95, 2) == 1.23
    assert percentile([], 0.5) is None
