"""Merge a LoRA adapter into its base and export a directory vLLM serves as is.

  memdistill merge --config configs/training/merge_cpu.yaml [key=value ...]      (make merge)

The output holds plain safetensors weights, the tokenizer with its chat template, a generation config
whose eos is the tokenizer's, a model card (README.md) and a copy of the adapter (`adapter/`) for
`vllm --enable-lora` serving.
"""

from __future__ import annotations

import json
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

from memdistill.core.config import job_config
from memdistill.core.io import atomic_dir, write_json, write_text
from memdistill.core.models import read_meta, saved_dir
from memdistill.core.report import card_front_matter, card_metrics, card_overlap, card_training
from memdistill.spec import SCHEMA_VERSION
from memdistill.spec.dialogue import describe_windows


@dataclass
class MergeConfig:
    run_dir: str = "runs/extractor-cpu"  # a training output_dir (holds adapter/ and summary.json)
    output_dir: str = "runs/extractor-cpu/merged"
    dtype: str = "float32"  # bfloat16 on GPU


def merge(cfg: MergeConfig) -> Path:
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    from memdistill.core.models import model_path

    run = Path(cfg.run_dir)
    adapter = saved_dir(run)  # adapter/ (LoRA) or model/ (full fine-tuning)
    meta_path = adapter / "memdistill.json"
    if not meta_path.exists():
        raise FileNotFoundError(f"{adapter}: no trained adapter (expected {meta_path}); run `make train-extractor`")
    meta = json.loads(meta_path.read_text())
    if meta.get("schema_version") != SCHEMA_VERSION:
        raise ValueError(
            f"{meta_path}: adapter trained for schema {meta.get('schema_version')}, the spec is {SCHEMA_VERSION}"
        )
    base = model_path(meta["base_model"])
    dtype = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}[cfg.dtype]
    if adapter.name == "model":  # fully fine-tuned: the weights are the model
        model = AutoModelForCausalLM.from_pretrained(adapter, dtype=dtype)
    else:
        model = AutoModelForCausalLM.from_pretrained(base, dtype=dtype)
        model = PeftModel.from_pretrained(model, adapter).merge_and_unload()
    tok = AutoTokenizer.from_pretrained(adapter)
    with atomic_dir(cfg.output_dir) as tmp:
        model.save_pretrained(tmp, safe_serialization=True)
        tok.save_pretrained(tmp)
        gen = (
            GenerationConfig.from_pretrained(base)
            if (Path(base) / "generation_config.json").exists()
            else GenerationConfig()
        )
        gen.eos_token_id = tok.eos_token_id
        gen.pad_token_id = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
        gen.do_sample = False
        for k in ("temperature", "top_p", "top_k"):  # greedy decoding: sampling knobs would only warn
            setattr(gen, k, None)
        gen.save_pretrained(tmp)
        if adapter.name == "adapter":
            shutil.copytree(adapter, tmp / "adapter")
        summary = json.loads((run / "summary.json").read_text()) if (run / "summary.json").exists() else {}
        write_json(tmp / "memdistill.json", {**meta, "training_summary": summary})
    out = Path(cfg.output_dir)
    write_card(out)  # `memdistill eval` rewrites it with its figures
    return out


def write_card(model_dir, evaluation: dict | None = None) -> None:
    """(Re)write a merged model's README.md; `memdistill eval` calls this with its figures."""
    write_text(Path(model_dir) / "README.md", model_card(read_meta(model_dir), evaluation))


def model_card(meta: dict, evaluation: dict | None) -> str:
    c = meta["config"]
    lines = (
        card_front_matter(["memdistill", "lora", "memory-extraction", "dimmem"])
        + [
            "# memdistill extractor",
            "",
            "Writes DimMem memory records from a dialogue window and parses memory queries "
            f"(spec schema {SCHEMA_VERSION}). Prompts, output schema and parser: `memdistill.spec.extractor` and "
            "`memdistill.spec.query_parser`.",
            "",
            "## Training",
            "",
            f"- base model: `{meta['base_model']}`",
            f"- data: `{c['train_file']}` (tasks: {', '.join(c['tasks'])})",
            "- windows (W/O per conversation style, most rows first): "
            f"{describe_windows(meta.get('training_windows') or {})} — `memdistill serve` and "
            "`MemoryModels.extract(conversation)` use the first of each style by default",
            f"- student prompt: `{meta.get('student_prompt') or 'student'}` (`extractor.STUDENT_PROMPTS`; the SDK "
            "and eval send it, read from this metadata)",
            (
                f"- LoRA r={c['lora_r']}, alpha={c['lora_alpha']}, dropout={c['lora_dropout']}, "
                f"targets: {', '.join(c['target_modules'])}"
                if c.get("finetune", "lora") == "lora"
                else "- full fine-tuning (embeddings frozen)"
            )
            + (f", layers {c['layers_to_transform']}" if c.get("layers_to_transform") else ", all layers"),
        ]
        + card_training(c, meta.get("training_summary"))
        + card_overlap(meta)
    )
    if evaluation:
        lines += [
            "",
            "## Evaluation",
            "",
            f"On the gold {evaluation.get('split', 'test')} split ({evaluation.get('source', '')}):",
        ]
        lines += [""] + card_metrics(None, {g: evaluation.get(g, {}) for g in ("extractor", "query_parser")})
    else:
        lines += ["", "## Evaluation", "", "Not evaluated yet: run `make eval`."]
    lines += [
        "",
        "## Serving",
        "",
        "`make serve` (vLLM OpenAI-compatible server, thinking off by default); "
        "the client SDK is `memdistill.serve.client.MemoryModels`.",
        "",
    ]
    return "\n".join(lines)


def main(argv=None) -> int:
    print(merge(job_config(MergeConfig, argv, "memdistill merge", __doc__)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
