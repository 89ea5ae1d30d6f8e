"""Student-vs-teacher fidelity: how close a distilled extractor comes to its teacher, with no gold labels.

  memdistill eval-fidelity --config configs/eval/fidelity_cpu.yaml [key=value ...]      (make eval-fidelity)

The teacher's records are the reference for the record-level metrics of `memdistill eval`
(memdistill.metrics.extraction: one-to-one matching by content similarity, precision / recall / F1,
memory_type and time agreement on matched records beside their majority baselines), on held-out windows
cut with the windows the student was trained on (its memdistill.json; `windows` overrides them).

- Teacher reference, one of: `teacher` (an OpenAI-compatible endpoint, asked through the cached teacher
  client with the labelling job's extraction prompt and request, so a window that job or an earlier run
  already paid for is free), or `teacher_labels` (labels.jsonl of the labelling job, or its label dir:
  a window's label is found by the window's content, so the file must hold these very windows).
- Windows: the gold corpus's `split` (default test), or `source: {format, path}` of any format
  memdistill.data.sources reads. On the gold corpus, student-vs-gold and teacher-vs-gold sit beside.
- A window whose teacher answer is unusable (the labelling job's rules: unparsable, cut off) has no
  reference and is left out of the comparison; the teacher's usable rate counts it.
- A teacher endpoint that leaves any window unanswered stops the job (exit 1, naming the endpoint); the
  answers that did arrive are cached, so the rerun asks only for the rest.

The run directory gets metrics.json, outputs.jsonl (per window), report.md and fidelity.png; every rate
carries a 95% bootstrap interval over windows. Student generations are logged in
<output_dir>/generations.jsonl, so a rerun generates nothing and asks the teacher nothing new.
"""

from __future__ import annotations

import asyncio
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path

from memdistill.core.config import ConfigError, job_config
from memdistill.core.embedder import Embedder
from memdistill.core.io import recover_log, write_json
from memdistill.core.models import model_path, trained_windows
from memdistill.core.report import ci_cell, md_table, print_report, pyplot, run_dir, save_figure
from memdistill.data.label import ALWAYS_REJECT
from memdistill.data.sources import load
from memdistill.data.teacher import Teacher, TeacherError, settings_from_dict
from memdistill.eval.extractor import EvalConfig, cell, evaluate_model, test_items
from memdistill.metrics.extraction import ExtractionScores, schema_valid
from memdistill.metrics.stats import mean_ci, rate_ci
from memdistill.spec import extractor
from memdistill.spec.dialogue import first_windows, interleaved, windows


class FidelityError(RuntimeError):
    """The job cannot produce a fair comparison (a teacher that does not answer, labels for other windows)."""


@dataclass
class FidelityConfig:
    student: str = "runs/extractor-cpu/merged"  # a merged model directory (or embedded:<name>)
    student_label: str | None = None  # display name; default the directory's name
    # the teacher's endpoint: memdistill.data.teacher.TeacherSettings keys (base_urls, model, api_key_env, ...)
    teacher: dict | None = None
    teacher_labels: str | None = None  # or the labelling job's labels.jsonl / label dir (exactly one of the two)
    teacher_cache_dir: str = ".cache/teacher"  # the teacher client's reply cache (the data job's default too)
    source: dict | None = None  # {format, path} of any source memdistill.data.sources reads; None: the gold corpus
    seed_dir: str = "data/seed"
    split: str = "test"  # gold corpus split (held out from training)
    windows: dict | None = None  # {style: [W, O]}; None: the student's training windows (first per style)
    max_conversations: int | None = None
    max_windows: int | None = None
    gold: bool = True  # gold corpus: also score student and teacher against the gold records
    max_new_tokens: int = 512  # student generation, as in `memdistill eval`
    backend: str = "vllm"  # vllm (a private server) or hf (in-process)
    structured: bool = False
    concurrency: int = 16
    serve_config: str = "configs/serving/cpu.yaml"
    serve_overrides: list = field(default_factory=list)
    max_model_len: int = 4096
    batch_size: int = 8
    dtype: str = "float32"
    similarity: str = "embedding"  # or token_f1
    threshold: float | None = None  # default per similarity (memdistill.metrics.extraction.DEFAULT_THRESHOLD)
    output_dir: str = "runs/eval-fidelity"


@dataclass
class TeacherOutput:
    records: list | None  # MemoryRecords; None: no usable answer (no reference for this window)
    raw: str | None  # the reply text; None when the labels file did not keep it
    cached: bool = False


def student_windows(cfg: FidelityConfig) -> dict:
    """{style: [W, O]}: the configured windows, else the first training window per style of the student."""
    if cfg.windows:
        return cfg.windows
    path = Path(model_path(cfg.student))
    trained = trained_windows(path) if path.is_dir() else None
    if not trained:
        raise ConfigError(f"student {cfg.student}: no training windows in its metadata; set windows: {{style: [W, O]}}")
    return first_windows(trained)


def held_out_windows(cfg: FidelityConfig, win: dict):
    """(windows, {conversation_id: style}, the gold Seed or None)."""
    if cfg.source is None:
        ev = EvalConfig(
            seed_dir=cfg.seed_dir,
            split=cfg.split,
            windows=win,
            max_conversations=cfg.max_conversations,
            max_windows=cfg.max_windows,
        )
        seed, wins, _ = test_items(ev)
        return wins, {cid: c.style for cid, c in seed.conversations.items()}, seed
    if not isinstance(cfg.source, dict) or not {"format", "path"} <= set(cfg.source):
        raise ConfigError(f"source: expected a mapping with format and path, got {cfg.source!r}")
    convs = interleaved(
        {c.conversation_id: c for c in load(cfg.source["format"], cfg.source["path"])}, cfg.max_conversations
    )
    wins = []
    for c in convs.values():
        if c.style not in win:
            raise ConfigError(f"windows: no setting for conversation style {c.style!r} ({c.conversation_id})")
        wins += windows(c, *win[c.style])
    return wins[: cfg.max_windows] if cfg.max_windows else wins, {cid: c.style for cid, c in convs.items()}, None


def usable(reply_text: str, finish_reason: str | None, window) -> list | None:
    """The teacher's records when the labelling job would accept the answer, else None."""
    res = extractor.parse(reply_text, window)
    if not res.ok or finish_reason == "length" or {p.code for p in res.problems} & ALWAYS_REJECT:
        return None
    return res.records


def ask_teacher(cfg: FidelityConfig, wins, styles) -> tuple[list[TeacherOutput], dict]:
    settings = settings_from_dict(cfg.teacher)

    async def run():
        async with Teacher(settings, cfg.teacher_cache_dir) as t:
            # the labelling job's exact request (prompt, schema, name): the reply cache serves both
            got = await asyncio.gather(
                *(
                    t.complete(
                        extractor.chat_messages(w, "teacher", styles[w.conversation_id]),
                        extractor.json_schema(),
                        "memories",
                    )
                    for w in wins
                ),
                return_exceptions=True,
            )
            return got, t.stats.to_json(settings)

    got, stats = asyncio.run(run())
    failed = [g for g in got if isinstance(g, BaseException)]
    if failed:
        if not all(isinstance(g, TeacherError) for g in failed):
            raise next(g for g in failed if not isinstance(g, TeacherError))
        codes = sorted({g.code for g in failed})
        raise FidelityError(
            f"teacher {', '.join(settings.base_urls)} (model {settings.model}): no answer for {len(failed)} of "
            f"{len(wins)} windows ({', '.join(codes)}: {failed[0].detail[:200]}). The {len(wins) - len(failed)} "
            f"answers that arrived are cached in {cfg.teacher_cache_dir}; a rerun asks only for the rest."
        )
    outs = [TeacherOutput(usable(r.text, r.finish_reason, w), r.text, r.cached) for r, w in zip(got, wins)]
    return outs, stats


def labels_path(path: str) -> Path:
    p = Path(path)
    for cand in (p, p / "labels.jsonl", p / "extractor" / "labels.jsonl"):
        if cand.is_file():
            return cand
    raise ConfigError(f"teacher_labels {path}: no labels.jsonl there (expected the labelling job's file or label dir)")


def _window_key(window_json: dict) -> str:
    return json.dumps(window_json, sort_keys=True, ensure_ascii=False)


def teacher_from_labels(path: str, wins) -> tuple[list[TeacherOutput], dict]:
    """Each window's extraction label from a labelling job's log (a later line for the same item wins)."""
    f = labels_path(path)
    by_window, settings = {}, set()
    for rec in recover_log(f):
        if rec.get("job") == "extractor":
            by_window[_window_key(rec["input"]["window"])] = rec
            settings.add(f"{rec['input']['style']} {'/'.join(map(str, rec['input']['window_setting']))}")
    missing = [w for w in wins if _window_key(w.to_json()) not in by_window]
    if missing:
        raise FidelityError(
            f"{f}: no teacher label for {len(missing)} of {len(wins)} windows (first: {missing[0].conversation_id} "
            f"window {missing[0].window_index}); it holds {', '.join(sorted(settings)) or 'no extraction labels'}. "
            "Label these windows (memdistill data, with the student's windows and sources) "
            "or set `teacher` to ask the endpoint."
        )
    outs = []
    for w in wins:
        rec = by_window[_window_key(w.to_json())]
        ok = rec["status"] == "ok"
        recs = [extractor.MemoryRecord.model_validate(r) for r in rec["label"]["records"]] if ok else None
        outs.append(TeacherOutput(recs, None, bool(rec.get("cached"))))
    return outs, {"labels_file": str(f), "teacher": next(iter(by_window.values()))["teacher"] if by_window else None}


class _Reference:
    """The teacher's records in the place of gold, for the extractor eval's scoring."""

    def __init__(self, wins, outs):
        self.by = {(w.conversation_id, w.window_index): o.records for w, o in zip(wins, outs)}

    def gold_records(self, window):
        return self.by[(window.conversation_id, window.window_index)]


def _student_eval(cfg: FidelityConfig) -> EvalConfig:
    """The extractor eval's settings for the student, so its generation (cached) and scoring are reused."""
    return EvalConfig(
        models=[cfg.student],
        max_new_tokens=cfg.max_new_tokens,
        batch_size=cfg.batch_size,
        backend=cfg.backend,
        structured=cfg.structured,
        concurrency=cfg.concurrency,
        serve_config=cfg.serve_config,
        serve_overrides=cfg.serve_overrides,
        max_model_len=cfg.max_model_len,
        similarity=cfg.similarity,
        threshold=cfg.threshold,
        output_dir=cfg.output_dir,
        dtype=cfg.dtype,
    )


def _against_gold(cfg: FidelityConfig, seed, sw, st, rows, embedder) -> tuple[dict, dict]:
    """Student and teacher each scored against the gold records of the same windows."""
    sg = ExtractionScores(threshold=cfg.threshold, similarity=cfg.similarity)
    tg = ExtractionScores(threshold=cfg.threshold, similarity=cfg.similarity)
    for w, t, r in zip(sw, st, rows):
        gold, res = seed.gold_records(w), extractor.parse(r["raw"], w)
        sg.add(r["raw"], res.records, gold, res.ok, embedder, parsed=res)
        tg.add(t.raw, t.records, gold, True, embedder)
    return sg.summary(), tg.summary()


def _write_outputs(path: Path, wins, touts, rows):
    by_key = {(r["conversation_id"], r["window_index"]): r for r in rows}
    with path.open("w") as f:
        for w, t in zip(wins, touts):
            r = by_key.get((w.conversation_id, w.window_index), {})
            row = {
                "conversation_id": w.conversation_id,
                "window_index": w.window_index,
                "teacher_records": None if t.records is None else [x.model_dump() for x in t.records],
                "student_raw": r.get("raw"),
                "student_records": r.get("n_pred"),
                "matched": r.get("matched"),
            }
            f.write(json.dumps(row, ensure_ascii=False) + "\n")


def run(cfg: FidelityConfig) -> Path:
    if (cfg.teacher is None) == (cfg.teacher_labels is None):
        raise ConfigError("set exactly one of teacher (an endpoint) and teacher_labels (a labelling job's labels)")
    win = student_windows(cfg)
    wins, styles, seed = held_out_windows(cfg, win)
    if not wins:
        raise ValueError(f"no windows to score ({cfg.source or f'{cfg.split} split of {cfg.seed_dir}'})")
    if cfg.teacher is not None:
        touts, teacher_info = ask_teacher(cfg, wins, styles)
        teacher_info = {"model": cfg.teacher["model"], "endpoints": cfg.teacher["base_urls"], "this_run": teacher_info}
    else:
        touts, teacher_info = teacher_from_labels(cfg.teacher_labels, wins)
    scored = [(w, t) for w, t in zip(wins, touts) if t.records is not None]
    if not scored:
        raise FidelityError(f"no window has a usable teacher answer (of {len(wins)}): nothing to compare against")
    sw, st = [w for w, _ in scored], [t for _, t in scored]

    label = cfg.student_label or (Path(cfg.student).name if not cfg.student.startswith("embedded:") else cfg.student)
    ev = _student_eval(cfg)
    embedder = Embedder() if cfg.similarity == "embedding" else None
    # the extractor eval's own generation (cached) and scoring, with the teacher's records as the reference
    metrics, rows = evaluate_model(cfg.student, ev, _Reference(sw, st), sw, [], embedder)
    rows = [r for r in rows if "window_index" in r]
    vs_teacher = metrics["extractor"]

    result = {
        "student": cfg.student,
        "student_label": label,
        "teacher": teacher_info,
        "reference": "endpoint" if cfg.teacher is not None else "labels_file",
        "source": cfg.source or {"format": "seed", "path": cfg.seed_dir, "split": cfg.split},
        "windows_setting": win,
        "windows": len(wins),
        "scored_windows": len(sw),
        "student_vs_teacher": vs_teacher,
        "teacher_usable_rate": rate_ci([t.records is not None for t in touts]),
        # a labels file keeps the parsed records, not the reply text: the teacher's schema validity is unknown there
        "teacher_schema_valid_rate": rate_ci([schema_valid(t.raw) for t in touts]) if cfg.teacher is not None else None,
        "student_schema_valid_rate": {
            "rate": vs_teacher["schema_valid_rate"],
            "ci95": vs_teacher["schema_valid_rate_ci95"],
            "n": len(sw),
        },
        "teacher_records_per_window": mean_ci([float(len(t.records)) for t in st]),
        "student_records_per_window": mean_ci([float(r["n_pred"]) for r in rows]),
        "generation_seconds": metrics["generation_seconds"],
    }
    if seed is not None and cfg.gold:
        result["student_vs_gold"], result["teacher_vs_gold"] = _against_gold(cfg, seed, sw, st, rows, embedder)

    out = run_dir(cfg.output_dir)
    write_json(out / "metrics.json", result)
    _write_outputs(out / "outputs.jsonl", wins, touts, rows)
    write_report(out, result, cfg)
    return out


def verdict(f1: float) -> str:
    if f1 >= 0.9:
        return "very close to the teacher: nearly every record of one has a match in the other"
    if f1 >= 0.7:
        return "close to the teacher, with a visible share of records missed or added"
    if f1 >= 0.4:
        return "partway to the teacher: it finds some of the teacher's records and misses or invents many"
    return "far from the teacher: most of the teacher's records have no match in the student's output"


def summary_text(r: dict) -> str:
    v = r["student_vs_teacher"]
    pct = lambda x: f"{100 * x:.0f}%"  # noqa: E731
    ci = lambda key: f"{pct(v[key + '_ci95'][0])}-{pct(v[key + '_ci95'][1])}"  # noqa: E731
    text = (
        f"On {r['scored_windows']} held-out windows the student writes {v['predicted']} records where the teacher "
        f"writes {v['gold']}. It recovers {pct(v['memory_recall'])} of the teacher's records (recall, 95% CI "
        f"{ci('memory_recall')}), and {pct(v['memory_precision'])} of its own records match one of the teacher's "
        f"(precision, {ci('memory_precision')}); F1 {v['memory_f1']} ({ci('memory_f1')}). "
        f"The student is {verdict(v['memory_f1'])}."
    )
    if v["matched"]:
        text += (
            f" Where records match, it gives the teacher's memory_type {pct(v['type_accuracy'])} of the time "
            f"(always the teacher's majority type: {pct(v['type_accuracy_baseline'])}) and the same time "
            f"{pct(v['time_exact'])} (always empty: {pct(v['time_exact_baseline'])})."
        )
    return text


def write_report(out: Path, r: dict, cfg: FidelityConfig) -> None:
    v = r["student_vs_teacher"]
    src = r["source"]
    where = f"the {src['split']} split of {src['path']}" if cfg.source is None else f"{src['format']} {src['path']}"
    teacher = r["teacher"].get("model") or r["teacher"].get("teacher")
    how = (
        "asked through the cached teacher client"
        if r["reference"] == "endpoint"
        else f"from {r['teacher']['labels_file']}"
    )
    fmt = lambda d: ci_cell(d["rate"], d["ci95"]) if d else "n/a (labels file keeps no reply text)"  # noqa: E731
    per = lambda d: ci_cell(d["mean"], d["ci95"])  # noqa: E731
    lines = [
        f"# Student-vs-teacher fidelity: {r['student_label']} against {teacher}",
        "",
        f"{r['windows']} windows of {where}, cut with the student's windows {r['windows_setting']}; teacher "
        f"{how}. {r['scored_windows']} windows have a usable teacher answer and are compared. The teacher's "
        f"records are the reference; records are matched one to one by {v['match_similarity']} similarity >= "
        f"{v['match_threshold']}. Intervals: 95% bootstrap over windows.",
        "",
        summary_text(r),
        "",
        "## Student against the teacher",
        "",
    ]
    rows = [
        ["memory precision", cell(v, "memory_precision"), ""],
        ["memory recall", cell(v, "memory_recall"), ""],
        ["memory F1", cell(v, "memory_f1"), ""],
        ["memory_type agreement (matched)", cell(v, "type_accuracy"), v["type_accuracy_baseline"]],
        ["time agreement (matched)", cell(v, "time_exact"), v["time_exact_baseline"]],
    ]
    lines += md_table(["metric", "value [95% CI]", "majority baseline"], rows)
    lines += [
        "",
        f"Counts: student {v['predicted']} records, teacher {v['gold']}, matched {v['matched']}. Baselines: "
        f"memory_type {v['baseline_of']['type_accuracy']} (of the teacher's records), "
        f"time {v['baseline_of']['time_exact']}.",
        "",
        "## Each side on its own",
        "",
    ]
    lines += md_table(
        ["", "teacher", "student"],
        [
            ["schema-valid rate", fmt(r["teacher_schema_valid_rate"]), fmt(r["student_schema_valid_rate"])],
            ["usable answer rate (all windows)", fmt(r["teacher_usable_rate"]), ""],
            ["records per window", per(r["teacher_records_per_window"]), per(r["student_records_per_window"])],
        ],
    )
    if "student_vs_gold" in r:
        sg, tg = r["student_vs_gold"], r["teacher_vs_gold"]
        lines += ["", "## Against the gold records of the same windows", ""]
        lines += md_table(
            ["metric", "student vs gold", "teacher vs gold"],
            [
                [m, cell(sg, k), cell(tg, k)]
                for m, k in (("precision", "memory_precision"), ("recall", "memory_recall"), ("F1", "memory_f1"))
            ],
        )
    lines += ["", f"Student generation: {r['generation_seconds']} s.", "", "![fidelity](fidelity.png)", ""]
    (out / "report.md").write_text("\n".join(lines))
    chart(out / "fidelity.png", r)


def chart(path: Path, r: dict) -> None:
    v = r["student_vs_teacher"]
    keys = [("memory_precision", "precision"), ("memory_recall", "recall"), ("memory_f1", "F1"),
            ("type_accuracy", "type agr."), ("time_exact", "time agr.")]  # fmt: skip
    vals = [v[k] for k, _ in keys]
    errs = [
        [val - v[k + "_ci95"][0] for (k, _), val in zip(keys, vals)],
        [v[k + "_ci95"][1] - val for (k, _), val in zip(keys, vals)],
    ]
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 3.5))
    ax.bar([n for _, n in keys], vals, yerr=errs, capsize=4, color="tab:blue", label="student vs teacher")
    base = [None, None, None, v["type_accuracy_baseline"], v["time_exact_baseline"]]
    ax.scatter([3, 4], base[3:], marker="_", s=600, color="black", label="majority baseline", zorder=3)
    ax.set_ylim(0, 1.05)
    ax.set_title(f"{r['student_label']} vs teacher, {r['scored_windows']} windows (95% CI)")
    ax.legend(fontsize=8)
    save_figure(fig, path)


def main(argv=None) -> int:
    cfg = job_config(FidelityConfig, argv, "memdistill eval-fidelity", __doc__)
    try:
        out = run(cfg)
    except FidelityError as e:
        print(f"memdistill eval-fidelity: error: {e}", file=sys.stderr)
        return 1
    return print_report(out)


if __name__ == "__main__":
    sys.exit(main())
