"""Synthetic LoCoMo-style conversations written by the teacher from persona seeds (a clean source).

A data config names them as a source; `memdistill data --config ...` writes them first, then labels
them like any other source:

  sources:
    - {format: persona-synth, path: data/personas/personas.jsonl, name: persona-dialogues,
       conversations: 1000, sessions: [4, 7], turns: [10, 18], questions: 5}

To write (and inspect) the conversations alone, without labelling:
  python -m memdistill.data.synth --config configs/data/teacher_vllm_qwen3.yaml

Conversation k of a source pairs two personas drawn by a generator seeded with (name, k), which also
draws its session count and start date (2022-2024): the same config asks the same requests, so the
teacher cache (memdistill.data.teacher) makes a rerun free. Prompt, schema and parser are
memdistill.spec.dialogue_synthesis. Under <label_dir>/synth/<name>/:
  items.jsonl          one line per finished conversation (appended and fsync'd): key, status, reasons,
                       problems, the conversation and its questions; a rerun skips every key in it, except
                       transport rejects (nothing was paid for them), which are asked again
  conversations.jsonl  the accepted conversations in the project's conversation JSONL (data/seed/FORMAT.md,
  questions.jsonl      loader `seed`; no `split`, so the build splits them by hash like any teacher source),
                       questions dated a day after the last session, as LoCoMo asks after its last session
  rejects.jsonl        item, reason codes (the parser's HARD codes, teacher_max_tokens, transport_<code>)
A reply the parser rejects is a reject and the job goes on; a run that writes no conversation at all
stops with SynthError naming the endpoint and the reasons.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import random
import re
import threading
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path

from pydantic import ValidationError

from memdistill.core.config import ConfigError, from_mapping
from memdistill.core.io import append_jsonl, read_jsonl, recover_log, write_jsonl
from memdistill.data.teacher import Teacher, TeacherError, TeacherFatal, TeacherSettings, transport_rejection
from memdistill.spec import dialogue_synthesis as ds

SYNTH_FORMAT = "persona-synth"
FIRST_START, START_DAYS = datetime(2022, 1, 1), 3 * 365


class SynthError(ValueError):
    pass


@dataclass
class SynthSource:
    format: str
    path: str  # persona seeds, one JSON object a line (memdistill.spec.dialogue_synthesis.Persona)
    name: str = "persona-dialogues"
    conversations: int = 100
    sessions: list = field(default_factory=lambda: [4, 7])  # fewest, most sessions per conversation
    turns: list = field(default_factory=lambda: [10, 18])  # fewest, most messages per session
    questions: int = 5  # per conversation, asked after its last session
    max_tokens: int = 8192  # one request writes a whole conversation


def source_from_dict(d: dict, where: str) -> SynthSource:
    s = from_mapping(SynthSource, d, where)
    pairs_ok = all(
        isinstance(p, list) and len(p) == 2 and all(isinstance(x, int) for x in p) and p[0] <= p[1]
        for p in (s.sessions, s.turns)
    )
    if not pairs_ok or s.sessions[0] < 1 or s.turns[0] < 2:
        raise ConfigError(f"{where}: sessions and turns should be [fewest, most] with sessions >= 1, turns >= 2")
    if s.conversations < 1 or s.questions < 0 or s.max_tokens < 1:
        raise ConfigError(f"{where}: need conversations >= 1, questions >= 0, max_tokens >= 1")
    if not re.fullmatch(r"[A-Za-z0-9_.-]+", s.name):
        raise ConfigError(f"{where}: name {s.name!r} becomes a directory name: letters, digits, _ . - only")
    return s


def load_personas(path) -> list[ds.Persona]:
    out, names = [], {}
    for lineno, row in read_jsonl(path, SynthError):
        try:
            p = ds.Persona.model_validate(row)
        except ValidationError as e:
            err = e.errors()[0]
            field_ = ".".join(map(str, err["loc"]))
            raise SynthError(f"{path}:{lineno}: not a persona seed ({field_}: {err['msg']})") from None
        if p.name in names:
            raise SynthError(
                f"{path}:{lineno}: name {p.name} already used on line {names[p.name]}; speakers are told apart by name"
            )
        names[p.name] = lineno
        out.append(p)
    if len(out) < 2:
        raise SynthError(f"{path}: a conversation needs two personas, found {len(out)}")
    return out


def plan(src: SynthSource, personas: list[ds.Persona]) -> list[tuple[str, ds.Request]]:
    """(conversation id, request) for each conversation of the source; the same for the same config."""
    out = []
    for k in range(src.conversations):
        rng = random.Random(f"{src.name}|{k}")
        a, b = rng.sample(personas, 2)
        start = FIRST_START + timedelta(
            days=rng.randrange(START_DAYS), hours=rng.randint(8, 21), minutes=rng.choice((0, 15, 30, 45))
        )
        out.append(
            (
                f"{src.name}-{k:05d}",
                ds.Request(a, b, start, rng.randint(*src.sessions), tuple(src.turns), src.questions),
            )
        )
    return out


def conversation_row(cid: str, req: ds.Request, res: ds.ParseResult) -> dict:
    sessions = []
    for s, sess in enumerate(res.sessions, 1):
        turns = [
            {"turn_id": f"D{s}:{k}", "speaker": t["speaker"], "role": "user", "text": t["text"]}
            | ({"image_caption": t["image_caption"]} if t["image_caption"] else {})
            for k, t in enumerate(sess["turns"], 1)
        ]
        sessions.append({"session_id": f"S{s}", "date_time": sess["date_time"].isoformat(), "turns": turns})
    return {
        "conversation_id": cid,
        "style": "multi-party",
        "speakers": list(req.names),
        "sessions": sessions,
        "personas": [req.a.persona_id, req.b.persona_id],
    }


def question_rows(cid: str, res: ds.ParseResult) -> list[dict]:
    asked = (res.sessions[-1]["date_time"] + timedelta(days=1)).replace(hour=10, minute=0, second=0)
    return [
        {
            "question_id": f"{cid}-q{i:02d}",
            "conversation_id": cid,
            "question": q["question"],
            "answer": q["answer"],
            "question_date": asked.isoformat(),
        }
        for i, q in enumerate(res.questions, 1)
    ]


def item_key(cid: str, req: ds.Request, src: SynthSource, model: str) -> str:
    body = [cid, ds.chat_messages(req), ds.json_schema(req), src.max_tokens, model]
    return hashlib.sha256(json.dumps(body, sort_keys=True, ensure_ascii=False).encode()).hexdigest()[:32]


async def write_one(cid: str, req: ds.Request, key: str, t: Teacher, max_tokens: int) -> dict:
    rec = {"key": key, "item_id": cid, "teacher": t.s.model, "conversation": None, "questions": []}
    try:
        r = await t.complete(ds.chat_messages(req), ds.json_schema(req), "dialogue", max_tokens)
    except TeacherFatal:
        raise
    except TeacherError as e:
        return rec | transport_rejection(e)
    res = ds.parse(r.text, req)
    reasons = {p.code for p in res.problems if p.code in ds.HARD}
    reasons = sorted(reasons | {"teacher_max_tokens"} if r.finish_reason == "length" else reasons)
    rec |= {
        "status": "rejected" if reasons else "ok",
        "reasons": reasons,
        "problems": [p.to_json() for p in res.problems],
        "usage": {"prompt_tokens": r.prompt_tokens, "completion_tokens": r.completion_tokens},
        "cached": r.cached,
    }
    if reasons:
        rec["raw"] = r.text[:4000]
    else:
        rec |= {"conversation": conversation_row(cid, req, res), "questions": question_rows(cid, res)}
    return rec


def _transport(rec: dict) -> bool:
    return rec["status"] == "rejected" and any(r.startswith("transport_") for r in rec["reasons"])


async def write_conversations(src: SynthSource, t: Teacher, out_dir: Path, progress: bool = True) -> dict:
    """Write the source's conversations under out_dir; returns the summary (counts, reasons, tokens)."""
    from tqdm import tqdm

    out_dir.mkdir(parents=True, exist_ok=True)
    items = [(cid, req, item_key(cid, req, src, t.s.model)) for cid, req in plan(src, load_personas(src.path))]
    log = out_dir / "items.jsonl"
    done = {rec["key"]: rec for rec in recover_log(log, SynthError)}
    pending = [it for it in items if it[2] not in done or _transport(done[it[2]])]
    todo, lock = iter(pending), threading.Lock()
    bar = tqdm(total=len(pending), desc=f"teacher synth {src.name}", unit="conv", disable=not progress, mininterval=0.5)

    def append(rec: dict) -> None:
        with lock:  # whole lines, one writer at a time
            append_jsonl(log, [rec], fsync=True)

    async def worker():
        for cid, req, key in todo:  # one shared iterator: asyncio runs one worker at a time between awaits
            rec = await write_one(cid, req, key, t, src.max_tokens)
            await asyncio.to_thread(append, rec)
            done[key] = rec
            bar.update(1)

    tasks = [asyncio.create_task(worker()) for _ in range(min(t.s.concurrency, len(pending)))]
    try:
        await asyncio.gather(*tasks)
    except BaseException:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise
    finally:
        bar.close()
    recs = [done[key] for _, _, key in items]
    ok = [r for r in recs if r["status"] == "ok"]
    write_jsonl(out_dir / "conversations.jsonl", [r["conversation"] for r in ok])
    write_jsonl(out_dir / "questions.jsonl", [q for r in ok for q in r["questions"]])
    rejects = [{"item_id": r["item_id"], "reasons": r["reasons"], "detail": r.get("detail", "")} for r in recs]
    write_jsonl(out_dir / "rejects.jsonl", [x for x, r in zip(rejects, recs) if r["status"] != "ok"])
    reasons = Counter(c for r in recs for c in r["reasons"])
    if not ok:
        raise SynthError(
            f"{src.name}: the teacher at {', '.join(t.s.base_urls)} wrote no usable conversation out of "
            f"{len(recs)} (reasons {dict(reasons)}); see {out_dir / 'rejects.jsonl'}"
        )
    return {
        "conversations": len(recs),
        "ok": len(ok),
        "rejected": len(recs) - len(ok),
        "reject_reasons": dict(reasons),
        "turns": sum(len(s["turns"]) for r in ok for s in r["conversation"]["sessions"]),
        "questions": sum(len(r["questions"]) for r in ok),
        "this_run": t.stats.to_json(t.s),
    }


def _is_synth(spec) -> bool:
    return isinstance(spec, dict) and spec.get("format") == SYNTH_FORMAT


def has_synth(specs: list) -> bool:
    return any(map(_is_synth, specs))


def others(specs: list) -> list:
    """The sources the teacher does not write."""
    return [s for s in specs if not _is_synth(s)]


async def write_sources(
    specs: list, settings: TeacherSettings, cache_dir, out_dir, progress: bool = True
) -> tuple[list, dict]:
    """`specs` (a data config's sources) with each persona-synth source written under out_dir/<name> and
    replaced by the `seed`-format source that reads it back; also {name: summary}. Other sources pass through."""
    out, summaries = [], {}
    for i, spec in enumerate(specs):
        if not _is_synth(spec):
            out.append(spec)
            continue
        src = source_from_dict(spec, f"sources[{i}]")
        d = Path(out_dir) / src.name
        async with Teacher(settings, cache_dir) as t:
            summaries[src.name] = await write_conversations(src, t, d, progress)
        out.append({"format": "seed", "path": str(d / "conversations.jsonl"), "name": src.name})
    return out, summaries


def main(argv=None) -> int:
    from memdistill.core.config import job_config
    from memdistill.data.config import DataConfig
    from memdistill.data.teacher import settings_from_dict

    cfg = job_config(DataConfig, argv, "python -m memdistill.data.synth", __doc__, config_required=True)
    if not cfg.teacher:
        raise ConfigError("teacher: a teacher writes the conversations; this config has none")
    label_dir = Path(cfg.label_dir or Path(cfg.output_dir) / "labels")
    _, summaries = asyncio.run(
        write_sources(cfg.sources, settings_from_dict(cfg.teacher), cfg.cache_dir, label_dir / "synth", cfg.progress)
    )
    for name, s in summaries.items():
        print(
            f"synth {name}: {s['ok']} conversations written, {s['rejected']} rejected of {s['conversations']} "
            f"({s['turns']} turns, {s['questions']} questions) -> {label_dir / 'synth' / name}"
        )
    if not summaries:
        print(f"no {SYNTH_FORMAT} source in the config")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
