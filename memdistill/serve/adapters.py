"""Adapters that put memdistill's records into existing memory stacks.

mem0: records from our extractor go into a mem0 `Memory` as they are (`infer=False`: mem0's own LLM
extraction is replaced, not repeated), with their DimMem dimensions and source pointer as metadata,
and come back through mem0's search, optionally filtered by dimension:

    from memdistill.serve.client import MemoryModels
    from memdistill.serve.adapters import local_mem0, store_in_mem0, search_mem0
    mm = MemoryModels("http://127.0.0.1:8000/v1")
    mem = local_mem0("/tmp/mem0-store")                       # local MiniLM embedder + on-disk Qdrant
    store_in_mem0(mem, mm.extract(conversation).memories, user_id="caroline")
    search_mem0(mem, "support group", user_id="caroline", memory_type="episodic")

Memory update (mem0 2.x only adds): `store_in_mem0(..., consolidate=mm.consolidate_pairs)` compares each
record with the user's current mem0 memories through DimMem's cascade and the consolidator first. Nothing
is deleted: a superseded memory gets `status="superseded"`, `superseded_by` and `valid_until` in its
metadata; MERGE stores the merged record (both source turns) and marks the two `status="merged"`;
`search_mem0` returns current memories unless `history=True`.

Plain OpenAI client / LightMem-style stacks: any code that already calls an OpenAI-compatible chat
endpoint for extraction can point its base URL at `make serve` and use `openai_extraction_request`
for the request body and the spec's `parse` on the answer (see README, "Serving").
"""

from __future__ import annotations

import os
from pathlib import Path

from memdistill.spec import consolidator, extractor
from memdistill.spec.dialogue import Window
from memdistill.spec.request import chat_request

os.environ.setdefault("MEM0_TELEMETRY", "False")  # mem0 phones home otherwise; this machine is offline


def local_mem0(
    path,
    embedder_model: str | None = None,
    llm_base_url: str = "http://127.0.0.1:8000/v1",
    llm_model: str = "memdistill-extractor",
    collection: str = "memdistill",
):
    """A mem0 Memory that needs no network: MiniLM embeddings, on-disk Qdrant, history in SQLite.

    mem0 insists on an LLM config; it points at our endpoint and is only used if a caller asks mem0
    to infer (we never do)."""
    from mem0 import Memory

    from memdistill.core.models import model_path

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    return Memory.from_config(
        {
            "vector_store": {
                "provider": "qdrant",
                "config": {
                    "path": str(path / "qdrant"),
                    "collection_name": collection,
                    "embedding_model_dims": 384,
                    "on_disk": True,
                },
            },
            "embedder": {
                "provider": "huggingface",
                "config": {"model": embedder_model or model_path("embedded:minilm"), "embedding_dims": 384},
            },
            "llm": {
                "provider": "openai",
                "config": {
                    "model": llm_model,
                    "openai_base_url": llm_base_url,
                    "api_key": os.environ.get("MEMDISTILL_API_KEY", "EMPTY"),
                },
            },
            "history_db_path": str(path / "history.db"),
        }
    )


def record_metadata(m) -> dict:
    """mem0 metadata for one ExtractedMemory: its dimensions (flat, filterable) and source pointer."""
    d = m.record.dimension
    return {
        "memory_type": d.memory_type,
        "time": d.time,
        "location": d.location,
        "reason": d.reason,
        "purpose": d.purpose,
        "keywords": ", ".join(d.keywords),
        "source_turn_id": m.turn_id,
        "source_speaker": m.speaker,
        "source_timestamp": m.timestamp,
        "conversation_id": m.conversation_id,
        "status": "current",
    }


def _stored(hit: dict) -> consolidator.StoredRecord:
    """A mem0 memory written by store_in_mem0, as the consolidator sees it."""
    md = hit.get("metadata") or {}
    kws = [k.strip() for k in str(md.get("keywords") or "").split(",") if k.strip()]
    dim = extractor.Dimension(
        memory_type=md.get("memory_type") or "fact",
        time=md.get("time") or "",
        location=md.get("location") or "",
        reason=md.get("reason") or "",
        purpose=md.get("purpose") or "",
        keywords=kws,
    )
    return consolidator.StoredRecord(
        hit["memory"], dim, md.get("source_speaker") or "", str(md.get("source_timestamp") or "")
    )


def store_in_mem0(
    mem,
    memories,
    user_id: str,
    consolidate=None,
    embed=None,
    jaccard_min: float = consolidator.WIDE["jaccard_min"],
    cosine_min: float = consolidator.WIDE["cosine_min"],
    keywords_then_cosine: bool = consolidator.WIDE["keywords_then_cosine"],
    same_type: bool = True,
    one_change: bool = False,
) -> list[str]:
    """Add ExtractedMemory items to mem0 as raw memories (`infer=False`); returns mem0's ids of what was
    added. With `consolidate` ((new, existing) pairs -> consolidator.ParseResult list, e.g.
    `MemoryModels.consolidate_pairs`) each record is first checked against the user's current memories
    (cascade thresholds and `one_change` as in memdistill.runtime.consolidate.Consolidator; `embed` defaults to
    MiniLM)."""
    if consolidate is not None and embed is None:
        from memdistill.core.embedder import Embedder

        embed = Embedder()
    ids = []
    for m in memories:
        md = record_metadata(m)
        decisions = []
        if consolidate is not None:
            current = mem.get_all(filters={"user_id": user_id, "status": "current"}, top_k=100_000)["results"]
            new = consolidator.StoredRecord(m.record.content, m.record.dimension, m.speaker or "", m.timestamp or "")
            olds = [_stored(h) for h in current]
            picked, _ = consolidator.candidates(
                new,
                olds,
                embed,
                jaccard_min=jaccard_min,
                cosine_min=cosine_min,
                keywords_then_cosine=keywords_then_cosine,
                same_type=same_type,
            )
            results = consolidate([(new, olds[i]) for i, _ in picked]) if picked else []
            decisions = [(current[i], olds[i], r) for (i, _), r in zip(picked, results)]
            if one_change:  # the most similar candidate's change only (picked is best first)
                decisions = [d for d in decisions if d[2].action != "KEEPBOTH"][:1]
        out = mem.add(m.record.content, user_id=user_id, metadata=md, infer=False)
        new_ids = [r["id"] for r in out.get("results", [])]
        ids += new_ids
        merge = next(((old, stored, r) for old, stored, r in decisions if r.action == "MERGE"), None)
        for old, _, r in decisions:
            if r.action == "SUPERSEDE":
                mem.update(old["id"], metadata={"status": "superseded", "superseded_by": new_ids[0],
                                                 "valid_until": m.timestamp})  # fmt: skip
        if merge is not None:
            old, stored, r = merge
            merged = r.merged or consolidator.merge_rule(new, stored)
            d, omd = merged.dimension, old.get("metadata") or {}
            sources = [*str(omd.get("sources") or omd.get("source_turn_id") or "").split(", "), m.turn_id]
            mmd = {**md, "memory_type": d.memory_type, "time": d.time, "location": d.location, "reason": d.reason,
                   "purpose": d.purpose, "keywords": ", ".join(d.keywords),
                   "sources": ", ".join(dict.fromkeys(s for s in sources if s))}  # fmt: skip
            got = mem.add(merged.content, user_id=user_id, metadata=mmd, infer=False).get("results", [])
            ids += [x["id"] for x in got]
            for mid in (old["id"], *new_ids):
                mem.update(mid, metadata={"status": "merged", "merged_into": got[0]["id"]})
    return ids


def search_mem0(
    mem, query: str, user_id: str, top_k: int = 5, memory_type: str | None = None, history: bool = False
) -> list[dict]:
    """mem0 search over the user's current memories. `history=True`: superseded and merged ones too, after the
    current ones and never above what replaced them (as the runtime's history="after")."""
    filters = {"user_id": user_id}
    if memory_type:
        filters["memory_type"] = memory_type
    if not history:
        filters["status"] = "current"
    hits = mem.search(query, top_k=top_k, filters=filters, threshold=0.0).get("results", [])
    if not history:
        return hits
    hits = sorted(hits, key=lambda h: (h.get("metadata") or {}).get("status", "current") != "current")
    seen = {h["id"]: h for h in hits}

    def successor(memory_id: str) -> str | None:
        h = seen.get(memory_id) or mem.get(memory_id) or {}
        md = h.get("metadata") or {}
        return md.get("superseded_by") or md.get("merged_into")

    return [hits[k] for k in consolidator.below_successors([h["id"] for h in hits], successor)]


def openai_extraction_request(
    window: Window, model: str = "memdistill-extractor", max_tokens: int = 1024, prompt: str = "student"
) -> dict:
    """The chat-completions body for one window, for stacks that bring their own OpenAI client. `prompt`:
    the student prompt the served model was trained with (`core.models.trained_prompt(model_dir)`)."""
    return chat_request(
        extractor.chat_messages(window, prompt), model, max_tokens, extractor.json_schema(window), "memories"
    )
