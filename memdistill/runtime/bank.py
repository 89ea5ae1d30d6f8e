"""The memory bank: one `MemoryItem` per record, each pointing back to its source (conversation id,
source turn id, speaker, message timestamp). Built from any extractor endpoint (`MemoryBank.from_extracted`
over `memdistill.serve.client.MemoryModels.extract`), from the gold seed records (an upper bound), or from
a JSONL file of records (`from_jsonl`; errors name the file and line).
"""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass
from datetime import date, datetime
from pathlib import Path
from typing import Iterable

from memdistill.core.io import read_jsonl
from memdistill.spec import qa
from memdistill.spec.dialogue import message_text, parse_timestamp
from memdistill.spec.extractor import Dimension, time_bounds


class BankError(ValueError):
    pass


STATUSES = ("current", "superseded", "merged")


@dataclass
class MemoryItem:
    memory_id: str
    conversation_id: str
    turn_id: str  # the source turn: evidence recall is measured through this pointer
    content: str
    dimension: Dimension
    speaker: str | None = None
    timestamp: datetime | None = None  # of the source message
    # Consolidation (memdistill.runtime.consolidate) marks, never deletes: "current", "superseded" (by
    # superseded_by, holding until valid_until) or "merged" (into merged_into). A merged record keeps the
    # source turns of every record it merged in `sources`.
    status: str = "current"
    superseded_by: str | None = None
    valid_until: datetime | None = None
    merged_into: str | None = None
    sources: list[str] | None = None
    # TriMEM labels the type router gave the content when it entered a typed bank (MemoryBank.type_with);
    # None = never typed, [] = typed none. Type-scoped retrieval searches both (memdistill.spec.querytyper).
    types: list[str] | None = None

    @property
    def current(self) -> bool:
        return self.status == "current"

    @property
    def source_turns(self) -> list[str]:
        return self.sources or [self.turn_id]

    def stored(self):
        """The record as the consolidator sees it (memdistill.spec.consolidator.StoredRecord)."""
        from memdistill.spec.consolidator import StoredRecord

        return StoredRecord(
            self.content, self.dimension, self.speaker or "", self.timestamp.isoformat() if self.timestamp else ""
        )

    def lexical_text(self) -> str:
        d = self.dimension
        return " ".join([self.content, d.location, d.reason, d.purpose, *d.keywords])

    def time_span(self) -> tuple[date, date] | None:
        if self.dimension.time:
            return time_bounds(self.dimension.time)
        if self.timestamp is not None:
            return self.timestamp.date(), self.timestamp.date()
        return None

    def render(self, reply: str | None = None) -> str:
        d = self.dimension
        return qa.render_memory(self.content, self.timestamp, d.time, d.location, d.reason, d.purpose, reply=reply)

    def to_json(self) -> dict:
        return {
            "memory_id": self.memory_id,
            "conversation_id": self.conversation_id,
            "turn_id": self.turn_id,
            "speaker": self.speaker,
            "timestamp": self.timestamp.isoformat() if self.timestamp else None,
            "content": self.content,
            "dimension": self.dimension.model_dump(),
            **({"types": self.types} if self.types is not None else {}),
            **(
                {
                    "status": self.status,
                    "superseded_by": self.superseded_by,
                    "merged_into": self.merged_into,
                    "valid_until": self.valid_until.isoformat() if self.valid_until else None,
                    "sources": self.sources,
                }
                if self.status != "current" or self.sources
                else {}
            ),
        }

    @classmethod
    def from_json(cls, row: dict, where: str, default_id: str = "") -> "MemoryItem":
        if not isinstance(row, dict):
            raise BankError(f"{where}: expected a JSON object")
        for key in ("conversation_id", "content", "dimension"):
            if key not in row:
                raise BankError(f"{where}: missing field {key!r}")
        turn = row.get("turn_id", row.get("source_turn_id"))
        if turn is None:
            raise BankError(f"{where}: missing field 'turn_id' (or 'source_turn_id'): the pointer to the source turn")
        try:
            dim = Dimension.model_validate_json(json.dumps(row["dimension"]))
        except ValueError as e:
            raise BankError(f"{where}: field 'dimension' is not a DimMem dimension: {str(e).splitlines()[0]}") from None
        ts = row.get("timestamp")
        try:
            ts = parse_timestamp(ts) if ts else None
        except ValueError as e:
            raise BankError(f"{where}: field 'timestamp': {e}") from None
        if not str(row["content"]).strip():
            raise BankError(f"{where}: field 'content' is empty")
        status = row.get("status") or "current"
        if status not in STATUSES:
            raise BankError(f"{where}: field 'status' is {status!r}, not one of {STATUSES}")
        try:
            until = parse_timestamp(row["valid_until"]) if row.get("valid_until") else None
        except ValueError as e:
            raise BankError(f"{where}: field 'valid_until': {e}") from None
        return cls(
            str(row.get("memory_id") or default_id),
            str(row["conversation_id"]),
            str(turn),
            str(row["content"]),
            dim,
            row.get("speaker", row.get("source_speaker")),
            ts,
            status,
            row.get("superseded_by"),
            until,
            row.get("merged_into"),
            row.get("sources"),
            _types(row.get("types"), where),
        )


def _types(value, where: str) -> list[str] | None:
    from memdistill.spec.router import LABELS

    if value is None:
        return None
    if not isinstance(value, list) or any(x not in LABELS for x in value):
        raise BankError(f"{where}: field 'types' should be a list of {LABELS}, got {value!r}")
    return list(value)


class MemoryBank:
    def __init__(self, items: Iterable[MemoryItem]):
        self.typer = None
        self.items = list(items)
        self._by_conv: dict[str, list[MemoryItem]] = defaultdict(list)
        self._by_id: dict[str, MemoryItem] = {}
        for it in self.items:
            self._by_conv[it.conversation_id].append(it)
            self._by_id.setdefault(it.memory_id, it)

    def __len__(self) -> int:
        return len(self.items)

    def of(self, conversation_id: str) -> list[MemoryItem]:
        return self._by_conv.get(conversation_id, [])

    def get(self, memory_id: str) -> MemoryItem | None:
        return self._by_id.get(memory_id)

    def add(self, item: MemoryItem) -> None:
        if item.memory_id in self._by_id:
            raise BankError(f"memory_id {item.memory_id!r} is already in the bank")
        if self.typer is not None and item.types is None:
            item.types = list(self.typer([item.content])[0])
        self.items.append(item)
        self._by_conv[item.conversation_id].append(item)
        self._by_id[item.memory_id] = item

    def type_with(self, typer) -> int:
        """Type every untyped record now and each record as it is added from here on. `typer`: texts ->
        TriMEM label lists, e.g. `lambda xs: [r.labels for r in models.classify_types(xs)]` or an in-process
        Encoder's classify_types. Returns how many records it typed now."""
        self.typer = typer
        todo = [it for it in self.items if it.types is None]
        for it, labels in zip(todo, typer([it.content for it in todo]) if todo else []):
            it.types = list(labels)
        return len(todo)

    @classmethod
    def from_extracted(cls, memories) -> "MemoryBank":
        """From `MemoryModels.extract(...).memories` (ExtractedMemory: record + source pointers)."""
        return cls(
            MemoryItem(
                f"{m.conversation_id}-w{m.window_index}-{k}",
                m.conversation_id,
                m.turn_id,
                m.record.content,
                m.record.dimension,
                m.speaker,
                parse_timestamp(m.timestamp),
            )
            for k, m in enumerate(memories)
        )

    @classmethod
    def from_seed(cls, seed, conversation_ids=None) -> "MemoryBank":
        """The gold records of the seed corpus (memdistill.data.seed.Seed), optionally of some conversations."""
        keep = None if conversation_ids is None else set(conversation_ids)
        items = []
        for m in seed.memories:
            if keep is not None and m["conversation_id"] not in keep:
                continue
            turn = seed.conversations[m["conversation_id"]].turn(m["source_turn_id"])
            items.append(
                MemoryItem(
                    m["memory_id"],
                    m["conversation_id"],
                    m["source_turn_id"],
                    m["content"],
                    Dimension(**m["dimension"]),
                    turn.speaker,
                    turn.timestamp,
                )
            )
        return cls(items)

    @classmethod
    def from_turns(cls, conversations) -> "MemoryBank":
        """One memory per message, its text as written (image caption included), no model: the NaiveRAG
        baseline every extracted bank has to beat. Dimensions are empty; a message is typed episodic (a
        thing someone said at a time) only because the record contract requires a type."""
        items = []
        for conv in conversations:
            for t in conv.turns:
                items.append(
                    MemoryItem(
                        f"{conv.conversation_id}:{t.turn_id}",
                        conv.conversation_id,
                        t.turn_id,
                        f"{t.speaker}: {message_text(t)}",
                        Dimension(memory_type="episodic"),
                        t.speaker,
                        t.timestamp,
                    )
                )
        return cls(items)

    @classmethod
    def from_jsonl(cls, path) -> "MemoryBank":
        """One record a line: conversation_id, turn_id (or source_turn_id), content, dimension; optional
        memory_id, speaker (or source_speaker), timestamp (of the source message)."""
        path = Path(path)
        return cls(
            MemoryItem.from_json(row, f"{path}:{lineno}", f"{path.stem}-{lineno}")
            for lineno, row in read_jsonl(path, BankError)
        )

    def save(self, path) -> None:
        Path(path).write_text(
            "".join(json.dumps(it.to_json(), ensure_ascii=False) + "\n" for it in self.items), encoding="utf-8"
        )
