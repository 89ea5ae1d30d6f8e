"""The encoder jobs with the transformers Trainer: TriMEM type router, TiMem recall planner and gate, DimMem
memory-update consolidator.

  memdistill train router  --config configs/training/router_cpu.yaml  [key=value ...]   (make train-router)
  memdistill train planner --config configs/training/planner_cpu.yaml [key=value ...]   (make train-planner)
  memdistill train gate    --config configs/training/gate_cpu.yaml    [key=value ...]   (make train-gate)
  memdistill train consolidator --config configs/training/consolidator_cpu.yaml       (make train-consolidator)
  memdistill train segmenter --config configs/training/segmenter_cpu.yaml             (make train-segmenter)
  memdistill train querytyper --config configs/training/querytyper_cpu.yaml           (make train-querytyper)
  accelerate launch --config_file configs/accelerate/single_gpu.yaml -m memdistill.train.encoder \
      --config configs/training/router_roberta_base.yaml

- router: multi-label over memdistill.spec.router.LABELS (BCE, one sigmoid per label, no label = none),
  input `router.encoder_text(snippet)`.
- planner: single-label over memdistill.spec.planner.COMPLEXITIES (softmax); its keywords are not learnt
  (`planner.heuristic_keywords` offline, or the LM query parser: see memdistill.serve.client).
- gate: cross-encoder, one logit (BCE) over the pair (`gate.pair_query(question, complexity)`,
  candidate memory) -> keep probability; `gate.select` applies the per-complexity budgets.
- consolidator: single-label over memdistill.spec.consolidator.ACTIONS (softmax) on one text,
  `consolidator.encoder_text(new, existing)` (one text so that vLLM's /classify reads it as trained).
- segmenter: two-way softmax (DEVELOP / CHANGE) over `segmenter.encoder_text` (an utterance in context).
- querytyper: single-label over memdistill.spec.querytyper.LABELS (EM / PM / GM / none) on the question; the
  label is MemoType's vote of the type router named by `label_router` over the row's memories, cast here
  (the data stage may not import a trained model).

Rows come from `memdistill data` (data/built/<task>/{train,dev}.jsonl, built on first use). With a dev
file the run evaluates and checkpoints every epoch and keeps the best epoch; a killed run resumes from its
last checkpoint when started again with the same output_dir. Then decision thresholds are tuned on dev
(router: one per label, maximising that label's F1; gate: one, maximising keep-F1 after `select`) and
folded into the classifier bias (b_k -= logit(t_k)), so the exported model's sigmoid crosses 0.5 exactly
where the raw probability crosses t_k: a served model (vLLM `/classify`, `/score`) needs no side file and
0.5 is the cut everywhere. The tuned values stay recorded in thresholds.json, config.json (`memdistill`)
and the model card. The run leaves `model/` (servable: weights, tokenizer, id2label, thresholds, README
model card), `summary.json` and `loss.png` in output_dir.
"""

from __future__ import annotations

import json
import math
import os
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

from memdistill.core.config import ConfigError, job_config
from memdistill.core.encoder import Encoder
from memdistill.core.io import atomic_dir, read_jsonl, require_dataset, write_json, write_text
from memdistill.core.models import read_meta
from memdistill.core.report import (
    card_front_matter,
    card_metrics,
    card_overlap,
    card_training,
    dataset_overlap,
    peak_memory_mb,
    plot_loss,
)
from memdistill.spec import ENCODERS, MODELS, SCHEMA_VERSION, gate, querytyper
from memdistill.train.extractor import optimisation_args, run_args

DEFAULT_GRID = [round(0.05 * k, 2) for k in range(1, 20)]


@dataclass
class EncoderConfig:
    task: str = "router"  # the model it trains: one of memdistill.spec.ENCODERS
    model: str = "embedded:minilm"
    train_file: str = "data/built/router/train.jsonl"
    eval_file: str | None = "data/built/router/dev.jsonl"  # dev: best epoch + threshold tuning
    output_dir: str = "runs/router-cpu"
    data_config: str = "configs/data/seed.yaml"  # the build that writes train_file (named when it is missing)
    # querytyper: the exported type router whose vote over each row's memories is the label (MemoType 2.2)
    label_router: str | None = None
    max_train_rows: int | None = None
    max_length: int = 128
    learning_rate: float = 5e-5
    num_train_epochs: float = 8.0
    max_steps: int = -1
    per_device_train_batch_size: int = 16
    per_device_eval_batch_size: int = 64
    gradient_accumulation_steps: int = 1
    warmup_steps: float = 0.1  # a fraction of all steps when < 1
    lr_scheduler_type: str = "linear"
    weight_decay: float = 0.01
    dtype: str = "float32"  # bfloat16 | float16: mixed-precision compute (autocast; weights stay float32)
    gradient_checkpointing: bool = False
    threshold_grid: list = field(default_factory=lambda: list(DEFAULT_GRID))
    fold_thresholds: bool = True
    seed: int = 42
    logging_steps: int = 5
    save_steps: int | None = None  # None: a checkpoint per epoch (with a dev file: the dev evaluation too)
    save_total_limit: int = 2
    report_to: str = "none"
    dataloader_num_workers: int = 0


def validate(cfg: EncoderConfig) -> None:
    if cfg.task not in ENCODERS:
        raise ConfigError(f"task {cfg.task!r}: expected one of {', '.join(ENCODERS)}")
    if cfg.dtype not in ("bfloat16", "float16", "float32"):
        raise ConfigError(f"dtype {cfg.dtype!r}: expected bfloat16, float16 or float32")
    bad = [t for t in cfg.threshold_grid if not 0 < float(t) < 1]
    if bad or not cfg.threshold_grid:
        raise ConfigError(f"threshold_grid: every value must lie strictly between 0 and 1 (got {bad or 'none'})")


# --- data ---------------------------------------------------------------------------------------


def model_inputs(task: str, row: dict, where: str = "row") -> tuple:
    """What the encoder reads from a built row (the spec's `inputs`); a missing field names the row."""
    try:
        return MODELS[task].inputs(row)
    except ValueError as e:
        raise ValueError(f"{where}: {e.args[0].removeprefix('row: ')}") from None


def read_rows(path: str, task: str, limit: int | None = None, label_router=None) -> list[dict]:
    """Built rows, each checked (schema version, fields, labels); errors name the file and line.
    Query-typer rows carry memories, not labels: `label_router` (an exported router's directory, or an
    Encoder already loaded) casts the vote (`vote_labels`)."""
    p, m = Path(path), MODELS[task]
    if not p.exists():
        raise FileNotFoundError(f"{p}: dataset not found; run `make data`")
    rows = []
    for line_no, row in read_jsonl(p):
        where = f"{p}:{line_no}"
        if row.get("schema_version") != SCHEMA_VERSION:
            raise ValueError(
                f"{where}: schema_version {row.get('schema_version')!r} but the spec is "
                f"{SCHEMA_VERSION}; rebuild the dataset with `make data`"
            )
        model_inputs(task, row, where)
        if not m.labelled_by:
            row["_target"] = m.target(row, where)
        rows.append(row)
    if not rows:
        raise ValueError(f"{p}: no rows")
    if m.labelled_by:
        if not label_router:
            raise ValueError(f"{p}: {task} rows are labelled by a {m.labelled_by}'s vote: set label_router")
        vote_labels(rows, label_router)
        for line_no, row in enumerate(rows, 1):
            row["_target"] = m.target(row, f"{p}:{line_no}")
    if limit:
        import random

        rows = random.Random(0).sample(rows, min(limit, len(rows)))
    return rows


def vote_labels(rows: list[dict], router) -> list[dict]:
    """MemoType's query type for each row (memdistill.spec.querytyper.vote): the router's probabilities
    over the row's memories, voted. `router`: an exported router's directory or its Encoder. Sets
    row["label"] and row["router_labels"]."""
    if not isinstance(router, Encoder):
        if not (Path(router) / "config.json").exists():
            raise FileNotFoundError(f"label_router {router}: no exported type router there (run `make train-router`)")
        router = Encoder(router)
    voter = MODELS[querytyper.MODEL.labelled_by]
    if router.task != voter.name:
        raise ValueError(f"label_router {router.dir}: an exported {router.task}, not a {voter.name}")
    texts = [m for r in rows for m in r["memories"]]
    probs, k = router.scores([voter.inputs({"text": t}) for t in texts]), 0
    for r in rows:
        mine, k = probs[k : k + len(r["memories"])], k + len(r["memories"])
        r["router_labels"] = [voter.decide(p) for p in mine]
        r["label"] = querytyper.vote(mine)
    return rows


def tokenize(tok, task: str, rows: list[dict], max_length: int):
    import datasets

    cols = list(zip(*(model_inputs(task, r) for r in rows)))
    enc = tok(*[list(c) for c in cols], truncation=True, max_length=max_length)
    data = {k: enc[k] for k in tok.model_input_names if k in enc}
    data["labels"] = [r["_target"] for r in rows]
    return datasets.Dataset.from_dict(data)


# --- model --------------------------------------------------------------------------------------


def build_model(cfg: EncoderConfig):
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from memdistill.core.models import model_path

    base, m = model_path(cfg.model), MODELS[cfg.task]
    labels = m.labels
    tok = AutoTokenizer.from_pretrained(base)
    model = AutoModelForSequenceClassification.from_pretrained(
        base,
        num_labels=len(labels),
        problem_type=m.problem_type,
        dtype=torch.float32,
        id2label=dict(enumerate(labels)),
        label2id={lab: i for i, lab in enumerate(labels)},
    )
    return model, tok


def _compute_metrics(task: str):
    import numpy as np
    from sklearn.metrics import average_precision_score, f1_score

    m = MODELS[task]

    def compute(pred) -> dict:
        logits, labels = pred.predictions, pred.label_ids
        if m.softmax:
            return {
                "macro_f1": f1_score(
                    labels, logits.argmax(-1), average="macro", labels=list(range(len(m.labels))), zero_division=0
                ),
                "accuracy": float((logits.argmax(-1) == labels).mean()),
            }
        aps = [
            average_precision_score(labels[:, k], logits[:, k]) for k in range(labels.shape[1]) if labels[:, k].any()
        ]
        return {m.dev_metric: float(np.mean(aps)) if aps else 0.0}

    return compute


def training_args(cfg: EncoderConfig, use_cpu: bool):
    """The TrainingArguments of a run. The mixed-precision flags follow cfg.dtype alone, on every device (CPU
    autocast runs bf16 too), so a CPU test of a bf16 recipe trains with the GPU run's arguments.
    `use_cpu` must be true where no CUDA device exists: transformers refuses bf16 otherwise."""
    from transformers import TrainingArguments

    per_epoch = cfg.save_steps is None
    evaluate = bool(cfg.eval_file)
    return TrainingArguments(
        **optimisation_args(cfg),
        save_strategy="epoch" if per_epoch else "steps",
        save_steps=cfg.save_steps or 500,
        save_total_limit=cfg.save_total_limit,
        eval_strategy=("epoch" if per_epoch else "steps") if evaluate else "no",
        eval_steps=cfg.save_steps,
        load_best_model_at_end=evaluate,
        metric_for_best_model=MODELS[cfg.task].dev_metric if evaluate else None,
        greater_is_better=True,
        **run_args(cfg, use_cpu),
    )


def build_trainer(cfg: EncoderConfig):
    import torch
    from transformers import DataCollatorWithPadding, Trainer

    validate(cfg)
    for f in (cfg.train_file, cfg.eval_file):
        if f:
            require_dataset(f, cfg.data_config)
    args = training_args(cfg, use_cpu=not torch.cuda.is_available())
    model, tok = build_model(cfg)
    train_rows = read_rows(cfg.train_file, cfg.task, cfg.max_train_rows, cfg.label_router)
    dev_rows = read_rows(cfg.eval_file, cfg.task, label_router=cfg.label_router) if cfg.eval_file else None
    evaluate = dev_rows is not None
    trainer = Trainer(
        model=model,
        args=args,
        train_dataset=tokenize(tok, cfg.task, train_rows, cfg.max_length),
        eval_dataset=tokenize(tok, cfg.task, dev_rows, cfg.max_length) if evaluate else None,
        processing_class=tok,
        data_collator=DataCollatorWithPadding(tok),
        compute_metrics=_compute_metrics(cfg.task) if evaluate else None,
    )
    trainer.dev_rows = dev_rows
    return trainer


# --- thresholds -----------------------------------------------------------------------------------


def _logit(p: float) -> float:
    return math.log(p / (1 - p))


def _best(grid, score_of):
    return max(grid, key=lambda t: (round(score_of(t), 6), -abs(t - 0.5)))


def _tune_per_label(m, probs, rows, grid) -> dict[str, float]:
    """Per label, the grid value maximising that label's dev F1 (ties: nearest 0.5)."""
    from memdistill.metrics.encoders import binary_prf

    out = {}
    for k, lab in enumerate(m.labels):
        gold = [r["_target"][k] == 1.0 for r in rows]
        out[lab] = _best(grid, lambda t, k=k, gold=gold: binary_prf([p[k] >= t for p in probs], gold)["f1"])
    return out


def _tune_budgeted_keep(m, probs, rows, grid) -> dict[str, float]:
    """One value maximising keep-F1 of `gate.select` (budgets included) over dev examples."""
    from memdistill.metrics.encoders import gate_examples, gate_scores

    examples = gate_examples(rows, [p[0] for p in probs])
    return {m.labels[0]: _best(grid, lambda t: gate_scores(examples, shift=_logit(t))["keep_f1"])}


def _tune_change_cut(m, probs, rows, grid) -> dict[str, float]:
    """The cut on P(label 1) minimising dev WindowDiff, which counts missed and extra boundaries alike (tuned
    on boundary F1 instead, the segmenter cut at 0.15: F1 0.486 but Pk 0.424, no better than never cutting)."""
    from memdistill.metrics.encoders import segmenter_scores

    return {
        m.labels[1]: _best(grid, lambda t: -segmenter_scores([p[1] >= t for p in probs], rows, ci=False)["windowdiff"])
    }


TUNING = {"per_label": _tune_per_label, "budgeted_keep": _tune_budgeted_keep, "change_cut": _tune_change_cut}


def tune_thresholds(task: str, probs: list[list[float]], rows: list[dict], grid) -> dict[str, float]:
    """Dev-tuned decision thresholds, by the model's `tuning` (none for an argmax head)."""
    m = MODELS[task]
    return TUNING[m.tuning](m, probs, rows, grid) if m.tuning else {}


def fold_thresholds(model, thresholds: dict[str, float]) -> None:
    """b_k -= logit(t_k): sigmoid(z - logit(t)) >= 0.5 exactly when sigmoid(z) >= t; in a two-way softmax,
    argmax picks label k exactly when its probability was >= t_k."""
    import torch

    head = _out_layer(model)
    with torch.no_grad():
        for lab, t in thresholds.items():
            head.bias[model.config.label2id[lab]] -= _logit(t)


def _out_layer(model):
    """The last linear layer of a sequence-classification head (BERT: classifier; RoBERTa: classifier.out_proj)."""
    clf = model.classifier
    return clf.out_proj if hasattr(clf, "out_proj") else clf


# --- export + report ------------------------------------------------------------------------------


def export(trainer, cfg: EncoderConfig, thresholds: dict, dev_metrics: dict | None, summary: dict) -> Path:
    """Write output_dir/model atomically: servable weights with folded thresholds, tokenizer, id2label,
    thresholds.json, memdistill.json and a README model card."""
    out = Path(cfg.output_dir) / "model"
    model = trainer.model
    folded = bool(thresholds) and cfg.fold_thresholds
    if folded:
        fold_thresholds(model, thresholds)
    meta = {
        "task": cfg.task,
        "schema_version": SCHEMA_VERSION,
        "labels": list(MODELS[cfg.task].labels),
        "thresholds": thresholds,
        "thresholds_folded": folded,
        "decision": _decision_rule(cfg.task, thresholds, folded),
        "base_model": cfg.model,
        "eval_overlap": dataset_overlap(cfg.train_file),
        **({"label_router": cfg.label_router} if MODELS[cfg.task].labelled_by else {}),
    }
    model.config.memdistill = meta
    with atomic_dir(out) as tmp:
        model.save_pretrained(tmp, safe_serialization=True)
        trainer.processing_class.save_pretrained(tmp)
        write_json(
            tmp / "thresholds.json", {k: meta[k] for k in ("task", "thresholds", "thresholds_folded", "decision")}
        )
        write_json(
            tmp / "memdistill.json", {**meta, "config": asdict(cfg), "dev": dev_metrics, "training_summary": summary}
        )
    write_card(out)
    return out


def _decision_rule(task: str, thresholds: dict, folded: bool) -> str:
    m = MODELS[task]
    where = (
        "folded into the bias: every served probability is cut at 0.5" if folded else "apply them to the probabilities"
    )
    if m.tuning == "change_cut" and thresholds:
        ((lab, cut),) = thresholds.items()
        if not folded:
            return f"{lab} when P({lab}) >= {cut} (dev-tuned; apply it to the probabilities)"
        return f"argmax over {' / '.join(m.labels)} (cut P({lab}) >= {cut}, tuned on dev WindowDiff, folded in)"
    if m.softmax:
        return f"argmax of the softmax over {' / '.join(m.labels)}"
    if m.tuning == "per_label":
        return f"label k present when sigmoid_k >= 0.5 (dev-tuned thresholds {thresholds}, {where}); none when no label"
    return (
        f"gate.select(keep probabilities, complexity): >= 0.5 + per-complexity shift, budgets "
        f"{gate.BUDGETS} (dev-tuned threshold {thresholds.get('keep')}, {where})"
    )


def write_card(model_dir, test_metrics: dict | None = None) -> None:
    """(Re)write an exported encoder's README.md; `memdistill eval-encoders` adds its test figures."""
    model_dir = Path(model_dir)
    meta = read_meta(model_dir)
    if test_metrics is not None:
        meta["test"] = test_metrics
        write_json(model_dir / "memdistill.json", meta)
    c = meta["config"]
    what = MODELS[meta["task"]].summary
    lines = (
        card_front_matter(["memdistill", meta["task"], "text-classification"])
        + [
            f"# memdistill {meta['task']}",
            "",
            what + f" (spec schema {meta['schema_version']}).",
            "",
            f"- labels (id2label): {', '.join(meta['labels'])}",
            f"- decision: {meta['decision']}",
            f"- tuned thresholds: {json.dumps(meta['thresholds']) if meta['thresholds'] else 'none (argmax)'}"
            + (" (already folded into the classifier bias)" if meta["thresholds_folded"] else ""),
            "",
            "## Training",
            "",
            f"- base model: `{meta['base_model']}`; data: `{c['train_file']}` (dev: `{c['eval_file']}`)",
        ]
        + card_training(c, meta.get("training_summary"))
        + card_overlap(meta)
    )
    for name, figures in (
        ("dev split (best epoch, tuned thresholds)", meta.get("dev")),
        ("gold test split", meta.get("test")),
    ):
        if figures:
            lines += card_metrics(f"Evaluation: {name}", figures)
    if not meta.get("test"):
        lines += ["", "Test split: not evaluated yet (`make eval-encoders`)."]
    lines += [
        "",
        "## Serving",
        "",
        "`memdistill serve` starts it as a vLLM pooling server (`--runner pooling`): "
        + (
            "`POST /score` with the pair (pair_query(question, complexity), candidate)"
            if MODELS[meta["task"]].endpoint == "/score"
            else "`POST /classify`"
        )
        + "; the SDK (`memdistill.serve.client.MemoryModels`) turns the scores into decisions.",
        "",
    ]
    write_text(model_dir / "README.md", "\n".join(lines))


def dev_report(task: str, enc: Encoder, rows: list[dict]) -> dict:
    """Dev figures of the exported model (decisions as served)."""
    from memdistill.metrics.encoders import decisions, score

    return score(task, decisions(task, enc.scores([model_inputs(task, r) for r in rows]), rows), rows)


def train(cfg: EncoderConfig) -> dict:
    from memdistill.train.extractor import train_resuming

    trainer = build_trainer(cfg)
    result, wall, resume = train_resuming(trainer, cfg.output_dir)
    thresholds: dict = {}
    if trainer.dev_rows:
        enc = Encoder(None, model=trainer.model, tok=trainer.processing_class)
        probs = enc.scores([model_inputs(cfg.task, r) for r in trainer.dev_rows])
        thresholds = tune_thresholds(cfg.task, probs, trainer.dev_rows, cfg.threshold_grid)
    elif not MODELS[cfg.task].softmax:
        thresholds = {lab: 0.5 for lab in MODELS[cfg.task].labels}
    summary = run_summary(trainer, cfg, wall, result, resume, thresholds)
    out = export(trainer, cfg, thresholds, None, summary)
    if trainer.dev_rows:
        dev = dev_report(cfg.task, Encoder(str(out)), trainer.dev_rows)
        summary["dev"] = dev
        write_json(out / "memdistill.json", {**read_meta(out), "dev": dev, "training_summary": summary})
        write_card(out)
    write_json(Path(cfg.output_dir) / "summary.json", summary)
    plot_loss(
        trainer.state.log_history,
        Path(cfg.output_dir) / "loss.png",
        f"{cfg.task} on {cfg.model.split('/')[-1]}",
        ylabel="cross-entropy" if MODELS[cfg.task].softmax else "BCE",
    )
    return summary


def run_summary(trainer, cfg: EncoderConfig, wall: float, result, resumed_from, thresholds) -> dict:

    history = trainer.state.log_history
    losses = [h["loss"] for h in history if "loss" in h]
    steps = trainer.state.global_step
    return {
        "task": cfg.task,
        "model": cfg.model,
        "schema_version": SCHEMA_VERSION,
        "steps": steps,
        "epochs": trainer.state.epoch,
        "first_loss": round(losses[0], 4) if losses else None,
        "final_loss": round(losses[-1], 4) if losses else None,
        "train_loss": round(result.training_loss, 4),
        "best_checkpoint": trainer.state.best_model_checkpoint,
        "best_dev_metric": trainer.state.best_metric,
        "wall_time_s": round(wall, 1),
        "s_per_step": round(wall / steps, 3) if steps and not resumed_from else None,
        "peak_memory_mb": round(peak_memory_mb(), 1),
        "resumed_from": resumed_from,
        "train_rows": len(trainer.train_dataset),
        "thresholds": thresholds,
        "model_dir": str(Path(cfg.output_dir) / "model"),
    }


def main(argv=None, task: str | None = None) -> int:
    """`task`: set by `memdistill train <task>`; the config must agree with it."""
    cfg = job_config(
        EncoderConfig, argv, f"memdistill train {task or '|'.join(ENCODERS)}", __doc__, config_required=True
    )
    if task and cfg.task != task:
        raise ConfigError(f"this config trains task {cfg.task!r}, not {task!r}: use configs/training/{task}_*.yaml")
    print(json.dumps(train(cfg), indent=1))
    return 0


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    sys.exit(main())
