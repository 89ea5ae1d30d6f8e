"""Compare extractors on the gold test split: extraction and query analysis, metrics + report.

  memdistill eval --config configs/eval/extractor_cpu.yaml [key=value ...]        (make eval)

Each model (a directory, or `embedded:<name>`) generates for every test window and test question
through the shared rendering path; outputs are parsed by the spec and scored against the gold corpus.
The run directory gets metrics.json, outputs.jsonl (every raw output), report.md and PNG charts.
Finished generations are logged in <output_dir>/generations.jsonl: a killed eval resumes there.
"""

from __future__ import annotations

import json
import sys
import time
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path

from tqdm import tqdm

from memdistill.core.config import job_config
from memdistill.core.embedder import Embedder
from memdistill.core.report import grouped_bars, md_table, print_report
from memdistill.data import seed as seedlib
from memdistill.metrics.extraction import ExtractionScores, keyword_f1
from memdistill.spec import extraction, query_parse
from memdistill.spec.dialogue import interleaved, windows


@dataclass
class EvalConfig:
    models: list = field(default_factory=lambda: ["embedded:smollm2-135m-instruct", "runs/extractor-cpu/merged"])
    labels: list | None = None  # display names, one per model
    seed_dir: str = "data/seed"
    split: str = "test"
    windows: dict = field(default_factory=lambda: {"multi-party": [6, 1], "user-assistant": [4, 1]})
    max_conversations: int | None = None  # the first N of the split, conversation styles taken in turn
    max_windows: int | None = None
    max_questions: int | None = None
    max_new_tokens: int = 768  # extraction; query analysis gets query_max_new_tokens
    query_max_new_tokens: int = 256
    batch_size: int = 8  # hf backend
    backend: str = "vllm"  # vllm (a private server per model, several times faster on CPU) or hf (in-process)
    structured: bool = (
        False  # constrain decoding to the spec's JSON Schema (vllm backend); off measures the model itself
    )
    concurrency: int = 16  # vllm backend
    serve_config: str = "configs/serving/cpu.yaml"  # vllm backend: how each private server runs (gpu.yaml: bf16)
    serve_overrides: list = field(default_factory=list)  # key=value on top of serve_config, e.g. [replicas=1]
    max_model_len: int = 4096  # vllm backend: the longest window prompt + max_new_tokens must fit
    similarity: str = "embedding"  # or token_f1
    threshold: float | None = None  # default per similarity (memdistill.metrics.extraction.DEFAULT_THRESHOLD)
    output_dir: str = "runs/eval"
    dtype: str = "float32"


def test_items(cfg: EvalConfig):
    seed = seedlib.load(cfg.seed_dir)
    wins = []
    convs = {cid: c for cid, c in seed.conversations.items() if seed.split[cid] == cfg.split}
    convs = interleaved(convs, cfg.max_conversations)
    for conv in convs.values():
        size, overlap = cfg.windows[conv.style]
        wins += windows(conv, size, overlap)
    wins = wins[: cfg.max_windows] if cfg.max_windows else wins
    qs = [q for q in seed.rows("questions", cfg.split) if q["conversation_id"] in convs]
    qs = qs[: cfg.max_questions] if cfg.max_questions else qs
    return seed, wins, qs


def score_queries(outputs: list[str], questions: list[dict]) -> dict:
    n = len(questions)
    valid = nac = ad = types = kw = time_ok = 0
    for raw, q in zip(outputs, questions):
        res = query_parse.parse(raw)
        if not res.ok:
            continue
        valid += 1
        p, g = res.query, query_parse.QueryAnalysis.model_validate(q["query"])
        nac += p.need_assistant_context == g.need_assistant_context
        ad += p.answer_dim == g.answer_dim
        types += set(p.dimension.target_memory_type) == set(g.dimension.target_memory_type)
        kw += keyword_f1(p.dimension.keywords, g.dimension.keywords)
        time_ok += p.dimension.time == g.dimension.time
    d = lambda a: round(a / n, 4) if n else 0.0  # noqa: E731  (over all questions: invalid output scores 0)
    return {
        "questions": n,
        "valid_rate": d(valid),
        "need_assistant_context_acc": d(nac),
        "answer_dim_acc": d(ad),
        "target_type_exact": d(types),
        "keyword_f1": d(kw),
        "time_exact": d(time_ok),
    }


def _generate(model: str, cfg: EvalConfig, wins, qs):
    """Outputs for every window then every question; finished ones come from the run cache, so a killed
    eval resumes where it stopped and a repeated one starts no server."""
    from memdistill.eval.generate import GenerationCache, HFGenerator, VLLMGenerator

    if cfg.backend not in ("vllm", "hf"):
        raise ValueError(f"backend {cfg.backend!r}: expected vllm or hf")
    # the serving config decides how vLLM runs the model (dtype, parallelism), so it is part of the key
    served = {"serve_config": cfg.serve_config, "serve_overrides": cfg.serve_overrides} if cfg.backend == "vllm" else {}
    cache = GenerationCache(
        Path(cfg.output_dir) / "generations.jsonl",
        model,
        backend=cfg.backend,
        structured=cfg.structured and cfg.backend == "vllm",
        dtype=cfg.dtype,
        **served,
    )
    items = [(extraction.chat_messages(w), cfg.max_new_tokens, extraction.json_schema(w)) for w in wins]
    items += [
        (
            query_parse.chat_messages(q["question"], q["question_date"]),
            cfg.query_max_new_tokens,
            query_parse.json_schema(),
        )
        for q in qs
    ]
    keys = [cache.key(*it) for it in items]
    todo = [i for i, k in enumerate(keys) if cache.get(k) is None]
    groups: dict[int, list[int]] = {}  # one generator call per max_new_tokens
    for i in todo:
        groups.setdefault(items[i][1], []).append(i)
    with tqdm(
        total=len(items), initial=len(items) - len(todo), desc=f"generate {Path(model).name}", unit="prompt"
    ) as bar:
        if todo:
            vllm = cfg.backend == "vllm"
            with (
                VLLMGenerator(
                    model, cfg.structured, cfg.concurrency, cfg.max_model_len, cfg.serve_config, cfg.serve_overrides
                )
                if vllm
                else nullcontext(HFGenerator(model, cfg.dtype))
            ) as gen:
                for max_new, idx in groups.items():
                    opts = {"schema": [items[i][2] for i in idx]} if vllm else {"batch_size": cfg.batch_size}
                    gen(
                        [items[i][0] for i in idx],
                        max_new,
                        progress=bar,
                        sink=lambda j, g, idx=idx: cache.put(keys[idx[j]], g),
                        **opts,
                    )
    return [cache.get(k) for k in keys]


def evaluate_model(model: str, cfg: EvalConfig, seed, wins, qs, embedder) -> tuple[dict, list[dict]]:
    t0 = time.time()
    outs = _generate(model, cfg, wins, qs)
    gen_time = time.time() - t0
    scores = ExtractionScores(threshold=cfg.threshold, similarity=cfg.similarity)
    rows = []
    for w, o in zip(wins, outs[: len(wins)]):
        res = extraction.parse(o.text, w)
        gold = seed.gold_records(w)
        pairs = scores.add(
            o.text,
            res.records,
            gold,
            res.ok,
            embedder,
            o.prompt_tokens,
            o.output_tokens,
            parsed=res,
            capped=o.output_tokens >= cfg.max_new_tokens,
        )
        rows.append(
            {
                "model": model,
                "conversation_id": w.conversation_id,
                "window_index": w.window_index,
                "raw": o.text,
                "problems": [p.code for p in res.problems],
                "n_pred": len(res.records),
                "n_gold": len(gold),
                "matched": len(pairs),
            }
        )
    qout = outs[len(wins) :]
    for q, o in zip(qs, qout):
        rows.append({"model": model, "question_id": q["question_id"], "raw": o.text})
    metrics = {
        "extraction": scores.summary(),
        "query_parse": score_queries([o.text for o in qout], qs),
        "generation_seconds": round(gen_time, 1),
    }
    return metrics, rows


def run(cfg: EvalConfig) -> Path:
    seed, wins, qs = test_items(cfg)
    if not wins:
        raise ValueError(f"no {cfg.split} windows in {cfg.seed_dir}")
    labels = cfg.labels or [
        Path(m).name if not m.startswith("embedded:") else m.split(":", 1)[1] + " (base)" for m in cfg.models
    ]
    out = Path(cfg.output_dir) / time.strftime("%Y%m%d-%H%M%S")
    out.mkdir(parents=True, exist_ok=True)
    embedder = Embedder() if cfg.similarity == "embedding" else None
    results = {}
    with (out / "outputs.jsonl").open("w") as f:
        for label, model in zip(labels, cfg.models):
            metrics, rows = evaluate_model(model, cfg, seed, wins, qs, embedder)
            results[label] = {"model": model, **metrics}
            f.writelines(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)
    (out / "metrics.json").write_text(
        json.dumps({"split": cfg.split, "windows": len(wins), "questions": len(qs), "results": results}, indent=1)
    )
    write_report(out, results, cfg, len(wins), len(qs))
    from memdistill.train.merge import write_card

    for r in results.values():  # merged models carry their latest figures in their model card
        if (Path(r["model"]) / "memdistill.json").exists():
            write_card(
                r["model"],
                {
                    "split": cfg.split,
                    "source": str(out / "metrics.json"),
                    "extraction": r["extraction"],
                    "query_parse": r["query_parse"],
                },
            )
    return out


COUNT_COLUMNS = ["predicted", "gold", "matched"]  # per-pair rates below are over `matched` pairs only
EXTRACTION_COLUMNS = [
    "json_valid_rate",
    "schema_valid_rate",
    "memory_precision",
    "memory_recall",
    "memory_f1",
    "type_accuracy",
    "time_exact",
    "location_agreement",
    "reason_agreement",
    "purpose_agreement",
    "keyword_f1",
    "overfill_rate",
    "source_accuracy",
    "capped_outputs",
    "capped_rate",
    "records_written",
    "duplicate_rate",
    "speaker_fix_rate",
    "prompt_tokens_per_window",
    "output_tokens_per_window",
]
QUERY_COLUMNS = [
    "valid_rate",
    "need_assistant_context_acc",
    "answer_dim_acc",
    "target_type_exact",
    "keyword_f1",
    "time_exact",
]


def write_report(out: Path, results: dict, cfg: EvalConfig, n_windows: int, n_questions: int) -> None:
    first = next(iter(results.values()))["extraction"]
    lines = [
        f"# Extractor evaluation ({cfg.split} split of {cfg.seed_dir})",
        "",
        f"{n_windows} windows ({cfg.windows}), {n_questions} questions. Records matched one to one by "
        f"{first['match_similarity']} similarity >= {first['match_threshold']}.",
        "",
        "## Extraction",
        "",
    ]
    lines += md_table(
        ["metric", *results],
        [[c, *(r["extraction"][c] for r in results.values())] for c in COUNT_COLUMNS + EXTRACTION_COLUMNS],
    )
    lines += ["", "## Query analysis", ""]
    lines += md_table(
        ["metric", *results], [[c, *(r["query_parse"][c] for r in results.values())] for c in QUERY_COLUMNS]
    )
    lines += [
        "",
        "Generation time (s): " + ", ".join(f"{k} {v['generation_seconds']}" for k, v in results.items()),
        "",
        "![extraction](extraction.png)",
        "",
        "![query analysis](query_parse.png)",
        "",
    ]
    (out / "report.md").write_text("\n".join(lines))
    for name, cols in (("extraction", EXTRACTION_COLUMNS[:13]), ("query_parse", QUERY_COLUMNS)):
        grouped_bars(
            out / f"{name}.png",
            {label: [r[name][c] for c in cols] for label, r in results.items()},
            cols,
            f"{name} on the gold {cfg.split} split",
        )


def main(argv=None) -> int:
    return print_report(run(job_config(EvalConfig, argv, "memdistill eval", __doc__)))


if __name__ == "__main__":
    sys.exit(main())
