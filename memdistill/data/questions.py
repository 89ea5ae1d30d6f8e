"""Benchmark questions with their evidence turns: the gold test split, LoCoMo and LongMemEval.

LoCoMo questions are asked after the last session; LongMemEval gives each instance one question and
flags its evidence turns (`has_answer`), else names its answer sessions.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime

from memdistill.data import seed as seedlib
from memdistill.data.sources import SourceError, load
from memdistill.spec.dialogue import Conversation, parse_timestamp
from memdistill.spec.query_parser import QueryAnalysis

LOCOMO_CATEGORIES = {1: "multi-hop", 2: "temporal", 3: "open-domain", 4: "single-hop", 5: "adversarial"}


@dataclass
class Question:
    question_id: str
    conversation_id: str
    question: str
    question_date: datetime | None
    answer: str
    category: str
    evidence: list[str]  # turn ids that hold the answer
    query: QueryAnalysis | None = None  # gold query analysis, when the dataset has one
    # knowledge-update questions of the seed corpus: the turns holding the current and the replaced answer
    update_turns: tuple[str, str] | None = None
    # the same as gold record ids (current, replaced): what a bank holding the gold records is checked on
    update_records: tuple[str, str] | None = None


def _split_ids(value) -> list[str]:
    """LoCoMo evidence ids come as lists, sometimes with several ids in one string ("D8:6; D9:17")."""
    items = value if isinstance(value, list) else [value]
    return [p for x in items if x is not None for p in re.split(r"[;,\s]+", str(x)) if p]


def locomo_questions(conv: Conversation, include_adversarial: bool = False) -> tuple[list[Question], list[str]]:
    """Questions of a LoCoMo sample (kept in Conversation.meta["qa"] by memdistill.data.sources). Asked after the
    last session. Evidence ids absent from the conversation are dropped and reported."""
    turn_ids = {t.turn_id for t in conv.turns}
    asked = conv.sessions[-1].date_time
    out, notes = [], []
    for i, item in enumerate(conv.meta.get("qa") or [], 1):
        qid = f"{conv.conversation_id}-q{i:03d}"
        cat = LOCOMO_CATEGORIES.get(item.get("category"), str(item.get("category")))
        if cat == "adversarial" and not include_adversarial:
            continue
        if "question" not in item:
            raise SourceError(f"{conv.conversation_id}: qa[{i - 1}] has no 'question'")
        answer = item.get("answer", item.get("adversarial_answer", ""))
        ev = _split_ids(item.get("evidence") or [])
        bad = [e for e in ev if e not in turn_ids]
        if bad:
            notes.append(f"{qid}: evidence {bad} not in the conversation, dropped")
        out.append(
            Question(
                qid,
                conv.conversation_id,
                str(item["question"]),
                asked,
                str(answer),
                cat,
                [e for e in ev if e in turn_ids],
            )
        )
    return out, notes


def longmemeval_question(conv: Conversation) -> Question:
    """The instance's one question. Evidence: the turns flagged has_answer, else every turn of the
    answer sessions (answer_session_ids)."""
    m = conv.meta
    ev = [t.turn_id for t in conv.turns if t.meta.get("has_answer")]
    if not ev:
        answer_sessions = set(m.get("answer_session_ids") or [])
        ev = [t.turn_id for s in conv.sessions if s.session_id in answer_sessions for t in s.turns]
    qd = parse_timestamp(m["question_date"]) if m.get("question_date") else None
    return Question(
        conv.conversation_id,
        conv.conversation_id,
        str(m.get("question") or ""),
        qd,
        str(m.get("answer", "")),
        str(m.get("question_type") or "unknown"),
        ev,
    )


def seed_questions(seed, split: str | None = "test") -> list[Question]:
    def turns(u):
        return (
            (seed.memory(u["current"])["source_turn_id"], seed.memory(u["replaced"])["source_turn_id"]) if u else None
        )

    return [
        Question(
            q["question_id"],
            q["conversation_id"],
            q["question"],
            parse_timestamp(q["question_date"]),
            str(q.get("answer", "")),
            q.get("category") or "unknown",
            list(q.get("evidence") or []),
            QueryAnalysis.model_validate(q["query"]) if q.get("query") else None,
            turns(q.get("update")),
            (q["update"]["current"], q["update"]["replaced"]) if q.get("update") else None,
        )
        for q in seed.rows("questions", split)
    ]


def load_questions(fmt: str, path, split: str = "test", include_adversarial: bool = False):
    """(conversations by id, questions, notes, seed or None) for a LoCoMo file, a LongMemEval file or the
    seed corpus directory."""
    if fmt == "seed":
        seed = seedlib.load(path)
        qs, notes = seed_questions(seed, split), []
        if not include_adversarial:  # as LoCoMo's category 5: their "evidence" turns only look related
            unanswerable = [q for q in qs if q.category in seedlib.UNANSWERABLE]
            qs = [q for q in qs if q.category not in seedlib.UNANSWERABLE]
            notes += [f"{len(unanswerable)} unanswerable questions ({', '.join(seedlib.UNANSWERABLE)}) left out"]
        ids = {q.conversation_id for q in qs}
        return {c: seed.conversations[c] for c in seed.conversations if c in ids}, qs, notes if qs else [], seed
    convs = load(fmt, path)
    qs, notes = [], []
    for c in convs:
        if fmt == "locomo":
            got, n = locomo_questions(c, include_adversarial)
            qs += got
            notes += n
        elif fmt == "longmemeval":
            qs.append(longmemeval_question(c))
        else:
            raise SourceError(f"format {fmt!r} has no questions; expected seed, locomo or longmemeval")
    return {c.conversation_id: c for c in convs}, qs, notes, None
