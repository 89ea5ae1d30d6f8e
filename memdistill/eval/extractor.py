"""Compare extractors on the gold test split: extraction and query analysis, metrics + report.

  memdistill eval --config configs/eval/extractor_cpu.yaml [key=value ...]        (make eval)

Each model (a directory, or `embedded:<name>`) generates for every test window and test question
through the shared rendering path; outputs are parsed by the spec and scored against the gold corpus.
The run directory gets metrics.json, outputs.jsonl (every raw output), report.md and PNG charts.
Finished generations are logged in <output_dir>/generations.jsonl: a killed eval resumes there.
"""

from __future__ import annotations

import functools
import json
import sys
import time
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path

from tqdm import tqdm

from memdistill.core.config import ConfigError, job_config
from memdistill.core.embedder import Embedder
from memdistill.core.models import trained_prompt
from memdistill.core.report import bars_of, ci_cell, grouped_bars, md_table, print_report, run_dir
from memdistill.data import seed as seedlib
from memdistill.metrics.extraction import ExtractionScores, query_scores
from memdistill.spec import extractor, query_parser
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
    # Topic-aware windows: each TraceMem episode windowed on its own (spec.dialogue.windows topic_starts).
    # null = fixed windows; gold = data/seed/segments.jsonl; a directory = a trained segmenter's predictions.
    topic_windows: str | None = None


def test_items(cfg: EvalConfig):
    seed = seedlib.load(cfg.seed_dir)
    wins = []
    convs = {cid: c for cid, c in seed.conversations.items() if seed.split[cid] == cfg.split}
    convs = interleaved(convs, cfg.max_conversations)
    for conv in convs.values():
        size, overlap = cfg.windows[conv.style]
        wins += windows(conv, size, overlap, topic_starts(conv, cfg.topic_windows, seed))
    wins = wins[: cfg.max_windows] if cfg.max_windows else wins
    qs = [q for q in seed.rows("questions", cfg.split) if q["conversation_id"] in convs]
    qs = qs[: cfg.max_questions] if cfg.max_questions else qs
    return seed, wins, qs


def topic_starts(conv, how: str | None, seed) -> set[str] | None:
    """The turn ids that open a topic in `conv`: None (fixed windows), "gold" (data/seed/segments.jsonl) or
    a trained segmenter's directory (its decisions, in process, as the served one makes them)."""
    if not how:
        return None
    if how == "gold":
        if seed is None:
            raise ValueError("topic_windows=gold needs the gold corpus (dataset=seed): only it has gold boundaries")
        rows = [r for r in seed.segments if r["conversation_id"] == conv.conversation_id]
        if len(rows) != len(conv.sessions):
            raise ValueError(f"topic_windows=gold: {conv.conversation_id} has no gold boundaries for every session")
        return {i for r in rows for i in r["change_turn_ids"]}
    from memdistill.spec import segmenter

    enc = _segmenter(how)
    out = set()
    for s in conv.sessions:
        idx = segmenter.decisions(s.turns)
        flags = enc.changes([segmenter.encoder_text(*segmenter.context(s.turns, i)) for i in idx])
        out |= {s.turns[i].turn_id for i, f in zip(idx, flags) if f}
    return out


@functools.lru_cache(maxsize=None)
def _segmenter(model_dir: str):
    """One in-process segmenter per directory for the whole run (every conversation asks it)."""
    from memdistill.core.encoder import Encoder

    return Encoder(model_dir)


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
    # the student prompt the model was trained with (its metadata; "student" for a base model)
    prompt = trained_prompt(model)
    items = [(extractor.chat_messages(w, prompt), cfg.max_new_tokens, extractor.json_schema(w)) for w in wins]
    items += [
        (
            query_parser.chat_messages(q["question"], q["question_date"]),
            cfg.query_max_new_tokens,
            query_parser.json_schema(),
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
        res = extractor.parse(o.text, w)
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
        "extractor": scores.summary(),
        "query_parser": query_scores([o.text for o in qout], qs),
        "generation_seconds": round(gen_time, 1),
    }
    return metrics, rows


def run(cfg: EvalConfig) -> Path:
    if cfg.labels is not None and len(cfg.labels) != len(cfg.models):
        raise ConfigError(f"labels: {len(cfg.labels)} labels for {len(cfg.models)} models (one per model)")
    seed, wins, qs = test_items(cfg)
    if not wins:
        raise ValueError(f"no {cfg.split} windows in {cfg.seed_dir}")
    labels = cfg.labels or [
        Path(m).name if not m.startswith("embedded:") else m.split(":", 1)[1] + " (base)" for m in cfg.models
    ]
    out = run_dir(cfg.output_dir)
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
                    "extractor": headline(r["extractor"], COUNT_COLUMNS + EXTRACTION_COLUMNS),
                    "query_parser": headline(r["query_parser"], QUERY_COLUMNS),
                },
            )
    return out


COUNT_COLUMNS = ["windows", "predicted", "gold", "matched"]  # per-pair rates below are over `matched` pairs only
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
    "assistant_trigger_precision",
    "assistant_trigger_recall",
    "assistant_trigger_f1",
    "assistant_trigger_rate",
    "assistant_trigger_gold_rate",
    "need_assistant_context_acc",
    "time_exact_where_gold",
    "time_filled_where_gold_empty",
    "location_exact_where_gold",
    "location_filled_where_gold_empty",
    "target_type_exact_where_gold",
    "target_type_filled_where_gold_empty",
    "answer_dim_acc",
    "keyword_f1",
]
CHART_COLUMNS = {
    "extractor": EXTRACTION_COLUMNS[:13],
    "query_parser": [c for c in QUERY_COLUMNS if c != "assistant_trigger_gold_rate"],
}

DEFINITIONS = """\
## Definitions

Intervals: 95% percentile bootstrap (1000 resamples, seed 0). Extraction resamples windows, query
analysis resamples questions; each resample recomputes the pooled metric from its counts (memory F1
from the pooled matched / predicted / gold counts, not a mean of per-window F1s). A baseline is the
score of a trivial answer on the same items, computed from the gold; the row under a metric gives its
rule and value.

Extraction: a predicted record is matched to at most one gold record of its window (Hungarian
assignment on content similarity, kept at or above the threshold). memory precision / recall / F1 are
matched / predicted, matched / gold and their harmonic mean. type_accuracy, time_exact, the
agreements, keyword_f1 and source_accuracy are over matched pairs only, each beside a trivial answer
scored on the same pairs: the majority memory_type and the majority source_id of all gold records, and
an empty time, location, reason, purpose or keyword list. overfill_rate: dimensions filled where the gold
leaves them empty (always empty scores 0). capped_rate: outputs that ran to the token cap.
duplicate_rate and speaker_fix_rate: records the parser dropped as repeats or whose speaker it corrected,
over the records the model wrote.

Query analysis, DimMem Table 6 layout (DimMem section 4.6): the assistant-recall trigger
(need_assistant_context) as a confusion matrix of predicted against gold need, with precision =
TP / (TP + FP), recall = TP / (TP + FN) and F1 their harmonic mean; trigger rate = share of questions
the model sends to assistant-reply recall (DimMem section 4.4 reports 12.2% of LongMemEval-S queries),
gold rate = share whose gold needs it. DimMem's gold is whether the question is of LongMemEval's
single-session-assistant type; ours is the gold query's need_assistant_context label. For reference,
DimMem's GPT-4.1-mini trigger scored precision 90.2%, recall 98.2%, F1 94.0% on 500 questions (Table 6).
Time, location and target types are not in Table 6; they are this project's metrics: exact match over
the questions whose gold sets the field (target types as a set), and the share of questions where the
model sets the field although the gold leaves it empty (a model that never fills scores 0); each exact
match sits beside always answering the most common gold value among those same questions; "n/a" marks a
rate with no questions under it. An output the parser rejects triggers nothing,
fills nothing and is wrong wherever it is scored.
"""


def cell(summary: dict, key: str) -> str:
    """value [lo, hi] for a rate; value alone for a count."""
    ci = summary.get(f"{key}_ci95")
    return ci_cell(summary[key], ci) if ci else str(summary[key])


def headline(summary: dict, cols: list[str]) -> dict:
    return {c: cell(summary, c) for c in cols}


def metric_rows(summaries: list[dict], cols: list[str], undefined=lambda s, c: False) -> list[list]:
    """A row per metric, each baselined one followed by its trivial baseline and the baseline's rule
    (per-pair baselines follow each model's own matched pairs, so they can differ between models)."""
    rows = []
    for c in cols:
        rows.append([c, *("n/a (no items)" if undefined(s, c) else cell(s, c) for s in summaries)])
        if c in summaries[0]["baseline_of"]:
            rows.append([f"  baseline: {summaries[0]['baseline_of'][c]}", *(s[f"{c}_baseline"] for s in summaries)])
    return rows


def _no_items(q: dict, c: str) -> bool:
    """A per-field query rate whose denominator is empty: no gold sets the field, or every gold does."""
    if c.endswith("_exact_where_gold"):
        return not q[c.replace("_exact_where_gold", "_gold_questions")]
    if c.endswith("_filled_where_gold_empty"):
        return q[c.replace("_filled_where_gold_empty", "_gold_questions")] == q["questions"]
    return False


def confusion_table(label: str, q: dict) -> list[str]:
    m = q["assistant_trigger_confusion"]
    tp, fp, fn, tn = m["tp"], m["fp"], m["fn"], m["tn"]
    return [f"**{label}**", ""] + md_table(
        ["", "gold: need", "gold: no need", "total"],
        [
            ["predicted: need", tp, fp, tp + fp],
            ["predicted: no need", fn, tn, fn + tn],
            ["total", tp + fn, fp + tn, q["questions"]],
        ],
    )


def write_report(out: Path, results: dict, cfg: EvalConfig, n_windows: int, n_questions: int) -> None:
    first = next(iter(results.values()))["extractor"]
    ext = [r["extractor"] for r in results.values()]
    qa = [r["query_parser"] for r in results.values()]
    lines = [
        f"# Extractor evaluation ({cfg.split} split of {cfg.seed_dir})",
        "",
        f"{n_windows} windows ({cfg.windows}), {n_questions} questions. Records matched one to one by "
        f"{first['match_similarity']} similarity >= {first['match_threshold']}. Rates: value [95% bootstrap "
        "interval] (definitions at the end).",
        "",
        "## Extraction",
        "",
    ]
    lines += md_table(["metric", *results], metric_rows(ext, COUNT_COLUMNS + EXTRACTION_COLUMNS))
    lines += ["", "## Query analysis", "", "Assistant-recall trigger (DimMem Table 6 layout):", ""]
    for label, q in zip(results, qa):
        lines += confusion_table(label, q) + [""]
    lines += [
        f"Questions whose gold sets a time: {qa[0]['time_gold_questions']}, a location: "
        f"{qa[0]['location_gold_questions']}, target types: {qa[0]['target_type_gold_questions']} (of {n_questions}).",
        "",
    ]
    lines += md_table(["metric", *results], metric_rows(qa, QUERY_COLUMNS, _no_items))
    lines += [
        "",
        "Generation time (s): " + ", ".join(f"{k} {v['generation_seconds']}" for k, v in results.items()),
        "",
        "![extraction](extractor.png)",
        "",
        "![query analysis](query_parser.png)",
        "",
        DEFINITIONS,
    ]
    (out / "report.md").write_text("\n".join(lines))
    for name, cols in CHART_COLUMNS.items():
        values, intervals = bars_of({label: r[name] for label, r in results.items()}, cols)
        grouped_bars(out / f"{name}.png", values, cols, f"{name} on the gold {cfg.split} split", intervals=intervals)


def main(argv=None) -> int:
    return print_report(run(job_config(EvalConfig, argv, "memdistill eval", __doc__)))


if __name__ == "__main__":
    sys.exit(main())
