"""Every spec parser against a corpus of ugly model outputs: it never raises, recovers what can be
recovered, and names what was wrong with a reason code."""

import json

import pytest

from memdistill.spec import extractor, gate, planner, query_parser, router
from memdistill.spec.dialogue import windows
from tests.conftest import make_conversation

REC = {
    "source_id": 4,
    "source_speaker": "Tom",
    "content": "Tom adopted a puppy named Biscuit on 2023-05-06.",
    "dimension": {
        "memory_type": "episodic",
        "time": "2023-05-06",
        "location": "",
        "reason": "",
        "purpose": "",
        "keywords": ["puppy", "Biscuit"],
    },
}
GOOD = json.dumps({"memories": [REC]})


def codes(res):
    return [p.code for p in res.problems]


@pytest.fixture
def window():
    # second window of a 12-turn conversation with W=6, O=2: messages 1-2 are context
    return windows(make_conversation(12), 6, 2)[1]


# --- extraction -------------------------------------------------------------------------------


def test_clean_output_has_no_problems(window):
    res = extractor.parse(GOOD, window)
    assert codes(res) == [] and res.ok
    assert res.records[0].content.startswith("Tom adopted") and res.records[0].source_speaker == "Tom"


@pytest.mark.parametrize(
    "wrap, code",
    [
        ("<think>Let me look at message 4 {not json}</think>\n" + GOOD, None),
        ("</think>\n\n" + GOOD, None),
        ("```json\n" + GOOD + "\n```", None),
        ("```\n" + GOOD + "\n```\nHope this helps!", None),
        ("Here are the memories I found:\n" + GOOD + "\nLet me know if you need more.", "prose_around_json"),
        ("Sure! {as requested} " + GOOD, "prose_around_json"),
    ],
)
def test_wrappers_are_stripped(window, wrap, code):
    res = extractor.parse(wrap, window)
    assert len(res.records) == 1 and res.ok
    assert (code in codes(res)) if code else codes(res) == []


def test_truncated_output_salvages_complete_records(window):
    second = dict(REC, source_id=5, source_speaker="Maya", content="Maya loves hiking.")
    second["dimension"] = dict(REC["dimension"], memory_type="profile", time="")
    full = json.dumps({"memories": [REC, second, REC]})
    cut = full[: full.rindex('"content"') + 15]  # mid third record
    res = extractor.parse(cut, window)
    assert [r.source_id for r in res.records] == [4, 5]
    assert "truncated_output" in codes(res) and res.ok


def test_truncated_inside_unclosed_think_and_fence(window):
    raw = "<think>hmm\n```json\n" + GOOD[:-2]  # list and object never closed
    res = extractor.parse(raw, window)
    assert "unterminated_think" in codes(res) and "truncated_output" in codes(res)
    assert len(res.records) == 1


@pytest.mark.parametrize(
    "given, want",
    [
        ("Episodic", "episodic"),
        ("FACT", "fact"),
        (" Profile ", "profile"),
        ("event", "episodic"),
        ("preference", "profile"),
    ],
)
def test_memory_type_case_and_aliases(window, given, want):
    rec = json.loads(GOOD)
    rec["memories"][0]["dimension"]["memory_type"] = given
    res = extractor.parse(json.dumps(rec), window)
    assert res.records[0].dimension.memory_type == want
    assert "memory_type_normalised" in codes(res)


def test_unknown_memory_type_rejects_the_record(window):
    rec = json.loads(GOOD)
    rec["memories"][0]["dimension"]["memory_type"] = "semantic-ish"
    res = extractor.parse(json.dumps(rec), window)
    assert res.records == [] and "bad_memory_type" in codes(res) and res.ok


def test_source_in_overlap_and_out_of_range_are_rejected(window):
    recs = [dict(REC, source_id=k, content=f"Fact {k}.") for k in (1, 2, 3, 7, "5")]
    res = extractor.parse(json.dumps({"memories": recs}), window)
    assert [r.source_id for r in res.records] == [3, 5]
    c = codes(res)
    assert c.count("source_in_overlap") == 2 and c.count("source_out_of_range") == 1


def test_one_extractable_message_determines_a_source_past_the_windows_end():
    from memdistill.spec.dialogue import Turn, Window

    turns = [Turn(f"D1:{k}", "Maya", "user", f"line {k}", None) for k in (1, 2)]
    short = Window("c", 0, turns, extract_from=2)  # one context message, one to extract from
    recs = [dict(REC, source_id=k, content=f"Fact {k}.") for k in (3, 2, 1)]
    res = extractor.parse(json.dumps({"memories": recs}), short)
    assert [r.source_id for r in res.records] == [2, 2]  # 3 -> 2 (fixed), 2 kept; 1 is context, rejected
    assert codes(res).count("source_fixed") == 1 and "source_in_overlap" in codes(res)
    wide = Window("c", 0, turns, extract_from=1)  # two messages to extract from: a number past the end stays wrong
    assert "source_out_of_range" in codes(extractor.parse(json.dumps({"memories": [recs[0]]}), wide))


def test_without_window_overlap_is_not_checked():
    res = extractor.parse(json.dumps({"memories": [dict(REC, source_id=1)]}))
    assert len(res.records) == 1


def test_keywords_string_is_split_trimmed_deduplicated(window):
    rec = json.loads(GOOD)
    rec["memories"][0]["dimension"]["keywords"] = " puppy, Biscuit ;puppy,, adoption "
    res = extractor.parse(json.dumps(rec), window)
    assert res.records[0].dimension.keywords == ["puppy", "Biscuit", "adoption"]
    assert "keywords_normalised" in codes(res)


@pytest.mark.parametrize("bad", ["last Saturday", "2023-02-30", "2023-13", "05/06/2023", "2023-05-09/2023-05-01"])
def test_invalid_time_is_emptied_and_reported(window, bad):
    rec = json.loads(GOOD)
    rec["memories"][0]["dimension"]["time"] = bad
    res = extractor.parse(json.dumps(rec), window)
    assert res.records[0].dimension.time == "" and "invalid_time" in codes(res)


@pytest.mark.parametrize("ok", ["2023", "2023-05", "2023-05-06", "2023-05-01/2023-05-07", "2023-04/2023-06"])
def test_valid_times_are_kept(window, ok):
    rec = json.loads(GOOD)
    rec["memories"][0]["dimension"]["time"] = ok
    res = extractor.parse(json.dumps(rec), window)
    assert res.records[0].dimension.time == ok and codes(res) == []


def test_speaker_is_filled_and_corrected_from_window(window):
    recs = [
        {k: v for k, v in REC.items() if k != "source_speaker"},
        dict(REC, source_speaker="Maya", content="Tom named his puppy Biscuit."),
    ]
    res = extractor.parse(json.dumps({"memories": recs}), window)
    assert [r.source_speaker for r in res.records] == ["Tom", "Tom"]
    assert codes(res) == ["speaker_mismatch"]


def test_flattened_record_and_nulls(window):
    flat = {
        "source_id": 4,
        "content": "Tom has a dog.",
        "memory_type": "fact",
        "time": None,
        "location": None,
        "keywords": None,
    }
    res = extractor.parse(json.dumps({"memories": [flat]}), window)
    assert res.records[0].dimension.memory_type == "fact" and res.records[0].dimension.keywords == []
    assert "flattened_dimension" in codes(res)


@pytest.mark.parametrize(
    "raw, code",
    [
        ("", "empty_output"),
        ("   \n", "empty_output"),
        (None, "empty_output"),
        ("I could not find any memories in this conversation.", "no_json"),
        ('{"memories": [{"source_id": 4, "content": "x", "dimension": {', "truncated_output"),
        ("{'memories': []}", "invalid_json"),
        ('{"records": []}', "wrong_shape"),
        ("<think>The user greets. Nothing to extract.", "no_json"),
    ],
)
def test_hopeless_outputs_yield_no_records(window, raw, code):
    res = extractor.parse(raw, window)
    assert res.records == [] and code in codes(res)


def test_bare_list_and_bad_items(window):
    res = extractor.parse(
        json.dumps(
            [
                REC,
                "oops",
                {"source_id": "x", "content": "a", "dimension": {"memory_type": "fact"}},
                dict(REC, content="  "),
            ]
        ),
        window,
    )
    assert len(res.records) == 1
    assert {"bare_list", "bad_record", "bad_source_id", "empty_content"} <= set(codes(res))


def test_repeated_records_are_kept_once(window):
    loop = dict(REC, content="  tom ADOPTED a puppy named Biscuit on 2023-05-06. ")
    next_message = dict(REC, source_id=5, source_speaker="Maya")  # the loop moved on to the next message
    other = dict(REC, source_id=5, source_speaker="Maya", content="Maya loves hiking.")
    res = extractor.parse(json.dumps({"memories": [REC, loop, next_message, other, REC]}), window)
    assert [(r.source_id, r.content) for r in res.records] == [(4, REC["content"]), (5, "Maya loves hiking.")]
    assert [p.index for p in res.problems if p.code == "duplicate_record"] == [1, 2, 4]


def test_empty_memories_is_ok(window):
    res = extractor.parse('{"memories": []}', window)
    assert res.ok and res.records == [] and res.problems == []


# --- query parsing ------------------------------------------------------------------------------

QP = {
    "query_anchor": "The number of days the user spent camping in 2023",
    "need_assistant_context": False,
    "dimension": {
        "target_memory_type": ["episodic"],
        "keywords": ["camping"],
        "time": "between 2023-01-01 and 2023-04-29",
        "location": "United States",
    },
    "answer_dim": "content",
}


def test_query_parse_clean_and_wrapped():
    for raw in (json.dumps(QP), "```json\n" + json.dumps(QP) + "\n```", "<think>x</think>" + json.dumps(QP)):
        res = query_parser.parse(raw)
        assert res.ok and res.query.dimension.time.startswith("between") and codes(res) == []


def test_query_parse_repairs_fields():
    bad = dict(QP, need_assistant_context="yes", answer_dim="Time")
    bad["dimension"] = dict(
        QP["dimension"],
        target_memory_type="Episodic, event",
        keywords="camping; trips",
        time="Between 2023-01-01 and 2023-04-29",
    )
    res = query_parser.parse(json.dumps(bad))
    q = res.query
    assert q.need_assistant_context is True and q.answer_dim == "time"
    assert q.dimension.target_memory_type == ["episodic"] and q.dimension.keywords == ["camping", "trips"]
    assert q.dimension.time.startswith("between ")


@pytest.mark.parametrize(
    "raw, code",
    [
        ("", "empty_output"),
        ("no idea", "no_json"),
        ('{"query_anchor": ""}', "empty_anchor"),
        ('{"query_anchor": "a", "dimension": {"time": "this year"}}', "invalid_time"),
        ('{"query_anchor": "a", "answer_dim": "who"}', "bad_answer_dim"),
    ],
)
def test_query_parse_problems(raw, code):
    assert code in codes(query_parser.parse(raw))


def test_query_time_range():
    from datetime import date

    assert query_parser.time_range("between 2023-01-01 and 2023-04-29") == (date(2023, 1, 1), date(2023, 4, 29))
    assert query_parser.time_range("before 2023-05") == (None, date(2023, 5, 31))
    assert query_parser.time_range("") is None and query_parser.time_range("on someday") is None


# --- memory types -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "raw, want, code",
    [
        ('{"labels": ["EM", "PM"]}', ["EM", "PM"], None),
        ('{"labels": ["pm", "Episodic Memory", "EM"]}', ["EM", "PM"], None),
        ('```json\n{"labels": []}\n```', [], None),
        ('["GM"]', ["GM"], None),
        ("Episodic Memory and General Semantic Memory", ["EM", "GM"], "labels_from_text"),
        ("None", [], "labels_from_text"),
        ('{"labels": ["EM", "XX"]}', ["EM"], "bad_label"),
    ],
)
def test_memory_type_parse(raw, want, code):
    res = router.parse(raw)
    assert res.labels == want
    if code:
        assert code in codes(res)


def test_memory_type_unreadable():
    assert router.parse("").labels is None and router.parse("hmm, hard to say").labels is None


@pytest.mark.parametrize(
    "raw, want",
    [
        ('{"present": true}', True),
        ('{"present": "no"}', False),
        ("Yes.", True),
        ("None", False),
        ("", None),
        ("maybe", None),
    ],
)
def test_binary_decision(raw, want):
    assert router.parse_binary(raw)[0] is want


# --- recall plan --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "raw, c, kws, code",
    [
        ('{"complexity": "hybrid", "keywords": ["cities", "visited"]}', "hybrid", ["cities", "visited"], None),
        ('{"complexity": 2, "keywords": ["beach", "vacation"]}', "complex", ["beach", "vacation"], None),
        ('{"complexity": "0", "keywords": "job, office"}', "simple", ["job", "office"], "keywords_normalised"),
        (
            '{"complexity": "Deep Retrieval", "keywords": ["a","b","c","d"]}',
            "complex",
            ["a", "b", "c"],
            "too_many_keywords",
        ),
        (
            '{"complexity": "Simple", "keywords": ["Caroline", "Caroline\'s job", "adoption"]}',
            "simple",
            ["adoption"],
            "name_keyword",
        ),
    ],
)
def test_recall_plan_parse(raw, c, kws, code):
    res = planner.parse(raw, names=["Caroline"])
    assert res.plan.complexity == c and res.plan.keywords == kws
    if code:
        assert code in codes(res)


@pytest.mark.parametrize(
    "raw, code",
    [
        ('{"complexity": "medium", "keywords": ["x"]}', "bad_complexity"),
        ('{"complexity": "simple", "keywords": []}', "no_keywords"),
        ("", "empty_output"),
        ("[1, 2]", "wrong_shape"),
    ],
)
def test_recall_plan_problems(raw, code):
    res = planner.parse(raw)
    assert res.plan is None and code in codes(res)


def test_heuristic_keywords_skip_names_and_stopwords():
    kws = planner.heuristic_keywords("When did Caroline go to the LGBTQ support group?", names=["Caroline"])
    assert "Caroline" not in kws and 1 <= len(kws) <= 3 and "support" in kws


# --- recall gate --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "raw, want, code",
    [
        ('{"kept_ids": [3, 1]}', [3, 1], None),
        ('{"relevant_ids": ["2", 2, 9, "x"]}', [2], "id_out_of_range"),
        ("```json\n[1, 4]\n```", [1, 4], None),
        ('{"kept_ids": [1, 2, 3', [1, 2], "truncated_output"),
    ],
)
def test_gate_parse(raw, want, code):
    res = gate.parse(raw, n_candidates=5)
    assert res.kept_ids == want
    if code:
        assert code in codes(res)


def test_gate_budget_and_select():
    res = gate.parse(json.dumps({"kept_ids": list(range(1, 15))}), n_candidates=20, complexity="simple")
    assert len(res.kept_ids) == gate.BUDGETS["simple"] and "over_budget" in codes(res)
    scores = [0.9, 0.55, 0.65, 0.2, 0.95]
    assert gate.select(scores, "simple") == [5, 1, 3]  # cut 0.6
    assert gate.select(scores, "complex") == [5, 1, 3, 2]  # cut 0.4
    assert len(gate.select([0.99] * 30, "hybrid")) == gate.BUDGETS["hybrid"]


def test_gate_unreadable():
    assert gate.parse("").kept_ids is None and gate.parse("keep the first").kept_ids is None
