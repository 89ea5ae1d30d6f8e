"""Dialogues: turns, sessions, conversations, timestamps and overlapping extraction windows.

A window is what the extractor sees: W consecutive messages of a conversation (sessions flattened in
order), rendered one message a line as `[YYYY-MM-DDTHH:MM:SS, Wkd] N.Speaker: text`. In every window
after the first, the first O messages repeat the end of the previous window: they are context for
coreference and relative times, never a record's source. So every turn is extractable in exactly one
window, and each message number N maps back to its source turn id.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import datetime

WEEKDAYS = ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")
ROLES = ("user", "assistant")

# Paper presets (DimMem): LongMemEval-style user-assistant 15/3, LoCoMo-style multi-party 25/5.
WINDOW_PRESETS = {"user-assistant": (15, 3), "multi-party": (25, 5)}


class TimestampError(ValueError):
    pass


_MONTHS = {
    m: i + 1
    for i, m in enumerate(
        [
            "january",
            "february",
            "march",
            "april",
            "may",
            "june",
            "july",
            "august",
            "september",
            "october",
            "november",
            "december",
        ]
    )
}
_MONTHS.update({k[:3]: v for k, v in list(_MONTHS.items())})
_MONTHS["sept"] = 9
# LoCoMo: "1:56 pm on 8 May, 2023"
_LOCOMO = re.compile(r"^\s*(\d{1,2}):(\d{2})\s*([ap])\.?m\.?\s+on\s+(\d{1,2})\s+([A-Za-z]+)\.?,?\s+(\d{4})\s*$", re.I)
# LongMemEval: "2023/05/20 (Sat) 02:21"
_LME = re.compile(r"^\s*(\d{4})/(\d{1,2})/(\d{1,2})\s*(?:\([A-Za-z]{3}\))?\s*(\d{1,2}):(\d{2})(?::(\d{2}))?\s*$")


def parse_timestamp(value) -> datetime:
    """A naive datetime from the formats real corpora use.

    Accepts LoCoMo ("1:56 pm on 8 May, 2023"), LongMemEval ("2023/05/20 (Sat) 02:21") and ISO 8601
    ("2023-05-20", "2023-05-20T02:21:00", with or without a zone: the wall-clock time is kept, since
    the dialogue's own clock is what relative times are resolved against).
    """
    if isinstance(value, datetime):
        return value.replace(tzinfo=None)
    if not isinstance(value, str) or not value.strip():
        raise TimestampError(f"empty or non-string timestamp: {value!r}")
    try:
        if m := _LOCOMO.match(value):
            hour, minute, ampm, day, month, year = m.groups()
            mon = _MONTHS.get(month.lower())
            if mon is None:
                raise TimestampError(f"unknown month {month!r} in timestamp {value!r}")
            if not 1 <= int(hour) <= 12:
                raise TimestampError(f"hour {hour} is not a 12-hour clock hour in timestamp {value!r}")
            h = int(hour) % 12 + (12 if ampm.lower() == "p" else 0)
            return datetime(int(year), mon, int(day), h, int(minute))
        if m := _LME.match(value):
            y, mo, d, h, mi, s = m.groups()
            return datetime(int(y), int(mo), int(d), int(h), int(mi), int(s or 0))
        iso = value.strip().replace("Z", "+00:00")
        return datetime.fromisoformat(iso).replace(tzinfo=None)
    except TimestampError:
        raise
    except ValueError as e:
        raise TimestampError(
            f"unrecognised timestamp {value!r} ({e}); expected LoCoMo '1:56 pm on 8 May, 2023', "
            "LongMemEval '2023/05/20 (Sat) 02:21' or ISO 8601 '2023-05-20T02:21:00'"
        ) from None


def format_timestamp(ts: datetime) -> str:
    return f"{ts.strftime('%Y-%m-%dT%H:%M:%S')}, {WEEKDAYS[ts.weekday()]}"


@dataclass
class Turn:
    turn_id: str
    speaker: str
    role: str
    text: str
    timestamp: datetime
    image_caption: str | None = None
    meta: dict = field(default_factory=dict)  # source-specific flags, e.g. LongMemEval has_answer

    def __post_init__(self):
        if self.role not in ROLES:
            raise ValueError(f"turn {self.turn_id!r}: role {self.role!r} is not one of {ROLES}")


@dataclass
class Session:
    session_id: str
    date_time: datetime
    turns: list[Turn]


@dataclass
class Conversation:
    conversation_id: str
    sessions: list[Session]
    style: str = "multi-party"  # or "user-assistant"
    speakers: list[str] = field(default_factory=list)
    meta: dict = field(default_factory=dict)

    @property
    def turns(self) -> list[Turn]:
        return [t for s in self.sessions for t in s.turns]

    def turn(self, turn_id: str) -> Turn:
        for t in self.turns:
            if t.turn_id == turn_id:
                return t
        raise KeyError(f"conversation {self.conversation_id!r} has no turn {turn_id!r}")


def message_text(turn: Turn) -> str:
    """A message's text on one line, its shared photo's caption included."""
    text = " ".join(turn.text.split())
    if turn.image_caption:
        text = f"{text} [shares a photo: {' '.join(turn.image_caption.split())}]".strip()
    return text


def render_message(n: int, turn: Turn) -> str:
    """One message, one line. Newlines inside a message are folded so line N is message N."""
    return f"[{format_timestamp(turn.timestamp)}] {n}.{turn.speaker}: {message_text(turn)}"


@dataclass
class Window:
    conversation_id: str
    window_index: int
    turns: list[Turn]
    extract_from: int  # first message number (1-based) that may be a record's source

    @property
    def text(self) -> str:
        return "\n".join(render_message(n, t) for n, t in enumerate(self.turns, 1))

    @property
    def overlap(self) -> int:
        return self.extract_from - 1

    def turn_for(self, n: int) -> Turn:
        """The source turn of message number n (1-based)."""
        if not 1 <= n <= len(self.turns):
            raise IndexError(f"message {n} is outside window {self.window_index} (1..{len(self.turns)})")
        return self.turns[n - 1]

    def extractable(self) -> list[tuple[int, Turn]]:
        return [(n, t) for n, t in enumerate(self.turns, 1) if n >= self.extract_from]

    def to_json(self) -> dict:
        return {
            "conversation_id": self.conversation_id,
            "window_index": self.window_index,
            "text": self.text,
            "extract_from": self.extract_from,
            "messages": [
                {
                    "n": n,
                    "turn_id": t.turn_id,
                    "speaker": t.speaker,
                    "role": t.role,
                    "timestamp": t.timestamp.isoformat(),
                }
                for n, t in enumerate(self.turns, 1)
            ],
        }

    @classmethod
    def from_json(cls, d: dict) -> "Window":
        """Rebuild a window from `to_json` output (texts come back from the rendered lines)."""
        lines = d["text"].split("\n") if d.get("text") else []
        msgs = d["messages"]
        if len(lines) != len(msgs):
            raise ValueError(f"window {d.get('window_index')}: {len(lines)} text lines but {len(msgs)} messages")
        turns = []
        for line, m in zip(lines, msgs):
            _, _, body = line.partition(f"{m['n']}.{m['speaker']}: ")
            turns.append(Turn(m["turn_id"], m["speaker"], m.get("role", "user"), body, parse_timestamp(m["timestamp"])))
        return cls(d["conversation_id"], int(d["window_index"]), turns, int(d["extract_from"]))


def windows(conv: Conversation, size: int, overlap: int, topic_starts=None) -> list[Window]:
    """Overlapping windows of `size` messages whose first `overlap` messages (after window 0) are context.

    Consecutive windows start `size - overlap` messages apart; the last one may be shorter. A window
    is only made when it has at least one new message. With `topic_starts` (the turn ids that open a topic:
    TraceMem boundaries, gold or predicted) windows are cut at topic changes within the same size limits:
    new messages never run across a topic start, a window at a topic start has no context, and context never
    comes from another topic; every other window keeps the fixed shape (O context + W - O new messages).
    """
    if size < 1 or not 0 <= overlap < size:
        raise ValueError(f"need window >= 1 and 0 <= overlap < window, got window={size}, overlap={overlap}")
    turns, out = conv.turns, []
    starts = set(topic_starts or ())
    cuts = [k for k, t in enumerate(turns) if k == 0 or t.turn_id in starts] + [len(turns)]
    for a, b in zip(cuts, cuts[1:]):
        i = a
        while i < b:
            context = max(a, i - overlap)
            end = min(i + (size if i == 0 else size - overlap), b)  # the conversation's first window: all new
            out.append(Window(conv.conversation_id, len(out), turns[context:end], i - context + 1))
            i = end
    return out


def interleaved(conversations: dict, n: int | None) -> dict:
    """The first n conversations (all when n is None), styles taken in turn, so a small sample still
    covers both kinds of dialogue; original order kept."""
    if not n:
        return dict(conversations)
    nth, per_style = {}, {}
    for cid, c in conversations.items():
        per_style[c.style] = nth[cid] = per_style.get(c.style, 0) + 1
    keep = set(sorted(conversations, key=nth.get)[:n])
    return {cid: c for cid, c in conversations.items() if cid in keep}


def first_windows(windows: dict) -> dict:
    """{style: [[W, O], ...]} (most rows first) -> {style: [W, O]}: the window each style is evaluated and
    served with by default."""
    return {style: list(pairs[0]) for style, pairs in windows.items()}


def describe_windows(windows: dict) -> str:
    """{style: [[W, O], ...]} -> "multi-party 6/1; user-assistant 4/1" """
    return "; ".join(f"{style} {', '.join(f'{w}/{o}' for w, o in pairs)}" for style, pairs in windows.items()) or "none"


def choose_window(
    style: str, trained: dict | None = None, window: int | None = None, overlap: int | None = None
) -> tuple[int, int, str | None]:
    """(W, O) for a conversation of `style`, and a note when that is not a window the model was trained on.

    `trained` is a model's training windows ({style: [[W, O], ...]}, most rows first; see
    `memdistill.train.extractor`). An explicit window wins; without one, the model's first training window
    for the style; without that, the paper preset. An overlap left out is the default's, capped at W - 1.
    """
    pairs = [tuple(p) for p in (trained or {}).get(style, [])]
    default = pairs[0] if pairs else WINDOW_PRESETS[style]
    size = window or default[0]
    ov = overlap if overlap is not None else min(default[1], size - 1)
    if trained is None:
        note = (
            None
            if window
            else f"the model's training windows are unknown: {style} windows use the paper preset {size}/{ov}"
        )
    elif not pairs:
        note = f"the model was trained on no {style} windows; using {size}/{ov}"
    elif (size, ov) not in pairs:
        note = f"{style} window {size}/{ov} is not one the model was trained on ({describe_windows({style: pairs})})"
    else:
        note = None
    return size, ov, note
