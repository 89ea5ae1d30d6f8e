"""Dialogue sources -> spec Conversations.

Formats:
- `locomo`: the released locomo10.json (a list of samples with `sample_id`, `conversation` holding
  `speaker_a`, `speaker_b`, `session_N` turn lists and `session_N_date_time`, plus `qa`).
- `longmemeval`: the released LongMemEval files (a list of instances with `question_id`,
  `haystack_sessions`, `haystack_dates`, `haystack_session_ids`, `question`, `question_date`, ...);
  one conversation per instance, turn ids `<session id>:<k>`, `has_answer` kept in `Turn.meta`.
- `chat-jsonl`: one conversation a line, in one of three layouts: OpenAI `messages` ({role, content};
  HuggingFaceH4/ultrachat_200k), ShareGPT `conversations` ({from, value}), or the original UltraChat
  `data` (stingning/ultrachat: {"id", "data": [user, assistant, user, ...]}, plain strings taking
  turns, user first). Timestamps: a message's `timestamp` (or the line's `timestamp`/`date`) when
  present; otherwise synthesised: the conversation starts at 2024-01-01T09:00:00 plus one day per
  line, one minute per message, and `meta["synthetic_time"]` is set, so relative times in such data
  cannot be resolved faithfully.
- `seed`: the project's conversation JSONL (data/seed/FORMAT.md): the gold corpus
  `data/seed/conversations.jsonl`, and the teacher-written persona dialogues of memdistill.data.synth.
- `hf`: a local Hugging Face dataset directory (`save_to_disk`) or data file, rows in the
  `chat-jsonl` layout.

Malformed input raises SourceError naming the file and the record.
"""

from __future__ import annotations

import json
import re
from datetime import datetime, timedelta
from pathlib import Path
from typing import Iterator

from memdistill.core.io import read_jsonl
from memdistill.spec.dialogue import ROLES, Conversation, Session, TimestampError, Turn, parse_timestamp

FORMATS = ("locomo", "longmemeval", "chat-jsonl", "seed", "hf")
SYNTHETIC_START = datetime(2024, 1, 1, 9, 0)


class SourceError(ValueError):
    pass


def load(fmt: str, path) -> list[Conversation]:
    if fmt not in FORMATS:
        raise SourceError(f"unknown format {fmt!r}; expected one of {', '.join(FORMATS)}")
    path = Path(path)
    if not path.exists():
        raise SourceError(f"{path}: no such file")
    loader = {
        "locomo": load_locomo,
        "longmemeval": load_longmemeval,
        "chat-jsonl": load_chat_jsonl,
        "seed": load_seed,
        "hf": load_hf,
    }[fmt]
    return list(loader(path))


def _read_json(path: Path):
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise SourceError(f"{path}: not valid JSON (line {e.lineno}, column {e.colno}: {e.msg})") from None


def _ts(value, where: str) -> datetime:
    try:
        return parse_timestamp(value)
    except TimestampError as e:
        raise SourceError(f"{where}: {e}") from None


def _need(d: dict, key: str, where: str, kind=None):
    if not isinstance(d, dict) or key not in d:
        raise SourceError(f"{where}: missing field {key!r}")
    if kind is not None and not isinstance(d[key], kind):
        raise SourceError(
            f"{where}: field {key!r} should be {kind.__name__ if isinstance(kind, type) else kind}, "
            f"got {type(d[key]).__name__}"
        )
    return d[key]


# --- LoCoMo -------------------------------------------------------------------------------------

_SESSION_KEY = re.compile(r"^session_(\d+)$")


def load_locomo(path: Path) -> Iterator[Conversation]:
    data = _read_json(path)
    if not isinstance(data, list):
        raise SourceError(f"{path}: expected a list of LoCoMo samples, got {type(data).__name__}")
    for i, sample in enumerate(data):
        where = f"{path}: sample {i}"
        sid = str(_need(sample, "sample_id", where)) if isinstance(sample, dict) else None
        where = f"{path}: sample {i} ({sid})"
        conv = _need(sample, "conversation", where, dict)
        speakers = [_need(conv, "speaker_a", where, str), _need(conv, "speaker_b", where, str)]
        numbers = sorted(int(m.group(1)) for k in conv if (m := _SESSION_KEY.match(k)))
        sessions = []
        for n in numbers:
            key = f"session_{n}"
            turns_in = conv[key]
            if not isinstance(turns_in, list):
                raise SourceError(f"{where}: {key} should be a list of turns")
            if not turns_in:
                continue
            date = _ts(_need(conv, f"{key}_date_time", where), f"{where}: {key}_date_time")
            turns = []
            for k, t in enumerate(turns_in):
                tw = f"{where}: {key} turn {k}"
                speaker = _need(t, "speaker", tw, str)
                turns.append(
                    Turn(
                        turn_id=str(_need(t, "dia_id", tw)),
                        speaker=speaker,
                        role="user",
                        text=str(_need(t, "text", tw)),
                        timestamp=date,
                        image_caption=t.get("blip_caption") or None,
                    )
                )
            sessions.append(Session(key, date, turns))
        if not sessions:
            raise SourceError(f"{where}: no sessions (expected session_1, session_1_date_time, ...)")
        yield Conversation(sid, sessions, "multi-party", speakers, {"source": "locomo", "qa": sample.get("qa", [])})


# --- LongMemEval --------------------------------------------------------------------------------


def load_longmemeval(path: Path) -> Iterator[Conversation]:
    data = _read_json(path)
    if isinstance(data, dict):
        data = [data]
    if not isinstance(data, list):
        raise SourceError(f"{path}: expected a list of LongMemEval instances")
    for i, inst in enumerate(data):
        where = f"{path}: instance {i}"
        qid = str(_need(inst, "question_id", where))
        where = f"{path}: instance {i} ({qid})"
        hs = _need(inst, "haystack_sessions", where, list)
        dates = _need(inst, "haystack_dates", where, list)
        ids = inst.get("haystack_session_ids") or [f"s{k}" for k in range(len(hs))]
        if not len(hs) == len(dates) == len(ids):
            raise SourceError(
                f"{where}: haystack_sessions ({len(hs)}), haystack_dates ({len(dates)}) and "
                f"haystack_session_ids ({len(ids)}) differ in length"
            )
        sessions = []
        for s, (sess, date_s, sess_id) in enumerate(zip(hs, dates, ids)):
            sw = f"{where}: haystack_sessions[{s}] ({sess_id})"
            date = _ts(date_s, f"{where}: haystack_dates[{s}]")
            if not isinstance(sess, list):
                raise SourceError(f"{sw}: expected a list of messages")
            turns = []
            for k, m in enumerate(sess, 1):
                mw = f"{sw} message {k}"
                role = _need(m, "role", mw, str)
                if role not in ("user", "assistant"):
                    raise SourceError(f"{mw}: role {role!r} is not user or assistant")
                meta = {"has_answer": bool(m["has_answer"])} if "has_answer" in m else {}
                turns.append(
                    Turn(f"{sess_id}:{k}", role.capitalize(), role, str(_need(m, "content", mw)), date, meta=meta)
                )
            sessions.append(Session(str(sess_id), date, turns))
        meta = {k: inst.get(k) for k in ("question_type", "question", "answer", "question_date", "answer_session_ids")}
        meta["source"] = "longmemeval"
        yield Conversation(qid, sessions, "user-assistant", ["User", "Assistant"], meta)


# --- chat JSONL / HF datasets ---------------------------------------------------------------------

_SHAREGPT_ROLES = {
    "human": "user",
    "user": "user",
    "gpt": "assistant",
    "assistant": "assistant",
    "chatgpt": "assistant",
    "bard": "assistant",
    "bing": "assistant",
    "system": "system",
}


def chat_row_to_conversation(row: dict, index: int, where: str) -> Conversation:
    # HF datasets give every row every column, absent ones as None.
    row = {k: v for k, v in row.items() if v is not None}
    if "messages" in row:
        msgs = [
            (m.get("role"), m.get("content"), m) for m in _need(row, "messages", where, list) if isinstance(m, dict)
        ]
        if len(msgs) != len(row["messages"]):
            raise SourceError(f"{where}: every item of 'messages' must be an object with role and content")
    elif "conversations" in row:
        msgs = [
            (_SHAREGPT_ROLES.get(str(m.get("from", "")).lower(), m.get("from")), m.get("value"), m)
            for m in _need(row, "conversations", where, list)
            if isinstance(m, dict)
        ]
    elif "data" in row:  # UltraChat: the turns alone, user first, then taking turns with the assistant
        msgs = [(ROLES[k % 2], m, {}) for k, m in enumerate(_need(row, "data", where, list))]
    else:
        raise SourceError(
            f"{where}: expected 'messages' (OpenAI layout), 'conversations' (ShareGPT layout) "
            "or 'data' (UltraChat layout)"
        )
    cid = str(row.get("conversation_id") or row.get("id") or row.get("prompt_id") or f"chat-{index:06d}")
    start_raw = row.get("timestamp") or row.get("date")
    synthetic = start_raw is None
    start = SYNTHETIC_START + timedelta(days=index) if synthetic else _ts(start_raw, f"{where}: timestamp")
    turns = []
    for k, (role, content, m) in enumerate(msgs, 1):
        if role == "system":
            continue
        if role not in ("user", "assistant"):
            raise SourceError(f"{where}: message {k}: role {role!r} is not user, assistant or system")
        if not isinstance(content, str):
            raise SourceError(f"{where}: message {k}: content should be a string")
        ts = _ts(m["timestamp"], f"{where}: message {k}") if m.get("timestamp") else start + timedelta(minutes=k - 1)
        synthetic = synthetic and not m.get("timestamp")
        turns.append(Turn(f"{cid}:{k}", role.capitalize(), role, content, ts))
    if not turns:
        raise SourceError(f"{where}: no user or assistant messages")
    return Conversation(
        cid,
        [Session("S1", turns[0].timestamp, turns)],
        "user-assistant",
        ["User", "Assistant"],
        {"source": "chat", "synthetic_time": synthetic},
    )


def load_chat_jsonl(path: Path) -> Iterator[Conversation]:
    for index, (lineno, row) in enumerate(read_jsonl(path, SourceError)):
        yield chat_row_to_conversation(row, index, f"{path}:{lineno}")


def load_hf(path: Path) -> Iterator[Conversation]:
    import datasets

    try:
        if path.is_dir():
            ds = datasets.load_from_disk(str(path))
        else:
            ext = {"jsonl": "json"}.get(path.suffix.lstrip("."), path.suffix.lstrip("."))
            ds = datasets.load_dataset(ext, data_files=str(path), split="train")
    except Exception as e:  # datasets raises many types; the user needs the path and the reason
        raise SourceError(f"{path}: cannot load as a Hugging Face dataset: {e}") from None
    if isinstance(ds, datasets.DatasetDict):
        ds = ds["train"] if "train" in ds else next(iter(ds.values()))
    for index, row in enumerate(ds):
        yield chat_row_to_conversation(row, index, f"{path}: row {index}")


# --- the gold seed corpus -------------------------------------------------------------------------


def load_seed(path: Path) -> Iterator[Conversation]:
    for lineno, row in read_jsonl(path, SourceError):
        where = f"{path}:{lineno}"
        cid = str(_need(row, "conversation_id", where))
        where = f"{path}:{lineno} ({cid})"
        sessions = []
        for s, sess in enumerate(_need(row, "sessions", where, list)):
            sw = f"{where}: sessions[{s}]"
            date = _ts(_need(sess, "date_time", sw), f"{sw}.date_time")
            turns = []
            for k, t in enumerate(_need(sess, "turns", sw, list)):
                tw = f"{sw}.turns[{k}]"
                ts = _ts(t["timestamp"], f"{tw}.timestamp") if t.get("timestamp") else date
                try:
                    turns.append(
                        Turn(
                            str(_need(t, "turn_id", tw)),
                            _need(t, "speaker", tw, str),
                            t.get("role", "user"),
                            _need(t, "text", tw, str),
                            ts,
                            t.get("image_caption") or None,
                        )
                    )
                except ValueError as e:
                    raise SourceError(f"{tw}: {e}") from None
            sessions.append(Session(str(sess.get("session_id", f"S{s + 1}")), date, turns))
        yield Conversation(
            cid,
            sessions,
            row.get("style", "multi-party"),
            row.get("speakers", []),
            {"source": "seed", "split": row.get("split")},
        )
