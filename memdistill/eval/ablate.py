"""Ablations of the extractor: every variant is built, trained, merged and evaluated the same way, and
the variants are reported side by side in one table.

  make ablate      (= memdistill ablate --config configs/eval/ablate_extractor_cpu.yaml)
  memdistill ablate --config configs/eval/ablate_extractor_cpu.yaml 'only=[compact, windows-2new]'

A variant is a name plus key=value overrides for each stage on top of the shared configs (and the
config's `common` overrides): `data` (memdistill.data.build), `train` (memdistill.train.extractor),
`eval` (memdistill.eval.extractor). The evaluation windows are the variant's own training windows (the
first (W, O) pair per style of its data config), so a window variant is measured on the windows it was
trained for; the gold records per message are the same whatever the windows. Each stage runs as its own
process and leaves its output under <output_dir>/<variant>/; a rerun skips finished stages and a killed
training resumes from its last checkpoint, so variants can be added to the config and the job run again.
Writes <output_dir>/report.md, results.json and ablation.png.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from memdistill.core.config import job_config, load_config
from memdistill.core.io import write_json, write_text
from memdistill.core.models import REPO, saved_dir
from memdistill.core.report import bars_of, ci_cell, grouped_bars, md_table, print_report
from memdistill.spec.dialogue import first_windows


@dataclass
class AblateConfig:
    output_dir: str = "runs/ablate"
    data_config: str = "configs/data/seed.yaml"
    train_config: str = "configs/training/extractor_cpu.yaml"
    merge_config: str = "configs/training/merge_cpu.yaml"
    eval_config: str = "configs/eval/extractor_cpu.yaml"
    # overrides every variant gets, per stage: {data: [...], train: [...], eval: [...]}
    common: dict = field(default_factory=dict)
    # [{name, note, data: [...], train: [...], eval: [...]}], reported in this order
    variants: list = field(default_factory=list)
    only: list | None = None  # run just these variants (the report still lists every finished one)
    reeval: bool = False  # evaluate again where an evaluation exists (after the eval job changed); keeps the old one


STAGES = ("data", "train", "eval")

COLUMNS = [  # (label, where) in a variant's results
    ("train s", ("train", "wall_time_s")),
    ("train tok/s", ("train", "tokens_per_s")),
    ("final loss", ("train", "final_loss")),
    ("schema-valid", ("eval", "schema_valid_rate")),
    ("memory P", ("eval", "memory_precision")),
    ("memory R", ("eval", "memory_recall")),
    ("memory F1", ("eval", "memory_f1")),
    ("capped", ("eval", "capped_outputs")),
    ("repeats dropped", ("eval", "duplicate_rate")),
    ("speaker fixes", ("eval", "speaker_fix_rate")),
    ("out tok/window", ("eval", "output_tokens_per_window")),
    ("windows", ("eval", "windows")),
    ("gen s", ("eval", "generation_seconds")),
]


def _run(args: list[str], log: Path) -> None:
    log.parent.mkdir(parents=True, exist_ok=True)
    print(f"[ablate] {' '.join(args)}  (log: {log})", file=sys.stderr, flush=True)
    with log.open("a") as f:
        code = subprocess.call([sys.executable, "-m", "memdistill", *args], cwd=REPO, stdout=f, stderr=f)
    if code:
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-15:])
        raise RuntimeError(f"`memdistill {' '.join(args)}` exited {code}; log {log}:\n{tail}")


def eval_windows(data_config: str, overrides: list[str]) -> dict:
    """The evaluation window of each style: the first (W, O) the variant trains on."""
    from memdistill.data.config import DataConfig

    return first_windows(load_config(DataConfig, REPO / data_config, overrides).windows)


def run_variant(cfg: AblateConfig, v: dict) -> dict:
    unknown = set(v) - {"name", "note", *STAGES}
    if unknown or "name" not in v:
        raise ValueError(f"variant {v}: expected name, note, {', '.join(STAGES)} (unknown: {sorted(unknown)})")
    d = Path(cfg.output_dir) / v["name"]
    over = {s: [*cfg.common.get(s, []), *v.get(s, [])] for s in STAGES}
    data_dir, train_dir, merged = d / "data", d / "train", d / "merged"
    if not (data_dir / "stats.json").exists():
        _run(["data", "--config", cfg.data_config, *over["data"], f"output_dir={data_dir}"], d / "data.log")
    if not (saved_dir(train_dir) / "memdistill.json").exists():
        _run(["train", "extractor", "--config", cfg.train_config, *over["train"], f"output_dir={train_dir}",
              f"train_file={data_dir}/extractor/train.jsonl", "eval_file=null"], d / "train.log")  # fmt: skip
    if not (merged / "config.json").exists():
        _run(["merge", "--config", cfg.merge_config, f"run_dir={train_dir}", f"output_dir={merged}"], d / "merge.log")
    metrics = sorted((d / "eval").glob("*/metrics.json"))
    if not metrics or cfg.reeval:
        wins = json.dumps(eval_windows(cfg.data_config, over["data"]))
        _run(["eval", "--config", cfg.eval_config, *over["eval"], f"models=[{merged}]", f"labels=[{v['name']}]",
              f"windows={wins}", f"output_dir={d / 'eval'}"], d / "eval.log")  # fmt: skip
        metrics = sorted((d / "eval").glob("*/metrics.json"))
    result = json.loads(metrics[-1].read_text())
    (model,) = result["results"].values()  # the variant's merged model is the only one evaluated
    return {
        "name": v["name"],
        "note": v.get("note", ""),
        "overrides": over,
        "train": json.loads((train_dir / "summary.json").read_text()),
        "eval": {**model["extractor"], "generation_seconds": model["generation_seconds"]},
        "eval_split": result["split"],
        "eval_report": str(metrics[-1].parent / "report.md"),
    }


def _get(r: dict, where: tuple[str, str]):
    """A cell: the figure, with its 95% interval where the evaluation computed one (over windows)."""
    v, ci = r[where[0]].get(where[1]), r[where[0]].get(f"{where[1]}_ci95")
    if isinstance(v, float) and ci:
        return ci_cell(v, ci, ".3f")
    return round(v, 3) if isinstance(v, float) else v


def run(cfg: AblateConfig) -> Path:
    out = Path(cfg.output_dir)
    names = [v.get("name") for v in cfg.variants]
    if cfg.only and set(cfg.only) - set(names):
        raise ValueError(f"only={cfg.only}: no variant named {sorted(set(cfg.only) - set(names))} in {names}")
    results = []
    for v in cfg.variants:
        if cfg.only and v["name"] not in cfg.only:
            done = out / v["name"] / "result.json"
            if done.exists():
                results.append(json.loads(done.read_text()))
            continue
        r = run_variant(cfg, v)
        write_json(out / v["name"] / "result.json", r)
        results.append(r)
    write_json(out / "results.json", results)
    lines = [
        "# Extractor ablations",
        "",
        f"Each row: `memdistill data` -> `train extractor` -> `merge` -> `eval` ({cfg.data_config}, "
        f"{cfg.train_config}, {cfg.eval_config}) with the overrides listed below; evaluated on the "
        f"{results[0]['eval_split'] if results else '?'} split with the variant's own training windows. "
        "Rates of repeats dropped and speaker fixes are over the records the model wrote. Brackets: 95% "
        "bootstrap intervals over the evaluation windows.",
        "",
    ]
    lines += md_table(
        ["variant", *(c for c, _ in COLUMNS)], [[r["name"], *(_get(r, w) for _, w in COLUMNS)] for r in results]
    )
    lines += ["", "## Variants", ""]
    for r in results:
        lines.append(f"- **{r['name']}**: {r['note']}  ")
        lines.append("  overrides: " + "; ".join(f"{s}: {' '.join(o)}" for s, o in r["overrides"].items() if o))
    lines += ["", "![ablation](ablation.png)", ""]
    write_text(out / "report.md", "\n".join(lines))
    if results:
        cols = ["schema_valid_rate", "memory_precision", "memory_recall", "memory_f1", "capped_rate"]
        values, intervals = bars_of({r["name"]: r["eval"] for r in results}, cols)
        grouped_bars(out / "ablation.png", values, cols, "extractor ablations", intervals=intervals)
    return out


def main(argv=None) -> int:
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    return print_report(run(job_config(AblateConfig, argv, "memdistill ablate", __doc__, config_required=True)))


if __name__ == "__main__":
    sys.exit(main())
