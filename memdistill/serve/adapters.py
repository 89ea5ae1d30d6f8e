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

Plain OpenAI client / LightMem-style stacks: any code that already calls an OpenAI-compatible chat
endpoint for extraction can point its base URL at `make serve` and use `openai_extraction_request`
for the request body and the spec's `parse` on the answer (see README, "Serving").
"""

from __future__ import annotations

import os
from pathlib import Path

from memdistill.spec import extraction
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
    }


def store_in_mem0(mem, memories, user_id: str) -> list[str]:
    """Add ExtractedMemory items to mem0 as raw memories; returns mem0's ids."""
    ids = []
    for m in memories:
        out = mem.add(m.record.content, user_id=user_id, metadata=record_metadata(m), infer=False)
        ids += [r["id"] for r in out.get("results", [])]
    return ids


def search_mem0(mem, query: str, user_id: str, top_k: int = 5, memory_type: str | None = None) -> list[dict]:
    filters = {"user_id": user_id}
    if memory_type:
        filters["memory_type"] = memory_type
    return mem.search(query, top_k=top_k, filters=filters, threshold=0.0).get("results", [])


def openai_extraction_request(window: Window, model: str = "memdistill-extractor", max_tokens: int = 1024) -> dict:
    """The chat-completions body for one window, for stacks that bring their own OpenAI client."""
    return chat_request(extraction.chat_messages(window), model, max_tokens, extraction.json_schema(window), "memories")
