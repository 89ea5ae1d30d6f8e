"""Teacher labelling jobs: dialogue sources -> validated labels for every compact model.

Run through `memdistill data --config configs/data/teacher_*.yaml` (labels, then training sets;
see memdistill.data.build). A job is named after its model (memdistill.spec.MODELS) and asks the teacher
what the model's spec record says (`requests`), reading the answer with the model's parser (`read`); jobs
run in the table's order, since later jobs read earlier labels. Items per unit:

  extractor    windows -> DimMem records. Window settings per conversation style come from the
               config's `windows` (DimMem presets: 25/5 multi-party, 15/3 user-assistant).
  query_parser, planner, querytyper
               the sources' questions (LoCoMo `qa`, LongMemEval `question`, the gold corpus's
               questions.jsonl) -> DimMem query analysis; complexity + 1-3 keywords; querytyper.K
               hypothetical memories that would answer each (MemoType Eq. 2: `memdistill train querytyper`
               labels the question with its type router's vote over them, as offline over the gold
               evidence turns).
  router       snippets -> TriMEM labels. A snippet is one turn, or a turn ending in "?" together
               with the reply that follows in the same session (as in data/seed/types.jsonl).
               type_mode `binary` (default) asks one yes/no question per label and combines the
               answers; `single` asks one multi-label question.
  gate         each planned question, with the `gate_candidates` memories BM25 ranks highest among
               the records the extractor job wrote for that conversation (shuffled with a fixed
               seed so the teacher sees no rank order) -> the ids to keep.
  segmenter    every utterance but a session's first, with two utterances of context on each side ->
               CHANGE / DEVELOP (TraceMem).
  consolidator the extractor job's records of each conversation in the order they were said, each
               against every earlier one that passes the candidate cascade (`pair_cascade`: same
               memory_type, keywords and/or MiniLM cosine, as the runtime asks) -> MERGE / SUPERSEDE /
               KEEPBOTH (+ the merged record).

Each job appends to <label_dir>/<job>/labels.jsonl one line per item as soon as it is done (flushed
and fsync'd): item_id, key, status ("ok" | "rejected"), reasons, input (what the build needs to make
rows: the window, question, snippet or candidates), label, problems (spec codes), usage, cached.
`key` hashes the job, item, input and teacher model: a rerun skips every item whose key is already in
the file, so a kill -9 loses only the requests in flight and a rerun finishes the rest without
duplicates; a changed source or teacher gets new keys and is labelled again. A torn last line (a
kill mid-write) is cut off on the next run. At the end of a job, rejects.jsonl is rewritten from
labels.jsonl: one row per rejected item with its reason codes, one per extraction record the parser
dropped. run_summary.json holds per-job counts, requests, retries, cache hits, tokens and cost.

Reason codes: the spec parser's codes when an output is unusable (invalid_json, no_json,
wrong_shape, empty_output, empty_anchor, bad_complexity, no_keywords, unreadable_decision, ...);
truncated_output / unterminated_think (a cut-off answer: its salvaged part would teach the student
to stop early); teacher_max_tokens (finish_reason "length"); transport_<code> when retries ran out
(transport_http_500, transport_timeout, transport_connection, transport_http_400, ...; a rerun leaves
them be, so it costs nothing; `retry_transport: true` asks the teacher for them again);
too_few_candidates (gate: the conversation has fewer than `gate_min_candidates` memories; no request).

Before any request the sources pass memdistill.data.hygiene (no conversation or question of an evaluated
set). A job whose ok labels fall short of `min_ok_share` of the items it asks about (a wrong URL, a server
that is down, answers that do not parse) raises TeacherShortfall naming the endpoint and the reject counts,
after its labels are written: `memdistill data` exits 1, and a rerun resumes. When the first NO_ANSWER_STOP
items of a run all run out of retries with no answer at all, the job stops there instead of waiting out
every item's retries.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import random
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from tqdm import tqdm

from memdistill.core.config import ConfigError
from memdistill.core.io import JsonlError, load_jsonl, recover_log
from memdistill.data import hygiene, synth
from memdistill.data.sources import load
from memdistill.data.teacher import (
    Reply,
    Teacher,
    TeacherError,
    TeacherFatal,
    cost,
    settings_from_dict,
    transport_rejection,
)
from memdistill.spec import MODELS, NAMES, consolidator, segmenter
from memdistill.spec.dialogue import Conversation, Window, windows
from memdistill.spec.jsonout import Problem

# Answers the student would learn to cut short: reject even when something was salvaged.
ALWAYS_REJECT = {"truncated_output", "unterminated_think"}
SOURCE_KEYS = {"format", "path", "name", "style", "max_conversations"}
# Items in a row whose retries all ran out with no answer at all in this run: the endpoint is not there,
# and asking the rest would only add each item's full retry schedule to the wait.
NO_ANSWER_STOP = 16


class TeacherShortfall(RuntimeError):
    """A job got fewer ok labels than `min_ok_share` of its items: the endpoint is down or wrong, or its
    answers do not parse. The labels received are kept; a rerun resumes."""


@dataclass
class SourceConv:
    source: str  # the source's name, e.g. "locomo:locomo10"
    conv: Conversation
    questions: list[dict]  # question_id, question, question_date
    split: str | None = None  # the gold split, for conversations of the seed corpus
    fmt: str = ""  # the source's format and file, for memdistill.data.hygiene
    path: str = ""


@dataclass
class Item:
    job: str
    item_id: str
    sc: SourceConv
    input: dict
    window: Window | None = None
    key: str = ""


# --- sources ------------------------------------------------------------------------------------


def load_sources(specs: list) -> list[SourceConv]:
    out = []
    for i, spec in enumerate(specs):
        where = f"sources[{i}]"
        if not isinstance(spec, dict) or not {"format", "path"} <= set(spec):
            raise ConfigError(f"{where}: expected a mapping with format and path, got {spec!r}")
        if unknown := sorted(set(spec) - SOURCE_KEYS):
            raise ConfigError(f"{where}: unknown key(s) {unknown} (known: {', '.join(sorted(SOURCE_KEYS))})")
        fmt, path = spec["format"], Path(spec["path"])
        name = spec.get("name") or f"{fmt}:{path.stem}"
        convs = load(fmt, path)[: spec.get("max_conversations")]
        seed_q = _seed_questions(path) if fmt == "seed" else {}
        for conv in convs:
            if spec.get("style"):
                conv.style = spec["style"]
            out.append(
                SourceConv(
                    name,
                    conv,
                    _questions(fmt, conv, seed_q),
                    conv.meta.get("split") if fmt == "seed" else None,
                    fmt,
                    str(path),
                )
            )
    names = [(sc.source, sc.conv.conversation_id) for sc in out]
    if len(set(names)) != len(names):
        raise ConfigError(
            "sources: two conversations share a source name and conversation id; give each source a distinct name"
        )
    return out


def _seed_questions(conv_path: Path) -> dict[str, list[dict]]:
    p = conv_path.parent / "questions.jsonl"
    by_conv: dict[str, list[dict]] = {}
    for q in load_jsonl(p, missing_ok=True):
        by_conv.setdefault(q["conversation_id"], []).append(q)
    return by_conv


def _questions(fmt: str, conv: Conversation, seed_q: dict) -> list[dict]:
    if fmt == "locomo":  # LoCoMo asks after the last session; it gives no question date
        when = conv.turns[-1].timestamp.isoformat()
        return [
            {"question_id": f"q{k}", "question": str(qa["question"]), "question_date": when}
            for k, qa in enumerate(conv.meta.get("qa") or [])
            if qa.get("question")
        ]
    if fmt == "longmemeval" and conv.meta.get("question"):
        return [
            {
                "question_id": conv.conversation_id,
                "question": conv.meta["question"],
                "question_date": conv.meta.get("question_date"),
            }
        ]
    if fmt == "seed":
        return [
            {k: q[k] for k in ("question_id", "question", "question_date")}
            for q in seed_q.get(conv.conversation_id, [])
        ]
    return []


# --- items --------------------------------------------------------------------------------------


def extraction_items(convs: list[SourceConv], window_pairs: dict) -> list[Item]:
    items = []
    for sc in convs:
        style = sc.conv.style
        if style not in window_pairs:
            raise ConfigError(
                f"windows: no setting for conversation style {style!r} ({sc.source} {sc.conv.conversation_id})"
            )
        for size, overlap in dict.fromkeys(tuple(p) for p in window_pairs[style]):
            for w in windows(sc.conv, size, overlap):
                items.append(
                    Item(
                        "extractor",
                        f"{sc.source}|{sc.conv.conversation_id}|w{size}o{overlap}|{w.window_index}",
                        sc,
                        {"window": w.to_json(), "style": style, "window_setting": [size, overlap]},
                        w,
                    )
                )
    return items


def question_items(job: str, convs: list[SourceConv]) -> list[Item]:
    return [
        Item(
            job, f"{sc.source}|{sc.conv.conversation_id}|{q['question_id']}", sc, dict(q, names=list(sc.conv.speakers))
        )
        for sc in convs
        for q in sc.questions
    ]


def snippets(conv: Conversation) -> list[tuple[list[str], str]]:
    """(turn ids, text) snippets: one turn, or a question turn with the reply that follows."""
    out = []
    for sess in conv.sessions:
        turns, k = sess.turns, 0
        while k < len(turns):
            take = turns[k : k + 2] if turns[k].text.rstrip().endswith("?") and k + 1 < len(turns) else turns[k : k + 1]
            out.append(([t.turn_id for t in take], "\n".join(f"{t.speaker}: {' '.join(t.text.split())}" for t in take)))
            k += len(take)
    return out


def snippet_items(convs: list[SourceConv], mode: str) -> list[Item]:
    return [
        Item(
            "router",
            f"{sc.source}|{sc.conv.conversation_id}|t{ids[0]}",
            sc,
            {"turn_ids": ids, "text": text, "mode": mode},
        )
        for sc in convs
        for ids, text in snippets(sc.conv)
    ]


def segment_items(convs: list[SourceConv]) -> list[Item]:
    """One item per topic decision (every utterance but a session's first), as segmenter.context reads it."""
    out = []
    for sc in convs:
        for sess in sc.conv.sessions:
            for i in segmenter.decisions(sess.turns):
                before, target, after = segmenter.context(sess.turns, i)
                tid = sess.turns[i].turn_id
                out.append(
                    Item(
                        "segmenter",
                        f"{sc.source}|{sc.conv.conversation_id}|{sess.session_id}|{tid}",
                        sc,
                        {
                            "before": before,
                            "target": target,
                            "after": after,
                            "turn_id": tid,
                            "session_id": sess.session_id,
                        },
                    )
                )
    return out


def gate_items(
    convs: list[SourceConv], extracted: dict, planned: dict, n_candidates: int, window_pairs: dict
) -> list[Item]:
    """Gate items from the extractor job's records (first window setting of each style) and the planner job's
    complexities."""
    import bm25s

    mems: dict[tuple, list[str]] = {}
    for rec in extracted.values():
        inp = rec["input"]
        if rec["status"] == "ok" and inp["window_setting"] == list(window_pairs[inp["style"]][0]):
            bucket = mems.setdefault((rec["source"], rec["conversation_id"]), [])
            bucket += [r["content"] for r in rec["label"]["records"]]
    items = []
    for sc in convs:
        texts = list(dict.fromkeys(mems.get((sc.source, sc.conv.conversation_id), [])))
        index = None
        for q in sc.questions:
            item_id = f"{sc.source}|{sc.conv.conversation_id}|{q['question_id']}"
            plan = planned.get(item_id)
            if plan is None or plan["status"] != "ok":
                continue  # no complexity, no gate example (the plan job's rejects say why)
            cands: list[str] = []
            if texts:
                if index is None:
                    index = bm25s.BM25()
                    index.index(
                        bm25s.tokenize(texts, stopwords="en", show_progress=False, return_ids=False),
                        show_progress=False,
                    )
                query = bm25s.tokenize([q["question"]], stopwords="en", show_progress=False, return_ids=False)
                k = min(n_candidates, len(texts))
                docs, _ = index.retrieve(query if query[0] else [["_"]], k=k, show_progress=False)
                cands = [texts[int(i)] for i in docs[0]]
                random.Random(item_id).shuffle(cands)
            items.append(
                Item(
                    "gate",
                    item_id,
                    sc,
                    {
                        "question_id": q["question_id"],
                        "question": q["question"],
                        "complexity": plan["label"]["complexity"],
                        "candidates": cands,
                    },
                )
            )
    return items


def consolidation_items(convs: list[SourceConv], extracted: dict, window_pairs: dict, cascade: dict) -> list[Item]:
    """Pair items from the extractor job's records (first window setting of each style), in the order
    the records were said; each new record against every earlier record the cascade passes."""
    from memdistill.core.embedder import Embedder

    embed = Embedder()
    recs: dict[tuple, list] = {}
    for rec in extracted.values():
        inp = rec["input"]
        if rec["status"] == "ok" and inp["window_setting"] == list(window_pairs[inp["style"]][0]):
            w = Window.from_json(inp["window"])
            for r in rec["label"]["records"]:
                stored = consolidator.StoredRecord.at(r, w.turn_for(r["source_id"]))
                recs.setdefault((rec["source"], rec["conversation_id"]), []).append(
                    (w.window_index, r["source_id"], stored)
                )
    items = []
    for sc in convs:
        ordered, seen = [], set()
        for _, _, s in sorted(recs.get((sc.source, sc.conv.conversation_id), []), key=lambda x: x[:2]):
            key = json.dumps(s.to_json(), sort_keys=True)
            if key not in seen:  # a record repeated by overlapping windows counts once
                seen.add(key)
                ordered.append(s)
        for j, new in enumerate(ordered):
            picked, _ = consolidator.candidates(new, ordered[:j], embed, **cascade)
            items += [
                Item(
                    "consolidator",
                    f"{sc.source}|{sc.conv.conversation_id}|p{j}-{i}",
                    sc,
                    {"new": new.to_json(), "existing": ordered[i].to_json()},
                )
                for i, _ in picked
            ]
    return items


# One item builder per unit (memdistill.spec.compact.UNITS); the gate's and the pairs' items are built from
# the extractor's (and the planner's) labels, which check_jobs makes sure come first.
UNIT_ITEMS = {
    "window": lambda job, convs, results, cfg: extraction_items(convs, cfg.windows),
    "question": lambda job, convs, results, cfg: question_items(job, convs),
    "snippet": lambda job, convs, results, cfg: snippet_items(convs, cfg.type_mode),
    "utterance": lambda job, convs, results, cfg: segment_items(convs),
    "pair": lambda job, convs, results, cfg: consolidation_items(
        convs, results["extractor"], cfg.windows, cfg.pair_cascade
    ),
    "gate": lambda job, convs, results, cfg: gate_items(
        convs, results["extractor"], results["planner"], cfg.gate_candidates, cfg.windows
    ),
}


def _limit(items: list[Item], n: int | None) -> list[Item]:
    """At most n items, chosen by hash of the id: deterministic and spread over every conversation."""
    if n is None or len(items) <= n:
        return items
    keep = set(sorted((it.item_id for it in items), key=lambda s: hashlib.sha256(s.encode()).hexdigest())[:n])
    return [it for it in items if it.item_id in keep]


# --- asking the teacher -------------------------------------------------------------------------


@dataclass
class Outcome:
    ok: bool
    label: dict | None = None
    problems: list[Problem] = field(default_factory=list)
    replies: list[Reply] = field(default_factory=list)
    reasons: list[str] = field(default_factory=list)  # set directly when no request was made


async def ask(item: Item, t: Teacher, min_candidates: int) -> Outcome:
    """The model's teacher requests for one item, sent together, read by the model's parser. An item with a
    candidate list shorter than `min_candidates` is not asked (too_few_candidates)."""
    m = MODELS[item.job]
    if "candidates" in item.input and len(item.input["candidates"]) < min_candidates:
        return Outcome(False, reasons=["too_few_candidates"])
    got = await asyncio.gather(
        *(t.complete(r.messages, r.schema, r.name, m.max_tokens) for r in m.requests(item.input)),
        return_exceptions=True,
    )
    for g in got:  # the answers that did arrive are cached; a rerun pays only for the failed one
        if isinstance(g, BaseException):
            raise g
    a = m.read([r.text for r in got], item.input)
    return Outcome(a.ok, a.label, a.problems, list(got))


def _reasons(out: Outcome) -> list[str]:
    if out.reasons:
        return out.reasons
    codes = {p.code for p in out.problems if p.code != "record_dropped"}
    reasons = (codes if not out.ok else codes & ALWAYS_REJECT) or ({"unparsed"} if not out.ok else set())
    if any(r.finish_reason == "length" for r in out.replies):
        reasons.add("teacher_max_tokens")
    return sorted(reasons)


async def label_item(item: Item, t: Teacher, min_candidates: int) -> dict:
    rec = {
        "item_id": item.item_id,
        "key": item.key,
        "job": item.job,
        "source": item.sc.source,
        "conversation_id": item.sc.conv.conversation_id,
        "gold_split": item.sc.split,
        "teacher": t.s.model,
    }
    try:
        out = await ask(item, t, min_candidates)
    except TeacherFatal:
        raise
    except TeacherError as e:
        return rec | transport_rejection(e) | {"input": item.input, "label": None}
    reasons = _reasons(out)
    rec |= {
        "status": "rejected" if reasons else "ok",
        "reasons": reasons,
        "input": item.input,
        "label": out.label if not reasons else None,
        "problems": [p.to_json() for p in out.problems],
        "usage": {
            "prompt_tokens": sum(r.prompt_tokens for r in out.replies),
            "completion_tokens": sum(r.completion_tokens for r in out.replies),
        },
        "cached": bool(out.replies) and all(r.cached for r in out.replies),
    }
    if reasons and out.replies:
        rec["raw"] = [r.text[:4000] for r in out.replies]
    return rec


# --- the append-only label file -----------------------------------------------------------------


class LabelLog:
    """labels.jsonl: records by key. Appends are flushed and fsync'd one record at a time."""

    def __init__(self, path: Path):
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        try:  # a kill mid-write left half a line: that item was never done, and is cut off here
            self.done: dict[str, dict] = {rec["key"]: rec for rec in recover_log(path)}
        except (JsonlError, KeyError) as e:
            raise ValueError(f"{path}: not a label log ({e}); move the file away to relabel") from None
        self._f = path.open("ab")
        self._lock = threading.Lock()

    def append(self, rec: dict) -> None:
        with self._lock:  # whole lines, one writer at a time
            if self._f.closed:  # only after a fatal error stopped the job; the item was never recorded
                return
            self._f.write(json.dumps(rec, ensure_ascii=False).encode() + b"\n")
            self._f.flush()
            fd = self._f.fileno()
        os.fsync(fd)  # outside the lock: concurrent appends share one disk flush
        self.done[rec["key"]] = rec

    def close(self) -> None:
        with self._lock:
            self._f.close()


def item_key(item: Item, model: str) -> str:
    return hashlib.sha256(
        json.dumps([item.job, item.item_id, item.input, model], sort_keys=True, ensure_ascii=False).encode()
    ).hexdigest()[:32]


def _transport_reject(rec: dict) -> bool:
    return rec["status"] == "rejected" and any(r.startswith("transport_") for r in rec["reasons"])


async def run_job(
    items: list[Item],
    t: Teacher,
    job_dir: Path,
    min_candidates: int = 5,
    progress: bool = True,
    retry_transport: bool = False,
) -> tuple[dict, dict]:
    """Label every item not yet in job_dir/labels.jsonl (with retry_transport, also those whose retries
    ran out last time; the newer line wins). Returns ({item_id: record} for `items`, summary)."""
    job = items[0].job if items else job_dir.name
    log = LabelLog(job_dir / "labels.jsonl")
    todo = [it for it in items if it.key not in log.done or (retry_transport and _transport_reject(log.done[it.key]))]
    t0, counts = time.time(), {"ok": 0, "rejected": 0, "transport": 0}
    bar = tqdm(
        total=len(todo), desc=f"teacher {job}", unit="item", disable=not progress, mininterval=0.5, smoothing=0.1
    )
    queue = iter(todo)
    # Stopping is a flag, not a cancellation: requests already in flight finish and are logged, so the count
    # in the message is exactly what reached labels.jsonl (a cancelled fsync thread would still write).
    no_answer = False

    async def worker():
        nonlocal no_answer
        for item in queue:  # one shared iterator: asyncio runs one worker at a time between awaits
            if no_answer:
                return
            rec = await label_item(item, t, min_candidates)
            await asyncio.to_thread(log.append, rec)  # the fsync waits in a thread, not in the event loop
            counts[rec["status"]] += 1
            counts["transport"] += _transport_reject(rec)
            bar.update(1)
            bar.set_postfix(
                failed=counts["rejected"],
                retries=t.stats.retries,
                cost=f"${cost(t.s, t.stats.prompt_tokens, t.stats.completion_tokens):.2f}",
                refresh=False,
            )
            if counts["transport"] >= NO_ANSWER_STOP and counts["transport"] == counts["ok"] + counts["rejected"]:
                no_answer = True

    tasks = [asyncio.create_task(worker()) for _ in range(min(t.s.concurrency, len(todo)))]
    stopped = None
    try:
        await asyncio.gather(*tasks)
        if no_answer:
            stopped = f"stopped after the first {counts['transport']} items of this run got no answer"
    except BaseException:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise
    finally:
        bar.close()
        log.close()
    records = {it.item_id: log.done[it.key] for it in items if it.key in log.done}
    write_rejects(job_dir / "rejects.jsonl", records.values())
    status = [r["status"] for r in records.values()]
    paid = [r["usage"] for r in records.values() if not r["cached"]]
    summary = {
        "items": len(items),
        "already_done": len(items) - len(todo),
        "labelled_now": counts["ok"],
        "rejected_now": counts["rejected"],
        "ok": status.count("ok"),
        "rejected": status.count("rejected"),
        "unaccounted": len(items) - len(records),
        "stopped": stopped,
        "seconds": round(time.time() - t0, 2),
        "items_per_s": round(len(todo) / max(time.time() - t0, 1e-9), 2),
        "this_run": t.stats.to_json(t.s),
        "all_runs": {
            "prompt_tokens": sum(u["prompt_tokens"] for u in paid),
            "completion_tokens": sum(u["completion_tokens"] for u in paid),
        },
        "reject_reasons": _count(c for r in records.values() for c in r["reasons"]),
        "dropped_records": _count(
            p["detail"] for r in records.values() for p in r["problems"] if p["code"] == "record_dropped"
        ),
    }
    summary["all_runs"]["cost_usd"] = round(
        cost(t.s, summary["all_runs"]["prompt_tokens"], summary["all_runs"]["completion_tokens"]), 6
    )
    return records, summary


def _count(codes) -> dict:
    out: dict[str, int] = {}
    for c in codes:
        out[c] = out.get(c, 0) + 1
    return dict(sorted(out.items(), key=lambda kv: (-kv[1], kv[0])))


def write_rejects(path: Path, records) -> None:
    rows = []
    for r in sorted(records, key=lambda r: r["item_id"]):
        base = {
            "job": r["job"],
            "item_id": r["item_id"],
            "source": r["source"],
            "conversation_id": r["conversation_id"],
        }
        if r["status"] == "rejected":
            rows.append(base | {"level": "item", "reasons": r["reasons"], "detail": r.get("detail", "")})
        rows += [
            base | {"level": "record", "reasons": [p["detail"]], "index": p.get("index")}
            for p in r["problems"]
            if p["code"] == "record_dropped"
        ]
    _atomic_write(path, "".join(json.dumps(x, ensure_ascii=False) + "\n" for x in rows))


def _atomic_write(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)


# --- all jobs -----------------------------------------------------------------------------------


def check_jobs(jobs: list) -> list[str]:
    """The configured jobs in table order (a job reads the labels of the jobs it comes after)."""
    unknown = [j for j in jobs if j not in NAMES]
    if unknown:
        raise ConfigError(f"jobs: unknown job(s) {unknown}; expected some of {', '.join(NAMES)}")
    for j in jobs:
        if MODELS[j].unit not in UNIT_ITEMS:
            raise ConfigError(f"jobs: {j} has no teacher items yet (its gold rows come from data/seed only)")
        if missing := [a for a in MODELS[j].after if a not in jobs]:
            raise ConfigError(f"jobs: {j} needs {' and '.join(missing)} (its items are built from their labels)")
    return [j for j in NAMES if j in jobs]


async def run_all(cfg) -> tuple[dict, dict]:
    """Every configured job in order. Returns ({job: {item_id: record}}, run summary)."""
    settings = settings_from_dict(cfg.teacher)
    jobs = check_jobs(cfg.jobs)
    if cfg.type_mode not in ("binary", "single"):
        raise ConfigError(f"type_mode {cfg.type_mode!r} is not binary or single")
    if not 0.0 <= cfg.min_ok_share <= 1.0:
        raise ConfigError(f"min_ok_share {cfg.min_ok_share} is not a share between 0 and 1")
    label_dir = Path(cfg.label_dir or Path(cfg.output_dir) / "labels")
    if synth.has_synth(cfg.sources):  # the other sources pass the check before the teacher writes a dialogue
        hygiene.check(cfg, load_sources(synth.others(cfg.sources)))
    specs, synthesis = await synth.write_sources(
        cfg.sources, settings, cfg.cache_dir, label_dir / "synth", cfg.progress
    )
    convs = load_sources(specs)
    overlap = hygiene.check(cfg, convs)  # before any labelling request: refused builds cost nothing
    results: dict[str, dict] = {}
    summary = {
        "teacher": {
            "model": settings.model,
            "endpoints": len(settings.base_urls),
            "structured": settings.structured,
            "qwen3_no_think": settings.qwen3_no_think,
            "concurrency": settings.concurrency,
            "price_input_per_1m": settings.price_input_per_1m,
            "price_output_per_1m": settings.price_output_per_1m,
        },
        "sources": {s: sum(1 for sc in convs if sc.source == s) for s in dict.fromkeys(sc.source for sc in convs)},
        "eval_overlap": overlap,
        "synthesis": synthesis,
        "jobs": {},
    }
    for job in jobs:
        items = _limit(UNIT_ITEMS[MODELS[job].unit](job, convs, results, cfg), cfg.max_items.get(job))
        for it in items:
            it.key = item_key(it, settings.model)
        async with Teacher(settings, cfg.cache_dir) as t:
            results[job], summary["jobs"][job] = await run_job(
                items, t, label_dir / job, cfg.gate_min_candidates, cfg.progress, cfg.retry_transport
            )
        label_dir.mkdir(parents=True, exist_ok=True)
        _atomic_write(label_dir / "run_summary.json", json.dumps(summary, indent=1))
        if problem := shortfall(job, summary["jobs"][job], results[job], settings, cfg.min_ok_share, label_dir / job):
            raise TeacherShortfall(problem)  # later jobs and the training sets would be built from too little
    return results, summary


def shortfall(job: str, js: dict, records: dict, s, min_share: float, job_dir: Path) -> str | None:
    """Why a job's ok labels fall short of min_share of the items it asked the teacher about, or None."""
    asked = js["items"] - sum(1 for r in records.values() if r["reasons"] == ["too_few_candidates"])
    if not asked or js["ok"] >= min_share * asked:
        return None
    transport = {k: v for k, v in js["reject_reasons"].items() if k.startswith("transport_")}
    answered = {k: v for k, v in js["reject_reasons"].items() if k not in transport}
    ran_out = sum(1 for r in records.values() if _transport_reject(r))
    example = next((r["detail"] for r in records.values() if _transport_reject(r) and r.get("detail")), "")
    lines = [
        f"teacher job {job}: {js['ok']} of {asked} items labelled ok ({js['ok'] / asked:.0%}), below min_ok_share "
        f"{min_share:g}; endpoint {', '.join(s.base_urls)} (model {s.model})",
        "  requests whose retries ran out: "
        + (", ".join(f"{k} {v}" for k, v in transport.items()) or "none")
        + (f" (e.g. {example})" if example else ""),
        "  answers rejected: " + (", ".join(f"{k} {v}" for k, v in answered.items()) or "none"),
    ]
    if js["stopped"]:
        lines.append(f"  {js['stopped']}; {js['unaccounted']} items not asked")
    lines.append(
        f"  every label received is kept in {job_dir / 'labels.jsonl'}; fix the endpoint and run the same "
        "command again: finished items are skipped"
        + (f", and retry_transport=true asks again for the {ran_out} items whose retries ran out" if ran_out else "")
    )
    return "\n".join(lines)


def run(cfg) -> tuple[dict, dict]:
    return asyncio.run(run_all(cfg))
