"""The gold seed corpus (data/seed/, format in data/seed/FORMAT.md): loading, validation, gate building.

  memdistill check-seed [DIR]          validate everything and print statistics (make check-seed)
  python -m memdistill.data.seed gate [DIR]   rebuild gate.jsonl from questions + memories (deterministic)
  python -m memdistill.data.seed check-pairs FILE...   validate consolidation pairs written apart (a helper's part)
  python -m memdistill.data.seed check-part DIR...     validate a part written apart: a folder of the same files
                                                       for one or more conversations (no corpus minimums)
  python -m memdistill.data.seed check-tree FILE...    validate memory-tree nodes written apart against the corpus
  python -m memdistill.data.seed tree-plan DIR CONV...  the memory-tree nodes a conversation needs (tree.jsonl rows
                                                       to write: node id, level, window, interval, sessions)
  python -m memdistill.data.seed merge-parts DIR...    append valid parts to the corpus (their plans go to plans/),
                                                       rebuild gate.jsonl, validate the whole corpus

Snippets, questions and gate examples take the split of their conversation; standalone snippets carry
their own.
"""

from __future__ import annotations

import json
import random
import re
import sys
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

from pydantic import ValidationError

from memdistill.core.io import append_jsonl, load_jsonl, write_jsonl
from memdistill.core.models import REPO
from memdistill.data.sources import SourceError, load_seed
from memdistill.spec import consolidator, planner, router, summarizer
from memdistill.spec.dialogue import Conversation, Window, parse_timestamp
from memdistill.spec.extractor import Dimension, records_for_window, time_bounds, time_problem
from memdistill.spec.gate import BUDGETS
from memdistill.spec.query_parser import QueryAnalysis

SEED_DIR = REPO / "data" / "seed"
SPLITS = ("train", "dev", "test")
STYLES = ("multi-party", "user-assistant")
CATEGORIES = {
    "multi-party": ("single-hop", "multi-hop", "temporal", "open-domain", "adversarial"),
    "user-assistant": (
        "single-session-user",
        "single-session-assistant",
        "single-session-preference",
        "multi-session",
        "knowledge-update",
        "temporal-reasoning",
        "abstention",
    ),
}
# LoCoMo's adversarial and LongMemEval's abstention questions ask about something the conversation never
# says: they have no evidence records (a system should answer that it does not know).
UNANSWERABLE = ("adversarial", "abstention")
# A conversation of at least LONG_SESSIONS sessions is a long one (LoCoMo / LongMemEval scale): it is
# reported apart, and must meet LONG_MINIMUMS.
LONG_SESSIONS = 15
LONG_MINIMUMS = {"multi-party": {"turns": 200, "days": 120}, "user-assistant": {"turns": 150, "days": 0}}
LONG_QUESTIONS = 30
# What the issue asks of the corpus; check() reports shortfalls as errors.
MINIMUMS = {
    "conversations": 40,
    "multi-party": 20,
    "user-assistant": 20,
    "memories": 800,
    "types": 500,
    "questions": 200,
    "answered multi-party questions": 100,
    "gate": 150,
    "consolidation pairs": 400,
    "knowledge-update questions": 40,
}
# Least share of each memory_type among the records of short and of long conversations. Long ones (LoCoMo /
# LongMemEval scale) are dominated by events and, in user-assistant histories, by the assistant's facts: their
# writers and two review passes (DATA_CARD.md) found no more stated, unrecorded or mistyped traits than 10-23%.
TYPE_SHARE = {"short": 0.2, "long": 0.1}
PAIR_ORIGINS = ("cascade", "change", "restated", "hard_negative", "related")
GATE_CANDIDATES = (10, 30)


def _rows(path: Path) -> list[dict]:
    return load_jsonl(path, SourceError, missing_ok=True)  # check() reports a missing file


@dataclass
class Seed:
    conversations: dict[str, Conversation]
    split: dict[str, str]  # conversation id -> split
    memories: list[dict]
    types: list[dict]
    questions: list[dict]
    gate: list[dict]
    pairs: list[dict] = field(default_factory=list)  # consolidation.jsonl
    segments: list[dict] = field(default_factory=list)  # segments.jsonl: one row per session
    # segments_second.jsonl: a blind second labelling of whole conversations, for agreement only (never trained on)
    segments_second: list[dict] = field(default_factory=list)
    tree: list[dict] = field(default_factory=list)  # tree.jsonl: TiMem memory-tree nodes of levels 2-5

    def split_of(self, row: dict) -> str:
        return row.get("split") or self.split[row["conversation_id"]]

    def rows(self, kind: str, split: str | None = None) -> list[dict]:
        rows = getattr(self, kind)
        return rows if split is None else [r for r in rows if self.split_of(r) == split]

    def memories_of(self, conversation_id: str) -> list[dict]:
        return [m for m in self.memories if m["conversation_id"] == conversation_id]

    def gold_records(self, window: Window):
        """The gold DimMem records of a window (source_id = message number in that window)."""
        return records_for_window(window, self.memories_of(window.conversation_id))

    @cached_property
    def _memory_by_id(self) -> dict[str, dict]:
        return {m["memory_id"]: m for m in self.memories}

    def memory(self, memory_id: str) -> dict:
        if memory_id not in self._memory_by_id:
            raise KeyError(f"no gold memory {memory_id!r}")
        return self._memory_by_id[memory_id]

    def stored(self, conversation_id: str, ref) -> tuple[consolidator.StoredRecord, int]:
        """A pair side (a gold memory id, or an inline record with its source_turn_id) as the consolidator
        sees it, with its source turn's position in the conversation."""
        conv = self.conversations[conversation_id]
        row = self.memory(ref) if isinstance(ref, str) else ref
        if row.get("conversation_id", conversation_id) != conversation_id:
            raise KeyError(f"memory {ref!r} is not a record of {conversation_id}")
        turn = conv.turn(row["source_turn_id"])
        return consolidator.StoredRecord.at(row, turn), [t.turn_id for t in conv.turns].index(turn.turn_id)


FILES = {  # Seed field -> file
    "memories": "memories.jsonl",
    "types": "types.jsonl",
    "questions": "questions.jsonl",
    "gate": "gate.jsonl",
    "pairs": "consolidation.jsonl",
    "segments": "segments.jsonl",
    "segments_second": "segments_second.jsonl",
    "tree": "tree.jsonl",
}


def _load_dir(d: Path) -> Seed:
    convs = {c.conversation_id: c for c in load_seed(d / "conversations.jsonl")}
    split = {c.conversation_id: c.meta.get("split") for c in convs.values()}
    return Seed(convs, split, **{k: _rows(d / f) for k, f in FILES.items()})


def load(seed_dir=SEED_DIR) -> Seed:
    return _load_dir(Path(seed_dir))


# --- validation ---------------------------------------------------------------------------------


@dataclass
class Report:
    errors: list[str] = field(default_factory=list)
    stats: list[tuple[str, list[str], list[list]]] = field(default_factory=list)  # (title, header, rows)

    @property
    def ok(self) -> bool:
        return not self.errors

    def table(self, title, header, rows):
        self.stats.append((title, header, rows))

    def render(self) -> str:
        out = []
        for title, header, rows in self.stats:
            out.append(f"\n## {title}\n")
            out.append("| " + " | ".join(header) + " |")
            out.append("|" + "---|" * len(header))
            out += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
        shown = self.errors[:200]
        out.append(f"\n{len(self.errors)} error(s)" + (":" if shown else "; the seed corpus is valid."))
        out += [f"  - {e}" for e in shown]
        if len(self.errors) > len(shown):
            out.append(f"  ... and {len(self.errors) - len(shown)} more")
        return "\n".join(out)


def check(seed_dir=SEED_DIR, minimums: bool = True) -> Report:
    rep = Report()
    d = Path(seed_dir)
    try:
        seed = load(d)
    except (SourceError, json.JSONDecodeError) as e:
        rep.errors.append(str(e))
        return rep
    _check_conversations(seed, rep)
    _check_memories(seed, rep)
    _check_types(seed, rep)
    _check_questions(seed, rep)
    _check_long_questions(seed, rep)
    _check_gate(seed, rep)
    check_pairs(seed, seed.pairs, "consolidation.jsonl", rep)
    check_segments(seed, seed.segments, "segments.jsonl", rep, complete=minimums)
    check_segments(seed, seed.segments_second, "segments_second.jsonl", rep, complete=False)
    _check_whole_conversations(seed, seed.segments_second, "segments_second.jsonl", rep)
    check_tree(seed, seed.tree, "tree.jsonl", rep)
    _check_splits(seed, rep, minimums)
    _stats(seed, rep)
    if minimums:
        counts = _counts(seed)
        for name, least in MINIMUMS.items():
            if counts[name] < least:
                rep.errors.append(f"corpus: {counts[name]} {name}, at least {least} required")
        actions = Counter(p.get("action") for p in seed.pairs)
        for a in consolidator.ACTIONS:
            if actions[a] / (len(seed.pairs) or 1) < 0.2:
                rep.errors.append(f"consolidation.jsonl: action {a} is {actions[a]}/{len(seed.pairs)} pairs, under 20%")
        for group, least in TYPE_SHARE.items():
            mems = [m for m in seed.memories if length(seed.conversations[m["conversation_id"]]) == group]
            for t, c in Counter(m["dimension"]["memory_type"] for m in mems).items():
                if c / len(mems) < least:
                    rep.errors.append(
                        f"memories: memory_type {t} is {c / len(mems):.0%} of the {group} conversations' records, "
                        f"under {least:.0%}"
                    )
    return rep


def _counts(seed: Seed) -> Counter:
    styles = Counter(c.style for c in seed.conversations.values())
    return Counter(
        {
            "conversations": len(seed.conversations),
            **styles,
            "memories": len(seed.memories),
            "types": len(seed.types),
            "questions": len(seed.questions),
            "gate": len(seed.gate),
            "consolidation pairs": len(seed.pairs),
            "knowledge-update questions": sum(1 for q in seed.questions if q.get("update")),
            "answered multi-party questions": sum(
                1
                for q in seed.questions
                if q.get("answer")
                and q.get("evidence")
                and seed.conversations.get(q["conversation_id"]) is not None
                and seed.conversations[q["conversation_id"]].style == "multi-party"
            ),
        }
    )


def _check_conversations(seed: Seed, rep: Report):
    for cid, c in seed.conversations.items():
        where = f"conversations.jsonl ({cid})"
        if c.style not in STYLES:
            rep.errors.append(f"{where}: style {c.style!r} not in {STYLES}")
        if seed.split[cid] not in SPLITS:
            rep.errors.append(f"{where}: split {seed.split[cid]!r} not in {SPLITS}")
        ids = [t.turn_id for t in c.turns]
        if len(ids) != len(set(ids)):
            rep.errors.append(f"{where}: duplicate turn ids {sorted(k for k, v in Counter(ids).items() if v > 1)}")
        for s in c.sessions:
            if any(t.timestamp < s.date_time for t in s.turns):
                rep.errors.append(f"{where}: session {s.session_id} has a turn before the session start")
        starts = [s.date_time for s in c.sessions]
        if starts != sorted(starts):
            rep.errors.append(f"{where}: sessions are not in chronological order")
        if c.style == "multi-party":
            if len(c.sessions) < 3 or len({s.date_time.date() for s in c.sessions}) < 3:
                rep.errors.append(f"{where}: multi-party needs 3+ sessions on different dates")
            for s in c.sessions:
                if not 8 <= len(s.turns) <= 25:
                    rep.errors.append(f"{where}: session {s.session_id} has {len(s.turns)} turns (8-25)")
            for t in c.turns:
                if t.speaker not in c.speakers:
                    rep.errors.append(f"{where}: turn {t.turn_id} speaker {t.speaker!r} not in speakers {c.speakers}")
        if length(c) == "long":
            least = LONG_MINIMUMS.get(c.style, {})
            days = (c.sessions[-1].date_time - c.sessions[0].date_time).days
            if len(c.turns) < least.get("turns", 0):
                rep.errors.append(f"{where}: a long conversation needs {least['turns']}+ turns, has {len(c.turns)}")
            if days < least.get("days", 0):
                rep.errors.append(f"{where}: a long conversation spans {least['days']}+ days, spans {days}")


def length(conv: Conversation) -> str:
    """ "long" (LoCoMo / LongMemEval scale: LONG_SESSIONS sessions or more) or "short"; reports keep them apart."""
    return "long" if len(conv.sessions) >= LONG_SESSIONS else "short"


def _numbered(rows: list[dict], file: str, id_key: str, rep: Report):
    """(where, row) for each row, where = "file:line (id)"; repeated ids are reported."""
    seen = set()
    for k, row in enumerate(rows, 1):
        where = f"{file}:{k} ({row.get(id_key)})"
        if row.get(id_key) in seen:
            rep.errors.append(f"{where}: duplicate {id_key}")
        seen.add(row.get(id_key))
        yield where, row


def _check_memories(seed: Seed, rep: Report):
    for where, m in _numbered(seed.memories, "memories.jsonl", "memory_id", rep):
        missing = {"memory_id", "conversation_id", "source_turn_id", "content", "dimension"} - set(m)
        if missing:
            rep.errors.append(f"{where}: missing {sorted(missing)}")
            continue
        conv = seed.conversations.get(m["conversation_id"])
        if conv is None:
            rep.errors.append(f"{where}: unknown conversation {m['conversation_id']!r}")
            continue
        try:
            turn = conv.turn(m["source_turn_id"])
        except KeyError as e:
            rep.errors.append(f"{where}: {e.args[0]}")
            continue
        if m.get("source_speaker") and m["source_speaker"] != turn.speaker:
            rep.errors.append(
                f"{where}: source_speaker {m['source_speaker']!r} but turn {turn.turn_id} is {turn.speaker!r}"
            )
        try:
            dim = Dimension.model_validate_json(json.dumps(m["dimension"]))
        except ValidationError as e:
            rep.errors.append(f"{where}: dimension invalid: {e.errors()[0]['loc']} {e.errors()[0]['msg']}")
            continue
        if not m["content"].strip():
            rep.errors.append(f"{where}: empty content")
        if (why := time_problem(dim.time)) is not None:
            rep.errors.append(f"{where}: time {dim.time!r}: {why}")
        elif dim.time and not m.get("is_plan") and time_bounds(dim.time)[0] > turn.timestamp.date():
            rep.errors.append(
                f"{where}: time {dim.time} is after its source message ({turn.timestamp.date()}) "
                "and the record is not a plan"
            )


def _check_types(seed: Seed, rep: Report):
    for where, s in _numbered(seed.types, "types.jsonl", "snippet_id", rep):
        labels = s.get("labels")
        if (
            not isinstance(labels, list)
            or any(lab not in router.LABELS for lab in labels)
            or len(set(labels)) != len(labels)
        ):
            rep.errors.append(f"{where}: labels {labels!r} must be distinct items of {router.LABELS}")
        if not str(s.get("text", "")).strip():
            rep.errors.append(f"{where}: empty text")
        cid = s.get("conversation_id")
        if cid is None:
            if s.get("split") not in SPLITS:
                rep.errors.append(f"{where}: a standalone snippet needs a split in {SPLITS}")
            continue
        conv = seed.conversations.get(cid)
        if conv is None:
            rep.errors.append(f"{where}: unknown conversation {cid!r}")
            continue
        try:
            turns = [conv.turn(t) for t in s.get("turn_ids") or []]
        except KeyError as e:
            rep.errors.append(f"{where}: {e.args[0]}")
            continue
        if not 1 <= len(turns) <= 2:
            rep.errors.append(f"{where}: a conversation snippet is one turn or two consecutive turns")
        expected = "\n".join(f"{t.speaker}: {t.text}" for t in turns)
        if " ".join(expected.split()) != " ".join(s["text"].split()):
            rep.errors.append(f"{where}: text differs from turns {s.get('turn_ids')}")


def _check_questions(seed: Seed, rep: Report):
    mem_conv = {m["memory_id"]: m["conversation_id"] for m in seed.memories}
    for where, q in _numbered(seed.questions, "questions.jsonl", "question_id", rep):
        conv = seed.conversations.get(q.get("conversation_id"))
        if conv is None:
            rep.errors.append(f"{where}: unknown conversation {q.get('conversation_id')!r}")
            continue
        try:
            qd = parse_timestamp(q.get("question_date"))
            if qd < conv.turns[-1].timestamp:
                rep.errors.append(f"{where}: question_date {qd} is before the conversation's last message")
        except ValueError as e:
            rep.errors.append(f"{where}: {e}")
        for t in q.get("evidence") or []:
            if t not in {x.turn_id for x in conv.turns}:
                rep.errors.append(f"{where}: evidence turn {t!r} not in {conv.conversation_id}")
        for mid in q.get("evidence_memory_ids") or []:
            if mem_conv.get(mid) != conv.conversation_id:
                rep.errors.append(f"{where}: evidence memory {mid!r} is not a record of {conv.conversation_id}")
        if q.get("category") is not None and q["category"] not in CATEGORIES[conv.style]:
            rep.errors.append(f"{where}: category {q['category']!r} not in {CATEGORIES[conv.style]}")
        unanswerable = q.get("category") in UNANSWERABLE
        if unanswerable and q.get("evidence_memory_ids"):
            rep.errors.append(f"{where}: a {q['category']} question has no evidence records")
        if not unanswerable and not (q.get("evidence") and q.get("evidence_memory_ids")):
            rep.errors.append(f"{where}: an answerable question needs evidence turns and evidence_memory_ids")
        plan = q.get("plan") or {}
        try:
            p = planner.RecallPlan.model_validate_json(json.dumps(plan))
            if planner.drop_names(p.keywords, conv.speakers) != p.keywords:
                rep.errors.append(f"{where}: plan keywords {p.keywords} name a person")
        except ValidationError as e:
            rep.errors.append(f"{where}: plan invalid: {e.errors()[0]['loc']} {e.errors()[0]['msg']}")
        if q.get("update") is not None:
            _check_update(seed, q, where, rep)
        try:
            QueryAnalysis.model_validate_json(json.dumps(q.get("query")))
        except ValidationError as e:
            rep.errors.append(f"{where}: query invalid: {e.errors()[0]['loc']} {e.errors()[0]['msg']}")


def _check_long_questions(seed: Seed, rep: Report):
    asked = Counter(q.get("conversation_id") for q in seed.questions)
    for cid, conv in seed.conversations.items():
        if length(conv) == "long" and asked[cid] < LONG_QUESTIONS:
            rep.errors.append(
                f"questions.jsonl: long conversation {cid} has {asked[cid]} questions, {LONG_QUESTIONS}+ needed"
            )


def _check_update(seed: Seed, q: dict, where: str, rep: Report):
    """A knowledge-update question names the record holding the current answer and the one it replaced;
    the pair must be labelled SUPERSEDE in consolidation.jsonl."""
    u = q["update"]
    if not isinstance(u, dict) or set(u) != {"current", "replaced"}:
        rep.errors.append(f'{where}: update must be {{"current": memory id, "replaced": memory id}}')
        return
    try:
        _, i_new = seed.stored(q["conversation_id"], u["current"])
        _, i_old = seed.stored(q["conversation_id"], u["replaced"])
    except KeyError as e:
        rep.errors.append(f"{where}: update: {e.args[0]}")
        return
    if i_new <= i_old:
        rep.errors.append(f"{where}: update: current {u['current']} is not stated after replaced {u['replaced']}")
    if u["current"] not in (q.get("evidence_memory_ids") or []):
        rep.errors.append(f"{where}: update: current {u['current']} is not among evidence_memory_ids")
    if not any(
        p.get("new") == u["current"] and p.get("existing") == u["replaced"] and p.get("action") == "SUPERSEDE"
        for p in seed.pairs
    ):
        rep.errors.append(
            f"{where}: update: no SUPERSEDE pair ({u['current']} over {u['replaced']}) in consolidation.jsonl"
        )


def check_pairs(seed: Seed, rows: list[dict], file: str, rep: Report):
    """Consolidation pairs: both sides records of the conversation (the new one a gold memory id or an
    inline record with source_turn_id), the new one stated later, an action, and a merged record exactly
    for MERGE."""
    pair_keys = set()
    for where, p in _numbered(rows, file, "pair_id", rep):
        missing = {"pair_id", "conversation_id", "existing", "new", "action", "origin"} - set(p)
        if missing:
            rep.errors.append(f"{where}: missing {sorted(missing)}")
            continue
        cid = p["conversation_id"]
        if cid not in seed.conversations:
            rep.errors.append(f"{where}: unknown conversation {cid!r}")
            continue
        if not str(p["pair_id"]).startswith(f"{cid}-c"):
            rep.errors.append(f"{where}: pair_id should look like {cid}-c001")
        if p["action"] not in consolidator.ACTIONS:
            rep.errors.append(f"{where}: action {p['action']!r} not in {consolidator.ACTIONS}")
        if p["origin"] not in PAIR_ORIGINS:
            rep.errors.append(f"{where}: origin {p['origin']!r} not in {PAIR_ORIGINS}")
        if not isinstance(p["existing"], str):
            rep.errors.append(f"{where}: existing must be a gold memory id")
            continue
        if isinstance(p["new"], dict):
            extra = set(p["new"]) - {"source_turn_id", "content", "dimension", "is_plan"}
            if extra or not {"source_turn_id", "content", "dimension"} <= set(p["new"]):
                rep.errors.append(f"{where}: an inline new record has source_turn_id, content, dimension (and is_plan)")
                continue
        try:
            new, i_new = seed.stored(cid, p["new"])
            old, i_old = seed.stored(cid, p["existing"])
        except (KeyError, TypeError, ValidationError) as e:
            rep.errors.append(f"{where}: {e.args[0] if isinstance(e, KeyError) else e}".splitlines()[0])
            continue
        if i_new <= i_old:
            rep.errors.append(f"{where}: the new record's turn is not after the existing record's turn")
        key = (p["existing"], json.dumps(p["new"], sort_keys=True))
        if key in pair_keys:
            rep.errors.append(f"{where}: the same pair is labelled twice")
        pair_keys.add(key)
        merged = p.get("merged")
        if p["action"] == "MERGE":
            try:
                consolidator.MergedRecord.model_validate_json(json.dumps(merged))
            except ValidationError as e:
                rep.errors.append(f"{where}: merged invalid: {e.errors()[0]['loc']} {e.errors()[0]['msg']}")
        elif merged is not None:
            rep.errors.append(f"{where}: merged must be null unless the action is MERGE")


def _check_gate(seed: Seed, rep: Report):
    mem = {m["memory_id"]: m for m in seed.memories}
    for where, g in _numbered(seed.gate, "gate.jsonl", "gate_id", rep):
        cands = g.get("candidates") or []
        if not GATE_CANDIDATES[0] <= len(cands) <= GATE_CANDIDATES[1]:
            rep.errors.append(f"{where}: {len(cands)} candidates, need {GATE_CANDIDATES[0]}-{GATE_CANDIDATES[1]}")
        if [c.get("id") for c in cands] != list(range(1, len(cands) + 1)):
            rep.errors.append(f"{where}: candidate ids must be 1..{len(cands)}")
        if g.get("complexity") not in BUDGETS:
            rep.errors.append(f"{where}: complexity {g.get('complexity')!r}")
        if not set(g.get("kept_ids") or []) <= {c.get("id") for c in cands}:
            rep.errors.append(f"{where}: kept_ids not among candidate ids")
        for c in cands:
            m = mem.get(c.get("memory_id"))
            if m is None or m["conversation_id"] != g.get("conversation_id") or m["content"] != c.get("content"):
                rep.errors.append(f"{where}: candidate {c.get('id')} does not match gold record {c.get('memory_id')!r}")


def check_segments(seed: Seed, rows: list[dict], file: str, rep: Report, complete: bool = True):
    """Topic boundaries: each row names a real session; every change is a turn of that session, not its first
    (which opens an episode by construction), listed once and in order. `complete`: every session of every
    conversation has its row."""
    seen = set()
    for k, r in enumerate(rows, 1):
        where = f"{file} line {k} ({r.get('conversation_id')} {r.get('session_id')})"
        conv = seed.conversations.get(r.get("conversation_id"))
        session = next((x for x in conv.sessions if x.session_id == r.get("session_id")), None) if conv else None
        if session is None:
            rep.errors.append(f"{where}: no such conversation / session")
            continue
        key = (conv.conversation_id, session.session_id)
        if key in seen:
            rep.errors.append(f"{where}: a second row for this session")
        seen.add(key)
        ids = r.get("change_turn_ids")
        if not isinstance(ids, list) or not all(isinstance(i, str) for i in ids):
            rep.errors.append(f"{where}: change_turn_ids must be a list of turn ids")
            continue
        order = [t.turn_id for t in session.turns]
        for i in ids:
            if i not in order:
                rep.errors.append(f"{where}: change {i!r} is not a turn of this session")
            elif i == order[0]:
                rep.errors.append(f"{where}: change {i!r} is the session's first turn (an episode start already)")
        if len(set(ids)) != len(ids) or [i for i in order if i in ids] != [i for i in ids if i in order]:
            rep.errors.append(f"{where}: change_turn_ids repeat or are out of order")
    if complete and rows:
        missing = [f"{c.conversation_id} {x.session_id}" for c in seed.conversations.values() for x in c.sessions]
        missing = [m for m in missing if tuple(m.split(" ")) not in seen]
        if missing:
            rep.errors.append(f"{file}: no row for {len(missing)} session(s): {', '.join(missing[:5])}")


def _check_whole_conversations(seed: Seed, rows: list[dict], file: str, rep: Report):
    """Agreement is measured per session, so a conversation a file names is labelled whole."""
    have = {(r.get("conversation_id"), r.get("session_id")) for r in rows}
    for cid in dict.fromkeys(r.get("conversation_id") for r in rows):
        conv = seed.conversations.get(cid)
        missing = [x.session_id for x in conv.sessions if (cid, x.session_id) not in have] if conv else []
        if missing:
            rep.errors.append(f"{file}: {cid} has no row for session(s) {', '.join(missing)}")


def tree_windows(conv: Conversation) -> dict[str, summarizer.Window]:
    """The nodes a conversation's tree has above its leaves, by gold node id."""
    return {f"{conv.conversation_id}-{w.node_id}": w for w in summarizer.conversation_windows(conv)}


def _check_node(row: dict, conv: Conversation, where: str, rep: Report):
    level = row.get("level")
    if level == 5:
        people = summarizer.people(conv)
        profiles = row.get("profiles")
        named = [p.get("person") for p in profiles] if isinstance(profiles, list) else None
        if named is None or sorted(named) != sorted(people):
            rep.errors.append(f"{where}: profiles must be one per person of {people}, got {named}")
            return
        for p in profiles:
            bad = [f for f in summarizer.PROFILE_FIELDS if not isinstance(p.get(f), list)]
            bad += [
                f
                for f in summarizer.PROFILE_FIELDS
                if any(not isinstance(x, str) or not x.strip() for x in p.get(f) or [])
            ]
            if bad or not (p.get("identity") or p.get("events")):
                rep.errors.append(
                    f"{where}: {p.get('person')}: fields {sorted(set(bad))} must be lists of text "
                    "and identity or events non-empty"
                )
        return
    lo, hi = summarizer.WORDS[level]
    n = summarizer.words(str(row.get("summary") or ""))
    if not lo <= n <= hi:
        rep.errors.append(f"{where}: summary has {n} words, {lo}-{hi} expected for level {level}")


def check_tree(seed: Seed, rows: list[dict], file: str, rep: Report):
    """Every node names a window its conversation has, once; a conversation the file names has every node."""
    seen: dict[str, set] = defaultdict(set)
    for i, row in enumerate(rows, 1):
        where = f"{file}:{i} ({row.get('node_id')})"
        conv = seed.conversations.get(row.get("conversation_id"))
        if conv is None:
            rep.errors.append(f"{where}: unknown conversation {row.get('conversation_id')!r}")
            continue
        win = tree_windows(conv).get(row.get("node_id"))
        if win is None or row.get("level") != win.level or row.get("period") != win.name:
            rep.errors.append(f"{where}: not a node of {conv.conversation_id} (see tree-plan) or level/period differ")
            continue
        if row["node_id"] in seen[conv.conversation_id]:
            rep.errors.append(f"{where}: node written twice")
        seen[conv.conversation_id].add(row["node_id"])
        _check_node(row, conv, where, rep)
    for cid, have in seen.items():
        missing = sorted(set(tree_windows(seed.conversations[cid])) - have)
        if missing:
            rep.errors.append(f"{file}: {cid} lacks {len(missing)} node(s): {', '.join(missing[:6])}")


def tree_plan(seed: Seed, cid: str) -> list[dict]:
    return [
        {
            "node_id": nid,
            "conversation_id": cid,
            "level": w.level,
            "period": w.name,
            "start": w.start.isoformat(),
            "end": w.end.isoformat(),
            "sessions": list(w.sessions),
        }
        for nid, w in tree_windows(seed.conversations[cid]).items()
    ]


def _check_splits(seed: Seed, rep: Report, minimums: bool = True):
    n = len(seed.conversations)
    n_test = sum(1 for s in seed.split.values() if s == "test")
    if minimums and n and n_test / n < 0.2:
        rep.errors.append(f"splits: test holds {n_test}/{n} conversations, under 20%")
    # leakage: the same snippet text or memory content in two splits
    for kind, key in (("types", "text"), ("memories", "content"), ("questions", "question")):
        where = defaultdict(set)
        for r in getattr(seed, kind):
            if r.get("conversation_id") is None or r.get("conversation_id") in seed.split:
                where[" ".join(str(r.get(key, "")).lower().split())].add(seed.split_of(r))
        for text, splits in where.items():
            if len(splits) > 1:
                rep.errors.append(f"splits: {kind} text in {sorted(splits)}: {text[:80]!r}")


def _stats(seed: Seed, rep: Report):
    cols = list(SPLITS) + ["all"]

    def row(name, fn):
        return [name] + [fn(s) for s in SPLITS] + [fn(None)]

    def convs(s, style=None):
        return sum(
            1
            for c, v in seed.conversations.items()
            if (s is None or seed.split[c] == s) and (style is None or v.style == style)
        )

    def turns(s):
        return sum(len(c.turns) for cid, c in seed.conversations.items() if s is None or seed.split[cid] == s)

    rep.table(
        "Counts per split",
        ["file"] + cols,
        [
            row("conversations", convs),
            row("  multi-party", lambda s: convs(s, "multi-party")),
            row("  user-assistant", lambda s: convs(s, "user-assistant")),
            row("turns", turns),
            row("memories", lambda s: len(seed.rows("memories", s))),
            row("types", lambda s: len(seed.rows("types", s))),
            row("questions", lambda s: len(seed.rows("questions", s))),
            row("gate", lambda s: len(seed.rows("gate", s))),
            row("consolidation pairs", lambda s: len(seed.rows("pairs", s))),
            *[
                row(f"tree nodes L{lvl}", lambda s, lvl=lvl: sum(r.get("level") == lvl for r in seed.rows("tree", s)))
                for lvl in summarizer.SUMMARY_LEVELS
            ],
        ],
    )

    def dist(title, kind, key_fn, keys):
        rows = []
        for key in keys:
            rows.append(row(key, lambda s, key=key: sum(1 for r in seed.rows(kind, s) if key in key_fn(r))))
        total = row("(rows)", lambda s: len(seed.rows(kind, s)))
        rep.table(title, ["label"] + cols, rows + [total])

    dist("memory_type", "memories", lambda m: [m["dimension"]["memory_type"]], ["fact", "episodic", "profile"])
    dist(
        "Memory dimensions filled",
        "memories",
        lambda m: [k for k in ("time", "location", "reason", "purpose") if m["dimension"].get(k)],
        ["time", "location", "reason", "purpose"],
    )
    dist(
        "TriMEM labels (types.jsonl)",
        "types",
        lambda t: (
            t["labels"] + (["none"] if not t["labels"] else []) + (["multi-label"] if len(t["labels"]) > 1 else [])
        ),
        ["EM", "PM", "GM", "none", "multi-label"],
    )
    dist("Recall-plan complexity", "questions", lambda q: [q["plan"]["complexity"]], list(BUDGETS))
    cats = [c for cs in CATEGORIES.values() for c in cs]
    dist("Question categories", "questions", lambda q: [q.get("category")], cats)
    dist(
        "Query analysis",
        "questions",
        lambda q: (
            (["need_assistant_context"] if q["query"]["need_assistant_context"] else [])
            + [f"answer_dim={q['query']['answer_dim'] or '(reasoning)'}"]
        ),
        ["need_assistant_context"]
        + [f"answer_dim={a}" for a in ("content", "time", "location", "reason", "purpose", "keywords", "(reasoning)")],
    )
    if seed.pairs:
        dist(
            "Consolidation pairs (consolidation.jsonl)",
            "pairs",
            lambda p: (
                [p["action"], f"origin={p['origin']}"] + (["inline new record"] if isinstance(p["new"], dict) else [])
            ),
            [*consolidator.ACTIONS, *(f"origin={o}" for o in PAIR_ORIGINS), "inline new record"],
        )
        dist("Knowledge-update questions", "questions", lambda q: ["update"] if q.get("update") else [], ["update"])
    if seed.gate:
        rep.table(
            "Gate examples",
            ["complexity", "examples", "mean candidates", "mean kept"],
            [
                [
                    c,
                    len(g),
                    round(sum(len(x["candidates"]) for x in g) / len(g), 1),
                    round(sum(len(x["kept_ids"]) for x in g) / len(g), 1),
                ]
                for c in BUDGETS
                if (g := [x for x in seed.gate if x["complexity"] == c])
            ],
        )


# --- gate examples ------------------------------------------------------------------------------

_WORD = re.compile(r"[a-z0-9]+")


def build_gate(seed: Seed, rng_seed: int = 13) -> list[dict]:
    """One gate example per question with gold evidence records.

    Candidates are the question's evidence records plus distractors from the same conversation: first
    those sharing the most words with the question (hard negatives), then random ones, up to 10-30
    candidates, shuffled with a fixed seed. Kept ids are the evidence records (cut to the budget).
    """
    rng = random.Random(rng_seed)
    out = []
    for q in seed.questions:
        evid = [m for m in seed.memories if m["memory_id"] in set(q.get("evidence_memory_ids") or [])]
        if not evid:
            continue
        qwords = set(_WORD.findall(q["question"].lower())) - planner._STOP
        others = [m for m in seed.memories_of(q["conversation_id"]) if m not in evid]

        def overlap(m, qwords=qwords):
            return len(qwords & set(_WORD.findall(m["content"].lower())))

        hard = sorted((m for m in others if overlap(m)), key=lambda m: (-overlap(m), m["memory_id"]))
        rest = [m for m in others if not overlap(m)]
        rng.shuffle(rest)
        n_total = min(
            GATE_CANDIDATES[1], max(GATE_CANDIDATES[0], len(evid) + rng.randint(9, 19)), len(evid) + len(others)
        )
        if n_total < GATE_CANDIDATES[0]:
            continue
        n_hard = min(len(hard), (n_total - len(evid)) * 2 // 3)
        pool = evid + hard[:n_hard] + (rest + hard[n_hard:])[: n_total - len(evid) - n_hard]
        rng.shuffle(pool)
        keep_ids = {m["memory_id"] for m in evid}
        cands = [{"id": i, "memory_id": m["memory_id"], "content": m["content"]} for i, m in enumerate(pool, 1)]
        kept = [c["id"] for c in cands if c["memory_id"] in keep_ids][: BUDGETS[q["plan"]["complexity"]]]
        out.append(
            {
                "gate_id": q["question_id"],
                "conversation_id": q["conversation_id"],
                "question": q["question"],
                "question_date": q["question_date"],
                "complexity": q["plan"]["complexity"],
                "candidates": cands,
                "kept_ids": kept,
            }
        )
    return out


def merge_parts(parts: list[Path], seed_dir=SEED_DIR) -> Report:
    """Append each part's rows to the corpus files, after the corpus's own (so gate.jsonl, rebuilt here, keeps its
    earlier examples); the writer's plan.md moves to plans/<conversation>.md and the part folder goes. A part
    that fails check-part, or holds a conversation the corpus has, is refused before anything is written."""
    seed_dir = Path(seed_dir)
    have = set(load(seed_dir).conversations)
    for part in parts:
        rep = check(part, minimums=False)
        clash = have & set(load(part).conversations)
        if not rep.ok or clash:
            raise SourceError(
                f"{part}: not merged: " + ("; ".join(rep.errors[:3]) or f"conversations {sorted(clash)} exist")
            )
        have |= set(load(part).conversations)
    for part in parts:
        for f in ("conversations.jsonl", *FILES.values()):
            if (part / f).exists():
                append_jsonl(seed_dir / f, load_jsonl(part / f, SourceError))
        if (part / "plan.md").exists():
            (seed_dir / "plans").mkdir(exist_ok=True)
            (part / "plan.md").rename(seed_dir / "plans" / f"{part.name}.md")
        for f in part.iterdir():
            f.unlink()
        part.rmdir()
    write_jsonl(seed_dir / "gate.jsonl", build_gate(load(seed_dir)))
    return check(seed_dir)


if __name__ == "__main__":
    if len(sys.argv) >= 3 and sys.argv[1] == "merge-parts":
        rep = merge_parts([Path(d) for d in sys.argv[2:]])
        print(rep.render())
        sys.exit(0 if rep.ok else 1)
    if len(sys.argv) >= 3 and sys.argv[1] == "check-pairs":
        seed, rep = load(SEED_DIR), Report()
        for f in sys.argv[2:]:
            check_pairs(seed, load_jsonl(Path(f), SourceError), f, rep)
        print("\n".join(rep.errors) or "pairs valid")
        sys.exit(1 if rep.errors else 0)
    if len(sys.argv) >= 3 and sys.argv[1] == "check-part":
        reports = {d: check(d, minimums=False) for d in sys.argv[2:]}
        for d, rep in reports.items():
            print(f"# {d}\n{rep.render()}")
        sys.exit(0 if all(r.ok for r in reports.values()) else 1)
    if len(sys.argv) >= 3 and sys.argv[1] == "check-tree":
        seed, rep = load(SEED_DIR), Report()
        for f in sys.argv[2:]:
            rows = load_jsonl(Path(f), SourceError)
            check_tree(seed, rows, f, rep)
            if not rows:
                rep.errors.append(f"{f}: no nodes")
        print("\n".join(rep.errors) or "tree nodes valid")
        sys.exit(1 if rep.errors else 0)
    if len(sys.argv) >= 4 and sys.argv[1] == "tree-plan":
        seed = load(sys.argv[2])
        for cid in sys.argv[3:]:
            print("".join(json.dumps(r) + "\n" for r in tree_plan(seed, cid)), end="")
        sys.exit(0)
    if len(sys.argv) >= 2 and sys.argv[1] == "gate":
        d = Path(sys.argv[2]) if len(sys.argv) > 2 else SEED_DIR
        rows = build_gate(load(d))
        (d / "gate.jsonl").write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
        print(f"wrote {len(rows)} gate examples to {d / 'gate.jsonl'}")
    else:
        print(__doc__)
        sys.exit(2)
