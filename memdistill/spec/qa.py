"""End-to-end QA over recalled memories: the answering prompt and the LLM-judge prompt.

The memory runtime (memdistill.runtime.retrieval) recalls records for a question; `render_memories` turns them into
the context block the answering model reads (and whose tokens count as the query's memory cost).
The answer model replies {"answer": ...}; a judge model compares that answer with the reference and
replies {"reason": ..., "verdict": "correct" | "wrong"}. Both parsers accept the usual mess (think
blocks, fences, prose, bare labels such as CORRECT / yes) and never raise on model output.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Literal

from pydantic import BaseModel, ConfigDict

from memdistill.spec.dialogue import format_timestamp, parse_timestamp
from memdistill.spec.jsonout import Problem, load_json, norm_str, strip_wrappers


class AnswerOutput(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    answer: str


class JudgeOutput(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    reason: str  # first, so a constrained decoder writes its reasoning before committing
    verdict: Literal["correct", "wrong"]


def answer_schema() -> dict:
    return AnswerOutput.model_json_schema()


def judge_schema() -> dict:
    return JudgeOutput.model_json_schema()


# --- the recalled context -----------------------------------------------------------------------


def render_memory(
    content: str,
    said_on=None,
    time: str = "",
    location: str = "",
    reason: str = "",
    purpose: str = "",
    speaker: str | None = None,
    reply: str | None = None,
) -> str:
    """One recalled memory as one line: the date of the message it came from, the sentence, and the
    dimensions that are filled. `reply` is the assistant message attached on demand (DimMem's
    assistant-context recall)."""
    head = f"[{parse_timestamp(said_on).date().isoformat()}] " if said_on else ""
    dims = [
        f"{k}: {v}" for k, v in (("time", time), ("location", location), ("reason", reason), ("purpose", purpose)) if v
    ]
    line = head + (f"{speaker}: " if speaker else "") + " ".join(content.split())
    if dims:
        line += " (" + "; ".join(dims) + ")"
    if reply:
        line += f"\n   assistant replied: {' '.join(reply.split())}"
    return line


def render_memories(lines: list[str]) -> str:
    return "\n".join(f"{i}. {line}" for i, line in enumerate(lines, 1)) if lines else "(no memories recalled)"


# --- answering ----------------------------------------------------------------------------------

ANSWER_SYSTEM = """\
You answer a question about someone's earlier conversations. Below the question you get the memories a
memory system recalled for it: one numbered line each, starting with the date of the message it was
taken from, sometimes followed by its time, place, reason or purpose.
Use only these memories. Work out relative dates ("last week", "two days ago") from the message date
of the memory that states them, and prefer the most recent memory when two disagree. When the
memories do not hold the answer, say it is not mentioned instead of guessing.
Keep the answer short: a phrase or one or two sentences, with the exact names, numbers and dates.
Reply with JSON only: {"answer": "..."}"""


def answer_messages(question: str, question_date, context: str) -> list[dict]:
    when = format_timestamp(parse_timestamp(question_date)) if question_date else "unknown"
    user = f"Memories:\n{context}\n\nToday: {when}\nQuestion: {' '.join(question.split())}"
    return [{"role": "system", "content": ANSWER_SYSTEM}, {"role": "user", "content": user}]


@dataclass
class AnswerParse:
    answer: str | None = None
    problems: list[Problem] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.answer is not None


_ANSWER_PREFIX = re.compile(r"^\s*(?:final\s+)?answer\s*[:\-]\s*", re.I)


def parse_answer(raw: str | None) -> AnswerParse:
    """{"answer": ...} -> the answer; without JSON, the plain text (an "Answer:" prefix dropped)."""
    res = AnswerParse()
    value, problems = load_json(raw)
    if isinstance(value, dict) and ("answer" in value or "response" in value):
        res.answer = norm_str(value.get("answer", value.get("response"))) or None
        res.problems = [p for p in problems if p.code == "prose_around_json"]
        if res.answer is None:
            res.problems.append(Problem("empty_answer", "the answer field is empty"))
        return res
    text, _ = strip_wrappers(raw or "")
    text = _ANSWER_PREFIX.sub("", text).strip().strip('"').strip()
    if not text:
        res.problems.append(Problem("empty_output", "the model gave no answer"))
        return res
    res.answer = text
    res.problems.append(Problem("answer_from_text", "no JSON answer object; the plain text was taken"))
    return res


# --- judging ------------------------------------------------------------------------------------

JUDGE_SYSTEM = """\
You grade an answer to a question about someone's earlier conversations, comparing it with a reference
answer written by a person who knows the conversations.
The answer is correct when it gives the same key information as the reference: the same person, thing,
place, number or time, in any wording or format and however much longer, as long as nothing it adds
contradicts the reference. It is wrong when it gives a different value, covers only part of a
reference that has several parts, hedges between options, or says it does not know while the reference
gives an answer.
{note}Reply with JSON only: {{"reason": "<one short sentence>", "verdict": "correct" or "wrong"}}"""

# Extra rules for question kinds whose references are read differently.
JUDGE_NOTES = {
    "temporal": "For times and dates: any format counts, and relative expressions count when they point to "
    "the same day or period as the reference. A count of days, weeks or months that is off by "
    "one still counts as correct.",
    "update": "The facts changed over time: the answer is correct when it gives the latest value in the "
    "reference, even if it also mentions the earlier one as history.",
    "preference": "The reference describes what a good personalised reply looks like rather than a single "
    "fact: the answer is correct when it uses the person's stated preferences in the way the "
    "reference describes; it need not cover every point.",
    "abstention": "The reference says the information is not in the conversations: the answer is correct "
    "only when it says so too, and wrong when it states an answer.",
}
_NOTE_FOR_CATEGORY = {
    "temporal": "temporal",
    "temporal-reasoning": "temporal",
    "knowledge-update": "update",
    "single-session-preference": "preference",
    "adversarial": "abstention",
}


def judge_note(category: str | None, question_id: str = "") -> str | None:
    """Which JUDGE_NOTES entry applies (LongMemEval marks abstention questions with an `_abs` id)."""
    if str(question_id).endswith("_abs"):
        return "abstention"
    return _NOTE_FOR_CATEGORY.get(category or "")


def judge_messages(
    question: str, reference: str, answer: str, category: str | None = None, question_id: str = ""
) -> list[dict]:
    note = judge_note(category, question_id)
    system = JUDGE_SYSTEM.format(note=f"{JUDGE_NOTES[note]}\n" if note else "")
    user = (
        f"Question: {' '.join(question.split())}\nReference answer: {' '.join(str(reference).split())}\n"
        f"Answer to grade: {' '.join(str(answer).split())}"
    )
    return [{"role": "system", "content": system}, {"role": "user", "content": user}]


@dataclass
class VerdictParse:
    correct: bool | None = None
    problems: list[Problem] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.correct is not None


_POSITIVE = {"correct", "right", "yes", "true", "pass", "accurate"}
_NEGATIVE = {"wrong", "incorrect", "no", "false", "fail", "inaccurate"}
# "correct" / "wrong" are verdicts wherever they stand; yes / no / true ... often occur in the reasoning
# ("no mention of ..."), so they count only when no strong word is there.
_STRONG = {"correct", "incorrect", "wrong"}
_VERDICT_WORD = re.compile(
    r"(?:\b(not|never)\s+|n't\s+)?\b(correct|incorrect|wrong|right|yes|no|true|false|pass|fail|"
    r"accurate|inaccurate)\b",
    re.I,
)
_VERDICT_KEYS = ("verdict", "label", "judgement", "judgment", "grade", "result", "correct", "is_correct", "answer")


def _polarity(value) -> bool | None:
    if isinstance(value, bool):
        return value
    if isinstance(value, (int, float)) and value in (0, 1):
        return bool(value)
    words = norm_str(value).lower().strip(" .!\"'")
    if words in _POSITIVE:
        return True
    if words in _NEGATIVE:
        return False
    return None


def parse_verdict(raw: str | None) -> VerdictParse:
    """A judge output -> correct / wrong / None (unreadable).

    Reads {"verdict": ...} (or label / judgement / correct / ...: "CORRECT", "yes", true, 1); without a
    usable JSON verdict it reads the verdict words of the text, negations included ("not correct"),
    and takes the last one, reporting when earlier ones disagree.
    """
    res = VerdictParse()
    value, problems = load_json(raw)
    if isinstance(value, dict):
        for key in _VERDICT_KEYS:
            if key in value and (p := _polarity(value[key])) is not None:
                res.correct = p
                res.problems = [x for x in problems if x.code == "prose_around_json"]
                return res
    text, _ = strip_wrappers(raw or "")
    if isinstance(value, dict):  # a JSON object without a readable verdict: look at its values only
        text = " ".join(norm_str(v) for v in value.values())
    found = []  # (strong word?, polarity) in text order
    for m in _VERDICT_WORD.finditer(text):
        word = m.group(2).lower()
        negated = bool(m.group(1)) or m.group(0).startswith("n't")
        found.append((word in _STRONG, (word in _POSITIVE) != negated))
    if any(strong for strong, _ in found):
        found = [x for x in found if x[0]]
    found = [p for _, p in found]
    if not found:
        res.problems.append(Problem("unreadable_verdict", "neither correct nor wrong"))
        return res
    res.correct = found[-1]
    res.problems.append(Problem("verdict_from_text", "verdict read from plain text"))
    if len(set(found)) > 1:
        res.problems.append(Problem("conflicting_verdict", "the text says both; the last verdict was taken"))
    return res
