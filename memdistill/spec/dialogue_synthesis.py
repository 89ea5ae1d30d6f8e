"""Teacher-written dialogues: two personas -> a multi-session LoCoMo-style conversation plus questions.

DimMem (seeds/001, section 3.5, "Learning the Structured Extractor") trains its extractor on 5K
teacher-generated LoCoMo-style examples and 5K from UltraChat's training split, never on benchmark
conversations. This module is the contract for the first half: the prompt, the JSON Schema the
teacher answers under, and a parser that never raises. memdistill.data.synth runs it; the fake
teacher answers it.

A reply: {"sessions": [{"date_time": "YYYY-MM-DDTHH:MM", "turns": [{"speaker", "text", "image_caption"}]}],
          "questions": [{"question", "answer"}]}
`image_caption` is "" unless the speaker shares a photo (LoCoMo's turns carry BLIP captions of shared
images). Questions are asked after the last session, as LoCoMo's are; they feed the query-analysis,
planner and gate jobs with questions no benchmark contains.

Problem codes that reject a dialogue (HARD): empty_output, no_json, invalid_json, wrong_shape,
no_sessions, bad_date, dates_out_of_order, unknown_speaker, short_session, one_speaker. The others
are noted and repaired: empty_turn and bad_question (dropped), wrong_session_count,
turn_count_out_of_range, wrong_question_count, date_before_start.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import datetime

from pydantic import BaseModel, ConfigDict, Field

from memdistill.spec.dialogue import TimestampError, parse_timestamp
from memdistill.spec.jsonout import Problem, load_json, norm_str

HARD = {
    "empty_output",
    "no_json",
    "invalid_json",
    "wrong_shape",
    "no_sessions",
    "bad_date",
    "dates_out_of_order",
    "unknown_speaker",
    "short_session",
    "one_speaker",
}
DATE_PATTERN = r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}(:\d{2})?$"
MAX_TEXT, MAX_CAPTION, MAX_QUESTION = 600, 200, 300


class Persona(BaseModel):
    """One persona seed line (data/personas/personas.jsonl)."""

    model_config = ConfigDict(extra="forbid", strict=True)
    persona_id: str = Field(min_length=1)
    name: str = Field(min_length=1, pattern=r"^[A-Z][A-Za-z'-]+$")  # a first name: the speaker label
    age: int = Field(ge=16, le=99)
    occupation: str = Field(min_length=1)
    home: str = Field(min_length=1)
    traits: list[str] = Field(min_length=1)
    goals: list[str] = Field(min_length=1)
    interests: list[str] = Field(min_length=1)

    def line(self) -> str:
        return (
            f"{self.name}, {self.age}, {self.occupation}, lives in {self.home}. Traits: {'; '.join(self.traits)}. "
            f"Goals: {'; '.join(self.goals)}. Interests: {'; '.join(self.interests)}."
        )


@dataclass(frozen=True)
class Request:
    """What one conversation should look like; fixed by the job before asking."""

    a: Persona
    b: Persona
    start: datetime
    sessions: int
    turns: tuple[int, int]  # per session, inclusive
    questions: int

    @property
    def names(self) -> tuple[str, str]:
        return self.a.name, self.b.name


TEACHER_SYSTEM = """\
You write realistic chat conversations between two people for a dataset about long-term memory. The
two people are friends or acquaintances who text each other over several months. Each session is one
sitting of messages on one date. Across sessions their lives move on: they mention things that
happened since they last talked (trips, purchases, jobs, family news, hobbies, setbacks), make and
later follow up on plans, change some preferences or facts (a new job, a move, a new pet) and refer
back to earlier sessions. Use relative time phrases now and then ("last Saturday", "two weeks ago",
"next month") that make sense given the session date. Give names, places, dates, numbers and reasons,
so that the details can be remembered and asked about later. Keep messages natural: mostly one to
three sentences, some small talk, no narration and no stage directions. Now and then, about one
message in ten, a speaker shares a photo: describe the photo in one short sentence in image_caption
and let the message refer to it; otherwise image_caption is "".
Then write questions a reader could answer only by remembering the conversation: what happened,
when (as a date), where, why, who, what changed, and some that combine details from different
sessions. Give each a short answer.
Answer with JSON only, no explanation or code fences:
{"sessions": [{"date_time": "YYYY-MM-DDTHH:MM", "turns": [{"speaker": "", "text": "", "image_caption": ""}]}],
 "questions": [{"question": "", "answer": ""}]}"""


def user_message(req: Request) -> str:
    lo, hi = req.turns
    return (
        f"Person A: {req.a.line()}\n"
        f"Person B: {req.b.line()}\n"
        f"Sessions: {req.sessions}\n"
        f"Messages per session: {lo} to {hi}\n"
        f"First session: on or after {req.start.strftime('%Y-%m-%dT%H:%M')}; later sessions a few days to a "
        f"few weeks apart, in date order\n"
        f"Questions: {req.questions}\n"
        f"Speakers are written exactly {req.a.name} and {req.b.name}."
    )


def chat_messages(req: Request) -> list[dict]:
    return [{"role": "system", "content": TEACHER_SYSTEM}, {"role": "user", "content": user_message(req)}]


def json_schema(req: Request) -> dict:
    """Bounded to the request (speakers, session and turn counts, string lengths), so a looping decoder
    still closes its JSON; the parser checks the same things for endpoints without structured outputs."""
    lo, hi = req.turns
    turn = {
        "type": "object",
        "additionalProperties": False,
        "required": ["speaker", "text", "image_caption"],
        "properties": {
            "speaker": {"type": "string", "enum": list(req.names)},
            "text": {"type": "string", "minLength": 1, "maxLength": MAX_TEXT},
            "image_caption": {"type": "string", "maxLength": MAX_CAPTION},
        },
    }
    session = {
        "type": "object",
        "additionalProperties": False,
        "required": ["date_time", "turns"],
        "properties": {
            "date_time": {"type": "string", "pattern": DATE_PATTERN},
            "turns": {"type": "array", "items": turn, "minItems": lo, "maxItems": hi},
        },
    }
    question = {
        "type": "object",
        "additionalProperties": False,
        "required": ["question", "answer"],
        "properties": {
            "question": {"type": "string", "minLength": 1, "maxLength": MAX_QUESTION},
            "answer": {"type": "string", "minLength": 1, "maxLength": MAX_QUESTION},
        },
    }
    return {
        "type": "object",
        "additionalProperties": False,
        "required": ["sessions", "questions"],
        "properties": {
            "sessions": {"type": "array", "items": session, "minItems": req.sessions, "maxItems": req.sessions},
            "questions": {"type": "array", "items": question, "minItems": req.questions, "maxItems": req.questions},
        },
    }


@dataclass
class ParseResult:
    # {"date_time": datetime, "turns": [{"speaker", "text", "image_caption"}]}
    sessions: list[dict] = field(default_factory=list)
    questions: list[dict] = field(default_factory=list)  # {"question", "answer"}
    problems: list[Problem] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return bool(self.sessions) and not any(p.code in HARD for p in self.problems)


def _norm_name(s: str) -> str:
    return re.sub(r"[^a-z]", "", s.lower())


def parse(raw: str | None, req: Request) -> ParseResult:
    """The teacher's dialogue, checked against the request. Never raises; `ok` is false when a HARD
    problem was found (the sessions parsed so far are kept for the reject log only)."""
    res = ParseResult()
    value, problems = load_json(raw)
    res.problems += problems
    if value is None:
        return res
    if not isinstance(value, dict) or not isinstance(value.get("sessions", []), list):
        res.problems.append(Problem("wrong_shape", "expected an object with a list under 'sessions'"))
        return res
    names = {_norm_name(n): n for n in req.names}
    lo, hi = req.turns
    prev = None
    for s, sess in enumerate(value.get("sessions") or []):
        if not isinstance(sess, dict) or not isinstance(sess.get("turns"), list):
            res.problems.append(Problem("wrong_shape", "a session should be an object with a list of turns", s))
            return res
        try:
            when = parse_timestamp(sess.get("date_time"))
        except TimestampError as e:
            res.problems.append(Problem("bad_date", str(e), s))
            continue
        if prev is not None and when <= prev:
            res.problems.append(Problem("dates_out_of_order", f"session {s + 1} ({when}) is not after {prev}", s))
        elif prev is None and when < req.start:
            res.problems.append(Problem("date_before_start", f"first session {when} before {req.start}", s))
        prev = when
        turns = []
        for k, t in enumerate(sess["turns"]):
            t = t if isinstance(t, dict) else {}
            speaker, text = names.get(_norm_name(norm_str(t.get("speaker")))), " ".join(norm_str(t.get("text")).split())
            if speaker is None:
                where = f"session {s + 1} turn {k + 1}"
                res.problems.append(Problem("unknown_speaker", f"{where}: {t.get('speaker')!r}", s))
                continue
            if not text:
                res.problems.append(Problem("empty_turn", f"session {s + 1} turn {k + 1} dropped", s))
                continue
            turns.append({"speaker": speaker, "text": text, "image_caption": norm_str(t.get("image_caption"))})
        if len(turns) < 2:
            res.problems.append(Problem("short_session", f"session {s + 1} has {len(turns)} usable turn(s)", s))
        elif not lo <= len(turns) <= hi:
            res.problems.append(Problem("turn_count_out_of_range", f"session {s + 1}: {len(turns)} turns", s))
        res.sessions.append({"date_time": when, "turns": turns})
    if not res.sessions:
        res.problems.append(Problem("no_sessions", "no usable session"))
        return res
    if len(res.sessions) != req.sessions:
        res.problems.append(Problem("wrong_session_count", f"{len(res.sessions)} sessions, asked {req.sessions}"))
    if len({t["speaker"] for sess in res.sessions for t in sess["turns"]}) < 2:
        res.problems.append(Problem("one_speaker", "only one of the two people speaks"))
    qs = value.get("questions")
    for i, q in enumerate(qs if isinstance(qs, list) else []):
        q = q if isinstance(q, dict) else {}
        question, answer = norm_str(q.get("question")), norm_str(q.get("answer"))
        if question and answer:
            res.questions.append({"question": " ".join(question.split()), "answer": " ".join(answer.split())})
        else:
            res.problems.append(Problem("bad_question", "a question without question or answer text dropped", i))
    if len(res.questions) != req.questions:
        res.problems.append(Problem("wrong_question_count", f"{len(res.questions)} questions, asked {req.questions}"))
    return res
