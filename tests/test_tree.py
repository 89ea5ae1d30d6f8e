"""TiMem's memory tree (memdistill.runtime.tree) on hand-made timelines: its invariants, scheduling at window
close, resuming after a kill, consolidation marks kept, hierarchical recall's budgets and order, and the level
summarizer's parser on malformed output."""

import json
from datetime import datetime, timedelta

import pytest

from memdistill.runtime.bank import MemoryBank
from memdistill.runtime.tree import SCOPES, MemoryTree, TreeError, TreeRecall, lead_writer
from memdistill.spec import summarizer
from memdistill.spec.dialogue import Conversation, Session, Turn

# Sessions: Mon 2023-01-30 (January, ISO week 5), Wed 2023-02-01 twice (a day with two sessions), Mon 2023-02-06
# (week 6), Wed 2023-03-01 (March, week 9). Week 5 holds sessions of January and February: it closes in February.
STARTS = [
    datetime(2023, 1, 30, 9),
    datetime(2023, 2, 1, 9),
    datetime(2023, 2, 1, 20),
    datetime(2023, 2, 6, 9),
    datetime(2023, 3, 1, 9),
]
TOPICS = [
    "marathon training plan",
    "new job at the bakery",
    "sister's wedding in Porto",
    "adopted a cat named Miso",
    "moved to a flat in Lyon",
]


def timeline(cid: str = "t1") -> Conversation:
    sessions = []
    for s, (start, topic) in enumerate(zip(STARTS, TOPICS), 1):
        turns = [
            Turn(
                f"D{s}:{k}",
                ("Ana", "Ben")[k % 2],
                "user",
                f"Ana talks about the {topic}, part {k}.",
                start + timedelta(minutes=k),
            )
            for k in range(1, 4)
        ]
        sessions.append(Session(f"S{s}", start, turns))
    return Conversation(cid, sessions, "multi-party", ["Ana", "Ben"])


def build(path=None, writer=None, until=None):
    conv = timeline()
    tree = MemoryTree(MemoryBank.from_turns([conv]), {conv.conversation_id: conv}, path)
    tree.close(conv.conversation_id, writer or lead_writer(), until)
    return tree


def test_windows_group_sessions_by_session_day_iso_week_and_month_the_week_closes_in():
    wins = summarizer.conversation_windows(timeline())
    names = {lvl: [w.name for w in wins if w.level == lvl] for lvl in summarizer.SUMMARY_LEVELS}
    assert names == {
        2: ["S1", "S2", "S3", "S4", "S5"],
        3: ["2023-01-30", "2023-02-01", "2023-02-06", "2023-03-01"],
        4: ["2023-W05", "2023-W06", "2023-W09"],
        5: ["2023-02", "2023-03"],
    }
    month = {w.name: w.sessions for w in wins if w.level == 5}
    assert month["2023-02"] == ("S1", "S2", "S3", "S4")  # January's session rides with its week


def test_tree_holds_temporal_containment_order_and_fewer_nodes_per_level_up():
    tree = build()
    nodes = tree.nodes("t1")
    by_id = {n.node_id: n for n in nodes}
    counts = [len([n for n in nodes if n.level == lvl]) for lvl in range(1, 6)]
    assert counts == [15, 5, 4, 3, 2] and counts == sorted(counts, reverse=True)
    for n in nodes:
        for c in map(by_id.get, n.children):
            assert c.level == n.level - 1 and n.start <= c.start and c.end <= n.end
    for lvl in range(2, 6):  # same-level nodes do not overlap and come in time order
        same = [n for n in nodes if n.level == lvl]
        assert all(a.end < b.start for a, b in zip(same, same[1:]))
    leaves = {n.node_id for n in nodes if n.level == 1}
    assert set(tree.parents("t1")) == {n.node_id for n in nodes if n.level < 5}
    assert all(set(n.sources) <= {t.turn_id for t in timeline().turns} for n in nodes)
    assert len({c for n in nodes for c in n.children} & leaves) == 15


def test_a_node_is_written_only_when_its_window_closes_and_sees_only_its_past():
    asked = []

    def writer(req):
        asked.append(req)
        return f"{req.window.node_id}: {len(req.children)} below", None

    tree = build(writer=writer, until=datetime(2023, 2, 3))  # Friday of week 5: the week is still open
    levels = {r.window.node_id for r in asked}
    assert levels == {"L2-S1", "L3-2023-01-30", "L2-S2", "L2-S3", "L3-2023-02-01"}
    assert all(c.end <= r.window.end for r in asked for c in r.children)
    day = next(r for r in asked if r.window.node_id == "L3-2023-02-01")
    assert [c.node_id for c in day.children] == ["t1-L2-S2", "t1-L2-S3"]
    assert [h.node_id for h in day.history] == ["t1-L3-2023-01-30"]
    tree.close("t1", writer)  # the rest closes; nothing is written twice
    assert len(asked) == 14 and len({r.window.node_id for r in asked}) == 14


def test_history_is_the_three_latest_nodes_of_the_same_level():
    seen = {}

    def writer(req):
        seen[req.window.node_id] = [h.period for h in req.history]
        return "x " * 25, None

    build(writer=writer)
    assert seen["L2-S5"] == ["S2", "S3", "S4"] and seen["L2-S1"] == [] and seen["L5-2023-03"] == ["2023-02"]


def test_a_killed_build_resumes_at_the_next_node_even_with_a_torn_last_line(tmp_path):
    log = tmp_path / "tree.jsonl"
    calls = []

    def dies_after_six(req):
        if len(calls) == 6:
            raise KeyboardInterrupt
        calls.append(req.window.node_id)
        return lead_writer()(req)

    with pytest.raises(KeyboardInterrupt):
        build(log, dies_after_six)
    with log.open("a") as f:
        f.write('{"node_id": "t1-L2-S9", "conv')  # a kill mid-write leaves half a line
    resumed = []
    tree = build(log, lambda req: (resumed.append(req.window.node_id), lead_writer()(req))[1])
    assert not set(resumed) & set(calls) and len(calls) + len(resumed) == 14
    rows = [json.loads(x) for x in log.read_text().splitlines() if x.strip()]
    assert len(rows) == 14 and len({r["node_id"] for r in rows}) == 14
    assert [n.node_id for n in tree.nodes("t1", (2, 3, 4, 5))] == [n.node_id for n in build().nodes("t1", (2, 3, 4, 5))]


def test_a_superseded_record_stays_a_child_marked():
    conv = timeline()
    bank = MemoryBank.from_turns([conv])
    old, new = bank.of("t1")[0], bank.of("t1")[1]
    old.status, old.superseded_by = "superseded", new.memory_id
    tree = MemoryTree(bank, {"t1": conv})
    tree.close("t1", lead_writer())
    session = next(n for n in tree.nodes("t1", (2,)) if n.period == "S1")
    leaf = next(n for n in tree.nodes("t1", (1,)) if n.node_id == old.memory_id)
    assert old.memory_id in session.children and leaf.status == "superseded" and not leaf.current


def test_a_record_whose_turn_is_not_in_the_conversation_is_a_clear_error():
    conv = timeline()
    bank = MemoryBank.from_turns([conv])
    bank.of("t1")[0].turn_id = "D9:9"
    with pytest.raises(TreeError, match="D9:9"):
        MemoryTree(bank, {"t1": conv}).leaves("t1")


@pytest.fixture(scope="module")
def embed():
    from memdistill.core.embedder import Embedder

    return Embedder()


@pytest.mark.parametrize("complexity", sorted(SCOPES))
def test_hierarchical_recall_keeps_the_levels_and_budgets_of_its_complexity(embed, complexity):
    rec = TreeRecall(build(), embed, complexity=complexity, leaves=4).recall("When did Ana adopt the cat?", "t1")
    levels = [h.item.level for h in rec.hits]
    assert set(levels) <= set(SCOPES[complexity]) and levels.count(1) == 4
    for lvl, cap in SCOPES[complexity].items():
        assert levels.count(lvl) <= cap
    assert rec.hits[0].item.level == 1 and "cat" in rec.hits[0].item.text
    leaf_ids = {h.item.node_id for h in rec.hits if h.item.level == 1}
    tree = build()
    for h in rec.hits:  # every summary recalled is an ancestor of an activated leaf
        if h.item.level > 1:
            assert any(h.item.node_id in {a.node_id for a in tree.ancestors("t1", x)} for x in leaf_ids)


def test_kept_memories_come_by_level_then_by_distance_to_the_query_time(embed):
    rec = TreeRecall(build(), embed, complexity="complex", leaves=6).recall("What happened with Ana?", "t1")
    now = timeline().turns[-1].timestamp
    keys = [(h.item.level, abs((now - h.item.end).total_seconds())) for h in rec.kept]
    assert len({k[0] for k in keys}) >= 3 and keys == sorted(keys)


def test_the_gate_filters_candidates_of_every_level(embed):
    seen = {}

    def gate(question, complexity, texts):
        seen["texts"] = texts
        return [i for i, t in enumerate(texts, 1) if "adopted a cat" in t and not t.startswith("summary")]

    tree = build(writer=lambda req: ("summary of " + req.window.name, None))
    rec = TreeRecall(tree, embed, gate=gate, complexity="complex").recall("the cat Miso", "t1")
    assert any(t.startswith("summary of") for t in seen["texts"])
    assert rec.kept and all(h.item.level == 1 and "cat" in h.item.text for h in rec.kept)


def test_flat_recall_ranks_every_level_together(embed):
    tree = build(writer=lambda req: ("Ana adopted a cat named Miso. " * 3, None))
    rec = TreeRecall(tree, embed, recall="flat", flat_k=10).recall("Ana adopted a cat named Miso", "t1")
    assert len(rec.hits) == 10 and {h.item.level for h in rec.hits} > {1}
    assert [h.score for h in rec.hits] == sorted([h.score for h in rec.hits], reverse=True)


@pytest.mark.parametrize(
    "raw, level, problem",
    [
        ("", 2, "empty_output"),
        ('{"summary": "Ana moved to Lyon on 2023-03-01."', 2, None),  # cut before its brace: salvaged
        ("Ana moved to Lyon.", 3, "no_summary"),  # prose: kept as the text
        ('{"summary": 3}', 4, "no_summary"),
        ('{"profiles": [{"person": "Zed", "identity": ["x"]}]}', 5, "unknown_person"),
        ('{"profiles": "Ana"}', 5, "no_profile"),
        ("<think>hmm", 5, "no_profile"),
    ],
)
def test_the_summarizer_parser_never_raises_on_malformed_output(raw, level, problem):
    res = summarizer.parse(raw, level, ["Ana", "Ben"])
    text, profile, codes = res.text, res.profile, {p.code for p in res.problems}
    assert (problem in codes) if problem else ("no_summary" not in codes and text.startswith("Ana moved"))
    assert isinstance(text, str) and (profile is None) == (level != 5)


def test_a_profile_keeps_known_people_and_renders_every_field():
    raw = json.dumps(
        {
            "profiles": [
                {
                    "person": "Ana",
                    "identity": ["baker in Lyon"],
                    "events": [],
                    "traits": "runs",
                    "preferences": ["cats"],
                    "changes": [],
                },
                {"person": "Zed"},
            ]
        }
    )
    res = summarizer.parse(raw, 5, ["Ana", "Ben"])
    assert [p["person"] for p in res.profile] == ["Ana"] and res.profile[0]["traits"] == ["runs"]
    assert res.text == "Ana. Identity: baker in Lyon. Traits: runs. Preferences: cats."
    assert [p.code for p in res.problems] == ["unknown_person"] and not res.ok


def test_the_gold_rows_and_the_runtime_build_the_same_node_requests():
    """The summarizer's training inputs (data.build, from the gold corpus) are what the runtime asks a writer for
    when its bank holds the gold records: one request builder, one rendering."""
    from memdistill.data import build
    from memdistill.data import seed as seedlib
    from memdistill.runtime.tree import gold_writer

    seed = seedlib.load()
    cid = seed.tree[0]["conversation_id"]
    split = seed.split[cid]
    gold = [inp for inp, _, meta in build.gold_units("node", seed, split, None) if meta["conversation_id"] == cid]
    asked, write = [], gold_writer(seed)

    def recording(req):
        asked.append(req.to_json())
        return write(req)

    tree = MemoryTree(MemoryBank.from_seed(seed, [cid]), seed.conversations)
    tree.close(cid, recording)
    assert len(asked) == len(gold) >= 40 and asked == gold
    assert {r["level"] for r in asked} == {2, 3, 4, 5}


def test_conversations_closed_in_threads_write_what_they_write_one_by_one(tmp_path):
    from concurrent.futures import ThreadPoolExecutor

    convs = {c: timeline(c) for c in ("t1", "t2", "t3", "t4")}
    bank = MemoryBank.from_turns(list(convs.values()))
    together = MemoryTree(bank, convs, tmp_path / "tree.jsonl")
    with ThreadPoolExecutor(4) as pool:
        list(pool.map(lambda c: together.close(c, lead_writer()), convs))
    alone = MemoryTree(bank, convs)
    for c in convs:
        alone.close(c, lead_writer())
    key = lambda n: (n.node_id, n.text, n.children)  # noqa: E731
    for c in convs:
        assert [key(n) for n in together.nodes(c)] == [key(n) for n in alone.nodes(c)]
    assert len((tmp_path / "tree.jsonl").read_text().splitlines()) == 4 * 14
