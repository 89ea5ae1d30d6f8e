"""Memory update as records arrive (DimMem DA-Update, seed 001 section 3.4), never deleting anything.

    from memdistill.runtime.consolidate import Consolidator
    cons = Consolidator(decide=mm.consolidate_pairs)     # or any (pairs) -> [ParseResult] callable
    for item in new_items:                               # in the order they were said
        cons.add(bank, item)
    cons.save_log("decisions.jsonl"); Consolidator.replay(other_bank, "decisions.jsonl")

For each new record the cascade (`memdistill.spec.consolidator.candidates`: same memory_type, keyword
Jaccard, embedding cosine) picks the current records of its conversation worth a decision; `decide`
answers for those pairs only. Then:
- SUPERSEDE: the old record stays, marked superseded by the new one, holding until the new one's time;
- MERGE (the best-scoring MERGE only): a merged record is added carrying the source turns of both, and
  both are marked merged into it;
- KEEPBOTH: nothing changes.
Every decision goes to `log` with both ids; `replay` applies a log without the model; adding a record
already in the bank, or replaying a decision already applied, changes nothing.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from memdistill.core.io import read_jsonl
from memdistill.runtime.bank import MemoryBank, MemoryItem
from memdistill.spec import consolidator
from memdistill.spec.consolidator import CascadeStats, ParseResult, StoredRecord
from memdistill.spec.dialogue import parse_timestamp

Decide = Callable[[list[tuple[StoredRecord, StoredRecord]]], list[ParseResult]]


@dataclass
class Consolidator:
    decide: Decide  # (new, existing) pairs -> one decision each
    embed: Callable | None = None  # unit-vector embedder for the cascade's last level (MiniLM by default)
    # the cascade (consolidator.candidates); the default is consolidator.WIDE, DimMem's own is (JACCARD, COSINE, True)
    jaccard_min: float = consolidator.WIDE["jaccard_min"]
    cosine_min: float = consolidator.WIDE["cosine_min"]
    keywords_then_cosine: bool = consolidator.WIDE["keywords_then_cosine"]  # False: keywords or cosine
    same_type: bool = True  # False: records of any memory_type are compared (changes recorded under another type)
    # True: at most one MERGE or SUPERSEDE per new record, the most similar candidate's; the others are logged
    # unapplied. False: one MERGE, and every SUPERSEDE, as decided.
    one_change: bool = False
    log: list[dict] = field(default_factory=list)
    stats: CascadeStats = field(default_factory=CascadeStats)

    def __post_init__(self):
        if self.embed is None:
            from memdistill.core.embedder import Embedder

            self.embed = Embedder()

    def add(self, bank: MemoryBank, item: MemoryItem) -> list[dict]:
        """Put `item` into `bank` and consolidate it against the conversation's current records.
        Returns the decisions made (also appended to `log`)."""
        if bank.get(item.memory_id) is not None:
            return []
        existing = [it for it in bank.of(item.conversation_id) if it.current]
        bank.add(item)
        new, olds = item.stored(), [it.stored() for it in existing]
        picked, stats = consolidator.candidates(
            new,
            olds,
            self.embed,
            jaccard_min=self.jaccard_min,
            cosine_min=self.cosine_min,
            keywords_then_cosine=self.keywords_then_cosine,
            same_type=self.same_type,
        )
        self.stats.add(stats)
        if not picked:
            return []
        results = self.decide([(new, olds[i]) for i, _ in picked])
        decisions = []
        for (i, cos), res in zip(picked, results):
            d = {
                "new": item.memory_id,
                "existing": existing[i].memory_id,
                "action": res.action,
                "cosine": round(cos, 4),
                "problems": [p.code for p in res.problems],
            }
            if (
                self.one_change
                and res.action != "KEEPBOTH"
                and any(x["action"] != "KEEPBOTH" and x.get("applied") is not False for x in decisions)
            ):
                d["applied"] = False
            elif res.action == "MERGE":
                if any(x["action"] == "MERGE" for x in decisions):
                    d["applied"] = False  # one merge per new record: the most similar one
                else:
                    merged = res.merged or consolidator.merge_rule(new, olds[i])
                    d["merged"] = merged.model_dump()
            decisions.append(d)
        for d in decisions:
            apply(bank, d)
        self.log += decisions
        return decisions

    def save_log(self, path) -> None:
        Path(path).write_text("".join(json.dumps(d, ensure_ascii=False) + "\n" for d in self.log), encoding="utf-8")

    @staticmethod
    def replay(bank: MemoryBank, log) -> int:
        """Apply logged decisions (a list, or a JSONL path) to a bank holding the same records; returns how
        many changed something. Replaying twice changes nothing the second time."""
        rows = [r for _, r in read_jsonl(Path(log))] if isinstance(log, (str, Path)) else list(log)
        return sum(apply(bank, d) for d in rows)


def merged_id(new_id: str, existing_id: str) -> str:
    return f"{existing_id}+{new_id}"


def apply(bank: MemoryBank, d: dict) -> bool:
    """One logged decision onto the bank; False when it changes nothing (KEEPBOTH, already applied)."""
    new, old = bank.get(d["new"]), bank.get(d["existing"])
    if new is None or old is None:
        raise KeyError(f"decision {d['new']} / {d['existing']}: record not in the bank")
    if d.get("applied") is False:
        return False
    if d["action"] == "SUPERSEDE":
        if old.status == "superseded" and old.superseded_by == new.memory_id:
            return False
        old.status, old.superseded_by, old.valid_until = "superseded", new.memory_id, new.timestamp
        return True
    mid = merged_id(new.memory_id, old.memory_id)
    if d["action"] != "MERGE" or bank.get(mid):
        return False
    m = consolidator.MergedRecord.model_validate(d["merged"])
    bank.add(
        MemoryItem(
            mid,
            new.conversation_id,
            new.turn_id,
            m.content,
            m.dimension,
            new.speaker,
            new.timestamp,
            sources=list(dict.fromkeys(old.source_turns + new.source_turns)),
        )
    )
    for it in (old, new):
        it.status, it.merged_into = "merged", mid
    return True


def history(bank: MemoryBank, memory_id: str) -> list[MemoryItem]:
    """The chain behind a record: what it superseded or merged, oldest first (for 'history on request')."""
    out, todo = [], [memory_id]
    while todo:
        mid = todo.pop()
        for it in bank.items:
            if (it.superseded_by == mid or it.merged_into == mid) and it not in out:
                out.append(it)
                todo.append(it.memory_id)
    return sorted(out, key=lambda it: it.timestamp or parse_timestamp("1970-01-01T00:00:00"))
