"""Training sets for every compact model, built from labelled conversations.

  memdistill data --config configs/data/seed.yaml      (make data)

With the gold seed corpus as the label source (no teacher needed) this writes, under `output_dir`:
  extractor/{train,dev,test}.jsonl   SFT rows: conversational prompt/completion, extraction windows and
                                     query-analysis questions trained into one adapter
  router/{split}.jsonl               text + TriMEM labels (multi-label)
  planner/{split}.jsonl              question + complexity (+ keywords)
  gate/{split}.jsonl                 (question with complexity, candidate) pairs + keep label
  consolidator/{split}.jsonl         (new record, existing record) as one text + MERGE / SUPERSEDE / KEEPBOTH
  segmenter/{split}.jsonl            an utterance with two of context each side as one text + CHANGE / DEVELOP
  DATASET_CARD.md, stats.json        counts, label distributions, what was removed
Every row carries `schema_version`; splits follow the seed corpus's conversation split, so nothing from
a test conversation reaches a training file. Load any of them with
`datasets.load_dataset("json", data_files=...)`.

With a `teacher` configured (configs/data/teacher_*.yaml) the same files are built from teacher
labels (memdistill.data.label runs the labelling jobs first; a rerun pays only for what is missing):
- no source may share a conversation or question with a set an eval config evaluates on, nor be in a
  benchmark's format (memdistill.data.hygiene); `allow_eval_overlap: "<reason>"` overrides, and the
  reason and the overlaps go into the card (and the trained models' cards);
- a labelling job with fewer ok labels than `min_ok_share` of its items stops the build (exit 1),
  naming the endpoint and the reject counts; its labels are kept and a rerun resumes;
- rows have the same formats, plus `source`, `label_source` ("teacher" or "gold") and `teacher`;
- split by conversation: conversations of the seed corpus keep their gold split, every other
  conversation goes to dev when sha256(source|conversation id) falls under `dev_fraction`, else train;
- test.jsonl is always the gold test split; teacher labels of gold test conversations are dropped,
  and so is any train/dev row holding a message, snippet or question of 8+ words whose word 3-gram
  Jaccard with a gold test text is >= `test_overlap_threshold` (0.8);
- with `include_seed` the gold train/dev rows join the teacher rows (and win ties);
- exact duplicates (same normalised text) and near-duplicates (word 3-gram Jaccard >=
  `near_dup_threshold`, 0.9, found through bottom-16 shingle sketches and then computed exactly) are
  removed, keeping dev over train and gold over teacher; the text compared is the student prompt
  (extractor), the snippet (router), the question (planner), the question with all its candidates (gate);
- DATASET_CARD.md and stats.json add the labelling summary (items, reject reasons, tokens, cost) and
  every removal count.
"""

from __future__ import annotations

import hashlib
import json
import re
import sys
import zlib
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from memdistill.core.config import ConfigError, job_config
from memdistill.core.io import read_jsonl, write_jsonl
from memdistill.core.report import md_table
from memdistill.data import seed as seedlib
from memdistill.data.config import DataConfig
from memdistill.spec import (
    MODELS,
    SCHEMA_VERSION,
    TRAINING_SETS,
    consolidator,
    extractor,
    router,
    segmenter,
    summarizer,
)
from memdistill.spec import model as spec_model
from memdistill.spec.compact import CompactModel
from memdistill.spec.dialogue import Window, message_text, windows

SPLITS = seedlib.SPLITS


def _hash(obj) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, ensure_ascii=False).encode()).hexdigest()[:16]


# --- labelled items, gold or teacher, and the rows the spec makes of them ------------------------------


def gold_units(unit: str, seed: seedlib.Seed, split: str, cfg: DataConfig):
    """(item input, gold corpus row, row metadata) for every labelled item of `unit` in the split: the same
    inputs a teacher job sends (memdistill.data.label), so one spec row builder serves both paths."""
    yield from _GOLD_UNITS[unit](seed, split, cfg)


def _gold_windows(seed: seedlib.Seed, split: str, cfg: DataConfig):
    """Every window of every setting (train: the extra settings too); a window identical to one already
    given (short conversations) once; an empty train window kept for the `keep_empty_windows` share."""
    keep_empty = cfg.keep_empty_windows if split == "train" else 1.0
    for cid, conv in seed.conversations.items():
        if seed.split[cid] != split:
            continue
        extra = cfg.train_extra_windows if split == "train" else ()
        pairs = [tuple(p) for p in cfg.windows[conv.style]] + [tuple(p) for p in extra]
        seen = set()
        for size, overlap in dict.fromkeys(pairs):
            for w in windows(conv, size, overlap):
                key = _hash(extractor.chat_messages(w, cfg.student_prompt))
                if key in seen:
                    continue
                seen.add(key)
                recs = seed.gold_records(w)
                if not recs and int(key, 16) / 16 ** len(key) >= keep_empty:
                    continue
                inp = {"window": w.to_json(), "style": conv.style, "window_setting": [size, overlap]}
                yield inp, {"records": [r.model_dump(exclude_none=True) for r in recs]}, {"conversation_id": cid}


def _gold_questions(seed: seedlib.Seed, split: str, cfg: DataConfig):
    for q in seed.rows("questions", split):
        conv = seed.conversations[q["conversation_id"]]
        inp = {k: q[k] for k in ("question_id", "question", "question_date")} | {"names": list(conv.speakers)}
        evidence = [conv.turn(e) for e in q["evidence"]]
        gold = q | {"evidence_texts": [f"{t.speaker}: {message_text(t)}" for t in evidence]}
        yield inp, gold, {"question_id": q["question_id"], "conversation_id": q["conversation_id"]}


def _gold_snippets(seed: seedlib.Seed, split: str, cfg: DataConfig):
    seen = set()
    for s in seed.rows("types", split):
        key = router.encoder_text(s["text"]).lower()
        if key not in seen:  # the same snippet text twice would be one example counted twice
            seen.add(key)
            yield {"text": s["text"]}, s, {"snippet_id": s["snippet_id"], "conversation_id": s.get("conversation_id")}


def _gold_gate(seed: seedlib.Seed, split: str, cfg: DataConfig):
    for g in seed.rows("gate", split):
        inp = {
            "question": g["question"],
            "complexity": g["complexity"],
            "candidates": [c["content"] for c in g["candidates"]],
        }
        gold = g | {"kept_ids": [c["id"] for c in g["candidates"] if c["id"] in set(g["kept_ids"])]}
        yield (
            inp,
            gold,
            {"gate_id": g["gate_id"], "complexity": g["complexity"], "conversation_id": g["conversation_id"]},
        )


def _gold_pairs(seed: seedlib.Seed, split: str, cfg: DataConfig):
    """The gold pairs of the split, then (train and dev, consolidator_negatives > 0) that many cascade
    KEEPBOTH pairs per gold pair, chosen by hash."""
    gold = []
    for p in seed.rows("pairs", split):
        new, _ = seed.stored(p["conversation_id"], p["new"])
        old, _ = seed.stored(p["conversation_id"], p["existing"])
        meta = {"pair_id": p["pair_id"], "origin": p["origin"], "conversation_id": p["conversation_id"]}
        gold.append(({"new": new.to_json(), "existing": old.to_json()}, p, meta))
    yield from gold
    if cfg.consolidator_negatives > 0 and split != "test":
        neg = sorted(cascade_negatives(seed, split, cfg.pair_cascade), key=lambda x: _hash(x[2]["pair_id"]))
        yield from neg[: round(cfg.consolidator_negatives * len(gold))]


def cascade_negatives(seed: seedlib.Seed, split: str, cascade: dict) -> list[tuple]:
    """The pairs the runtime's cascade would ask about in the split's conversations and no gold pair names,
    as KEEPBOTH items. Records arrive in the order they were said; a gold SUPERSEDE or MERGE takes the old
    record out of later comparisons, as the runtime does, so a record already replaced is not paired again."""
    from memdistill.core.embedder import Embedder

    embed = Embedder()
    gold = {(p["existing"], p["new"]): p["action"] for p in seed.pairs if isinstance(p["new"], str)}
    out = []
    for cid in sorted(c for c, sp in seed.split.items() if sp == split):
        stored = [(seed.stored(cid, m["memory_id"]), m["memory_id"]) for m in seed.memories_of(cid)]
        recs = [(mid, rec) for (rec, _), mid in sorted(stored, key=lambda x: x[0][1])]  # in the order said
        embed([rec.content for _, rec in recs])  # one batch: the cascade's lookups below are then cached
        current: list[tuple[str, consolidator.StoredRecord]] = []
        for new_id, new in recs:
            picked, _ = consolidator.candidates(new, [r for _, r in current], embed, **cascade)
            for i, _ in picked:
                old_id, old = current[i]
                if (old_id, new_id) not in gold:
                    inp = {"new": new.to_json(), "existing": old.to_json()}
                    meta = {"pair_id": f"{old_id}~{new_id}", "origin": "cascade_negative", "conversation_id": cid}
                    out.append((inp, {"action": "KEEPBOTH", "merged": None}, meta))
            # this gold pair replaced the old record (SUPERSEDE or MERGE): the runtime stops comparing with it
            current = [x for x in current if gold.get((x[0], new_id), "KEEPBOTH") == "KEEPBOTH"] + [(new_id, new)]
    return out


def _gold_utterances(seed: seedlib.Seed, split: str, cfg: DataConfig):
    """One item per decision (every utterance but a session's first) of every labelled session."""
    for r in seed.rows("segments", split):
        conv = seed.conversations[r["conversation_id"]]
        turns = next(x for x in conv.sessions if x.session_id == r["session_id"]).turns
        for i, change in zip(segmenter.decisions(turns), segmenter.flags(turns, r["change_turn_ids"])):
            before, target, after = segmenter.context(turns, i)
            inp = {"before": before, "target": target, "after": after}
            meta = {"turn_id": turns[i].turn_id, "session_id": r["session_id"], "conversation_id": r["conversation_id"]}
            yield inp, {"change": change}, meta


def _gold_nodes(seed: seedlib.Seed, split: str, cfg: DataConfig):
    """Every gold memory-tree node of the split, its input built from the gold corpus the way the runtime
    builds it from a bank (memdistill.runtime.tree): a session's children are its gold records, a day's its
    gold sessions, and so on up; history is the three previous gold nodes of the level."""
    gold = {r["node_id"]: r for r in seed.tree}
    for cid in dict.fromkeys(r["conversation_id"] for r in seed.tree):
        conv = seed.conversations[cid]
        if seed.split[cid] != split:
            continue
        at = {t.turn_id: (s.session_id, t.timestamp) for s in conv.sessions for t in s.turns}
        # level -> what is written there, in closing order: (sessions, time, text, period)
        written = {1: [((at[m["source_turn_id"]][0],), at[m["source_turn_id"]][1], m["content"], m["memory_id"])
                       for m in seed.memories_of(cid)]}  # fmt: skip
        for w in summarizer.conversation_windows(conv):
            children = [(t, x) for ss, t, x, _ in written[w.level - 1] if set(ss) <= set(w.sessions)]
            if not children:  # the runtime writes no node over nothing
                continue
            row = gold[f"{cid}-{w.node_id}"]
            history = [(p, x) for _, _, x, p in written.get(w.level, [])[-summarizer.HISTORY :]]
            inp = summarizer.request(w, children, history, summarizer.people(conv))
            label = summarizer.gold_label(row)
            text = summarizer.profile_text(label["profiles"]) if w.level == 5 else label["summary"]
            written.setdefault(w.level, []).append((w.sessions, max(t for t, _ in children), text, w.name))
            yield inp, row, {"node_id": row["node_id"], "conversation_id": cid}


_GOLD_UNITS = {
    "window": _gold_windows,
    "question": _gold_questions,
    "snippet": _gold_snippets,
    "gate": _gold_gate,
    "pair": _gold_pairs,
    "utterance": _gold_utterances,
    "node": _gold_nodes,
}


def item_rows(m: CompactModel, inp: dict, label: dict, meta: dict, cfg: DataConfig) -> list[dict]:
    """The training rows of one labelled item (the spec's builder), with its metadata; LM rows also carry
    the student prompt they were rendered with and a row id (the hash of the prompt)."""
    opts = {"prompt": cfg.student_prompt, "compact": cfg.compact_completions} if m.head == "lm" else {}
    rows = [r | meta | {"schema_version": SCHEMA_VERSION} for r in m.rows(inp, label, **opts)]
    for r in rows:
        if "prompt" in r:
            r["row_id"] = _hash(r["prompt"])
    return rows


def gold_rows(seed: seedlib.Seed, built: str, split: str, cfg: DataConfig | None = None) -> list[dict]:
    """Every gold row of the split for the training set `built` (what `memdistill data` writes)."""
    return [r for item in gold_items(cfg or DataConfig(), seed, built, split) for r in item]


def gold_items(cfg: DataConfig, seed: seedlib.Seed, built: str, split: str) -> list[list[dict]]:
    """The rows of every gold item of the split for the training set `built`, one list per item."""
    return [
        item_rows(m, inp, m.gold_label(gold), {"source": "seed"} | meta, cfg)
        for m in MODELS.values()
        if m.built == built
        for inp, gold, meta in gold_units(m.unit, seed, split, cfg)
    ]


def _load_seed(cfg: DataConfig) -> seedlib.Seed:
    report = seedlib.check(cfg.seed_dir, minimums=False)
    if not report.ok:
        raise ValueError(
            f"{cfg.seed_dir}: the seed corpus has {len(report.errors)} error(s); run `make check-seed`:\n"
            + "\n".join(report.errors[:10])
        )
    return seedlib.load(cfg.seed_dir)


def build(cfg: DataConfig) -> dict:
    if cfg.student_prompt not in extractor.STUDENT_PROMPTS:
        raise ConfigError(
            f"student_prompt: {cfg.student_prompt!r} is not a student prompt; expected one of "
            f"{sorted(extractor.STUDENT_PROMPTS)}"
        )
    if cfg.teacher is not None:
        return build_from_teacher(cfg)
    seed = _load_seed(cfg)
    out = Path(cfg.output_dir)
    stats: dict = {"schema_version": SCHEMA_VERSION, "source": f"seed:{cfg.seed_dir}", "tasks": {}}
    check_sets(cfg.tasks)
    for task in cfg.tasks:
        tstats = {}
        for split in SPLITS:
            rows = gold_rows(seed, task, split, cfg)
            write_jsonl(out / task / f"{split}.jsonl", rows)
            tstats[split] = _describe(rows)
        stats["tasks"][task] = tstats
    _check_no_leak(seed, out, cfg.tasks)
    (out / "stats.json").write_text(json.dumps(stats, indent=1))
    (out / "DATASET_CARD.md").write_text(_card(stats))
    return stats


def check_sets(sets) -> None:
    unknown = [t for t in sets if t not in TRAINING_SETS]
    if unknown:
        raise ValueError(f"unknown task(s) {unknown}; expected some of {sorted(TRAINING_SETS)}")


def _describe(rows: list[dict]) -> dict:
    """Counts for the dataset card, read off the rows' fields."""
    d: dict = {"rows": len(rows)}
    first = rows[0] if rows else {}
    if "prompt" in first:
        d["by_task"] = dict(Counter(r["task"] for r in rows))
        d["records"] = sum(r.get("n_records") or 0 for r in rows)
        d["empty_windows"] = sum(1 for r in rows if r.get("n_records") == 0)
    elif "label_vector" in first:
        d["labels"] = dict(Counter(lab for r in rows for lab in (r["labels"] or ["none"])))
    elif "gate_id" in first:
        d["positives"] = int(sum(r["label"] for r in rows))
        d["examples"] = len({r["gate_id"] for r in rows})
    elif "memories" in first:
        d["memories"] = sum(len(r["memories"]) for r in rows)
    elif "label" in first:
        d["labels"] = dict(Counter(r["label"] for r in rows))
    return d


def _check_no_leak(seed: seedlib.Seed, out: Path, tasks) -> None:
    """No training or dev row may come from a test conversation (the gold test split stays unseen)."""
    test_convs = {c for c, s in seed.split.items() if s == "test"}
    for task in tasks:
        for split in ("train", "dev"):
            p = out / task / f"{split}.jsonl"
            for line_no, row in read_jsonl(p):
                cid = row.get("conversation_id")
                # ids only identify seed conversations in rows that come from the seed corpus
                if cid in test_convs and (row.get("source") or "seed").startswith("seed"):
                    raise AssertionError(f"{p}:{line_no}: row from test conversation {cid}")


# --- training sets from teacher labels ------------------------------------------------------------

_TOKEN = re.compile(r"[a-z0-9]+")
SHINGLE = 3  # words per shingle
SKETCH = 64  # bottom-k sketch size: Jaccard is exact below 64 shingles, estimated (sd <= 0.04 at 0.9) above
MIN_TEST_TOKENS = 8  # shorter texts ("sounds great, see you then") are too common to count as test leakage
MAX_POSTING = 5000  # a sketch hash shared by more texts than this is too common to find candidates with


def _tokens(text: str) -> list[str]:
    return _TOKEN.findall(text.lower())


def sketch(text: str) -> list[int]:
    """The SKETCH smallest crc32 hashes of the text's word 3-grams (deterministic across runs)."""
    toks = _tokens(text)
    grams = {" ".join(toks[i : i + SHINGLE]) for i in range(max(1, len(toks) - SHINGLE + 1))} if toks else set()
    return sorted({zlib.crc32(g.encode()) for g in grams})[:SKETCH]


def jaccard_estimate(a: list[int], b: list[int]) -> float:
    union = sorted(set(a) | set(b))[:SKETCH]
    both = set(a) & set(b)
    return sum(1 for h in union if h in both) / len(union) if union else 1.0


class NearDup:
    """Texts added so far; `find` names one that is the same after normalisation ("exact") or whose
    word 3-gram Jaccard with the query is at least `threshold` ("near")."""

    def __init__(self, threshold: float, min_tokens: int = 0):
        self.threshold, self.min_tokens = threshold, min_tokens
        self.exact: dict[str, object] = {}
        self.sketches: list[list[int]] = []
        self.ids: list = []
        self.postings: dict[int, list[int]] = {}

    def find(self, text: str) -> tuple[str, object] | None:
        toks = _tokens(text)
        if len(toks) < self.min_tokens:
            return None
        if (hit := self.exact.get(" ".join(toks))) is not None:
            return "exact", hit
        sk, seen = sketch(text), set()
        for h in sk:
            posting = self.postings.get(h, ())
            if len(posting) > MAX_POSTING:
                continue
            for d in posting:
                if d not in seen:
                    seen.add(d)
                    if jaccard_estimate(sk, self.sketches[d]) >= self.threshold:
                        return "near", self.ids[d]
        return None

    def add(self, text: str, id_) -> None:
        toks = _tokens(text)
        if len(toks) < self.min_tokens:
            return
        self.exact.setdefault(" ".join(toks), id_)
        sk = sketch(text)
        for h in sk:
            self.postings.setdefault(h, []).append(len(self.sketches))
        self.sketches.append(sk)
        self.ids.append(id_)


@dataclass
class Example:
    """One training example (several rows for a gate question), what it is compared by, and its split."""

    rows: list[dict]
    text: str  # compared with other examples for duplicates
    units: list[str]  # compared with the gold test texts
    split: str
    gold: bool


def hash_split(source: str, conversation_id: str, dev_fraction: float) -> str:
    h = int(hashlib.sha256(f"{source}|{conversation_id}".encode()).hexdigest()[:8], 16) / 2**32
    return "dev" if h < dev_fraction else "train"


# what an item's texts are compared with the gold test texts by (test leakage), per unit
_UNIT_TEXTS = {
    "window": lambda inp: [t.text for t in Window.from_json(inp["window"]).turns],
    "question": lambda inp: [inp["question"]],
    "snippet": lambda inp: [line.split(": ", 1)[-1] for line in router.encoder_text(inp["text"]).splitlines()],
    "gate": lambda inp: [inp["question"]],
    "pair": lambda inp: [inp["new"]["content"], inp["existing"]["content"]],
    "utterance": lambda inp: [inp["target"].split(": ", 1)[-1]],
    "node": lambda inp: [c["text"] for c in inp["children"]],
}
# a teacher item's own metadata on its rows, per unit (the gold path's ids for the same fields)
_UNIT_META = {
    "window": lambda rec: {},
    "question": lambda rec: {"question_id": rec["input"]["question_id"]},
    "snippet": lambda rec: {"snippet_id": rec["item_id"]},
    "gate": lambda rec: {"gate_id": rec["item_id"], "complexity": rec["input"]["complexity"]},
    "pair": lambda rec: {"pair_id": rec["item_id"], "origin": "teacher"},
    "utterance": lambda rec: {k: rec["input"][k] for k in ("turn_id", "session_id")},
    "node": lambda rec: {"node_id": rec["item_id"]},
}


def compared_text(rows: list[dict]) -> str:
    """What an example is compared with others by for duplicates: the LM's user message, the gate's question
    with all its candidates, or the encoder's text."""
    if "prompt" in rows[0]:
        return rows[0]["prompt"][1]["content"]
    if "query" in rows[0]:
        return "\n".join([rows[0]["query"]] + [r["text"] for r in rows])
    return rows[0]["text"]


def teacher_example(rec: dict, split: str, cfg: DataConfig) -> Example:
    """Rows from one accepted label record, by the same spec builder as the gold rows."""
    m = spec_model(rec["job"])
    meta = {
        "source": rec["source"],
        "conversation_id": rec["conversation_id"],
        "label_source": "teacher",
        "teacher": rec["teacher"],
    } | _UNIT_META[m.unit](rec)
    rows = item_rows(m, rec["input"], rec["label"], meta, cfg)
    return Example(rows, compared_text(rows), _UNIT_TEXTS[m.unit](rec["input"]), split, False)


def gold_examples(items: list[list[dict]], split: str) -> list[Example]:
    for rows in items:
        for r in rows:
            r["label_source"] = "gold"
    return [Example(rows, compared_text(rows), [], split, True) for rows in items if rows]


def gold_test_texts(seed: seedlib.Seed) -> list[str]:
    """Every text of the gold test split: its conversations' turns, snippets and questions."""
    out = [t.text for cid, c in seed.conversations.items() if seed.split[cid] == "test" for t in c.turns]
    out += [line.split(": ", 1)[-1] for s in seed.rows("types", "test") for line in s["text"].splitlines()]
    return out + [q["question"] for q in seed.rows("questions", "test")]


def dedup(examples: list[Example], test_index: NearDup, threshold: float, removed: Counter) -> list[Example]:
    """Drop teacher examples that repeat gold test text, then exact and near duplicates: dev is kept over
    train and gold over teacher (processed first); order within is by text, so the result is deterministic."""
    index, kept = NearDup(threshold), []
    for e in sorted(examples, key=lambda e: (e.split != "dev", not e.gold, e.text)):
        if not e.gold and any(test_index.find(u) for u in e.units):
            removed["near_test_text"] += 1
            continue
        if hit := index.find(e.text):
            removed[f"{hit[0]}_duplicate"] += 1
            continue
        index.add(e.text, len(kept))
        kept.append(e)
    return kept


def _uniform(rows: list[dict]) -> list[dict]:
    """Every row with the same keys (missing ones null), sorted: one schema per file for datasets/pyarrow."""
    keys = list(dict.fromkeys(k for r in rows for k in r))
    rows = [{k: r.get(k) for k in keys} for r in rows]
    return sorted(rows, key=lambda r: json.dumps(r, sort_keys=True, ensure_ascii=False))


def build_from_teacher(cfg: DataConfig) -> dict:
    from memdistill.data import label

    seed = _load_seed(cfg)
    results, summary = label.run(cfg)
    out = Path(cfg.output_dir)
    test_index = NearDup(cfg.test_overlap_threshold, MIN_TEST_TOKENS)
    for k, text in enumerate(gold_test_texts(seed)):
        test_index.add(text, k)
    stats: dict = {
        "schema_version": SCHEMA_VERSION,
        "source": f"teacher {summary['teacher']['model']} over "
        + ", ".join(summary["sources"])
        + (f" + gold corpus {cfg.seed_dir}" if cfg.include_seed else ""),
        "labelling": summary,
        "eval_overlap": summary["eval_overlap"],
        "removed": {},
        "tasks": {},
        "thresholds": {
            "near_dup_jaccard": cfg.near_dup_threshold,
            "test_overlap_jaccard": cfg.test_overlap_threshold,
            "test_overlap_min_words": MIN_TEST_TOKENS,
            "shingle_words": SHINGLE,
            "dev_fraction": cfg.dev_fraction,
        },
    }
    check_sets(cfg.tasks)
    for task in cfg.tasks:
        removed: Counter = Counter()
        examples = (
            [e for s in ("train", "dev") for e in gold_examples(gold_items(cfg, seed, task, s), s)]
            if cfg.include_seed
            else []
        )
        for job in (m.name for m in MODELS.values() if m.built == task):
            for rec in results.get(job, {}).values():
                if rec["status"] != "ok":
                    continue
                split = rec["gold_split"] or hash_split(rec["source"], rec["conversation_id"], cfg.dev_fraction)
                if split == "test":
                    removed["gold_test_conversation"] += 1
                    continue
                examples.append(teacher_example(rec, split, cfg))
        kept = dedup(examples, test_index, cfg.near_dup_threshold, removed)
        per = {s: [r for e in kept if e.split == s for r in e.rows] for s in ("train", "dev")}
        per["test"] = [r for e in gold_examples(gold_items(cfg, seed, task, "test"), "test") for r in e.rows]
        tstats = {}
        for split in SPLITS:
            rows = _uniform(per[split])
            write_jsonl(out / task / f"{split}.jsonl", rows)
            tstats[split] = _describe(rows) | {"label_source": dict(Counter(r["label_source"] for r in rows))}
            if any(r.get("n_records") is not None for r in rows):
                tstats[split]["memory_types"] = dict(
                    Counter(
                        m["dimension"]["memory_type"]
                        for r in rows
                        if r.get("n_records") is not None
                        for m in json.loads(r["completion"][0]["content"])["memories"]
                    )
                )
        stats["tasks"][task] = tstats
        stats["removed"][task] = dict(removed)
    _check_no_leak(seed, out, cfg.tasks)
    (out / "stats.json").write_text(json.dumps(stats, indent=1))
    (out / "DATASET_CARD.md").write_text(_card(stats))
    return stats


def main(argv=None) -> int:
    from memdistill.data.hygiene import EvalOverlap
    from memdistill.data.label import TeacherShortfall
    from memdistill.data.synth import SynthError
    from memdistill.data.teacher import TeacherFatal

    try:
        stats = build(job_config(DataConfig, argv, "memdistill data", __doc__))
    except TeacherFatal as e:
        print(f"memdistill data: the teacher refused every request: {e}", file=sys.stderr)
        return 1
    except (EvalOverlap, TeacherShortfall, SynthError, ConfigError) as e:
        print(f"memdistill data: {e}", file=sys.stderr)
        return 1
    for job, js in stats.get("labelling", {}).get("jobs", {}).items():
        print(
            f"labels {job}: {js['ok']} ok, {js['rejected']} rejected of {js['items']} "
            f"({js['this_run']['requests']} requests now, {js['this_run']['cache_hits']} cache hits)"
        )
    for task, per in stats["tasks"].items():
        print(f"{task}: " + ", ".join(f"{s} {d['rows']}" for s, d in per.items()))
    return 0


def _card(stats: dict) -> str:
    lines = [
        "# memdistill training data",
        "",
        f"Built by `memdistill data` from {stats['source']} (schema {stats['schema_version']}).",
        "Splits follow the seed corpus's conversation split; test conversations never reach train or dev.",
        "",
    ]
    if "labelling" in stats:
        lines[-2] = "Test is the gold test split; nothing from a gold test conversation reaches train or dev."
        lines += _labelling_card(stats)
    for task, per in stats["tasks"].items():
        lines += [f"## {task}", ""] + md_table(
            ["split", "rows", "details"],
            [
                [split, d["rows"], ", ".join(f"{k}={v}" for k, v in d.items() if k != "rows")]
                for split, d in per.items()
            ],
        )
        lines.append("")
    return "\n".join(lines)


def _labelling_card(stats: dict) -> list[str]:
    lab, th = stats["labelling"], stats["thresholds"]
    t = lab["teacher"]
    lines = [
        f"Teacher: `{t['model']}` ({t['endpoints']} endpoint(s), structured={t['structured']}, "
        f"thinking off={t['qwen3_no_think']}). Sources: "
        + ", ".join(f"{k} ({v} conversations)" for k, v in lab["sources"].items())
        + ".",
        "Other conversations are split by sha256(source|conversation id): "
        f"dev_fraction={th['dev_fraction']}; test is the gold test split.",
        "",
        "## Labelling",
        "",
    ]
    lines += md_table(
        [
            "job",
            "items",
            "ok",
            "rejected",
            "reject reasons",
            "dropped records",
            "tokens in / out (paid, all runs)",
            "cost USD",
        ],
        [
            [
                job,
                j["items"],
                j["ok"],
                j["rejected"],
                ", ".join(f"{k} {v}" for k, v in j["reject_reasons"].items()) or "-",
                ", ".join(f"{k} {v}" for k, v in j["dropped_records"].items()) or "-",
                f"{j['all_runs']['prompt_tokens']} / {j['all_runs']['completion_tokens']}",
                f"{j['all_runs']['cost_usd']:.4f}",
            ]
            for job, j in lab["jobs"].items()
        ],
    )
    lines += [
        "",
        "## Benchmark hygiene",
        "",
        "Checked against (memdistill.data.hygiene): " + "; ".join(stats["eval_overlap"]["eval_sets"]) + ".",
    ]
    if stats["eval_overlap"]["overlaps"]:
        lines += [
            "",
            f"**This build overlaps evaluated data**, allowed by the data config: "
            f'"{stats["eval_overlap"]["allowed"]}". Figures on these sets from models trained on it are '
            "not held-out figures:",
            "",
        ] + [f"- {line}" for line in stats["eval_overlap"]["summary"]]
    else:
        lines += ["", "No source shares a conversation or question with them."]
    lines += [
        "",
        "## Removed before writing",
        "",
        f"Exact duplicates: same lower-cased word sequence. Near duplicates: word {th['shingle_words']}-gram "
        f"Jaccard >= {th['near_dup_jaccard']}. Test overlap: a message, snippet or question of "
        f"{th['test_overlap_min_words']}+ words with Jaccard >= {th['test_overlap_jaccard']} to a gold test text.",
        "",
    ]
    lines += md_table(
        ["set", "gold test conversation", "test overlap", "exact duplicate", "near duplicate"],
        [
            [
                task,
                *(
                    r.get(k, 0)
                    for k in ("gold_test_conversation", "near_test_text", "exact_duplicate", "near_duplicate")
                ),
            ]
            for task, r in stats["removed"].items()
        ],
    )
    return lines + [""]


if __name__ == "__main__":
    sys.exit(main())
