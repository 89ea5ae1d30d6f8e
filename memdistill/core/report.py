"""What every job's report is made of: markdown tables, PNG charts (no display needed), loss curves and
the pieces of a model card. One copy each, so all reports read alike."""

from __future__ import annotations

import json
import time
from pathlib import Path


def md_table(header: list, rows: list[list]) -> list[str]:
    return ["| " + " | ".join(str(h) for h in header) + " |", "|" + "---|" * len(header)] + [
        "| " + " | ".join(str(c) for c in r) + " |" for r in rows
    ]


def ci_cell(value, ci, spec: str = "", ci_spec: str | None = None) -> str:
    """A figure with its 95% interval, `value [lo, hi]`, the way every report prints one."""
    ci_spec = spec if ci_spec is None else ci_spec
    return f"{value:{spec}} [{ci[0]:{ci_spec}}, {ci[1]:{ci_spec}}]"


def rate_cell(s: dict, key: str, scale: float = 1, spec: str = ".3f", ci_spec: str | None = ".2f") -> str:
    """`s[key]` with its interval `s[key + "_ci95"]` (every rate in the reports carries one), scaled (100 for
    percentages); "-" where the figure is missing (None: no unit had it)."""
    if s.get(key) is None:
        return "-"
    return ci_cell(s[key] * scale, [x * scale for x in s[f"{key}_ci95"]], spec, ci_spec)


def run_dir(output_dir) -> Path:
    """A new run directory, output_dir/<YYYYmmdd-HHMMSS>: every eval job writes one per run."""
    out = Path(output_dir) / time.strftime("%Y%m%d-%H%M%S")
    out.mkdir(parents=True, exist_ok=True)
    return out


def flat(d: dict, prefix: str = "") -> dict:
    """{"a": {"b": 1}} -> {"a.b": 1}"""
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def pyplot():
    """matplotlib.pyplot on the Agg backend: jobs run on machines without a display."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig, path, dpi: int = 110) -> None:
    fig.tight_layout()
    fig.savefig(path, dpi=dpi)
    pyplot().close(fig)


def draw_grouped_bars(
    ax,
    values: dict[str, list[float]],
    columns: list[str],
    title: str,
    ylim=(0, 1.05),
    rotation: int = 40,
    intervals: dict[str, list] | None = None,
) -> None:
    """On one axis: a group of bars per column, one bar per series (e.g. per model or system); `intervals`
    (per series, a [lo, hi] or None per column) draws each figure's 95% interval as an error bar."""
    width = 0.8 / max(1, len(values))
    for k, (label, ys) in enumerate(values.items()):
        xs = [i + k * width for i in range(len(columns))]
        ax.bar(xs, ys, width, label=label)
        cis = (intervals or {}).get(label) or []
        drawn = [(x, y, ci) for x, y, ci in zip(xs, ys, cis) if ci and y == y]  # y != y: NaN, no bar
        if drawn:
            err = [[max(0.0, y - ci[0]) for _, y, ci in drawn], [max(0.0, ci[1] - y) for _, y, ci in drawn]]
            ax.errorbar([x for x, _, _ in drawn], [y for _, y, _ in drawn], yerr=err, fmt="none", ecolor="black",
                        elinewidth=0.8, capsize=2)  # fmt: skip
    ax.set_xticks([i + width * (len(values) - 1) / 2 for i in range(len(columns))])
    ax.set_xticklabels(columns, rotation=rotation, ha="right" if rotation else "center", fontsize=8)
    if ylim:
        ax.set_ylim(*ylim)
    ax.set_title(title)
    ax.legend(fontsize=8)


def grouped_bars(
    path,
    values: dict[str, list[float]],
    columns: list[str],
    title: str,
    ylim=(0, 1.05),
    size=(10, 4),
    intervals: dict[str, list] | None = None,
) -> None:
    """A PNG with one group of bars per column, one bar per series (error bars from `intervals`)."""
    fig, ax = pyplot().subplots(figsize=size)
    draw_grouped_bars(ax, values, columns, title, ylim, intervals=intervals)
    save_figure(fig, path)


def bars_of(stats: dict[str, dict], keys: list[str]) -> tuple[dict, dict]:
    """(values, intervals) for grouped_bars from per-series figure dicts that keep each figure's interval
    beside it as `<key>_ci95` (a figure without one gets no error bar; a missing figure, None, no bar)."""
    return (
        {name: [float("nan") if s[k] is None else s[k] for k in keys] for name, s in stats.items()},
        {name: [s.get(f"{k}_ci95") for k in keys] for name, s in stats.items()},
    )


def plot_loss(history: list[dict], path, title: str, ylabel: str = "loss") -> bool:
    """Train (and dev) loss against step from a Trainer's log history; False when nothing was logged."""
    losses = [(h["step"], h["loss"]) for h in history if "loss" in h]
    evals = [(h["step"], h["eval_loss"]) for h in history if "eval_loss" in h]
    if not losses:
        return False
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.plot(*zip(*losses), label="train loss")
    if evals:
        ax.plot(*zip(*evals), "o-", label="dev loss")
    ax.set_xlabel("step")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.legend()
    save_figure(fig, path, dpi=120)
    return True


# --- model cards ----------------------------------------------------------------------------------


def card_front_matter(tags: list[str]) -> list[str]:
    return ["---", "library_name: transformers", f"tags: [{', '.join(tags)}]", "---", ""]


def card_metrics(title: str | None, figures: dict) -> list[str]:
    """A metric / value table of (nested) figures, under a `## title` heading when one is given."""
    table = md_table(["metric", "value"], [[k, v] for k, v in flat(figures).items()])
    return (["", f"## {title}", ""] if title else []) + table


def dataset_overlap(train_file) -> dict | None:
    """The evaluated-set overlap that the teacher build which wrote `train_file` (<output_dir>/<task>/train.jsonl)
    was allowed to keep (memdistill.data.hygiene), from its stats.json; None when it kept none. Training jobs
    put it into memdistill.json, so every card of a model trained on such data says so."""
    p = Path(train_file).parent.parent / "stats.json"
    o = (json.loads(p.read_text()).get("eval_overlap") or {}) if p.is_file() else {}
    return {"allowed": o["allowed"], "overlaps": o["summary"], "dataset": str(p.parent)} if o.get("overlaps") else None


def card_overlap(meta: dict) -> list[str]:
    o = meta.get("eval_overlap")
    if not o:
        return []
    return [
        "",
        "## Benchmark overlap",
        "",
        f"Trained on data (`{o['dataset']}`) that overlaps evaluated sets, allowed by "
        f'its data config: "{o["allowed"]}". Figures on these sets are not held-out figures:',
        "",
    ] + [f"- {line}" for line in o["overlaps"]]


def card_training(config: dict, summary: dict | None) -> list[str]:
    """The optimisation line and the run line every trained model's card carries."""
    c, s = config, summary or {}
    lines = [
        f"- lr {c['learning_rate']}, epochs {c['num_train_epochs']}, batch {c['per_device_train_batch_size']} x "
        f"accumulation {c['gradient_accumulation_steps']}, max length {c['max_length']}, dtype {c['dtype']}"
    ]
    if s:
        lines.append(
            f"- run: {s.get('steps')} steps, loss {s.get('first_loss')} -> {s.get('final_loss')}, "
            f"{s.get('wall_time_s')} s wall, {s.get('tokens_per_s')} tokens/s, "
            f"peak memory {s.get('peak_memory_mb')} MB"
        )
    return lines


def peak_memory_mb() -> float:
    """Peak memory of this process: GPU memory allocated on CUDA, else resident set size."""
    import resource

    import torch

    if torch.cuda.is_available():
        return torch.cuda.max_memory_allocated() / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def print_report(out) -> int:
    """What an evaluation job's `main` ends with: its report on stdout, then where it lies."""
    print((Path(out) / "report.md").read_text())
    print(f"\nreport: {Path(out) / 'report.md'}")
    return 0
