"""LoRA SFT of the extractor (DimMem extraction + query analysis in one adapter) with TRL + PEFT.

  memdistill train extractor --config configs/training/extractor_cpu.yaml [key=value ...]
  accelerate launch --config_file configs/accelerate/ddp_8gpu.yaml -m memdistill.train.extractor \
      --config configs/training/extractor_qwen3_4b.yaml

Rows are conversational prompt/completion pairs from `memdistill data` (a missing dataset is an error that
names that command); the loss covers the completion only. A run killed after a checkpoint resumes
from it when started again with the same output_dir. The run leaves `adapter/` (LoRA) or `model/`
(finetune=full), `loss.png` and `summary.json` in output_dir.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path

from memdistill.core.config import job_config
from memdistill.core.io import read_jsonl, require_dataset, write_json
from memdistill.core.report import dataset_overlap, peak_memory_mb, plot_loss
from memdistill.spec import MODELS, SCHEMA_VERSION

DEFAULT_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
FORBIDDEN_TARGETS = ("embed_tokens", "lm_head", "wte", "embed_out")


@dataclass
class ExtractorConfig:
    model: str = "embedded:smollm2-135m-instruct"
    train_file: str = "data/built/extractor/train.jsonl"
    eval_file: str | None = "data/built/extractor/dev.jsonl"
    output_dir: str = "runs/extractor-cpu"
    data_config: str = "configs/data/seed.yaml"  # the build that writes train_file (named when it is missing)
    tasks: list = field(default_factory=lambda: [m.name for m in MODELS.values() if m.head == "lm"])  # the LM's models
    max_train_rows: int | None = None
    # lora: train adapters (merged afterwards); full: train the weights of the chosen layers themselves
    # (layers_to_transform; embeddings stay frozen, tied to lm_head) and save the whole model under model/
    finetune: str = "lora"
    # LoRA (never on embeddings or lm_head: Qwen3-4B and SmolLM2 tie them)
    lora_r: int = 16
    lora_alpha: int = 32
    lora_dropout: float = 0.05
    target_modules: list = field(default_factory=lambda: list(DEFAULT_TARGETS))
    # Only these decoder layers get adapters (None = all). On CPU, adapting the top layers only lets the
    # backward pass stop early: the top third of SmolLM2 trains about twice as fast per token.
    layers_to_transform: list | None = None
    load_in_4bit: bool = False  # QLoRA (bitsandbytes, CUDA)
    # optimisation
    learning_rate: float = 5e-5
    num_train_epochs: float = 2.0
    max_steps: int = -1
    per_device_train_batch_size: int = 1
    per_device_eval_batch_size: int = 1
    gradient_accumulation_steps: int = 2
    warmup_steps: float = 0.03  # a fraction of all steps when < 1
    lr_scheduler_type: str = "cosine"
    weight_decay: float = 0.0
    max_length: int | None = 12288  # None: no truncation (padding-free without packing requires it)
    dtype: str = "bfloat16"  # bfloat16 | float16 | float32
    gradient_checkpointing: bool = True
    padding_free: bool = False  # flatten a batch into one sequence (no pad tokens); needs flash-attention on GPU
    packing: bool = False
    seed: int = 42
    # bookkeeping
    logging_steps: int = 5
    save_steps: int = 100
    save_total_limit: int = 2
    eval_steps: int | None = None
    report_to: str = "none"
    dataloader_num_workers: int = 0


def validate(cfg: ExtractorConfig) -> None:
    bad = [t for t in cfg.target_modules if any(f in t for f in FORBIDDEN_TARGETS)]
    if bad:
        raise ValueError(f"target_modules {bad}: LoRA must not touch embeddings or lm_head (tied in the base models)")
    if cfg.finetune not in ("lora", "full"):
        raise ValueError(f"finetune {cfg.finetune!r}: expected lora or full")
    if cfg.finetune == "full" and cfg.load_in_4bit:
        raise ValueError("finetune=full cannot train a 4-bit base (load_in_4bit is QLoRA's)")
    if cfg.dtype not in ("bfloat16", "float16", "float32"):
        raise ValueError(f"dtype {cfg.dtype!r}: expected bfloat16, float16 or float32")
    lm_tasks = [m.name for m in MODELS.values() if m.head == "lm"]
    if set(cfg.tasks) - set(lm_tasks) or not cfg.tasks:
        raise ValueError(f"tasks {cfg.tasks}: expected a non-empty subset of {lm_tasks} (the LM's models)")


def load_rows(path: str, tasks, limit: int | None = None):
    """The SFT dataset, checked against the spec's schema version (a stale dataset is refused)."""
    import datasets

    p = Path(path)
    if not p.exists():
        raise FileNotFoundError(f"{p}: dataset not found; run `make data`")
    for line_no, row in read_jsonl(p):
        if row.get("schema_version") != SCHEMA_VERSION:
            raise ValueError(
                f"{p}:{line_no}: schema_version {row.get('schema_version')!r} but the spec is "
                f"{SCHEMA_VERSION}; rebuild the dataset with `make data`"
            )
    ds = datasets.load_dataset("json", data_files=str(p), split="train")
    ds = ds.filter(lambda r: r["task"] in tasks)
    keep = ["prompt", "completion", "chat_template_kwargs"]
    ds = ds.remove_columns([c for c in ds.column_names if c not in keep])
    if limit:
        ds = ds.shuffle(seed=0).select(range(min(limit, len(ds))))
    return ds


def _torch_dtype(name: str):
    import torch

    return {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}[name]


def score_completion_positions_only() -> None:
    """Make TRL's fused LM head score only the positions that carry a label on CPU too.

    TRL 1.16 does this on Triton devices only, so that compiled backends keep fixed shapes, and on
    every other device projects every position, prompt included, through the 49k-word LM head. CPU
    eager mode has no shapes to keep, and the prompt is over half of each row: the same losses come
    out (tests/test_training.py checks) and a CPU step is about 1.4x faster (measured on SmolLM2).
    """
    import trl
    import trl.trainer.utils as trl_utils

    try:
        from trl.kernels.chunked_logprob import _use_triton
    except ImportError:
        _use_triton = None
    if _use_triton is None or not hasattr(trl_utils, "_use_triton"):
        raise RuntimeError(
            f"trl {trl.__version__} has no private `_use_triton` in trl.trainer.utils and trl.kernels.chunked_logprob, "
            "which the CPU completion-only speed-up patches; pyproject.toml pins the TRL range it was written for"
        )
    trl_utils._use_triton = lambda device: device.type == "cpu" or _use_triton(device)


def quantization_config(cfg: ExtractorConfig):
    """The 4-bit base of QLoRA (Dettmers et al. 2023): NF4 with double quantisation, computing in cfg.dtype.
    None unless load_in_4bit. bitsandbytes 0.50 also runs it on CPU (tests/test_training.py does)."""
    if not cfg.load_in_4bit:
        return None
    from transformers import BitsAndBytesConfig

    return BitsAndBytesConfig(
        load_in_4bit=True,
        bnb_4bit_quant_type="nf4",
        bnb_4bit_use_double_quant=True,
        bnb_4bit_compute_dtype=_torch_dtype(cfg.dtype),
    )


def optimisation_args(cfg) -> dict:
    """The optimisation settings every memdistill trainer passes the same way (extractor and encoders).
    The mixed-precision flags follow cfg.dtype alone, on every device (CPU autocast runs bf16 too)."""
    return dict(
        output_dir=cfg.output_dir,
        learning_rate=cfg.learning_rate,
        num_train_epochs=cfg.num_train_epochs,
        max_steps=cfg.max_steps,
        per_device_train_batch_size=cfg.per_device_train_batch_size,
        per_device_eval_batch_size=cfg.per_device_eval_batch_size,
        gradient_accumulation_steps=cfg.gradient_accumulation_steps,
        warmup_steps=cfg.warmup_steps,
        lr_scheduler_type=cfg.lr_scheduler_type,
        weight_decay=cfg.weight_decay,
        bf16=cfg.dtype == "bfloat16",
        fp16=cfg.dtype == "float16",
        # transformers 5 checkpoints non-reentrantly by default and TRL calls enable_input_require_grads for
        # PEFT (and forces reentrant under DeepSpeed ZeRO-3, which needs it): nothing to add here.
        gradient_checkpointing=cfg.gradient_checkpointing,
        seed=cfg.seed,
        data_seed=cfg.seed,
        logging_steps=cfg.logging_steps,
    )


def run_args(cfg, use_cpu: bool) -> dict:
    """Bookkeeping settings shared by the trainers. `use_cpu` must be true where no CUDA device exists:
    transformers refuses bf16 otherwise."""
    return dict(report_to=cfg.report_to, use_cpu=use_cpu, dataloader_num_workers=cfg.dataloader_num_workers,
                disable_tqdm=False)  # fmt: skip


def sft_args(cfg: ExtractorConfig, use_cpu: bool):
    """The SFTConfig of a run. The mixed-precision flags follow cfg.dtype alone, on every device (CPU autocast
    runs bf16 too), so a CPU test of a bf16 recipe trains with the same arguments as the GPU run.
    `use_cpu` must be true where no CUDA device exists: transformers refuses bf16 otherwise."""
    from trl import SFTConfig

    return SFTConfig(
        completion_only_loss=True,
        max_length=cfg.max_length,
        packing=cfg.packing,
        padding_free=cfg.padding_free,
        **optimisation_args(cfg),
        save_strategy="steps",
        save_steps=cfg.save_steps,
        save_total_limit=cfg.save_total_limit,
        eval_strategy="steps" if cfg.eval_file and cfg.eval_steps else "no",
        eval_steps=cfg.eval_steps,
        **run_args(cfg, use_cpu),
    )


def build_trainer(cfg: ExtractorConfig):
    import torch
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import SFTTrainer

    from memdistill.core.models import model_path

    validate(cfg)
    # A no-op on CUDA, where TRL already scores only the labelled positions; on CPU the same loss, faster.
    score_completion_positions_only()
    for f in (cfg.train_file, cfg.eval_file):
        if f:
            require_dataset(f, cfg.data_config)
    # The arguments come before the model: they set up the distributed state, so that a 4-bit base loads on
    # this rank's GPU, and DeepSpeed ZeRO-3 (zero3_init_flag) and FSDP (cpu_ram_efficient_loading) shard the
    # weights as they load instead of every rank loading the whole model first.
    args = sft_args(cfg, use_cpu=not torch.cuda.is_available())
    base = model_path(cfg.model)
    tok = AutoTokenizer.from_pretrained(base)
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    # QLoRA needs no prepare_model_for_kbit_training here: TRL 1.16 does the preparation it still needs
    # (input grads under checkpointing, bf16 adapters on a 4-bit base; huggingface/trl#4577).
    model = AutoModelForCausalLM.from_pretrained(
        base, dtype=_torch_dtype(cfg.dtype), quantization_config=quantization_config(cfg)
    )
    train = load_rows(cfg.train_file, cfg.tasks, cfg.max_train_rows)
    evald = load_rows(cfg.eval_file, cfg.tasks) if cfg.eval_file else None
    if cfg.finetune == "full":
        train_only_layers(model, cfg.layers_to_transform)
        return SFTTrainer(model=model, args=args, train_dataset=train, eval_dataset=evald, processing_class=tok)
    peft_cfg = LoraConfig(
        r=cfg.lora_r,
        lora_alpha=cfg.lora_alpha,
        lora_dropout=cfg.lora_dropout,
        target_modules=list(cfg.target_modules),
        task_type="CAUSAL_LM",
        bias="none",
        layers_to_transform=cfg.layers_to_transform,
    )
    return SFTTrainer(
        model=model, args=args, train_dataset=train, eval_dataset=evald, processing_class=tok, peft_config=peft_cfg
    )


def train_only_layers(model, layers: list | None) -> None:
    """Full fine-tuning of some decoder layers: every weight of those layers (all layers when None) and the
    final norm trains; embeddings do not (tied to lm_head in the base models), nor do the other layers, so
    the backward pass stops at the lowest trained layer as it does for LoRA on the same layers."""
    import re

    wanted = None if layers is None else {int(k) for k in layers}
    for name, p in model.named_parameters():
        m = re.search(r"\.layers\.(\d+)\.", name)
        p.requires_grad = (m is not None and (wanted is None or int(m.group(1)) in wanted)) or name.endswith(
            "model.norm.weight"
        )


def last_checkpoint(output_dir: str) -> str | None:
    from transformers.trainer_utils import get_last_checkpoint

    return get_last_checkpoint(output_dir) if Path(output_dir).is_dir() else None


def train_resuming(trainer, output_dir: str):
    """Train, continuing from the last checkpoint in output_dir when a killed run left one.
    Returns (train result, wall seconds, the checkpoint resumed from or None)."""
    resume = last_checkpoint(output_dir)
    if resume:
        print(f"[train] resuming from {resume}", file=sys.stderr)
    t0 = time.time()
    result = trainer.train(resume_from_checkpoint=resume)
    return result, time.time() - t0, resume


def training_windows(path) -> tuple[dict, dict, str]:
    """The (W, O) windows per conversation style of a dataset's extraction rows, most rows first, the row
    count of each, and the student prompt the rows were rendered with: what serving and the SDK default to
    once the model is trained."""
    counts: Counter = Counter()
    prompts: dict = {}
    for line_no, row in read_jsonl(path):
        if row.get("task") == "extractor":
            # rows built before prompts had names carry none: they were rendered with "student"
            prompts.setdefault(row.get("student_prompt", "student"), f"{path}:{line_no}")
            if row.get("window"):
                counts[(row.get("style") or "unknown", tuple(row["window"]))] += 1
    if len(prompts) > 1:
        raise ValueError(
            f"{path}: extraction rows rendered with different student prompts ("
            + ", ".join(f"{k!r} first at {v}" for k, v in prompts.items())
            + "); a model is served with one, so build the set with one `student_prompt`"
        )
    windows: dict = {}
    for (style, (w, o)), _ in counts.most_common():
        windows.setdefault(style, []).append([w, o])
    window_rows = {f"{style} {w}/{o}": n for (style, (w, o)), n in counts.most_common()}
    return windows, window_rows, next(iter(prompts), "student")


def train(cfg: ExtractorConfig) -> dict:
    # before training: a set mixing student prompts fails here, not after an hour's work
    windows, window_rows, prompt = training_windows(cfg.train_file) if "extractor" in cfg.tasks else ({}, {}, "student")
    trainer = build_trainer(cfg)
    result, wall, resume = train_resuming(trainer, cfg.output_dir)
    out = Path(cfg.output_dir)
    # save_model, not model.save_pretrained: under ZeRO-3 / FSDP each rank holds a shard, and the Trainer
    # gathers the adapter and writes it (with the tokenizer) from the main process only
    saved = out / ("model" if cfg.finetune == "full" else "adapter")
    trainer.save_model(str(saved))
    summary = write_run_report(trainer, cfg, wall, result, resumed_from=resume)
    if trainer.is_world_process_zero():
        write_json(
            saved / "memdistill.json",
            {
                "base_model": cfg.model,
                "schema_version": SCHEMA_VERSION,
                "training_windows": windows,
                "training_window_rows": window_rows,
                "student_prompt": prompt,
                "eval_overlap": dataset_overlap(cfg.train_file),
                "config": asdict(cfg),
            },
        )
    return summary


def write_run_report(trainer, cfg, wall: float, result, resumed_from=None) -> dict:
    history = trainer.state.log_history
    losses = [(h["step"], h["loss"]) for h in history if "loss" in h]
    tokens = max((h.get("num_tokens", 0) for h in history), default=0)
    summary = {
        "model": cfg.model,
        "schema_version": SCHEMA_VERSION,
        "steps": trainer.state.global_step,
        "epochs": trainer.state.epoch,
        "final_loss": losses[-1][1] if losses else None,
        "first_loss": losses[0][1] if losses else None,
        "train_loss": result.training_loss,
        "wall_time_s": round(wall, 1),
        "tokens": int(tokens),
        "tokens_per_s": round(tokens / wall, 1) if wall and tokens and not resumed_from else None,
        "peak_memory_mb": round(peak_memory_mb(), 1),
        "resumed_from": resumed_from,
        "train_rows": len(trainer.train_dataset),
    }
    if trainer.is_world_process_zero():
        out = Path(cfg.output_dir)
        write_json(out / "summary.json", summary)
        plot_loss(history, out / "loss.png", f"extractor LoRA on {cfg.model.split('/')[-1]}")
    return summary


def main(argv=None) -> int:
    summary = train(job_config(ExtractorConfig, argv, "memdistill train extractor", __doc__, config_required=True))
    print(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    sys.exit(main())
