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
from dataclasses import dataclass, field
from pathlib import Path

from memdistill.core.config import ConfigError, job_config
from memdistill.core.io import read_jsonl, write_jsonl
from memdistill.core.report import md_table
from memdistill.data import seed as seedlib
from memdistill.spec import (
    SCHEMA_VERSION,
    TASKS,
    consolidation,
    extraction,
    memory_type,
    query_parse,
    query_type,
    recall_gate,
    recall_plan,
    topic_segment,
)
from memdistill.spec.dialogue import WINDOW_PRESETS, Window, message_text, windows
from memdistill.spec.render import sft_row

SPLITS = seedlib.SPLITS


@dataclass
class DataConfig:
    output_dir: str = "data/built"
    seed_dir: str = "data/seed"
    # Window settings per conversation style; each (W, O) pair yields one pass over every conversation,
    # so several pairs multiply extraction rows (the first pair is also the evaluation setting).
    windows: dict = field(default_factory=lambda: {k: [list(v)] for k, v in WINDOW_PRESETS.items()})
    tasks: list = field(
        default_factory=lambda: ["extractor", "router", "planner", "gate", "consolidator", "segmenter", "querytyper"]
    )
    # Extra (W, O) pairs applied to train conversations only (augmentation).
    train_extra_windows: list = field(default_factory=list)
    # Extraction completions as the student writes them: compact records (no source_speaker, no empty
    # dimension; `extraction.parse` restores both) or, false, the full DimMem record (the schema-1.0 format).
    compact_completions: bool = True
    # The extraction student prompt rows are rendered with (a name in `extraction.STUDENT_PROMPTS`); rows
    # carry it and training writes it into the model's metadata, so serving and eval send the same one.
    student_prompt: str = "student"
    # Share of the gold train split's extraction windows with no record that are kept (chosen by hash):
    # they teach the model to answer an empty list, but each costs a whole prompt for a 6-token answer.
    keep_empty_windows: float = 1.0
    # Consolidator: KEEPBOTH rows for the cascade's pairs that no gold pair names, this many per gold pair of
    # the split (train and dev; the test split stays the gold pairs). The runtime asks the consolidator
    # about every pair the cascade (pair_cascade) lets through, most of them unrelated records, while the
    # gold pairs are hand-picked changes, restatements and hard negatives; without these rows the model
    # never sees the pairs it is asked about most. 0 turns them off (configs/data/seed.yaml says why it is off).
    consolidator_negatives: float = 0.0
    # --- teacher labelling (memdistill.data.label); with teacher null the gold corpus alone is used ---
    teacher: dict | None = (
        None  # memdistill.data.teacher.TeacherSettings as a mapping (base_urls, model, api_key_env, ...)
    )
    sources: list = field(default_factory=list)  # [{format, path, name?, style?, max_conversations?}]
    jobs: list = field(default_factory=lambda: list(TASKS))
    label_dir: str | None = None  # labels.jsonl / rejects.jsonl per job; default <output_dir>/labels
    cache_dir: str = ".cache/teacher"  # teacher replies (sqlite), shared by every run against the same teacher
    type_mode: str = "binary"  # memory_type: one yes/no request per label (binary) or one multi-label request (single)
    gate_candidates: int = 20  # BM25 top-N memories per gate question
    gate_min_candidates: int = 5
    # consolidation pairs: the candidate cascade over the extraction job's records (spec.consolidation.candidates)
    # (also the cascade whose unlabelled pairs become the consolidator's KEEPBOTH rows offline)
    pair_cascade: dict = field(default_factory=lambda: dict(consolidation.WIDE))
    retry_transport: bool = False  # ask again for items whose retries ran out in an earlier run
    # a job with fewer ok labels than this share of its items stops the build (exit 1; a rerun resumes)
    min_ok_share: float = 0.5
    # where the eval configs live whose data a teacher build may not train on (memdistill.data.hygiene)
    eval_configs: str = "configs/eval"
    # a sentence saying why this build may overlap an evaluated set anyway; written into every card
    allow_eval_overlap: str | None = None
    max_items: dict = field(default_factory=dict)  # job -> at most this many items (chosen by hash, spread out)
    include_seed: bool = True  # add the gold corpus's train/dev rows to the teacher rows
    dev_fraction: float = 0.05
    near_dup_threshold: float = 0.9
    test_overlap_threshold: float = 0.8
    progress: bool = True


def _hash(obj) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, ensure_ascii=False).encode()).hexdigest()[:16]


def extractor_rows(
    seed: seedlib.Seed,
    split: str,
    window_pairs: dict,
    extra_pairs=(),
    compact: bool = True,
    keep_empty: float = 1.0,
    prompt: str = "student",
) -> list[dict]:
    rows, seen = [], set()
    for cid, conv in seed.conversations.items():
        if seed.split[cid] != split:
            continue
        pairs = [tuple(p) for p in window_pairs[conv.style]] + [tuple(p) for p in extra_pairs]
        for size, overlap in dict.fromkeys(pairs):
            for w in windows(conv, size, overlap):
                msgs = extraction.chat_messages(w, prompt)
                key = _hash(msgs)
                if key in seen:  # identical windows from two settings (short conversations)
                    continue
                seen.add(key)
                recs = seed.gold_records(w)
                if not recs and int(key, 16) / 16 ** len(key) >= keep_empty:
                    continue
                rows.append(
                    sft_row(
                        msgs,
                        extraction.render_completion(recs, compact),
                        task="extraction",
                        source="seed",
                        conversation_id=cid,
                        window_index=w.window_index,
                        window=[size, overlap],
                        style=conv.style,
                        n_records=len(recs),
                        student_prompt=prompt,
                        schema_version=SCHEMA_VERSION,
                        row_id=key,
                    )
                )
    for q in seed.rows("questions", split):
        msgs = query_parse.chat_messages(q["question"], q["question_date"], "student")
        qa = query_parse.QueryAnalysis.model_validate(q["query"])
        rows.append(
            sft_row(
                msgs,
                query_parse.render_completion(qa),
                task="query_parse",
                source="seed",
                conversation_id=q["conversation_id"],
                question_id=q["question_id"],
                schema_version=SCHEMA_VERSION,
                row_id=_hash(msgs),
            )
        )
    return rows


def router_rows(seed: seedlib.Seed, split: str) -> list[dict]:
    out, seen = [], set()
    for s in seed.rows("types", split):
        text = memory_type.encoder_text(s["text"])
        if text.lower() in seen:
            continue
        seen.add(text.lower())
        out.append(
            {
                "text": text,
                "labels": [lab for lab in memory_type.LABELS if lab in s["labels"]],
                "label_vector": memory_type.to_vector(s["labels"]),
                "snippet_id": s["snippet_id"],
                "conversation_id": s.get("conversation_id"),
                "schema_version": SCHEMA_VERSION,
            }
        )
    return out


def planner_rows(seed: seedlib.Seed, split: str) -> list[dict]:
    return [
        {
            "text": " ".join(q["question"].split()),
            "label": q["plan"]["complexity"],
            "label_id": recall_plan.COMPLEXITIES.index(q["plan"]["complexity"]),
            "keywords": q["plan"]["keywords"],
            "question_id": q["question_id"],
            "conversation_id": q["conversation_id"],
            "schema_version": SCHEMA_VERSION,
        }
        for q in seed.rows("questions", split)
    ]


def gate_rows(seed: seedlib.Seed, split: str) -> list[dict]:
    out = []
    for g in seed.rows("gate", split):
        kept = set(g["kept_ids"])
        for c in g["candidates"]:
            out.append(
                {
                    "query": recall_gate.pair_query(g["question"], g["complexity"]),
                    "text": c["content"],
                    "label": 1.0 if c["id"] in kept else 0.0,
                    "gate_id": g["gate_id"],
                    "candidate_id": c["id"],
                    "complexity": g["complexity"],
                    "conversation_id": g["conversation_id"],
                    "schema_version": SCHEMA_VERSION,
                }
            )
    return out


def cascade_negatives(seed: seedlib.Seed, split: str, cascade: dict) -> list[dict]:
    """The pairs the runtime's cascade would ask about in the split's conversations and no gold pair names,
    as KEEPBOTH rows. Records arrive in the order they were said; a gold SUPERSEDE or MERGE takes the old
    record out of later comparisons, as the runtime does, so a record already replaced is not paired again."""
    from memdistill.core.embedder import Embedder

    embed = Embedder()
    gold = {(p["existing"], p["new"]): p["action"] for p in seed.pairs if isinstance(p["new"], str)}
    out = []
    for cid in sorted(c for c, sp in seed.split.items() if sp == split):
        stored = [(seed.stored(cid, m["memory_id"]), m["memory_id"]) for m in seed.memories_of(cid)]
        recs = [(mid, rec) for (rec, _), mid in sorted(stored, key=lambda x: x[0][1])]  # in the order said
        embed([rec.content for _, rec in recs])  # one batch: the cascade's lookups below are then cached
        current: list[tuple[str, consolidation.StoredRecord]] = []
        for new_id, new in recs:
            picked, _ = consolidation.candidates(new, [r for _, r in current], embed, **cascade)
            for i, _ in picked:
                old_id, old = current[i]
                if (old_id, new_id) not in gold:
                    out.append(_pair_row(new, old, "KEEPBOTH", None, f"{old_id}~{new_id}", "cascade_negative", cid))
            # this gold pair replaced the old record (SUPERSEDE or MERGE): the runtime stops comparing with it
            current = [x for x in current if gold.get((x[0], new_id), "KEEPBOTH") == "KEEPBOTH"] + [(new_id, new)]
    return out


def _pair_row(new, old, action: str, merged, pair_id: str, origin: str, cid: str) -> dict:
    return {
        "text": consolidation.encoder_text(new, old),
        "label": action,
        "label_id": consolidation.ACTIONS.index(action),
        "merged": merged,
        "new": new.to_json(),
        "existing": old.to_json(),
        "pair_id": pair_id,
        "origin": origin,
        "conversation_id": cid,
        "schema_version": SCHEMA_VERSION,
    }


def consolidator_rows(
    seed: seedlib.Seed, split: str, cascade: dict | None = None, negatives: float = 0.0
) -> list[dict]:
    """The gold pairs of the split, plus (train and dev, negatives > 0) that many cascade KEEPBOTH rows per
    gold pair, chosen by hash."""
    out = []
    for p in seed.rows("pairs", split):
        new, _ = seed.stored(p["conversation_id"], p["new"])
        old, _ = seed.stored(p["conversation_id"], p["existing"])
        out.append(_pair_row(new, old, p["action"], p.get("merged"), p["pair_id"], p["origin"], p["conversation_id"]))
    if negatives > 0 and cascade is not None and split != "test":
        neg = sorted(cascade_negatives(seed, split, cascade), key=lambda r: _hash(r["pair_id"]))
        out += neg[: round(negatives * len(out))]
    return out


def segmenter_rows(seed: seedlib.Seed, split: str) -> list[dict]:
    """One row per decision (every utterance but a session's first) of every labelled session."""
    out = []
    for r in seed.rows("segments", split):
        conv = seed.conversations[r["conversation_id"]]
        turns = next(x for x in conv.sessions if x.session_id == r["session_id"]).turns
        for i, change in zip(topic_segment.decisions(turns), topic_segment.flags(turns, r["change_turn_ids"])):
            before, target, after = topic_segment.context(turns, i)
            out.append(
                {
                    "text": topic_segment.encoder_text(before, target, after),
                    "before": before,
                    "target": target,
                    "after": after,
                    "label": topic_segment.LABELS[change],
                    "label_id": int(change),
                    "turn_id": turns[i].turn_id,
                    "session_id": r["session_id"],
                    "conversation_id": r["conversation_id"],
                    "schema_version": SCHEMA_VERSION,
                }
            )
    return out


def querytyper_rows(seed: seedlib.Seed, split: str) -> list[dict]:
    """One row per question with its first query_type.K evidence turns, `Speaker: text` as the router reads
    snippets, as the memories the type router votes over: MemoType's hypothetical memories are one-speaker
    dialogue records standing in for exactly these (memdistill.spec.query_type). The label is that vote,
    cast by `memdistill train querytyper` with the router its config names (a trained model, which this
    stage may not import)."""
    return [
        {
            "text": query_type.encoder_text(q["question"]),
            "memories": [
                f"{t.speaker}: {message_text(t)}"
                for t in (seed.conversations[q["conversation_id"]].turn(e) for e in q["evidence"][: query_type.K])
            ],
            "question_id": q["question_id"],
            "conversation_id": q["conversation_id"],
            "schema_version": SCHEMA_VERSION,
        }
        for q in seed.rows("questions", split)
    ]


def _load_seed(cfg: DataConfig) -> seedlib.Seed:
    report = seedlib.check(cfg.seed_dir, minimums=False)
    if not report.ok:
        raise ValueError(
            f"{cfg.seed_dir}: the seed corpus has {len(report.errors)} error(s); run `make check-seed`:\n"
            + "\n".join(report.errors[:10])
        )
    return seedlib.load(cfg.seed_dir)


def gold_makers(cfg: DataConfig, seed: seedlib.Seed) -> dict:
    """Training set -> (split -> rows from the gold corpus), for every set in cfg.tasks."""
    makers = {
        "extractor": lambda s: extractor_rows(
            seed,
            s,
            cfg.windows,
            cfg.train_extra_windows if s == "train" else (),
            cfg.compact_completions,
            cfg.keep_empty_windows if s == "train" else 1.0,
            cfg.student_prompt,
        ),
        "router": lambda s: router_rows(seed, s),
        "planner": lambda s: planner_rows(seed, s),
        "gate": lambda s: gate_rows(seed, s),
        "consolidator": lambda s: consolidator_rows(seed, s, cfg.pair_cascade, cfg.consolidator_negatives),
        "segmenter": lambda s: segmenter_rows(seed, s),
        "querytyper": lambda s: querytyper_rows(seed, s),
    }
    unknown = [t for t in cfg.tasks if t not in makers]
    if unknown:
        raise ValueError(f"unknown task(s) {unknown}; expected some of {sorted(makers)}")
    return makers


def build(cfg: DataConfig) -> dict:
    if cfg.student_prompt not in extraction.STUDENT_PROMPTS:
        raise ConfigError(
            f"student_prompt: {cfg.student_prompt!r} is not a student prompt; expected one of "
            f"{sorted(extraction.STUDENT_PROMPTS)}"
        )
    if cfg.teacher is not None:
        return build_from_teacher(cfg)
    seed = _load_seed(cfg)
    out = Path(cfg.output_dir)
    stats: dict = {"schema_version": SCHEMA_VERSION, "source": f"seed:{cfg.seed_dir}", "tasks": {}}
    makers = gold_makers(cfg, seed)
    for task in cfg.tasks:
        tstats = {}
        for split in SPLITS:
            rows = makers[task](split)
            write_jsonl(out / task / f"{split}.jsonl", rows)
            tstats[split] = _describe(task, rows)
        stats["tasks"][task] = tstats
    _check_no_leak(seed, out, cfg.tasks)
    (out / "stats.json").write_text(json.dumps(stats, indent=1))
    (out / "DATASET_CARD.md").write_text(_card(stats))
    return stats


def _describe(task: str, rows: list[dict]) -> dict:
    d: dict = {"rows": len(rows)}
    if task == "extractor":
        d["by_task"] = dict(Counter(r["task"] for r in rows))
        d["records"] = sum(r.get("n_records") or 0 for r in rows)
        d["empty_windows"] = sum(1 for r in rows if r["task"] == "extraction" and not r["n_records"])
    elif task == "router":
        d["labels"] = dict(Counter(lab for r in rows for lab in (r["labels"] or ["none"])))
    elif task in ("planner", "consolidator", "segmenter"):
        d["labels"] = dict(Counter(r["label"] for r in rows))
    elif task == "querytyper":
        d["memories"] = sum(len(r["memories"]) for r in rows)
    elif task == "gate":
        d["positives"] = int(sum(r["label"] for r in rows))
        d["examples"] = len({r["gate_id"] for r in rows})
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

TASK_JOBS = {
    "extractor": ("extraction", "query_parse"),
    "router": ("memory_type",),
    "planner": ("recall_plan",),
    "gate": ("recall_gate",),
    "consolidator": ("consolidation",),
    "segmenter": ("topic_segment",),
    "querytyper": ("query_type",),  # hypothetical memories; `memdistill train querytyper` casts the router's vote
}
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


def teacher_example(rec: dict, split: str, compact: bool = True, prompt: str = "student") -> Example:
    """Rows in the gold build's formats from one accepted label record."""
    inp, lab, job = rec["input"], rec["label"], rec["job"]
    meta = {
        "source": rec["source"],
        "conversation_id": rec["conversation_id"],
        "label_source": "teacher",
        "teacher": rec["teacher"],
        "schema_version": SCHEMA_VERSION,
    }
    if job == "extraction":
        w = Window.from_json(inp["window"])
        recs = [extraction.MemoryRecord.model_validate(r) for r in lab["records"]]
        msgs = extraction.chat_messages(w, prompt)
        row = sft_row(
            msgs,
            extraction.render_completion(recs, compact),
            task="extraction",
            **meta,
            window_index=w.window_index,
            window=inp["window_setting"],
            style=inp["style"],
            n_records=len(recs),
            student_prompt=prompt,
            row_id=_hash(msgs),
        )
        return Example([row], msgs[1]["content"], [t.text for t in w.turns], split, False)
    if job == "query_parse":
        msgs = query_parse.chat_messages(inp["question"], inp["question_date"], "student")
        row = sft_row(
            msgs,
            query_parse.render_completion(query_parse.QueryAnalysis.model_validate(lab)),
            task="query_parse",
            **meta,
            question_id=inp["question_id"],
            row_id=_hash(msgs),
        )
        return Example([row], msgs[1]["content"], [inp["question"]], split, False)
    if job == "memory_type":
        text = memory_type.encoder_text(inp["text"])
        row = {
            "text": text,
            "labels": [lab_ for lab_ in memory_type.LABELS if lab_ in lab["labels"]],
            "label_vector": memory_type.to_vector(lab["labels"]),
            "snippet_id": rec["item_id"],
            **meta,
        }
        return Example([row], text, [line.split(": ", 1)[-1] for line in text.splitlines()], split, False)
    if job == "recall_plan":
        q = " ".join(inp["question"].split())
        row = {
            "text": q,
            "label": lab["complexity"],
            "label_id": recall_plan.COMPLEXITIES.index(lab["complexity"]),
            "keywords": lab["keywords"],
            "question_id": inp["question_id"],
            **meta,
        }
        return Example([row], q, [q], split, False)
    if job == "recall_gate":
        kept, query = set(lab["kept_ids"]), recall_gate.pair_query(inp["question"], inp["complexity"])
        rows = [
            {
                "query": query,
                "text": c,
                "label": 1.0 if i in kept else 0.0,
                "gate_id": rec["item_id"],
                "candidate_id": i,
                "complexity": inp["complexity"],
                **meta,
            }
            for i, c in enumerate(inp["candidates"], 1)
        ]
        return Example(rows, "\n".join([query] + inp["candidates"]), [inp["question"]], split, False)
    if job == "consolidation":
        new, old = (consolidation.StoredRecord.from_json(inp[k]) for k in ("new", "existing"))
        text = consolidation.encoder_text(new, old)
        row = {
            "text": text,
            "label": lab["action"],
            "label_id": consolidation.ACTIONS.index(lab["action"]),
            "merged": lab["merged"],
            "new": inp["new"],
            "existing": inp["existing"],
            "pair_id": rec["item_id"],
            "origin": "teacher",
            **meta,
        }
        return Example([row], text, [new.content, old.content], split, False)
    if job == "topic_segment":
        change = lab["intent"] == "CHANGE"
        text = topic_segment.encoder_text(inp["before"], inp["target"], inp["after"])
        row = {
            "text": text,
            "before": inp["before"],
            "target": inp["target"],
            "after": inp["after"],
            "label": topic_segment.LABELS[change],
            "label_id": int(change),
            "turn_id": inp["turn_id"],
            "session_id": inp["session_id"],
            **meta,
        }
        return Example([row], text, [inp["target"].split(": ", 1)[-1]], split, False)
    if job == "query_type":
        q = query_type.encoder_text(inp["question"])
        row = {"text": q, "memories": lab["memories"], "question_id": inp["question_id"], **meta}
        return Example([row], q, [inp["question"]], split, False)
    raise ValueError(f"unknown job {job!r}")


def gold_examples(task: str, rows: list[dict], split: str) -> list[Example]:
    for r in rows:
        r.setdefault("source", "seed")
        r["label_source"] = "gold"
    if task == "gate":
        by_id: dict[str, list[dict]] = {}
        for r in rows:
            by_id.setdefault(r["gate_id"], []).append(r)
        return [
            Example(g, "\n".join([g[0]["query"]] + [r["text"] for r in g]), [], split, True) for g in by_id.values()
        ]
    return [
        Example([r], r["prompt"][1]["content"] if task == "extractor" else r["text"], [], split, True) for r in rows
    ]


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
    gold = gold_makers(cfg, seed)
    for task in cfg.tasks:
        removed: Counter = Counter()
        examples = (
            [e for s in ("train", "dev") for e in gold_examples(task, gold[task](s), s)] if cfg.include_seed else []
        )
        for job in TASK_JOBS[task]:
            for rec in results.get(job, {}).values():
                if rec["status"] != "ok":
                    continue
                split = rec["gold_split"] or hash_split(rec["source"], rec["conversation_id"], cfg.dev_fraction)
                if split == "test":
                    removed["gold_test_conversation"] += 1
                    continue
                examples.append(teacher_example(rec, split, cfg.compact_completions, cfg.student_prompt))
        kept = dedup(examples, test_index, cfg.near_dup_threshold, removed)
        per = {s: [r for e in kept if e.split == s for r in e.rows] for s in ("train", "dev")}
        per["test"] = [r for e in gold_examples(task, gold[task]("test"), "test") for r in e.rows]
        tstats = {}
        for split in SPLITS:
            rows = _uniform(per[split])
            write_jsonl(out / task / f"{split}.jsonl", rows)
            tstats[split] = _describe(task, rows) | {"label_source": dict(Counter(r["label_source"] for r in rows))}
            if task == "extractor":
                tstats[split]["memory_types"] = dict(
                    Counter(
                        m["dimension"]["memory_type"]
                        for r in rows
                        if r["task"] == "extraction"
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
