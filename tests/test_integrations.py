"""Adapters: mem0 (the real mem0ai package, local embedder and vector store) and the plain OpenAI client."""

import openai
import pytest

from memdistill.data import seed as seedlib
from memdistill.serve.adapters import local_mem0, openai_extraction_request, search_mem0, store_in_mem0
from memdistill.serve.client import ExtractedMemory
from memdistill.spec import extraction
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
    res = mm.extract(windows(seed.conversations["mp02"], 6, 1)[:3])
    mem = local_mem0(tmp_path / "store")
    store_in_mem0(mem, res.memories, user_id="u2")
    for m in res.memories[:3]:
        hits = search_mem0(mem, m.record.content, user_id="u2", top_k=1)
        assert hits and hits[0]["memory"] == m.record.content


@pytest.mark.vllm
def test_plain_openai_client_recipe(server):
    seed = seedlib.load(REPO / "data" / "seed")
    w = windows(seed.conversations["ua01"], 4, 1)[1]
    client = openai.OpenAI(base_url=f"{server.urls[0]}/v1", api_key="EMPTY")
    resp = client.chat.completions.create(**openai_extraction_request(w, max_tokens=200))
    parsed = extraction.parse(resp.choices[0].message.content, w)
    assert parsed.raw_count >= len(parsed.records)
    assert all(w.extract_from <= r.source_id <= len(w.turns) for r in parsed.records)
