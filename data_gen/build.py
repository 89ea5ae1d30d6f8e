"""Training sets for every compact model, built from labelled conversations.

  memdistill data --config configs/data_gen/seed.yaml      (make data)

With the gold seed corpus as the label source (no teacher needed) this writes, under `output_dir`:
  extractor/{train,dev,test}.jsonl   SFT rows: conversational prompt/completion, extraction windows and
                                     query-analysis questions trained into one adapter
  router/{split}.jsonl               text + TriMEM labels (multi-label)
  planner/{split}.jsonl              question + complexity (+ keywords)
  gate/{split}.jsonl                 (question with complexity, candidate) pairs + keep label
  DATASET_CARD.md, stats.json        counts, label distributions, what was removed
Every row carries `schema_version`; splits follow the seed corpus's conversation split, so nothing from
a test conversation reaches a training file. Load any of them with
`datasets.load_dataset("json", data_files=...)`.
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from data_gen import seed as seedlib
from memdistill.config import job_config
from memspec import SCHEMA_VERSION, extraction, memory_type, query_parse, recall_gate, recall_plan
from memspec.dialogue import WINDOW_PRESETS, windows
from memspec.render import sft_row

SPLITS = seedlib.SPLITS


@dataclass
class DataConfig:
    output_dir: str = "data/built"
    seed_dir: str = "data/seed"
    # Window settings per conversation style; each (W, O) pair yields one pass over every conversation,
    # so several pairs multiply extraction rows (the first pair is also the evaluation setting).
    windows: dict = field(default_factory=lambda: {k: [list(v)] for k, v in WINDOW_PRESETS.items()})
    tasks: list = field(default_factory=lambda: ["extractor", "router", "planner", "gate"])
    # Extra (W, O) pairs applied to train conversations only (augmentation).
    train_extra_windows: list = field(default_factory=list)


def _hash(obj) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, ensure_ascii=False).encode()).hexdigest()[:16]


def extractor_rows(seed: seedlib.Seed, split: str, window_pairs: dict, extra_pairs=()) -> list[dict]:
    rows, seen = [], set()
    for cid, conv in seed.conversations.items():
        if seed.split[cid] != split:
            continue
        pairs = [tuple(p) for p in window_pairs[conv.style]] + [tuple(p) for p in extra_pairs]
        for size, overlap in dict.fromkeys(pairs):
            for w in windows(conv, size, overlap):
                msgs = extraction.chat_messages(w, "student")
                key = _hash(msgs)
                if key in seen:  # identical windows from two settings (short conversations)
                    continue
                seen.add(key)
                recs = seed.gold_records(w)
                rows.append(sft_row(msgs, extraction.render_completion(recs), task="extraction", source="seed",
                                    conversation_id=cid, window_index=w.window_index, window=[size, overlap],
                                    n_records=len(recs), schema_version=SCHEMA_VERSION, row_id=key))
    for q in seed.rows("questions", split):
        msgs = query_parse.chat_messages(q["question"], q["question_date"], "student")
        qa = query_parse.QueryAnalysis.model_validate(q["query"])
        rows.append(sft_row(msgs, query_parse.render_completion(qa), task="query_parse", source="seed",
                            conversation_id=q["conversation_id"], question_id=q["question_id"],
                            schema_version=SCHEMA_VERSION, row_id=_hash(msgs)))
    return rows


def router_rows(seed: seedlib.Seed, split: str) -> list[dict]:
    out, seen = [], set()
    for s in seed.rows("types", split):
        text = memory_type.encoder_text(s["text"])
        if text.lower() in seen:
            continue
        seen.add(text.lower())
        out.append({"text": text, "labels": [lab for lab in memory_type.LABELS if lab in s["labels"]],
                    "label_vector": memory_type.to_vector(s["labels"]), "snippet_id": s["snippet_id"],
                    "conversation_id": s.get("conversation_id"), "schema_version": SCHEMA_VERSION})
    return out


def planner_rows(seed: seedlib.Seed, split: str) -> list[dict]:
    return [{"text": " ".join(q["question"].split()), "label": q["plan"]["complexity"],
             "label_id": recall_plan.COMPLEXITIES.index(q["plan"]["complexity"]), "keywords": q["plan"]["keywords"],
             "question_id": q["question_id"], "conversation_id": q["conversation_id"], "schema_version": SCHEMA_VERSION}
            for q in seed.rows("questions", split)]


def gate_rows(seed: seedlib.Seed, split: str) -> list[dict]:
    out = []
    for g in seed.rows("gate", split):
        kept = set(g["kept_ids"])
        for c in g["candidates"]:
            out.append({"query": recall_gate.pair_query(g["question"], g["complexity"]), "text": c["content"],
                        "label": 1.0 if c["id"] in kept else 0.0, "gate_id": g["gate_id"], "candidate_id": c["id"],
                        "complexity": g["complexity"], "conversation_id": g["conversation_id"],
                        "schema_version": SCHEMA_VERSION})
    return out


def _write(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    tmp.replace(path)


def build(cfg: DataConfig) -> dict:
    seed = seedlib.load(cfg.seed_dir)
    report = seedlib.check(cfg.seed_dir, minimums=False)
    if not report.ok:
        raise ValueError(f"{cfg.seed_dir}: the seed corpus has {len(report.errors)} error(s); run `make check-seed`:\n"
                         + "\n".join(report.errors[:10]))
    out = Path(cfg.output_dir)
    stats: dict = {"schema_version": SCHEMA_VERSION, "source": f"seed:{cfg.seed_dir}", "tasks": {}}
    makers = {"extractor": lambda s: extractor_rows(seed, s, cfg.windows, cfg.train_extra_windows if s == "train" else ()),
              "router": lambda s: router_rows(seed, s), "planner": lambda s: planner_rows(seed, s),
              "gate": lambda s: gate_rows(seed, s)}
    for task in cfg.tasks:
        if task not in makers:
            raise ValueError(f"unknown task {task!r}; expected one of {sorted(makers)}")
        tstats = {}
        for split in SPLITS:
            rows = makers[task](split)
            _write(out / task / f"{split}.jsonl", rows)
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
        d["records"] = sum(r.get("n_records", 0) for r in rows)
        d["empty_windows"] = sum(1 for r in rows if r["task"] == "extraction" and not r["n_records"])
    elif task == "router":
        d["labels"] = dict(Counter(lab for r in rows for lab in (r["labels"] or ["none"])))
    elif task == "planner":
        d["labels"] = dict(Counter(r["label"] for r in rows))
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
            for line_no, line in enumerate(p.read_text().splitlines(), 1):
                cid = json.loads(line).get("conversation_id")
                if cid in test_convs:
                    raise AssertionError(f"{p}:{line_no}: row from test conversation {cid}")


def main(argv=None) -> int:
    stats = build(job_config(DataConfig, argv, "memdistill data", __doc__))
    for task, per in stats["tasks"].items():
        print(f"{task}: " + ", ".join(f"{s} {d['rows']}" for s, d in per.items()))
    return 0


def _card(stats: dict) -> str:
    lines = ["# memdistill training data", "",
             f"Built by `memdistill data` from {stats['source']} (schema {stats['schema_version']}).",
             "Splits follow the seed corpus's conversation split; test conversations never reach train or dev.", ""]
    for task, per in stats["tasks"].items():
        lines += [f"## {task}", "", "| split | rows | details |", "|---|---|---|"]
        for split, d in per.items():
            details = ", ".join(f"{k}={v}" for k, v in d.items() if k != "rows")
            lines.append(f"| {split} | {d['rows']} | {details} |")
        lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":
    import sys
    sys.exit(main())
