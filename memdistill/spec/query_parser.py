"""DimMem query analysis: question + question date -> a structured retrieval query.

Served by the extractor's own adapter (multi-task): same model, different system prompt.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from memdistill.spec.compact import Answer, CompactModel, Request
from memdistill.spec.dialogue import format_timestamp, parse_timestamp
from memdistill.spec.extractor import MEMORY_TYPES, TYPE_ALIASES, MemoryType, inline_refs
from memdistill.spec.jsonout import Problem, load_json, norm_bool, norm_keywords, norm_str
from memdistill.spec.render import sft_row

ANSWER_DIMS = ("content", "time", "location", "reason", "purpose", "keywords", "")
AnswerDim = Literal["content", "time", "location", "reason", "purpose", "keywords", ""]
QUERY_TIME_PATTERN = r"^(?:|(?:on|before|after|around) \S.*|between \S.* and \S.*)$"
_QT_RE = re.compile(QUERY_TIME_PATTERN, re.S)


class QueryDimension(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    target_memory_type: list[MemoryType] = Field(default_factory=list)
    keywords: list[str] = Field(default_factory=list)
    time: str = Field(default="", pattern=QUERY_TIME_PATTERN)
    location: str = ""


class QueryAnalysis(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    query_anchor: str = Field(min_length=1)
    need_assistant_context: bool = False
    dimension: QueryDimension
    answer_dim: AnswerDim = ""


# Bounds for constrained decoding only, about twice the longest gold value (anchor 123 characters, 6 keywords
# of up to 43, time 33, location 21): a schema without them lets a looping model write one string until the
# token cap, which is then unparseable JSON.
MAX_ANCHOR_CHARS = 240
MAX_KEYWORDS = 8
MAX_KEYWORD_CHARS = 60
MAX_FIELD_CHARS = 80


def json_schema() -> dict:
    schema = inline_refs(QueryAnalysis.model_json_schema())
    schema["properties"]["query_anchor"]["maxLength"] = MAX_ANCHOR_CHARS
    dim = schema["properties"]["dimension"]["properties"]
    dim["target_memory_type"]["maxItems"] = len(MEMORY_TYPES)
    dim["keywords"]["maxItems"] = MAX_KEYWORDS
    dim["keywords"]["items"]["maxLength"] = MAX_KEYWORD_CHARS
    dim["location"]["maxLength"] = MAX_FIELD_CHARS
    # xgrammar ignores maxLength beside a pattern, so the bound goes into the pattern itself
    n = MAX_FIELD_CHARS - len("between  and ") - 2
    dim["time"]["pattern"] = (
        rf"^(?:|(?:on|before|after|around) \S.{{0,{MAX_FIELD_CHARS - 8}}}|between \S.{{0,{n // 2}}} and \S.{{0,{n // 2}}})$"
    )
    return schema


TEACHER_SYSTEM = """\
You turn a question about someone's past conversations into a structured retrieval query for a
memory store. Answer with JSON only, no explanation or code fences:
{"query_anchor": "", "need_assistant_context": false, "dimension": {"target_memory_type": [], "keywords": [], "time": "", "location": ""}, "answer_dim": ""}

Fields:
- query_anchor: the question restated as a plain sentence that would match the memory holding the
  answer. Write "the user" for I / me / my. Keep its intent and every constraint (time, place,
  quantity, order). A sentence, not a keyword list.
- need_assistant_context: true only when the question asks what the assistant said, suggested,
  recommended or explained, or points back to an earlier chat ("last time we talked", "remind me",
  "you told me", "following up on our conversation"). Otherwise false.
- dimension.target_memory_type: which record types likely hold the answer, any of fact (stable facts,
  identity, relationships, status, possessions), episodic (events, actions, trips, purchases, plans,
  progress), profile (preferences, habits, interests, goals, style). [] when unsure.
- dimension.keywords: short phrases for the entities, people, objects, tools, places, activities and
  topics in the question. [] if none.
- dimension.time: only an explicit time constraint, written "on T", "before T", "after T",
  "around T" or "between A and B", with dates as YYYY-MM-DD (or YYYY-MM, YYYY). Resolve relative
  phrases ("this year", "last month", "yesterday") against the question date. Frequency words
  (daily, often) are not constraints. If the question asks for the time itself, leave time "" and
  set answer_dim to "time".
- dimension.location: only an explicit place, platform or setting constraint. If the question asks
  for the place itself, leave it "" and set answer_dim to "location".
- answer_dim: the record field that holds the answer: "content", "time", "location", "reason",
  "purpose" or "keywords" (a name, object or tool); "" when answering needs counting, comparing,
  ranking, reasoning, recommending or summarising."""

STUDENT_SYSTEM = """\
Parse the question into a memory retrieval query. Reply with JSON only:
{"query_anchor": "...", "need_assistant_context": false, "dimension": {"target_memory_type": [], "keywords": [], "time": "", "location": ""}, "answer_dim": ""}
query_anchor restates the question as a sentence ("the user" for I/me). need_assistant_context is
true when it asks what the assistant said or refers to an earlier chat. target_memory_type from fact,
episodic, profile. time is "on/before/after/around T" or "between A and B", resolved against the
question date, only for an explicit constraint. answer_dim is content, time, location, reason,
purpose, keywords, or "" when reasoning is needed."""


def user_message(question: str, question_date) -> str:
    when = format_timestamp(parse_timestamp(question_date)) if question_date else "unknown"
    return f"Question date: {when}\nQuestion: {' '.join(question.split())}"


def chat_messages(question: str, question_date, prompt: str = "student") -> list[dict]:
    system = STUDENT_SYSTEM if prompt == "student" else TEACHER_SYSTEM
    return [{"role": "system", "content": system}, {"role": "user", "content": user_message(question, question_date)}]


def render_completion(q: QueryAnalysis) -> str:
    return json.dumps(q.model_dump(), ensure_ascii=False, separators=(",", ":"))


@dataclass
class ParseResult:
    query: QueryAnalysis | None = None
    problems: list[Problem] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.query is not None

    def to_json(self) -> dict:
        return {
            "records": [self.query.model_dump()] if self.query else [],
            "problems": [p.to_json() for p in self.problems],
        }


def parse(raw: str | None) -> ParseResult:
    res = ParseResult()
    value, problems = load_json(raw)
    res.problems.extend(problems)
    if value is None:
        return res
    if not isinstance(value, dict):
        res.problems.append(Problem("wrong_shape", "expected a JSON object"))
        return res
    dim = value.get("dimension")
    if not isinstance(dim, dict):
        if any(k in value for k in ("target_memory_type", "keywords", "time", "location")):
            res.problems.append(Problem("flattened_dimension", "dimension fields found at top level"))
            dim = value
        else:
            dim = {}
            res.problems.append(Problem("missing_dimension", "no dimension object; empty constraints used"))

    anchor = norm_str(value.get("query_anchor"))
    if not anchor:
        res.problems.append(Problem("empty_anchor", "query_anchor is missing or empty"))
        return res

    nac = norm_bool(value.get("need_assistant_context", False))
    if nac is None:
        res.problems.append(
            Problem("bad_bool", f"need_assistant_context {value.get('need_assistant_context')!r} read as false")
        )
        nac = False

    types_in = dim.get("target_memory_type") or []
    if isinstance(types_in, str):
        types_in = [t for t in re.split(r"[,;|/ ]+", types_in) if t]
    types = []
    for t in types_in if isinstance(types_in, list) else []:
        t = TYPE_ALIASES.get(norm_str(t).lower(), norm_str(t).lower())
        if t in MEMORY_TYPES and t not in types:
            types.append(t)
        elif t not in MEMORY_TYPES:
            res.problems.append(Problem("bad_memory_type", f"target_memory_type {t!r} dropped"))

    kws, notes = norm_keywords(dim.get("keywords"))
    res.problems.extend(Problem("keywords_normalised", n) for n in notes)

    qt = " ".join(norm_str(dim.get("time")).split())
    if qt and qt.split(" ", 1)[0].lower() in ("on", "before", "after", "around", "between"):
        qt = qt[0].lower() + qt[1:]
    if not _QT_RE.match(qt):
        res.problems.append(
            Problem("invalid_time", f"time {qt!r} emptied: expected on/before/after/around T or between A and B")
        )
        qt = ""

    ad = norm_str(value.get("answer_dim")).lower()
    if ad not in ANSWER_DIMS:
        res.problems.append(Problem("bad_answer_dim", f"answer_dim {value.get('answer_dim')!r} read as ''"))
        ad = ""

    res.query = QueryAnalysis(
        query_anchor=anchor,
        need_assistant_context=nac,
        dimension=QueryDimension(
            target_memory_type=types, keywords=kws, time=qt, location=norm_str(dim.get("location"))
        ),
        answer_dim=ad,
    )
    return res


def time_range(qt: str):
    """(first day, last day) a query time constraint admits, open ends as None; None for ""."""
    from memdistill.spec.extractor import time_bounds

    if not qt:
        return None
    op, _, rest = qt.partition(" ")
    try:
        if op == "between":
            a, _, b = rest.partition(" and ")
            return time_bounds(a.strip())[0], time_bounds(b.strip())[1]
        lo, hi = time_bounds(rest.strip())
    except (ValueError, TypeError):
        return None
    return {"on": (lo, hi), "around": (lo, hi), "before": (None, hi), "after": (lo, None)}.get(op)


# --- the compact model ----------------------------------------------------------------------------


def training_rows(inp: dict, label: dict, **_) -> list[dict]:
    messages = chat_messages(inp["question"], inp["question_date"], "student")
    return [sft_row(messages, render_completion(QueryAnalysis.model_validate(label)), task=MODEL.name)]


def read_teacher(texts: list[str], inp: dict) -> Answer:
    res = parse(texts[0])
    return Answer(res.ok, res.query.model_dump() if res.ok else None, res.problems)


MODEL = CompactModel(
    name="query_parser",
    summary="DimMem query parser (the extractor's LM and adapter): a question and its date -> query anchor, "
    "assistant trigger, target memory types, keywords, time and location constraints, answer dimension; DimMem 3.3",
    head="lm",
    unit="question",
    training_set="extractor",
    rows=training_rows,
    requests=lambda inp: [
        Request(chat_messages(inp["question"], inp["question_date"], "teacher"), json_schema(), "query")
    ],
    read=read_teacher,
    parse=parse,
    gold_label=lambda q: q["query"],
    max_tokens=512,
)
