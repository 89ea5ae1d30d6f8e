"""MemoType query typing and type-scoped retrieval on the gold test split.

  memdistill eval-typing --config configs/eval/typing_cpu.yaml [key=value ...]        (make eval-typing)

Reference label of each test question (memdistill.spec.querytyper): MemoType's vote of the trained type
router (`router`) over the question's gold evidence turns, the real memories that LLM-written hypothetical
ones stand in for (`data/built/querytyper/<split>.jsonl`, cast as `memdistill train querytyper` casts it).
Three ways to type a question, as the runtime could, each scored against it (accuracy, macro-F1, per-type
F1, 95% bootstrap intervals over questions, beside always answering the majority type):
- router on the raw question: the snippet router run on the question itself, its labels voted as one
  memory (what the runtime did before; MemoType says it does not work);
- router on K hypothetical memories: MemoType's procedure, the LM writes K = 5 one-sentence messages
  that would answer (the spec's student prompt, JSON Schema), the router labels each, majority vote. The LM
  is the local merged extractor on a private vLLM server (or `lm_baseline: {base_url, model, ...}`);
- the distilled query typer (`querytyper`, in process; `tests/test_encoder_serving.py` checks served ==
  in-process): one encoder call;
- rules: eval-encoders' rule router (cue words from the type definitions) on the question, voted alike.

Type-scoped retrieval, MemoType Table 2 layout: banks (`banks`) `turns` (one memory per message, MemoType's
retrieval unit) and `gold` (the gold DimMem records); every record is typed by the router as it enters the
bank; each question is answered by the runtime (plain question, BM25 + dense, reciprocal-rank fusion, the
whole ranking) unscoped and scoped by each typing above and by the reference label (the oracle). Scoped
retrieval skips records the router typed otherwise; records typed none stay searchable. Recall@k: share of
the question's evidence turns among the top-k records' source turns; NDCG@k: memdistill.metrics.recall.
ndcg_at; skipped: share of the conversation's records outside the scope (MemoType reports about 20%).
Output: runs/eval-typing/<time>/ with metrics.json, predictions.jsonl, report.md and PNG charts.
"""

from __future__ import annotations

import json
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from tqdm import tqdm

from memdistill.core.config import job_config
from memdistill.core.io import write_json
from memdistill.core.report import bars_of, ci_cell, grouped_bars, md_table, print_report, run_dir
from memdistill.metrics.encoders import class_scores
from memdistill.metrics.recall import evidence_coverage, ndcg_at
from memdistill.metrics.stats import mean_ci
from memdistill.spec import querytyper as querytyper_spec
from memdistill.spec import router as router_spec

BANKS = ("turns", "gold")
RAW, HYPO, TYPER, ORACLE = "router on the raw question", "router on K LM memories", "query typer", "reference vote"
RULES = "rules on the raw question"


@dataclass
class TypingEvalConfig:
    seed_dir: str = "data/seed"
    data_dir: str = "data/built"
    split: str = "test"
    router: str = "runs/router-cpu/model"  # labels the reference, the bank's records and every vote
    querytyper: str | None = "runs/querytyper-cpu/model"  # missing: its rows are skipped (reported)
    # the LM that writes hypothetical memories: true = the local LM below on a private vLLM server; false =
    # none; a mapping {base_url, model, api_key_env, name, qwen3_no_think} = that endpoint (eval-encoders' LMBaseline)
    lm_baseline: dict | bool = True
    lm: str = "runs/extractor-cpu/merged"
    fallback_lm: str = "embedded:smollm2-135m-instruct"
    serve_config: str = "configs/serving/cpu.yaml"
    serve_overrides: list = field(default_factory=list)
    max_model_len: int = 2048
    structured: bool = True
    concurrency: int = 16
    banks: list = field(default_factory=lambda: list(BANKS))
    ks: list = field(default_factory=lambda: [1, 3, 5, 10])
    output_dir: str = "runs/eval-typing"

    def __post_init__(self):
        from memdistill.eval.encoders import EncoderEvalConfig

        # the zero-shot LM is started exactly as eval-encoders starts it; its config checks lm_baseline
        self.lm_baseline = EncoderEvalConfig(lm_baseline=self.lm_baseline).lm_baseline
        unknown = [b for b in self.banks if b not in BANKS]
        if unknown:
            raise ValueError(f"banks: unknown {unknown}; expected some of {BANKS}")


def hypothetical_types(mm, router, questions: list[str], concurrency: int) -> tuple[list[str], list[dict]]:
    """MemoType's query type through the LM's hypothetical memories and the in-process router."""
    with ThreadPoolExecutor(concurrency) as pool:
        asked = pool.map(mm.hypothetical_memories, questions)
        parsed = list(tqdm(asked, total=len(questions), desc="hypothetical memories", unit="q"))
    types, detail = [], []
    for res in parsed:
        probs = router.scores([(router_spec.encoder_text(m),) for m in res.memories]) if res.memories else []
        types.append(querytyper_spec.vote(probs) if probs else querytyper_spec.NONE)
        detail.append({"memories": res.memories, "problems": [p.code for p in res.problems]})
    return types, detail


def build_bank(kind: str, seed, conv_ids: list[str], router):
    from memdistill.runtime import MemoryBank

    bank = (
        MemoryBank.from_turns([seed.conversations[c] for c in conv_ids])
        if kind == "turns"
        else MemoryBank.from_seed(seed, conv_ids)
    )
    bank.type_with(router.classify_types)
    return bank


def retrieval(bank, questions, scopes: dict[str, list[str] | None], ks: list[int]) -> dict:
    """Per scope: Recall@k / NDCG@k (mean with interval) and the mean share of records skipped."""
    from memdistill.runtime import MemoryRuntime

    base = MemoryRuntime(bank, budget=None)
    out = {}
    for name, types in scopes.items():
        per = {f"recall@{k}": [] for k in ks} | {f"ndcg@{k}": [] for k in ks}
        skipped = []
        for i, q in enumerate(questions):
            rt = base if types is None else base.but(query_typer=lambda _q, t=types[i]: t)
            rec = rt.recall(q.question, q.conversation_id, route=False)
            skipped.append(rec.skipped)
            for k in ks:
                per[f"recall@{k}"].append(evidence_coverage(rec.hits[:k], q.evidence)[0])
                per[f"ndcg@{k}"].append(ndcg_at(rec.hits, q.evidence, k))
        out[name] = {m: mean_ci(v) for m, v in per.items()} | {"skipped": mean_ci(skipped), "n": len(questions)}
    return out


def run(cfg: TypingEvalConfig) -> Path:
    from memdistill.core.encoder import Encoder
    from memdistill.data import seed as seedlib
    from memdistill.data.questions import seed_questions
    from memdistill.eval.encoders import zero_shot_lm
    from memdistill.train.encoder import read_rows

    out = run_dir(cfg.output_dir)
    router = Encoder(cfg.router)
    rows = read_rows(str(Path(cfg.data_dir) / "querytyper" / f"{cfg.split}.jsonl"), "querytyper", label_router=router)
    gold = [r["label"] for r in rows]
    texts = [r["text"] for r in rows]
    preds: dict[str, list[str]] = {
        RAW: [querytyper_spec.vote([p]) for p in router.scores([(t,) for t in texts])],
        RULES: [querytyper_spec.vote([router_spec.to_vector(router_spec.rule_labels(t))]) for t in texts],
    }
    skipped, detail, lm = [], [{} for _ in rows], None
    if cfg.lm_baseline:
        with zero_shot_lm(cfg, out) as (mm, name, answered_by):
            preds[HYPO], detail = hypothetical_types(mm, router, texts, cfg.concurrency)
        lm = {"row": name, **answered_by}
    else:
        skipped.append("router on K LM memories: lm_baseline is false")
    if cfg.querytyper and (Path(cfg.querytyper) / "config.json").exists():
        preds[TYPER] = Encoder(cfg.querytyper).query_types(texts)
    else:
        skipped.append(f"query typer: no exported model at {cfg.querytyper} (run `make train-querytyper`)")
    typing = {name: class_scores(p, gold, querytyper_spec.LABELS) for name, p in preds.items()}

    seed = seedlib.load(cfg.seed_dir)
    # unanswerable questions' evidence turns only look related: they stay out of retrieval, as in eval-e2e
    questions = [q for q in seed_questions(seed, cfg.split) if q.evidence and q.category not in seedlib.UNANSWERABLE]
    index = {r["question_id"]: i for i, r in enumerate(rows)}
    missing = [q.question_id for q in questions if q.question_id not in index]
    if missing:
        raise ValueError(f"{cfg.data_dir}/querytyper/{cfg.split}.jsonl lacks questions {missing[:5]}: run `make data`")
    scopes = {"unscoped": None} | {
        name: [p[index[q.question_id]] for q in questions] for name, p in {**preds, ORACLE: gold}.items()
    }
    conv_ids = sorted({q.conversation_id for q in questions})
    ret = {}
    for kind in cfg.banks:
        bank = build_bank(kind, seed, conv_ids, router)
        ret[kind] = {"records": len(bank), "typed": _type_counts(bank)} | {
            "scopes": retrieval(bank, questions, scopes, cfg.ks)
        }
    meta = {"split": cfg.split, "router": cfg.router, "querytyper": cfg.querytyper, "lm": lm, "skipped": skipped}
    meta["reference"] = dict(sorted((lab, gold.count(lab)) for lab in set(gold)))
    write_json(out / "metrics.json", {**meta, "typing": typing, "retrieval": ret})
    with (out / "predictions.jsonl").open("w") as f:
        for i, r in enumerate(rows):
            row = {"question_id": r["question_id"], "question": r["text"], "reference": gold[i]}
            row |= {name: p[i] for name, p in preds.items()} | detail[i]
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
    write_report(out, meta, typing, ret, cfg.ks)
    return out


def _type_counts(bank) -> dict:
    from collections import Counter

    return dict(Counter("+".join(it.types) or "none" for it in bank.items))


def write_report(out: Path, meta: dict, typing: dict, ret: dict, ks: list[int]) -> None:
    n = sum(meta["reference"].values())
    majority = max(meta["reference"], key=meta["reference"].get)
    lm = meta["lm"]
    L = [
        f"# Query typing and type-scoped retrieval, gold {meta['split']} split",
        "",
        f"Reference: the type router `{meta['router']}` voting over each question's gold evidence turns "
        f"(MemoType section 2.2 with real memories for the hypothetical ones): {meta['reference']}. "
        + (f"Hypothetical memories: {lm['row']} (`{lm['model']}`). " if lm else "")
        + "Brackets: 95% bootstrap intervals over questions.",
        "",
    ]
    L += [f"Skipped: {s}" for s in meta["skipped"]] + ([""] if meta["skipped"] else [])
    L += ["## Query type (against the reference vote)", ""]
    rows = [
        [
            name,
            ci_cell(s["accuracy"], s["accuracy_ci95"], ".3f"),
            ci_cell(s["macro_f1"], s["macro_f1_ci95"], ".3f"),
            *[f"{s['f1'][lab]:.3f}" for lab in querytyper_spec.LABELS],
        ]
        for name, s in typing.items()
    ]
    rows.append([f"always {majority} (majority)", f"{meta['reference'][majority] / n:.3f}", "", "", "", "", ""])
    L += md_table(["typing", "accuracy", "macro-F1", *[f"F1 {lab}" for lab in querytyper_spec.LABELS]], rows) + [""]
    for kind, r in ret.items():
        L += [
            f"## Retrieval, {kind} bank (MemoType Table 2 layout)",
            "",
            f"{r['records']} records, typed by the router on entry: {r['typed']}.",
            "",
        ]
        head = ["scope"] + [f"{m}@{k}" for k in ks for m in ("Recall", "NDCG")] + ["skipped"]
        body = []
        for name, s in r["scopes"].items():
            cells = [f"{s[f'{m}@{k}']['mean']:.3f}" for k in ks for m in ("recall", "ndcg")]
            cells[-2] = ci_cell(s[f"recall@{ks[-1]}"]["mean"], s[f"recall@{ks[-1]}"]["ci95"], ".3f")
            cells[0] = ci_cell(s[f"recall@{ks[0]}"]["mean"], s[f"recall@{ks[0]}"]["ci95"], ".3f")
            body.append([name, *cells, f"{s['skipped']['mean']:.3f}"])
        L += md_table(head, body) + [""]
    L += ["![query typing](typing.png)", "", "![scoped retrieval](retrieval.png)", ""]
    (out / "report.md").write_text("\n".join(L))
    values, intervals = bars_of(typing, ["accuracy", "macro_f1"])
    grouped_bars(out / "typing.png", values, ["accuracy", "macro-F1"],
                 f"query typing vs the reference vote, gold {meta['split']} split", intervals=intervals)  # fmt: skip
    grouped_bars(
        out / "retrieval.png",
        {
            f"{kind}: {name}": [s[f"recall@{k}"]["mean"] for k in ks]
            for kind, r in ret.items()
            for name, s in r["scopes"].items()
        },
        [f"Recall@{k}" for k in ks],
        "type-scoped retrieval",
    )


def main(argv=None) -> int:
    cfg = job_config(TypingEvalConfig, argv, "memdistill eval-typing", __doc__)
    return print_report(run(cfg))


if __name__ == "__main__":
    sys.exit(main())
