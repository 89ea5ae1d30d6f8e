"""TiMem's level summarizer: the memory consolidator that writes the nodes of the temporal memory tree
above its leaves (seed 000, section 3.1-3.2, formula 1; appendix B).

The tree has five levels. L1 leaves are the extractor's records of one message (TiMem's segments of one
turn), and each higher node is written from its children, the `HISTORY` most recent nodes of its own
level, and an instruction for its level, when its time window closes:

    L2 session   the session's events and facts            window: the session
    L3 day       the day's events, routines and interests  window: the calendar day
    L4 week      repeated behaviour and what changed        window: the ISO week (Monday to Sunday)
    L5 month     a profile per person, refined monthly      window: the calendar month

Only a window that holds a session gets a node, so each level has at most as many nodes as the one
below (TiMem's progressive consolidation). This module states the windows, the output's shape and its
parser; the tree itself lives in `memdistill.runtime.tree`.
"""

from __future__ import annotations

import datetime as dt
import json
import re
from dataclasses import dataclass, field

from memdistill.spec.compact import Answer, CompactModel, Request
from memdistill.spec.jsonout import Problem, load_json
from memdistill.spec.render import sft_row

LEVELS = {1: "segment", 2: "session", 3: "day", 4: "week", 5: "month"}
SUMMARY_LEVELS = (2, 3, 4, 5)
HISTORY = 3  # w_i: same-level nodes shown for continuity (section 3.2.1, "w_i = 3 across all levels")
PROFILE_FIELDS = ("identity", "events", "traits", "preferences", "changes")
# Word bounds for gold and for the parser's warnings; TiMem's own prompts ask for 200-600 words a node,
# far past what a 135M student writes well, so the project's nodes are short and dense.
WORDS = {2: (20, 150), 3: (15, 130), 4: (20, 160)}
# answer caps in SmolLM2 tokens: above the longest gold answer of the level (354 / 183 / 308 / 773)
MAX_TOKENS = {2: 448, 3: 256, 4: 384, 5: 896}


def period(level: int, when: dt.datetime, session_id: str) -> str:
    """The name of the level-`level` window that holds a session starting at `when`."""
    if level == 2:
        return session_id
    if level == 3:
        return when.date().isoformat()
    if level == 4:
        year, week, _ = when.isocalendar()
        return f"{year}-W{week:02d}"
    if level == 5:
        return f"{when.year}-{when.month:02d}"
    raise ValueError(f"level {level}: summary levels are {SUMMARY_LEVELS}")


def bounds(level: int, name: str, start: dt.datetime | None = None, end: dt.datetime | None = None):
    """The [start, end] of a window: a session's own first and last times; a calendar window's first and
    last second (a day, an ISO week, a month)."""
    if level == 2:
        return start, end
    if level == 3:
        day = dt.date.fromisoformat(name)
        first, last = day, day
    elif level == 4:
        year, week = name.split("-W")
        first = dt.date.fromisocalendar(int(year), int(week), 1)
        last = first + dt.timedelta(days=6)
    elif level == 5:
        first = dt.date.fromisoformat(name + "-01")
        last = (first.replace(day=28) + dt.timedelta(days=4)).replace(day=1) - dt.timedelta(days=1)
    else:
        raise ValueError(f"level {level}: summary levels are {SUMMARY_LEVELS}")
    return dt.datetime.combine(first, dt.time.min), dt.datetime.combine(last, dt.time(23, 59, 59))


@dataclass(frozen=True)
class Window:
    """One node to write: its level, window name, interval and the sessions inside it."""

    level: int
    name: str
    start: dt.datetime
    end: dt.datetime
    sessions: tuple[str, ...]

    @property
    def node_id(self) -> str:
        return f"L{self.level}-{self.name}"


def windows(sessions: list[tuple[str, dt.datetime, dt.datetime]]) -> list[Window]:
    """Every window of levels 2-5 over (session id, start, end) triples, in order of closing time and,
    at one closing time, lower levels first (a day closes before the week it ends). Each window's sessions
    are those of its children, so a parent holds its children whole: a week whose sessions fall in two months
    belongs to the month it closes in (its last session's)."""
    week_end: dict[str, dt.datetime] = {}
    for sid, start, _ in sessions:
        name = period(4, start, sid)
        week_end[name] = max(week_end.get(name, start), start)
    out = []
    for level in SUMMARY_LEVELS:
        groups: dict[str, list] = {}
        for sid, start, end in sessions:
            when = week_end[period(4, start, sid)] if level == 5 else start
            groups.setdefault(period(level, when, sid), []).append((sid, start, end))
        for name, members in groups.items():
            first = min(s for _, s, _ in members)
            last = max(e for _, _, e in members)
            lo, hi = bounds(level, name, first, last)
            out.append(Window(level, name, lo, hi, tuple(sid for sid, _, _ in members)))
    return sorted(out, key=lambda w: (w.end, w.level))


def conversation_windows(conv) -> list[Window]:
    """The windows of a `spec.dialogue.Conversation`, each session spanning its first to last turn."""
    return windows([(s.session_id, s.turns[0].timestamp, s.turns[-1].timestamp) for s in conv.sessions if s.turns])


def people(conv) -> list[str]:
    """Whom a level-5 profile describes: both speakers of a multi-party chat, the user of an assistant's."""
    return ["User"] if conv.style == "user-assistant" else list(conv.speakers)


def words(text: str) -> int:
    return len(text.split())


def profile_text(profile: list[dict]) -> str:
    """A level-5 profile (one entry per person) as the text stored and retrieved."""
    parts = []
    for p in profile:
        lines = [f"{p['person']}."]
        for f in PROFILE_FIELDS:
            if p.get(f):
                lines.append(f"{f.capitalize()}: " + "; ".join(p[f]) + ".")
        parts.append(" ".join(lines))
    return "\n".join(parts)


# --- the request: formula 1's children, history and level instruction -----------------------------

INSTRUCTIONS = {
    2: "Summarize one conversation session. State its facts, events, plans, decisions and corrections "
    "(what was corrected, and to what), and in an assistant's chat what the assistant concretely recommended. "
    "Third person, names as given, dates as YYYY-MM-DD; no greetings or small talk. 20-150 words.",
    3: "Summarize one day against the days before it: what the day brought, which interests and routines recur, "
    "what is new. Keep the key facts and dates. 15-130 words.",
    4: "Summarize one week: its events in a line each, then patterns (behaviour seen more than once), "
    "preferences shown by repeated choices, and what changed against earlier weeks, from what to what. "
    "20-160 words.",
    5: "Refine the profile of each person as of this month's end, starting from the previous profile: identity "
    "(role, work, family, place), events (the month's 2-5 defining events, dated), traits (behaviour seen at "
    "least twice, as behaviour, not adjectives), preferences, changes (from what to what, this month). "
    "Short sentences; drop what the month contradicts.",
}
TEACHER_SYSTEM = (
    "You consolidate an agent's long-term memory into a temporal tree: each node summarizes the memories "
    "below it for one period (a session, a day, a week, a month). Use only the memories given; never invent "
    "or guess. Earlier nodes of the same level are there for continuity: say what continues or changes, do not "
    "repeat them. Answer with JSON only, in the schema given."
)
STUDENT_SYSTEM = "Write the memory-tree node as JSON."


def json_schema(level: int) -> dict:
    if level != 5:
        return {"type": "object", "properties": {"summary": {"type": "string"}}, "required": ["summary"],
                "additionalProperties": False}  # fmt: skip
    texts = {"type": "array", "items": {"type": "string"}}
    person = {
        "type": "object",
        "properties": {"person": {"type": "string"}} | {f: texts for f in PROFILE_FIELDS},
        "required": ["person", *PROFILE_FIELDS],
        "additionalProperties": False,
    }
    return {"type": "object", "properties": {"profiles": {"type": "array", "items": person}}, "required": ["profiles"],
            "additionalProperties": False}  # fmt: skip


def request(window: Window, children: list[tuple], history: list[tuple], people: list[str]) -> dict:
    """One node's input: its window, children as (end time, text) and the previous same-level nodes as
    (period, text), oldest first. The runtime and the gold corpus build it alike."""
    return {
        "level": window.level,
        "period": window.name,
        "start": window.start.isoformat(),
        "end": window.end.isoformat(),
        "people": list(people),
        "history": [{"period": p, "text": t} for p, t in history],
        "children": [{"when": f"{when:%Y-%m-%d}", "text": t} for when, t in children],
    }


def user_message(request: dict) -> str:
    """One node's input as text: level, window, people, the previous same-level nodes, the child memories.
    `request`: {"level", "period", "start", "end", "people", "history": [{"period", "text"}],
    "children": [{"when", "text"}]} (`memdistill.runtime.tree.NodeRequest.to_json`)."""
    lines = [
        f"LEVEL: L{request['level']} {LEVELS[request['level']]} {request['period']} "
        f"({request['start'][:10]} to {request['end'][:10]})",
        "PEOPLE: " + ", ".join(request["people"]),
        "EARLIER NODES:",
        *([f"- {h['period']}: {h['text']}" for h in request["history"]] or ["- (none)"]),
        "MEMORIES:",
        *[f"- [{c['when']}] {c['text']}" for c in request["children"]],
    ]
    return "\n".join(lines)


def chat_messages(request: dict, prompt: str = "student") -> list[dict]:
    level = request["level"]
    system = f"{TEACHER_SYSTEM}\n\n{INSTRUCTIONS[level]}" if prompt == "teacher" else f"{STUDENT_SYSTEM} L{level}."
    return [{"role": "system", "content": system}, {"role": "user", "content": user_message(request)}]


_CUT_SUMMARY = re.compile(r'"summary"\s*:\s*"((?:[^"\\]|\\.)*\\?)"?\s*$', re.S)


@dataclass
class ParseResult:
    text: str = ""  # the node's memory text (a profile rendered by `profile_text`)
    profile: list[dict] | None = None  # level 5: one entry per person
    problems: list[Problem] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return bool(self.text) and not self.problems

    def to_json(self) -> dict:
        node = {"text": self.text} | ({"profiles": self.profile} if self.profile is not None else {})
        return {"records": [node], "problems": [p.to_json() for p in self.problems]}


def parse(raw: str | None, level: int | None = None, people: list[str] | None = None) -> ParseResult:
    """A model's answer for one node; never raises. A summary level takes {"summary": ...}, a summary cut at
    the token cap, or failing both the bare text; level 5 takes {"profiles": [...]} and keeps the persons it
    recognises (any person when `people` is None). Without `level`, the answer's own key says which."""
    obj, problems = load_json(raw)
    if level is None:
        level = 5 if isinstance(obj, dict) and "profiles" in obj else 2
    if level != 5:
        text = obj.get("summary") if isinstance(obj, dict) else None
        cut = _CUT_SUMMARY.search(raw or "") if obj is None else None
        if cut:  # cut at the token cap inside the summary: what was written is kept
            try:
                text = json.loads(f'"{cut.group(1).rstrip(chr(92))}"')
            except ValueError:  # an escape cut in half
                text = cut.group(1)
            problems.append(Problem("cut_summary", "the summary was cut off; its written part is kept"))
        elif not isinstance(text, str) or not text.strip():
            problems.append(Problem("no_summary", "no summary field; the raw text is kept"))
            text = (raw or "").strip()
        return ParseResult(" ".join(text.split()), None, problems)
    rows = obj.get("profiles") if isinstance(obj, dict) else None
    profile = []
    for i, row in enumerate(rows if isinstance(rows, list) else []):
        if (
            not isinstance(row, dict)
            or not isinstance(row.get("person"), str)
            or (people and row["person"] not in people)
        ):
            problems.append(Problem("unknown_person", f"profile for {row!r:.60}", i))
            continue
        entry = {"person": row["person"]}
        for f in PROFILE_FIELDS:
            items = row.get(f) or []
            entry[f] = [" ".join(str(x).split()) for x in (items if isinstance(items, list) else [items]) if x]
        profile.append(entry)
    if not profile:
        problems.append(Problem("no_profile", "no usable profile"))
    return ParseResult(profile_text(profile), profile, problems)


# --- the record ---------------------------------------------------------------------------------------


def render_completion(label: dict) -> str:
    """The exact answer the student is trained to write for a node's label ({"summary"} or {"profiles"})."""
    body = {"profiles": label["profiles"]} if "profiles" in label else {"summary": label["summary"]}
    return json.dumps(body, ensure_ascii=False, separators=(",", ":"))


def training_rows(inp: dict, label: dict, **_) -> list[dict]:
    return [sft_row(chat_messages(inp, "student"), render_completion(label), task=MODEL.name)]


def read_teacher(texts: list[str], inp: dict) -> Answer:
    res = parse(texts[0], inp["level"], inp["people"])
    label = {"profiles": res.profile} if inp["level"] == 5 else {"summary": res.text}
    return Answer(res.ok, label if res.ok else None, res.problems)


def gold_label(row: dict) -> dict:
    return {"profiles": row["profiles"]} if row["level"] == 5 else {"summary": row["summary"]}


MODEL = CompactModel(
    name="summarizer",
    summary="TiMem level summarizer: a memory-tree window (session, day, week, month) with its child memories and "
    "the three previous nodes of its level -> the node's summary, or at L5 a profile per person; TiMem 3.2, formula 1",
    head="lm",
    unit="node",
    rows=training_rows,
    requests=lambda inp: [Request(chat_messages(inp, "teacher"), json_schema(inp["level"]), "node")],
    read=read_teacher,
    parse=parse,
    gold_label=gold_label,
    max_tokens=1024,
)
