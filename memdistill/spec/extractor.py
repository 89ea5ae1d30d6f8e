"""DimMem memory extraction: a dialogue window -> {"memories": [record, ...]}.

Owns the record schema (pydantic + JSON Schema for structured outputs), the teacher and student
prompts, the completion format the student is trained on, and `parse`, which turns any model output
into valid records plus problems.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from datetime import date
from typing import Iterable, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from memdistill.spec.compact import Answer, CompactModel, Request
from memdistill.spec.dialogue import Window
from memdistill.spec.jsonout import Problem, load_json, norm_keywords, norm_str
from memdistill.spec.render import sft_row

MEMORY_TYPES = ("fact", "episodic", "profile")
MemoryType = Literal["fact", "episodic", "profile"]

# Obvious synonyms small models and other memory stacks use for the three types.
TYPE_ALIASES = {
    "facts": "fact",
    "factual": "fact",
    "semantic": "fact",
    "knowledge": "fact",
    "status": "fact",
    "event": "episodic",
    "events": "episodic",
    "episode": "episodic",
    "episodic memory": "episodic",
    "experience": "episodic",
    "plan": "episodic",
    "activity": "episodic",
    "preference": "profile",
    "preferences": "profile",
    "persona": "profile",
    "habit": "profile",
    "personal": "profile",
    "trait": "profile",
    "user profile": "profile",
}

_D = r"\d{4}(?:-(?:0[1-9]|1[0-2])(?:-(?:0[1-9]|[12]\d|3[01]))?)?"
TIME_PATTERN = rf"^(?:|{_D}(?:/{_D})?)$"
_TIME_RE = re.compile(TIME_PATTERN)


class Dimension(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    memory_type: MemoryType
    time: str = Field(default="", pattern=TIME_PATTERN)
    location: str = ""
    reason: str = ""
    purpose: str = ""
    keywords: list[str] = Field(default_factory=list)


class MemoryRecord(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    source_id: int = Field(ge=1)
    source_speaker: str | None = None
    content: str = Field(min_length=1)
    dimension: Dimension


class ExtractionOutput(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    memories: list[MemoryRecord]


# Decoding-time bounds (not part of the record contract): the gold corpus has at most 6 records per
# message, no content over 400 characters and no field over 200, so these only stop a looping model,
# never a good one.
MAX_RECORDS_PER_MESSAGE = 6
MAX_CONTENT_CHARS = 400
MAX_FIELD_CHARS = 200
MAX_KEYWORDS = 8
MAX_KEYWORD_CHARS = 60  # the longest gold keyword has 43


def json_schema(window: Window | None = None) -> dict:
    """JSON Schema of the output, self-contained (no $ref) so every structured-output backend takes it.

    With a window it is tightened for constrained decoding: source_id can only name one of the
    window's extractable messages, and lists and strings are bounded, so a model caught in a loop
    still closes its JSON instead of running to max_tokens. The parser validates either way.
    """
    schema = inline_refs(ExtractionOutput.model_json_schema())
    if window is None:
        return schema
    extractable = [n for n, _ in window.extractable()]
    memories = schema["properties"]["memories"]
    memories["maxItems"] = MAX_RECORDS_PER_MESSAGE * len(extractable)
    record = memories["items"]["properties"]
    record["source_id"] = {"type": "integer", "enum": extractable}
    record["content"]["maxLength"] = MAX_CONTENT_CHARS
    dim = record["dimension"]["properties"]
    for k in ("location", "reason", "purpose"):
        dim[k]["maxLength"] = MAX_FIELD_CHARS
    dim["keywords"]["maxItems"] = MAX_KEYWORDS
    dim["keywords"]["items"]["maxLength"] = MAX_KEYWORD_CHARS
    return schema


def inline_refs(schema: dict) -> dict:
    defs = schema.pop("$defs", {})

    def walk(node):
        if isinstance(node, dict):
            if "$ref" in node:
                return walk(dict(defs[node["$ref"].split("/")[-1]]))
            return {k: walk(v) for k, v in node.items() if k != "title"}
        if isinstance(node, list):
            return [walk(v) for v in node]
        return node

    return walk(schema)


def time_problem(value: str) -> str | None:
    """Why `value` is not a valid record time, or None when it is."""
    if not _TIME_RE.match(value):
        return "not YYYY-MM-DD, YYYY-MM, YYYY or A/B"
    try:
        bounds = [_time_bounds(p) for p in value.split("/")] if value else []
    except ValueError as e:
        return f"not a calendar date ({e})"
    if len(bounds) == 2 and bounds[0][0] > bounds[1][1]:
        return "range starts after it ends"
    return None


def _time_bounds(part: str) -> tuple[date, date]:
    bits = [int(b) for b in part.split("-")]
    if len(bits) == 3:
        d = date(*bits)
        return d, d
    if len(bits) == 2:
        start = date(bits[0], bits[1], 1)
        nxt = date(bits[0] + bits[1] // 12, bits[1] % 12 + 1, 1)
        return start, date.fromordinal(nxt.toordinal() - 1)
    return date(bits[0], 1, 1), date(bits[0], 12, 31)


def time_bounds(value: str) -> tuple[date, date] | None:
    """First and last day a valid record time covers (None for "")."""
    if not value:
        return None
    parts = [_time_bounds(p) for p in value.split("/")]
    return parts[0][0], parts[-1][1]


# --- prompts ------------------------------------------------------------------------------------

_TYPE_RULES = """\
memory_type is exactly one of:
- fact: something stable that is true now: identity, job, relationships, where someone lives, what they
  own or use (tools, models, datasets, configurations), a status, a confirmed choice.
- episodic: one specific happening: an event, action, experience, trip, purchase, meeting, a step of
  progress, or a plan for the future, usually with a time or place.
- profile: what someone is like over time: preferences, likes and dislikes, habits, interests, values,
  long-term goals, skills, communication or writing style.
Do not generalise one event into a profile."""

_DIMENSION_RULES = """\
Dimensions (every field present; use "" or [] when the dialogue gives no clear support, never guess):
- time: when it happened, is planned, or holds. Absolute only: YYYY-MM-DD, YYYY-MM, YYYY, or a range
  START/END (e.g. 2023-05-01/2023-05-07). Resolve relative expressions ("yesterday", "last week",
  "next month", "two weeks ago") against the timestamp of the message that says them, never against
  today's date. content must state the same time.
- location: a place, venue, platform, organisation, workplace or environment named or clearly implied.
- reason: the cause, motive or trigger stated for it. Not the goal.
- purpose: the goal, intention or expected result stated for it. Not the cause.
- keywords: a few short noun phrases for retrieval (people, things, places, activities, tools, topics),
  no sentences, no repeats, no filler words."""

TEACHER_SYSTEM = f"""\
You turn a conversation into long-term memory records. Read the numbered messages and write every
piece of information worth remembering later as a structured record. Answer with JSON only: no
explanation, no Markdown, no code fences.

Output shape:
{{"memories": [{{"source_id": 4, "source_speaker": "Name", "content": "...", "dimension": {{"memory_type": "fact", "time": "", "location": "", "reason": "", "purpose": "", "keywords": []}}}}]}}
With nothing to remember, answer {{"memories": []}}.

What to record:
- identities, backgrounds, relationships, jobs, homes, possessions, health, current situations;
- events, activities, trips, purchases, meetings, shared photos, progress and future plans;
- lasting preferences, habits, interests, values, goals, abilities and styles;
- for assistant messages, concrete recommendations, named items, figures and explanations that the
  user may ask about later (write them as what the assistant said, e.g. "The assistant recommended ...").
What not to record: greetings, thanks, bare confirmations ("ok", "sure"), generic reactions ("that's
great"), one-off formatting or task instructions with no lasting value. A message that opens with
thanks or a reaction can still hold information: record that information.

Each record:
- source_id: the number of the message the record mainly comes from; source_speaker: that message's
  speaker exactly as written.
- content: one complete sentence that stands on its own: name the people (in user-assistant chats
  "the user" and "the assistant"), replace pronouns and vague references, include the time, place,
  reason and purpose when the message gives them. Add nothing the dialogue does not support.
- one record per fact, event, plan or trait: split a message that holds several; merge only true
  repeats, and never drop a detail when merging.
- when a message corrects or updates something said earlier, record the new state and say what changed.

{_TYPE_RULES}

{_DIMENSION_RULES}

Windows overlap: the user message says which messages are earlier context. Use context messages only
to understand the others (who "she" is, what "that trip" was, which day "yesterday" was); never take a
record's source_id from them.

Style-specific guidance:
{{style_rules}}"""

STYLE_RULES = {
    "multi-party": "This is a chat between people. Extract from every speaker's messages, going message by "
    "message; prefer fine-grained records to missing details about people, dates, places, "
    "photos, plans, reasons and purposes. Always fill source_speaker.",
    "user-assistant": "This is a chat between a user and an AI assistant. Most records come from the user's "
    "messages; take from the assistant's messages only the concrete recommendations and "
    "facts the user may want recalled. Write 'the user' and 'the assistant' in content.",
}

STUDENT_SYSTEM = """\
Extract long-term memories as JSON: {"memories": [{"source_id": N, "content": "", "dimension": {"memory_type": "fact|episodic|profile", "time": "", "location": "", "reason": "", "purpose": "", "keywords": []}}]}
One self-contained sentence per fact, event or trait. Leave out empty dimensions. time: YYYY-MM-DD, YYYY-MM,
YYYY or START/END, resolved against the message date. Skip filler and context messages."""

# The student prompts by name. A trained model's metadata names the one its rows were rendered with
# (`student_prompt`, read by `core.models.trained_prompt`); serving, the SDK and eval send that one, since a
# 135M model only follows the prompt it was trained under. "student-short" is issue 13's prompt-length lever:
# the record shape is left to the completions to teach.
STUDENT_PROMPTS = {
    "student": STUDENT_SYSTEM,
    "student-short": "Extract long-term memories as JSON.",
}


def user_message(window: Window) -> str:
    """The per-window user turn: which messages may be sources, then the rendered window."""
    n = len(window.turns)
    new = f"message {n}" if window.extract_from == n else f"messages {window.extract_from}-{n}"
    if window.overlap:
        head = f"Messages 1-{window.overlap} are context only. Extract from {new}."
    else:
        head = f"Extract from {new}."
    return f"{head}\n\n{window.text}"


def teacher_system(style: str) -> str:
    if style not in STYLE_RULES:
        raise ValueError(f"unknown conversation style {style!r}; expected one of {sorted(STYLE_RULES)}")
    return TEACHER_SYSTEM.replace("{style_rules}", STYLE_RULES[style])


def chat_messages(window: Window, prompt: str = "student", style: str = "multi-party") -> list[dict]:
    """System + user messages for one window. `prompt` names a student prompt (STUDENT_PROMPTS: what the
    trained model sees) or is "teacher" (every rule, for labelling)."""
    if prompt == "teacher":
        system = teacher_system(style)
    elif prompt in STUDENT_PROMPTS:
        system = STUDENT_PROMPTS[prompt]
    else:
        raise ValueError(
            f"unknown extraction prompt {prompt!r}; expected 'teacher' or one of {sorted(STUDENT_PROMPTS)}"
        )
    return [{"role": "system", "content": system}, {"role": "user", "content": user_message(window)}]


def compact_record(record: MemoryRecord) -> dict:
    """A record as the student writes it: without what the window or the schema already determines.

    source_speaker is the speaker of message source_id, and an empty dimension is "" or [] by default, so
    neither is generated (about a fifth of the output tokens of the gold records); `parse` restores both,
    so every consumer still gets the full DimMem record."""
    out = record.model_dump(exclude={"source_speaker"})
    out["dimension"] = {k: v for k, v in out["dimension"].items() if k == "memory_type" or v}
    return out


def render_completion(records: Iterable[MemoryRecord], compact: bool = True) -> str:
    """The exact assistant text the student is trained to produce (key order fixed). compact=False keeps
    every field (the full DimMem record), for comparison and for models trained before schema 1.1."""
    items = [compact_record(r) if compact else r.model_dump(exclude_none=True) for r in records]
    return json.dumps({"memories": items}, ensure_ascii=False, separators=(",", ":"))


# --- parsing ------------------------------------------------------------------------------------


@dataclass
class ParseResult:
    records: list[MemoryRecord] = field(default_factory=list)
    problems: list[Problem] = field(default_factory=list)
    raw_count: int = 0  # how many candidate records the output held before validation

    @property
    def ok(self) -> bool:
        """Parsed as valid JSON of the right shape (records may still have been dropped)."""
        return not any(p.code in FATAL_CODES for p in self.problems)

    def to_json(self) -> dict:
        return {
            "records": [r.model_dump(exclude_none=True) for r in self.records],
            "problems": [p.to_json() for p in self.problems],
        }


FATAL_CODES = {"empty_output", "no_json", "invalid_json", "wrong_shape"}
_DIM_KEYS = ("memory_type", "time", "location", "reason", "purpose", "keywords")


def parse(raw: str | None, window: Window | None = None) -> ParseResult:
    """Any model output -> valid records + problems. Never raises on the output's content.

    With a window, records whose source_id lies in the overlap or outside the window are rejected (except
    past the end of a window with one message to extract from, which determines the source: `source_fixed`),
    and source_speaker is filled in (or corrected) from the window.
    """
    result = ParseResult()
    value, problems = load_json(raw, list_key="memories")
    result.problems.extend(problems)
    if value is None:
        return result
    if not isinstance(value, dict) or not isinstance(value.get("memories"), list):
        result.problems.append(Problem("wrong_shape", 'expected {"memories": [...]}'))
        return result
    items = value["memories"]
    result.raw_count = len(items)
    seen = set()
    for i, item in enumerate(items):
        rec = _normalise_record(item, i, window, result.problems)
        if rec is None:
            continue
        # Small models fall into loops that repeat a record's content, often under the next message's
        # number; a memory store wants each memory once (the gold corpus never repeats a content).
        key = " ".join(rec.content.lower().split())
        if key in seen:
            result.problems.append(
                Problem("duplicate_record", f"content repeats an earlier record (message {rec.source_id})", i)
            )
            continue
        seen.add(key)
        result.records.append(rec)
    return result


def _normalise_record(item, i: int, window: Window | None, problems: list[Problem]) -> MemoryRecord | None:
    def reject(code, detail):
        problems.append(Problem(code, detail, i))
        return None

    if not isinstance(item, dict):
        return reject("bad_record", f"record is a {type(item).__name__}, not an object")
    item = dict(item)
    dim = item.pop("dimension", None)
    if dim is None and any(k in item for k in _DIM_KEYS):
        problems.append(Problem("flattened_dimension", "dimension fields found at record level", i))
        dim = {k: item.pop(k) for k in _DIM_KEYS if k in item}
    if not isinstance(dim, dict):
        return reject("missing_dimension", "record has no dimension object")
    dim = dict(dim)

    # source_id
    sid = item.get("source_id")
    if isinstance(sid, str) and sid.strip().lstrip("#").isdigit():
        sid = int(sid.strip().lstrip("#"))
    if isinstance(sid, float) and sid.is_integer():
        sid = int(sid)
    if not isinstance(sid, int) or isinstance(sid, bool):
        return reject("bad_source_id", f"source_id {item.get('source_id')!r} is not a message number")
    if window is not None:
        last = len(window.turns)
        if sid > last and window.extract_from == last:
            # A window with one message to extract from determines the source, as it determines the speaker:
            # a number past its end is a model citing the position the new message had in its training
            # windows (a short window at a conversation or topic start). Corrected and counted, like speakers.
            problems.append(Problem("source_fixed", f"source_id {sid} -> {last} (the one message to extract from)", i))
            sid = last
        if not 1 <= sid <= last:
            return reject("source_out_of_range", f"source_id {sid} is outside messages 1-{last}")
        if sid < window.extract_from:
            return reject(
                "source_in_overlap", f"source_id {sid} is a context message (extract from {window.extract_from})"
            )

    # memory_type: case and obvious aliases
    mt = norm_str(dim.get("memory_type")).lower()
    mt = TYPE_ALIASES.get(mt, mt)
    if mt not in MEMORY_TYPES:
        return reject("bad_memory_type", f"memory_type {dim.get('memory_type')!r} is not fact, episodic or profile")
    if mt != dim.get("memory_type"):
        problems.append(Problem("memory_type_normalised", f"{dim.get('memory_type')!r} -> {mt!r}", i))

    kws, notes = norm_keywords(dim.get("keywords"))
    for note in notes:
        problems.append(Problem("keywords_normalised", note, i))

    t = norm_str(dim.get("time"))
    if (why := time_problem(t)) is not None:
        problems.append(Problem("invalid_time", f"time {t!r} emptied: {why}", i))
        t = ""

    speaker = item.get("source_speaker")
    speaker = norm_str(speaker) or None
    if window is not None:
        actual = window.turn_for(sid).speaker
        if speaker is not None and speaker.lower() != actual.lower():
            problems.append(Problem("speaker_mismatch", f"source_speaker {speaker!r} -> {actual!r} (message {sid})", i))
        speaker = actual

    extra = set(item) - {"source_id", "source_speaker", "content"} | set(dim) - set(_DIM_KEYS)
    if extra:
        problems.append(Problem("extra_fields", f"ignored fields: {', '.join(sorted(extra))}", i))

    content = norm_str(item.get("content"))
    if not content:
        return reject("empty_content", "record has no content")
    try:
        return MemoryRecord(
            source_id=sid,
            source_speaker=speaker,
            content=content,
            dimension=Dimension(
                memory_type=mt,
                time=t,
                location=norm_str(dim.get("location")),
                reason=norm_str(dim.get("reason")),
                purpose=norm_str(dim.get("purpose")),
                keywords=kws,
            ),
        )
    except ValidationError as e:  # pragma: no cover - normalisation above should make this unreachable
        return reject("schema_invalid", str(e).splitlines()[0])


def records_for_window(window: Window, gold: Iterable[dict]) -> list[MemoryRecord]:
    """Gold records a window may produce: those whose source turn is one of its extractable messages.

    `gold` holds seed-corpus records (`source_turn_id`, `content`, `dimension`, ...); source_id
    becomes the message number in this window. Order follows the window, then the gold order.
    """
    number = {t.turn_id: n for n, t in window.extractable()}
    picked = [(number[g["source_turn_id"]], k, g) for k, g in enumerate(gold) if g["source_turn_id"] in number]
    return [
        MemoryRecord(
            source_id=n,
            source_speaker=g.get("source_speaker") or window.turn_for(n).speaker,
            content=g["content"],
            dimension=Dimension(**g["dimension"]),
        )
        for n, _, g in sorted(picked, key=lambda x: (x[0], x[1]))
    ]


# --- the compact model ----------------------------------------------------------------------------


def training_rows(inp: dict, label: dict, prompt: str = "student", compact: bool = True) -> list[dict]:
    """inp: a window (`Window.to_json`), its conversation style and window setting; label: its records."""
    w = Window.from_json(inp["window"])
    recs = [MemoryRecord.model_validate(r) for r in label["records"]]
    return [
        sft_row(
            chat_messages(w, prompt),
            render_completion(recs, compact),
            task=MODEL.name,
            window_index=w.window_index,
            window=list(inp["window_setting"]),
            style=inp["style"],
            n_records=len(recs),
            student_prompt=prompt,
        )
    ]


def dropped(text: str, window: Window, res: ParseResult) -> list[Problem]:
    """One `record_dropped` problem per raw record the parser did not keep, detailed with the parser's
    own last code for that record (source_in_overlap, bad_memory_type, duplicate_record, ...)."""
    if res.raw_count <= len(res.records):
        return []
    value, _ = load_json(text, list_key="memories")
    kept = [r.model_dump() for r in res.records]
    out = []
    for i, raw in enumerate(value.get("memories", []) if isinstance(value, dict) else []):
        alone = parse(json.dumps({"memories": [raw]}), window).records
        if alone and alone[0].model_dump() in kept:
            kept.remove(alone[0].model_dump())
            continue
        codes = [p.code for p in res.problems if p.index == i]
        out.append(Problem("record_dropped", codes[-1] if codes else "unknown", i))
    return out


def read_teacher(texts: list[str], inp: dict) -> Answer:
    w = Window.from_json(inp["window"])
    res = parse(texts[0], w)
    label = {"records": [x.model_dump(exclude_none=True) for x in res.records], "raw_count": res.raw_count}
    return Answer(res.ok, label, res.problems + dropped(texts[0], w, res))


MODEL = CompactModel(
    name="extractor",
    summary="DimMem extractor: a dialogue window -> typed memory records (content, memory_type, time, location, "
    "reason, purpose, keywords); DimMem 3.2",
    head="lm",
    unit="window",
    rows=training_rows,
    requests=lambda inp: [
        Request(chat_messages(Window.from_json(inp["window"]), "teacher", inp["style"]), json_schema(), "memories")
    ],
    read=read_teacher,
    parse=parse,
    gold_label=lambda g: {"records": g["records"]},
)
