"""Adapters: mem0 (the real mem0ai package, local embedder and vector store) and the plain OpenAI client."""

import openai
import pytest

from memdistill.data import seed as seedlib
from memdistill.serve.adapters import local_mem0, openai_extraction_request, search_mem0, store_in_mem0
from memdistill.serve.client import ExtractedMemory
from memdistill.spec import extractor
from memdistill.spec.dialogue import windows
from tests.conftest import REPO


def _gold_memories(n_windows=3):
    seed = seedlib.load(REPO / "data" / "seed")
    conv = seed.conversations["mp01"]
    out = []
    for w in windows(conv, 6, 1)[:n_windows]:
        for r in seed.gold_records(w):
            t = w.turn_for(r.source_id)
            out.append(
                ExtractedMemory(r, w.conversation_id, w.window_index, t.turn_id, t.speaker, t.timestamp.isoformat())
            )
    return out


def em(content, mtype, keywords, turn, ts):
    """A hand-made record as the SDK returns it (conversation c1, said by Tom)."""
    from memdistill.spec.extractor import Dimension, MemoryRecord

    rec = MemoryRecord(source_id=1, content=content, dimension=Dimension(memory_type=mtype, keywords=keywords))
    return ExtractedMemory(rec, "c1", 0, turn, "Tom", ts)


def test_mem0_stores_records_with_dimensions_and_finds_them(tmp_path):
    mems = _gold_memories()
    assert len(mems) >= 5
    mem = local_mem0(tmp_path / "store")
    ids = store_in_mem0(mem, mems, user_id="u1")
    assert len(ids) == len(mems)
    for m in mems[:5]:
        hits = search_mem0(mem, m.record.content, user_id="u1", top_k=3)
        assert hits[0]["memory"] == m.record.content
        md = hits[0]["metadata"]
        assert md["memory_type"] == m.record.dimension.memory_type and md["source_turn_id"] == m.turn_id
    wanted = next(m for m in mems if m.record.dimension.memory_type == "profile")
    typed = search_mem0(mem, wanted.record.content, user_id="u1", memory_type="profile")
    assert typed and all(h["metadata"]["memory_type"] == "profile" for h in typed)
    assert search_mem0(mem, wanted.record.content, user_id="someone-else") == []


@pytest.mark.vllm
def test_mem0_with_records_from_the_served_extractor(mm, tmp_path):
    seed = seedlib.load(REPO / "data" / "seed")
    wins = [w for w in windows(seed.conversations["mp02"], 6, 1) if seed.gold_records(w)][:3]
    res = mm.extract(wins)
    assert res.memories, f"the served extractor wrote no valid record to store; problems: {res.problems}"
    mem = local_mem0(tmp_path / "store")
    ids = store_in_mem0(mem, res.memories, user_id="u2")
    assert len(ids) == len(res.memories)
    for m in res.memories[:3]:
        hits = search_mem0(mem, m.record.content, user_id="u2", top_k=1)
        assert hits and hits[0]["memory"] == m.record.content


@pytest.mark.vllm
def test_plain_openai_client_recipe(server, mm):
    """A stack with its own OpenAI client, given openai_extraction_request and extractor.parse, gets the
    records the SDK gets for the same window (greedy decoding, same body)."""
    seed = seedlib.load(REPO / "data" / "seed")
    w = windows(seed.conversations["ua01"], 4, 1)[1]
    assert seed.gold_records(w)
    client = openai.OpenAI(base_url=f"{server.urls[0]}/v1", api_key="EMPTY")
    resp = client.chat.completions.create(**openai_extraction_request(w, max_tokens=mm.max_tokens))
    parsed = extractor.parse(resp.choices[0].message.content, w)
    assert parsed.records, f"no valid record for a window whose gold holds records; problems: {parsed.problems}"
    assert parsed.records == [m.record for m in mm.extract(w).memories]


def test_mem0_consolidates_before_storing_and_never_deletes(tmp_path):
    from memdistill.core.embedder import Embedder
    from memdistill.spec import consolidator

    old_job = em(
        "Tom works as a baker at Acme Bakery.", "fact", ["job", "bakery", "Acme"], "D1:2", "2023-05-01T10:00:00"
    )
    trip = em("Tom hiked Mount Tam with Maya.", "episodic", ["hike", "Mount Tam"], "D1:5", "2023-05-01T10:05:00")
    new_job = em(
        "Tom now works as a baker at Zed Bakery.", "fact", ["job", "bakery", "Zed"], "D2:4", "2023-06-10T09:00:00"
    )
    trip2 = em("Tom and Maya hiked Mount Tam together.", "episodic", ["hike", "Mount Tam", "Maya"], "D2:6",
               "2023-06-10T09:05:00")  # fmt: skip
    script = {new_job.record.content: "SUPERSEDE", trip2.record.content: "MERGE"}
    asked = []

    def decide(pairs):
        asked.extend((n.content, o.content) for n, o in pairs)
        return [consolidator.ParseResult(script.get(n.content, "KEEPBOTH"), ok=True) for n, _ in pairs]

    mem = local_mem0(tmp_path / "store")
    ids = store_in_mem0(mem, [old_job, trip, new_job, trip2], user_id="u1", consolidate=decide, embed=Embedder(),
                        jaccard_min=0.1, cosine_min=0.5)  # fmt: skip
    assert asked == [(new_job.record.content, old_job.record.content), (trip2.record.content, trip.record.content)]
    everything = mem.get_all(filters={"user_id": "u1"}, top_k=100)["results"]
    assert len(everything) == len(ids) == 5  # four records and the merged one: nothing deleted
    by_text = {h["memory"]: h for h in everything}
    old = by_text[old_job.record.content]["metadata"]
    new_id = by_text[new_job.record.content]["id"]
    assert (old["status"], old["superseded_by"], old["valid_until"]) == ("superseded", new_id, new_job.timestamp)
    merged = [h for h in everything if h["metadata"].get("sources")]
    assert len(merged) == 1 and merged[0]["metadata"]["sources"] == "D1:5, D2:6"
    assert merged[0]["memory"] == trip2.record.content  # merge_rule: the newer wording covers the older
    for t in (trip, trip2):
        hit = next(h for h in everything if h["memory"] == t.record.content and not h["metadata"].get("sources"))
        assert hit["metadata"]["status"] == "merged" and hit["metadata"]["merged_into"] == merged[0]["id"]
    current = [h["memory"] for h in search_mem0(mem, "Where does Tom work?", user_id="u1", top_k=10)]
    assert old_job.record.content not in current and new_job.record.content in current
    history = [h["memory"] for h in search_mem0(mem, "Where does Tom work?", user_id="u1", top_k=10, history=True)]
    assert old_job.record.content in history


def test_mem0_history_search_never_ranks_a_memory_above_what_replaced_it(tmp_path):
    from memdistill.core.embedder import Embedder
    from memdistill.spec import consolidator

    acme = em("Tom works as a baker at Acme Bakery.", "fact", ["job", "Acme"], "D1:2", "2023-05-01T10:00:00")
    zed = em("Tom now works as a baker at Zed Bakery.", "fact", ["job", "Zed"], "D2:4", "2023-06-10T09:00:00")
    bees = em("Tom keeps bees in his garden.", "fact", ["job", "bees"], "D3:1", "2023-07-01T09:00:00")

    def decide(pairs):  # every later record supersedes: the bees wrongly supersede the Zed job too
        return [consolidator.ParseResult("SUPERSEDE", ok=True) for _ in pairs]

    mem = local_mem0(tmp_path / "store")
    store_in_mem0(mem, [acme, zed, bees], user_id="u1", consolidate=decide, embed=Embedder())
    status = {h["memory"]: h["metadata"]["status"] for h in mem.get_all(filters={"user_id": "u1"})["results"]}
    assert status == {
        acme.record.content: "superseded",
        zed.record.content: "superseded",
        bees.record.content: "current",
    }
    hits = search_mem0(mem, "Where does Tom work at Acme Bakery?", user_id="u1", top_k=10, history=True)
    raw = mem.search("Where does Tom work at Acme Bakery?", top_k=10, filters={"user_id": "u1"}, threshold=0.0)
    by_score = [h["memory"] for h in raw["results"]]
    assert by_score.index(acme.record.content) < by_score.index(zed.record.content)  # by score alone, Acme first
    assert [h["memory"] for h in hits] == [bees.record.content, zed.record.content, acme.record.content]


@pytest.mark.parametrize("one_change", [False, True])
def test_mem0_one_change_supersedes_only_the_most_similar_memory(tmp_path, one_change):
    from memdistill.core.embedder import Embedder
    from memdistill.spec import consolidator

    acme = em("Tom works as a baker at Acme Bakery.", "fact", ["job", "Acme"], "D1:2", "2023-05-01T10:00:00")
    shift = em("Tom works the early shift on weekdays.", "fact", ["job", "shift"], "D1:3", "2023-05-01T10:01:00")
    zed = em("Tom now works as a baker at Zed Bakery.", "fact", ["job", "Zed"], "D2:4", "2023-06-10T09:00:00")
    asked = []

    def decide(pairs):  # the model has the Zed job supersede both earlier job records
        asked.extend((n.content, o.content) for n, o in pairs)
        action = {zed.record.content: "SUPERSEDE"}
        return [consolidator.ParseResult(action.get(n.content, "KEEPBOTH"), ok=True) for n, _ in pairs]

    mem = local_mem0(tmp_path / "store")
    store_in_mem0(mem, [acme, shift, zed], user_id="u1", consolidate=decide, embed=Embedder(), one_change=one_change)
    # both reached the model, the most similar first
    assert [o for n, o in asked if n == zed.record.content] == [acme.record.content, shift.record.content]
    status = {h["memory"]: h["metadata"]["status"] for h in mem.get_all(filters={"user_id": "u1"})["results"]}
    assert status[acme.record.content] == "superseded" and status[zed.record.content] == "current"
    assert status[shift.record.content] == ("current" if one_change else "superseded")
