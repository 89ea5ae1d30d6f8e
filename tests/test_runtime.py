"""The reference memory runtime: retrieval on a fixture whose answers are known, the dimension route,
hooks, evidence recall and the LoCoMo / LongMemEval evidence mapping."""

import json
from datetime import datetime

import pytest

from memdistill.data.questions import Question, locomo_questions, longmemeval_question
from memdistill.data.sources import load
from memdistill.metrics.recall import RecallScores, evidence_coverage
from memdistill.runtime import (
    BankError,
    Hit,
    MemoryBank,
    MemoryItem,
    MemoryRuntime,
    Recall,
    dimension_score,
    score_gate,
)
from memdistill.spec.dialogue import Conversation, Session, Turn
from memdistill.spec.extractor import Dimension, MemoryRecord
from memdistill.spec.query_parser import QueryAnalysis, QueryDimension
from tests.conftest import FIXTURES


def item(mid, turn, content, mt, time="", location="", kws=(), ts=datetime(2023, 3, 5, 10), cid="c1", speaker="Maya"):
    return MemoryItem(
        mid,
        cid,
        turn,
        content,
        Dimension(memory_type=mt, time=time, location=location, keywords=list(kws)),
        speaker,
        ts,
    )


MARCH, JULY = datetime(2023, 3, 5, 10), datetime(2023, 7, 9, 18)
ITEMS = [
    item(
        "m1",
        "D1:1",
        "Maya went hiking on Mount Rainier with her brother Sam.",
        "episodic",
        "2023-03-04",
        "Mount Rainier",
        ["hiking", "Mount Rainier", "Sam"],
        MARCH,
    ),
    item(
        "m2",
        "D2:1",
        "Maya hiked a trail near Lake Tahoe with her friend Lena.",
        "episodic",
        "2023-07-08",
        "Lake Tahoe",
        ["hiking", "Lake Tahoe", "Lena"],
        JULY,
    ),
    item(
        "m3",
        "D1:2",
        "Tom works as a nurse at a hospital in Leeds.",
        "fact",
        "",
        "Leeds",
        ["nurse", "hospital", "Leeds"],
        MARCH,
        speaker="Tom",
    ),
    item(
        "m4",
        "D2:2",
        "Maya loves hiking and goes on a hike most weekends.",
        "profile",
        "",
        "",
        ["hiking", "weekends"],
        JULY,
    ),
    item(
        "m5",
        "D1:3",
        "Tom adopted a golden retriever puppy named Biscuit.",
        "episodic",
        "2023-03-01",
        "",
        ["puppy", "Biscuit", "golden retriever"],
        MARCH,
        speaker="Tom",
    ),
]


@pytest.fixture(scope="module")
def embed():
    from memdistill.core.embedder import Embedder

    return Embedder()


@pytest.fixture(scope="module")
def rt(embed):
    return MemoryRuntime(MemoryBank(ITEMS), embed, top_k=20)


def top(hits, n=1):
    return [h.item.memory_id for h in hits[:n]]


def query(anchor, keywords=(), time="", location="", types=()):
    return QueryAnalysis(
        query_anchor=anchor,
        dimension=QueryDimension(target_memory_type=list(types), keywords=list(keywords), time=time, location=location),
    )


@pytest.mark.parametrize(
    "question, expected",
    [
        ("What does Tom do for a living?", "m3"),
        ("What is the name of Tom's dog?", "m5"),
        ("Which lake did Maya visit with Lena?", "m2"),
    ],
)
def test_bm25_and_dense_find_the_record_at_k1(rt, question, expected):
    assert top(rt.rank(question, "c1", route=False)) == [expected]


def test_time_constraint_changes_the_ranking(rt):
    q = query(
        "The person Maya went hiking with in July 2023",
        ["Maya", "hiking"],
        "between 2023-07-01 and 2023-07-31",
        types=["episodic"],
    )
    without = rt.rank("Who did Maya go hiking with in July 2023?", "c1", q, route=False)
    with_route = rt.rank("Who did Maya go hiking with in July 2023?", "c1", q, route=True)
    assert top(without) == ["m4"]  # the profile "loves hiking" matches the words best ...
    assert top(with_route) == ["m2"]  # ... but only the July trip is an episode within the time constraint
    assert with_route[0].ranks.get("dim") == 1 and with_route[0].dim_score == 1.0


def test_type_constraint_and_type_router_change_the_ranking(embed):
    q = query("The place where Maya went hiking", ["Maya", "hiking"], types=["episodic"])
    rt = MemoryRuntime(MemoryBank(ITEMS), embed)
    assert top(rt.rank("Where did Maya go hiking?", "c1", q, route=False)) == ["m4"]  # a profile, no place
    assert top(rt.rank("Where did Maya go hiking?", "c1", q, route=True), 2) in (["m1", "m2"], ["m2", "m1"])
    # the same through the type-router hook, with no parsed query at all
    routed = MemoryRuntime(MemoryBank(ITEMS), embed, router=lambda question: ["episodic"])
    assert top(routed.recall("Where did Maya go hiking?", "c1", route=False).hits) == ["m4"]
    rec = routed.recall("Where did Maya go hiking?", "c1", route=True)
    assert rec.target_types == ["episodic"] and top(rec.hits, 2) in (["m1", "m2"], ["m2", "m1"])


def test_dimension_score_by_hand():
    m3 = ITEMS[2]
    dim = QueryDimension(
        target_memory_type=["fact"], keywords=["nurse", "Manchester"], time="before 2023-01-01", location="Manchester"
    )
    # type 1 x 1.5, time 0 x 3 (said 2023-03-05), location 0 x 2, phrases 1/2 x 1.5, tokens 1/2 x 1.5
    assert dimension_score(m3, dim) == pytest.approx((1.5 + 0 + 0 + 0.75 + 0.75) / 9.5)
    assert dimension_score(m3, QueryDimension(location="leeds")) == 1.0  # case-folded, only one active part
    assert dimension_score(m3, QueryDimension()) is None  # nothing active: no dimension route
    # open-ended ranges: "after" admits everything from its start
    assert dimension_score(ITEMS[1], QueryDimension(time="after 2023-07")) == 1.0
    assert dimension_score(ITEMS[0], QueryDimension(time="after 2023-07")) == 0.0


def test_dedup_keeps_one_copy_of_a_repeated_sentence(embed):
    twice = ITEMS + [item("m6", "D2:5", "Tom works as a nurse at a hospital in Leeds.", "fact", ts=JULY)]
    hits = MemoryRuntime(MemoryBank(twice), embed).rank("What does Tom do for a living?", "c1", route=False)
    assert [h.item.content for h in hits].count(ITEMS[2].content) == 1 and len(hits) == 5


def test_dimmem_union_is_each_routes_top_k_deduplicated_by_content_in_route_order():
    """Hand-set routes: the dimension route finds only the profile record (e), a stub embedder ranks d, c,
    a for dense, BM25 matches only a and d ("kayaking"). Top 2 per route, concatenated dimension -> dense
    -> BM25: e; d, c; d, a. d repeats (one hit, with both ranks) and a is d's sentence up to case and spaces
    (dropped), so the union is e, d, c, and it is read whole (budget None)."""
    import numpy as np

    bank = MemoryBank(
        [
            item("a", "D1:1", "Alpha likes kayaking.", "fact"),
            item("b", "D1:2", "Bravo plays chess.", "fact"),
            item("c", "D1:3", "Charlie bakes bread.", "fact"),
            item("d", "D1:4", "ALPHA likes   kayaking.", "fact"),
            item("e", "D1:5", "Delta sings opera.", "profile"),
        ]
    )
    vec = {
        "Who likes kayaking?": [1.0, 0.0],
        "Alpha likes kayaking.": [0.7, 0.71],
        "Bravo plays chess.": [0.0, 1.0],
        "Charlie bakes bread.": [0.8, 0.6],
        "ALPHA likes   kayaking.": [0.9, 0.44],
        "Delta sings opera.": [0.1, 0.99],
    }
    stub = lambda texts: np.array([vec[t] for t in texts])  # noqa: E731
    q = query("Who likes kayaking?", types=["profile"])
    rt = MemoryRuntime(bank, stub, top_k=2, fusion="dimmem_union", budget=None)
    hits = rt.rank(q.query_anchor, "c1", q)
    assert [h.item.memory_id for h in hits] == ["e", "d", "c"]
    assert [h.ranks for h in hits] == [{"dim": 1}, {"dense": 1, "bm25": 1}, {"dense": 2}]
    rec = rt.recall(q.query_anchor, "c1", q)
    assert rec.kept == rec.hits and rec.budget == 3
    # the same routes under RRF: e's full dimension agreement (3 / 61) beats d's two first places (2 / 61),
    # c's one second place (1 / 62) comes last, and the ranking is cut to the budget
    rrf = rt.but(fusion="rrf", budget=2, dim_weight=3.0).recall(q.query_anchor, "c1", q)
    assert [h.item.memory_id for h in rrf.hits] == ["e", "d", "c"] and rrf.kept == rrf.hits[:2]
    with pytest.raises(ValueError, match="fusion"):
        MemoryRuntime(bank, stub, fusion="sum")
    with pytest.raises(TypeError, match="no setting"):
        rt.but(topk=3)


def test_planner_budget_and_gate(embed):
    seen = {}

    def gate(q, complexity, cands):
        seen["args"] = (complexity, len(cands))
        return [2, 9]  # 9 is out of range: ignored

    rt = MemoryRuntime(MemoryBank(ITEMS), embed, planner=lambda q: "simple", plan_budgets={"simple": 3}, gate=gate)
    rec = rt.recall("What does Tom do for a living?", "c1", route=False)
    assert rec.budget == 3 and rec.complexity == "simple" and seen["args"] == ("simple", 3)
    assert rec.kept == [rec.hits[1]]
    lost = MemoryRuntime(MemoryBank(ITEMS), embed, budget=2, planner=lambda q: "weird", gate=lambda *a: None)
    rec = lost.recall("What does Tom do for a living?", "c1", route=False, gate_complexity="complex")
    assert rec.budget == 2 and rec.kept == rec.hits[:2] and len(rec.notes) == 2
    g = score_gate(lambda q, c, cands: [0.9, 0.2, 0.7][: len(cands)])
    assert g("q", "hybrid", ["a", "b", "c"]) == [1, 3] and g("q", "simple", ["a", "b", "c"]) == [1, 3]


def test_evidence_coverage_and_scores_by_hand():
    m1, m2 = (Hit(ITEMS[0], 0.0), Hit(ITEMS[1], 0.0))
    assert evidence_coverage([m2, m1][:1], ["D2:1", "D9:9"]) == (0.5, True)
    assert evidence_coverage([m2, m1], ["D1:1", "D2:1"]) == (1.0, True)
    assert evidence_coverage([m1], ["D2:1"]) == (0.0, False)
    with pytest.raises(ValueError):
        evidence_coverage([m1], [])
    s = RecallScores(ks=(1, 2))
    qa = Question("q1", "c1", "?", None, "", "temporal", ["D1:1", "D2:1"])
    qb = Question("q2", "c1", "?", None, "", "single-hop", ["D2:1"])
    qc = Question("q3", "c1", "?", None, "", "single-hop", [])  # no evidence: tokens only
    s.add(qa, Recall([m2, m1], [m2], 1), {1: 10, 2: 30}, 10)
    s.add(qb, Recall([m1, m2], [m1, m2], 2), {1: 20, 2: 30}, 30)
    s.add(qc, Recall([m1], [m1], 1), {1: 30, 2: 30}, 20)
    out = s.summary()
    o = out["overall"]
    assert o["questions"] == 3 and o["with_evidence"] == 2
    assert o["recall@1"] == 0.25 and o["hit@1"] == 0.5  # q1: 1/2, q2: 0
    assert o["recall@2"] == 1.0 and o["hit@2"] == 1.0
    assert o["tokens@1"] == 20.0 and o["tokens_per_query"] == 20.0 and o["kept_per_query"] == pytest.approx(1.33)
    assert o["kept_recall"] == 0.75  # q1 reads m2 only: 1/2; q2 reads both: 1
    assert out["by_category"]["single-hop"]["recall@1"] == 0.0 and out["by_category"]["single-hop"]["questions"] == 2
    assert out["by_category"]["temporal"]["recall@2"] == 1.0


def test_assistant_reply_is_attached_on_demand(embed):
    t = [
        Turn("D1:1", "User", "user", "Can you suggest a podcast about history?", MARCH),
        Turn("D1:2", "Assistant", "assistant", "Try Hardcore History.", MARCH),
    ]
    conv = Conversation("ua", [Session("S1", MARCH, t)], "user-assistant", ["User", "Assistant"])
    rec = item("u1", "D1:1", "The user asked for history podcast suggestions.", "episodic", cid="ua", ts=MARCH)
    rt = MemoryRuntime(MemoryBank([rec]), embed, conversations={"ua": conv})
    hits = rt.rank("Which podcast did you suggest?", "ua")
    assert "Try Hardcore History." in rt.context(hits, assistant_replies=True)
    assert "Hardcore" not in rt.context(hits) and "[2023-03-05] The user asked" in rt.context(hits)


def test_bank_from_jsonl_and_errors(tmp_path):
    good = {
        "conversation_id": "c1",
        "source_turn_id": "D1:1",
        "content": "Maya hikes.",
        "dimension": {
            "memory_type": "profile",
            "time": "",
            "location": "",
            "reason": "",
            "purpose": "",
            "keywords": [],
        },
        "timestamp": "2023-03-05T10:00:00",
    }
    p = tmp_path / "bank.jsonl"
    p.write_text(json.dumps(good) + "\n\n" + json.dumps({**good, "turn_id": "D1:2", "memory_id": "x"}) + "\n")
    bank = MemoryBank.from_jsonl(p)
    assert [(i.memory_id, i.turn_id) for i in bank.items] == [("bank-1", "D1:1"), ("x", "D1:2")]
    bank.save(tmp_path / "again.jsonl")
    assert [i.to_json() for i in MemoryBank.from_jsonl(tmp_path / "again.jsonl").items] == [
        i.to_json() for i in bank.items
    ]
    for bad, msg in [
        ("{not json", r"bank.jsonl:1: not valid JSON"),
        (json.dumps({k: v for k, v in good.items() if k != "source_turn_id"}), r":1: missing field 'turn_id'"),
        (json.dumps({**good, "dimension": {"memory_type": "event"}}), r":1: field 'dimension'"),
        (json.dumps({**good, "timestamp": "yesterday"}), r":1: field 'timestamp'"),
    ]:
        p.write_text(bad + "\n")
        with pytest.raises(ValueError, match=msg):  # BankError, or the shared JSONL reader's SourceError
            MemoryBank.from_jsonl(p)
    with pytest.raises(BankError, match="nope.jsonl: no such file"):
        MemoryBank.from_jsonl(tmp_path / "nope.jsonl")


def test_bank_from_extracted_keeps_pointers():
    from memdistill.serve.client import ExtractedMemory

    rec = MemoryRecord(source_id=2, content="Tom is a nurse.", dimension=Dimension(memory_type="fact"))
    bank = MemoryBank.from_extracted([ExtractedMemory(rec, "c1", 3, "D1:2", "Tom", "2023-03-05T10:00:00")])
    (it,) = bank.items
    assert (it.conversation_id, it.turn_id, it.speaker, it.timestamp) == ("c1", "D1:2", "Tom", MARCH)
    assert bank.of("c1") == [it] and bank.of("other") == []


def test_locomo_evidence_mapping(tmp_path):
    (conv,) = load("locomo", FIXTURES / "locomo_sample.json")
    qs, notes = locomo_questions(conv)
    assert [(q.category, q.evidence) for q in qs] == [
        ("temporal", ["D1:3"]),
        ("multi-hop", ["D1:6"]),
        ("temporal", ["D1:9", "D2:10"]),
    ]
    assert qs[0].question_date == conv.sessions[-1].date_time and qs[0].answer == "7 May 2023" and not notes
    data = json.loads((FIXTURES / "locomo_sample.json").read_text())
    data[0]["qa"] = [
        {"question": "q?", "answer": 2022, "evidence": ["D1:9; D2:10", "D7:1"], "category": 4},
        {"question": "adv?", "adversarial_answer": "x", "evidence": [], "category": 5},
    ]
    (tmp_path / "l.json").write_text(json.dumps(data))
    (conv,) = load("locomo", tmp_path / "l.json")
    qs, notes = locomo_questions(conv)
    assert [(q.category, q.answer, q.evidence) for q in qs] == [("single-hop", "2022", ["D1:9", "D2:10"])]
    assert notes == ["conv-26-q001: evidence ['D7:1'] not in the conversation, dropped"]
    assert [q.category for q in locomo_questions(conv, include_adversarial=True)[0]] == ["single-hop", "adversarial"]


def test_longmemeval_evidence_mapping(tmp_path):
    (conv,) = load("longmemeval", FIXTURES / "longmemeval_sample.json")
    q = longmemeval_question(conv)
    assert (q.question_id, q.category, q.answer, q.evidence) == (
        "e47becba",
        "single-session-user",
        "Business Administration",
        ["answer_280352e9:1"],
    )
    assert q.question_date == datetime(2023, 5, 30, 23, 40)
    data = json.loads((FIXTURES / "longmemeval_sample.json").read_text())
    for sess in data[0]["haystack_sessions"]:
        for m in sess:
            m.pop("has_answer", None)
    (tmp_path / "l.json").write_text(json.dumps(data))
    (conv,) = load("longmemeval", tmp_path / "l.json")
    assert longmemeval_question(conv).evidence == ["answer_280352e9:1", "answer_280352e9:2"]  # the answer session


def test_raw_turn_bank_holds_every_message_once_with_its_pointer():
    ts = datetime(2024, 3, 1, 10, 0)
    turns = [
        Turn("t1", "Ann", "user", "I adopted  a cat.", ts),
        Turn("t2", "Bob", "user", "Look!", ts, image_caption="a dog on a beach"),
    ]
    conv = Conversation("c1", [Session("s1", ts, turns)], "multi-party")
    bank = MemoryBank.from_turns([conv])
    assert [(it.conversation_id, it.turn_id, it.content) for it in bank.items] == [
        ("c1", "t1", "Ann: I adopted a cat."),
        ("c1", "t2", "Bob: Look! [shares a photo: a dog on a beach]"),
    ]
    assert all(it.timestamp == ts and it.dimension.time == "" for it in bank.items)
