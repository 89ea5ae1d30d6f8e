"""Extractor training, merge and the shared rendering path, on tiny models on CPU."""

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml

from memdistill.core.config import ConfigError, load_config
from memdistill.data.sources import load
from memdistill.spec import SCHEMA_VERSION, extractor, query_parser
from memdistill.spec.dialogue import windows
from memdistill.spec.render import prompt_ids, sft_row
from tests.conftest import FIXTURES, REPO

GOLDEN = Path(__file__).parent / "golden" / "render_hashes.json"


@pytest.fixture(scope="session")
def tiny_qwen3_dir(tmp_path_factory, smollm2_dir):
    """A tiny random Qwen3 with Qwen3's real chat template (thinking on by default, like the 4B)."""
    from transformers import AutoTokenizer, Qwen3Config, Qwen3ForCausalLM
    from trl.chat_template_utils import qwen3_chat_template

    out = tmp_path_factory.mktemp("tiny-qwen3")
    tok = AutoTokenizer.from_pretrained(smollm2_dir)
    tok.add_special_tokens({"additional_special_tokens": ["<think>", "</think>"]})
    tok.chat_template = qwen3_chat_template
    # Qwen's pre-tokenizer keeps a newline run in one piece (GPT-2's splits off its last character), so
    # "</think>\n\n" tokenizes alike before a completion and at the end of a generation prompt.
    from tokenizers import Regex, pre_tokenizers

    qwen_split = (
        r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
        r"|\s*[\r\n]+|\s+(?!\S)|\s+"
    )
    tok.backend_tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(qwen_split), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    torch.manual_seed(0)
    cfg = Qwen3Config(
        vocab_size=len(tok),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )
    Qwen3ForCausalLM(cfg).save_pretrained(out)
    tok.save_pretrained(out)
    return str(out)


def _rows(prompt: str = "student"):
    """SFT rows from the LoCoMo fixture: a few hand-made gold records and one query row."""
    conv = load("locomo", FIXTURES / "locomo_sample.json")[0]
    rows = []
    for w in windows(conv, 8, 2)[:3]:
        n, t = w.extractable()[0]
        rec = extractor.MemoryRecord(
            source_id=n,
            source_speaker=t.speaker,
            content=f"{t.speaker} said: {t.text[:60]}",
            dimension=extractor.Dimension(
                memory_type="episodic", time=t.timestamp.date().isoformat(), keywords=[t.speaker.lower()]
            ),
        )
        rows.append(
            sft_row(
                extractor.chat_messages(w, prompt),
                extractor.render_completion([rec]),
                task="extractor",
                schema_version=SCHEMA_VERSION,
                conversation_id=conv.conversation_id,
                window=[8, 2],
                style=conv.style,
                student_prompt=prompt,
            )
        )
    qa = query_parser.QueryAnalysis(
        query_anchor="When Caroline went to the support group",
        need_assistant_context=False,
        dimension=query_parser.QueryDimension(target_memory_type=["episodic"], keywords=["support group"]),
        answer_dim="time",
    )
    rows.append(
        sft_row(
            query_parser.chat_messages("When did Caroline go to the support group?", "2023-06-01T10:00:00"),
            query_parser.render_completion(qa),
            task="query_parser",
            schema_version=SCHEMA_VERSION,
            conversation_id=conv.conversation_id,
        )
    )
    return rows


@pytest.fixture
def train_file(tmp_path):
    p = tmp_path / "train.jsonl"
    p.write_text("".join(json.dumps(r) + "\n" for r in _rows() * 2))
    return str(p)


def _cfg(model, train_file, out, **kw):
    from memdistill.train.extractor import ExtractorConfig

    base = dict(
        model=model,
        train_file=train_file,
        eval_file=None,
        output_dir=str(out),
        learning_rate=1e-2,
        max_steps=3,
        per_device_train_batch_size=2,
        gradient_accumulation_steps=1,
        max_length=1024,
        dtype="float32",
        gradient_checkpointing=False,
        logging_steps=1,
        save_steps=100,
        lora_r=4,
        lora_alpha=8,
    )
    base.update(kw)
    return ExtractorConfig(**base)


def _mean_training_loss(trainer) -> float:
    """The loss over every training row, without dropout or an update: compared before and after training,
    a run that trained nothing (no step, learning rate 0) shows no gain."""
    model = trainer.model
    was_training = model.training
    model.eval()
    with torch.no_grad():
        losses = [trainer.compute_loss(model, dict(b)).item() for b in trainer.get_train_dataloader()]
    model.train(was_training)
    return sum(losses) / len(losses)


@pytest.mark.parametrize("which", ["tiny_qwen3_dir", "smollm2_dir"])
def test_lora_changes_adapter_not_base(request, which, train_file, tmp_path):
    from memdistill.train.extractor import build_trainer

    model_dir = request.getfixturevalue(which)
    cfg = _cfg(model_dir, train_file, tmp_path / "run", max_steps=2 if which == "smollm2_dir" else 3)
    trainer = build_trainer(cfg)
    before = {k: v.detach().clone() for k, v in trainer.model.named_parameters()}
    trainer.train()
    changed_lora = unchanged_base = 0
    for k, v in trainer.model.named_parameters():
        same = torch.equal(before[k], v.detach())
        if "lora_" in k:
            changed_lora += not same
        else:
            assert same, f"base weight {k} changed"
            unchanged_base += 1
    assert changed_lora > 0 and unchanged_base > 0
    names = [k for k, _ in trainer.model.named_parameters() if "lora_" in k]
    assert not any("embed" in k or "lm_head" in k for k in names)


def test_full_finetune_trains_only_the_chosen_layers_and_merge_exports_it(tiny_qwen3_dir, train_file, tmp_path):
    from transformers import AutoModelForCausalLM

    from memdistill.train.extractor import train
    from memdistill.train.merge import MergeConfig, merge

    run = tmp_path / "full"
    before = {k: v.detach().clone() for k, v in AutoModelForCausalLM.from_pretrained(tiny_qwen3_dir).named_parameters()}
    train(_cfg(tiny_qwen3_dir, train_file, run, finetune="full", layers_to_transform=[1], learning_rate=1e-3))
    assert (run / "model" / "memdistill.json").exists() and not (run / "adapter").exists()
    out = merge(MergeConfig(run_dir=str(run), output_dir=str(tmp_path / "merged")))
    after = dict(AutoModelForCausalLM.from_pretrained(out).named_parameters())
    changed = {k for k in before if not torch.equal(before[k], after[k].detach())}
    assert changed and all(".layers.1." in k or k.endswith("model.norm.weight") for k in changed)
    assert not any("embed" in k or ".layers.0." in k for k in changed)
    assert (out / "memdistill.json").exists() and (out / "tokenizer_config.json").exists()


def test_completion_only_scoring_gives_the_same_loss_and_gradients(tiny_qwen3_dir, train_file, tmp_path):
    """The CPU speed-up (score only labelled positions) changes no number the optimiser sees."""
    import trl.trainer.utils as trl_utils
    from trl.kernels.chunked_logprob import _use_triton

    from memdistill.train.extractor import build_trainer

    trainer = build_trainer(_cfg(tiny_qwen3_dir, train_file, tmp_path / "s", lora_dropout=0.0))
    batch = next(iter(trainer.get_train_dataloader()))
    model = trainer.model

    def loss_and_grads():
        model.zero_grad()
        loss = trainer.compute_loss(model, dict(batch))
        loss.backward()
        return loss.item(), {k: p.grad.clone() for k, p in model.named_parameters() if p.grad is not None}

    patched = trl_utils._use_triton
    compact = loss_and_grads()
    trl_utils._use_triton = _use_triton
    try:
        full = loss_and_grads()
    finally:
        trl_utils._use_triton = patched
    assert patched(torch.device("cpu")) and not _use_triton(torch.device("cpu"))
    assert compact[0] == pytest.approx(full[0], rel=1e-5)
    assert compact[1].keys() == full[1].keys() and compact[1]
    for k in full[1]:
        assert torch.allclose(compact[1][k], full[1][k], atol=1e-6), k


def test_training_rendering_equals_serving_rendering(tiny_qwen3_dir, smollm2_dir, train_file, tmp_path):
    """The prompt part of every tokenized training row is exactly what serving renders for it."""
    from transformers import AutoTokenizer

    from memdistill.train.extractor import build_trainer

    for model_dir in (tiny_qwen3_dir, smollm2_dir):
        trainer = build_trainer(_cfg(model_dir, train_file, tmp_path / Path(model_dir).name))
        tok = AutoTokenizer.from_pretrained(model_dir)
        rows = [json.loads(x) for x in Path(train_file).read_text().splitlines()]
        for row, tokenized in zip(rows, trainer.train_dataset):
            served = prompt_ids(tok, row["prompt"])
            n_prompt = next(i for i, lab in enumerate(tokenized["labels"]) if lab != -100)  # loss starts here
            assert tokenized["input_ids"][:n_prompt] == served
            completion = tok.decode(tokenized["input_ids"][n_prompt:])
            assert row["completion"][0]["content"] in completion and completion.rstrip().endswith(tok.eos_token)
        if model_dir == tiny_qwen3_dir:  # thinking is off in both paths
            text = tok.decode(served)
            assert text.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")


def _render_hash(model_dir, train_file, tmp_path):
    from memdistill.train.extractor import build_trainer

    trainer = build_trainer(_cfg(model_dir, train_file, tmp_path / "h"))
    h = hashlib.sha256()
    for r in trainer.train_dataset:
        h.update(json.dumps([r["input_ids"], r["labels"]]).encode())
    return h.hexdigest()


def test_rendered_rows_match_golden_hash(smollm2_dir, tiny_qwen3_dir, train_file, tmp_path):
    """Template, prompt or completion-format drift changes these hashes. After an intended change, bump
    memdistill.spec.SCHEMA_VERSION and regenerate with UPDATE_GOLDEN=1."""
    got = {
        "smollm2": _render_hash(smollm2_dir, train_file, tmp_path),
        "tiny_qwen3": _render_hash(tiny_qwen3_dir, train_file, tmp_path),
    }
    if os.environ.get("UPDATE_GOLDEN"):
        GOLDEN.parent.mkdir(exist_ok=True)
        GOLDEN.write_text(json.dumps({"schema_version": SCHEMA_VERSION, **got}, indent=1) + "\n")
    want = json.loads(GOLDEN.read_text())
    assert want["schema_version"] == SCHEMA_VERSION
    assert got == {k: want[k] for k in got}


def test_merge_logits_equal_base_plus_adapter(tiny_qwen3_dir, train_file, tmp_path):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    from memdistill.train.extractor import train
    from memdistill.train.merge import MergeConfig, merge

    run = tmp_path / "run"
    summary = train(_cfg(tiny_qwen3_dir, train_file, run))
    assert summary["steps"] == 3 and (run / "loss.png").stat().st_size > 1000
    assert {"tokens_per_s", "peak_memory_mb", "final_loss", "wall_time_s"} <= set(summary)
    out = merge(MergeConfig(run_dir=str(run), output_dir=str(tmp_path / "merged")))
    assert (out / "model.safetensors").exists() and (out / "adapter" / "adapter_model.safetensors").exists()
    assert (out / "chat_template.jinja").exists() and "schema" in (out / "README.md").read_text()
    tok = AutoTokenizer.from_pretrained(out)
    assert GenerationConfig.from_pretrained(out).eos_token_id == tok.eos_token_id
    ids = torch.tensor([tok("Hey Mel! I went to a support group yesterday.")["input_ids"]])
    merged = AutoModelForCausalLM.from_pretrained(out).eval()
    ref = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny_qwen3_dir), run / "adapter").eval()
    base = AutoModelForCausalLM.from_pretrained(tiny_qwen3_dir).eval()
    with torch.no_grad():
        a, b, c = merged(ids).logits, ref(ids).logits, base(ids).logits
    assert torch.allclose(a, b, atol=1e-4)
    assert not torch.allclose(a, c, atol=1e-4)  # the adapter did something


def test_training_windows_travel_from_the_dataset_to_the_merged_model(tiny_qwen3_dir, train_file, tmp_path):
    from memdistill.core.models import trained_windows
    from memdistill.serve.client import MemoryModels
    from memdistill.train.extractor import train
    from memdistill.train.merge import MergeConfig, merge

    run = tmp_path / "run"
    train(_cfg(tiny_qwen3_dir, train_file, run, max_steps=1))
    adapter_meta = json.loads((run / "adapter" / "memdistill.json").read_text())
    assert adapter_meta["training_windows"] == {"multi-party": [[8, 2]]}
    assert adapter_meta["training_window_rows"] == {"multi-party 8/2": 6}  # 3 windows, each row twice
    out = merge(MergeConfig(run_dir=str(run), output_dir=str(tmp_path / "merged")))
    assert json.loads((out / "memdistill.json").read_text())["training_windows"] == {"multi-party": [[8, 2]]}
    assert "windows (W/O per conversation style, most rows first): multi-party 8/2" in (out / "README.md").read_text()
    assert trained_windows(out) == trained_windows(run) == {"multi-party": [[8, 2]]}
    # the SDK reads them from the model directory when told where it is (from /v1/models otherwise)
    assert MemoryModels(None, model_dir=str(out)).training_windows() == {"multi-party": [[8, 2]]}


def test_the_student_prompt_travels_from_the_dataset_to_the_sdk(tiny_qwen3_dir, tmp_path):
    from memdistill.core.models import trained_prompt
    from memdistill.serve.client import MemoryModels
    from memdistill.train.extractor import train
    from memdistill.train.merge import MergeConfig, merge

    rows = _rows("student-short")
    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    run = tmp_path / "run"
    train(_cfg(tiny_qwen3_dir, str(data), run, max_steps=1))
    out = merge(MergeConfig(run_dir=str(run), output_dir=str(tmp_path / "merged")))
    assert json.loads((out / "memdistill.json").read_text())["student_prompt"] == "student-short"
    assert trained_prompt(out) == trained_prompt(run) == "student-short"
    assert trained_prompt(tiny_qwen3_dir) == "student"  # a base model: the default prompt
    mm = MemoryModels(None, model_dir=str(out))
    assert mm.student_prompt() == "student-short"
    assert MemoryModels(None, model_dir=str(out), student_prompt="student").student_prompt() == "student"
    with pytest.raises(ValueError, match="student_prompt 'short': expected one of"):
        MemoryModels(None, student_prompt="short")
    # what the SDK and eval send for a window is what the model was trained on for it, system prompt included
    conv = load("locomo", FIXTURES / "locomo_sample.json")[0]
    w = windows(conv, 8, 2)[0]
    assert extractor.chat_messages(w, mm.student_prompt()) == rows[0]["prompt"]
    assert rows[0]["prompt"][0]["content"] == extractor.STUDENT_PROMPTS["student-short"] != extractor.STUDENT_SYSTEM


def test_a_set_mixing_student_prompts_is_refused_before_training(tiny_qwen3_dir, tmp_path):
    from memdistill.train.extractor import train

    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in _rows() + _rows("student-short")))
    with pytest.raises(ValueError, match=r"different student prompts.*'student-short' first at .*train.jsonl:5"):
        train(_cfg(tiny_qwen3_dir, str(data), tmp_path / "run"))
    assert not (tmp_path / "run").exists()


def test_a_missing_dataset_names_the_command_that_builds_it(tiny_qwen3_dir, tmp_path):
    from memdistill.train.extractor import build_trainer

    cfg = _cfg(tiny_qwen3_dir, str(tmp_path / "nope.jsonl"), tmp_path / "run", data_config="configs/data/x.yaml")
    with pytest.raises(
        FileNotFoundError,
        match=r"nope.jsonl: no such dataset; build it first with "
        r"`memdistill data --config configs/data/x.yaml`",
    ):
        build_trainer(cfg)
    assert not (tmp_path / "nope.jsonl").exists() and not (REPO / "data/built-x").exists()


def test_schema_version_mismatch_is_refused(tiny_qwen3_dir, tmp_path):
    from memdistill.train.extractor import build_trainer

    p = tmp_path / "old.jsonl"
    row = dict(_rows()[0], schema_version="0.1")
    p.write_text(json.dumps(row) + "\n")
    with pytest.raises(ValueError, match=r"old.jsonl:1: schema_version '0.1'"):
        build_trainer(_cfg(tiny_qwen3_dir, str(p), tmp_path / "r"))


def test_lora_on_embeddings_is_refused(tiny_qwen3_dir, train_file, tmp_path):
    from memdistill.train.extractor import validate

    with pytest.raises(ValueError, match="embeddings or lm_head"):
        validate(_cfg(tiny_qwen3_dir, train_file, tmp_path, target_modules=["q_proj", "lm_head"]))


def test_every_yaml_loads_into_its_dataclass():
    from accelerate.commands.config.config_args import ClusterConfig

    from memdistill.data.build import DataConfig
    from memdistill.eval.ablate import AblateConfig
    from memdistill.eval.consolidation import ConsolidationEvalConfig
    from memdistill.eval.e2e import E2EConfig
    from memdistill.eval.encoders import EncoderEvalConfig
    from memdistill.eval.extractor import EvalConfig
    from memdistill.eval.fidelity import FidelityConfig
    from memdistill.eval.mem0_compat import Mem0EvalConfig
    from memdistill.eval.query_types import TypingEvalConfig
    from memdistill.serve.server import ServeConfig
    from memdistill.spec import MODELS, TRAINING_SETS
    from memdistill.train.encoder import EncoderConfig
    from memdistill.train.extractor import ExtractorConfig, validate
    from memdistill.train.merge import MergeConfig

    # one training config family per training set of the table: the LoRA job's for an LM's set, else the encoder's
    kinds = {"merge_": MergeConfig} | {
        f"{s}_": ExtractorConfig if MODELS[s].head == "lm" else EncoderConfig for s in TRAINING_SETS
    }
    seen = 0
    for path in sorted((REPO / "configs").rglob("*.yaml")):
        rel = path.relative_to(REPO / "configs")
        assert path.read_text().startswith("#"), f"{rel}: needs a header saying how to run it"
        if rel.parts[0] == "accelerate":
            ClusterConfig.from_yaml_file(str(path))
        elif rel.parts[0] == "data":
            load_config(DataConfig, path)
        elif rel.parts[0] == "eval":
            prefix = rel.name.split("_")[0]
            kinds_eval = {
                "encoders": EncoderEvalConfig,
                "e2e": E2EConfig,
                "extractor": EvalConfig,
                "ablate": AblateConfig,
                "consolidation": ConsolidationEvalConfig,
                "fidelity": FidelityConfig,
                "mem0": Mem0EvalConfig,
                "typing": TypingEvalConfig,
            }
            load_config(kinds_eval[prefix], path)
        elif rel.parts[0] == "serving":
            load_config(ServeConfig, path)
        else:
            cls = next(c for prefix, c in kinds.items() if rel.name.startswith(prefix))
            cfg = load_config(cls, path)
            if cls is ExtractorConfig:
                validate(cfg)
        seen += 1
    assert seen >= 13


def test_config_errors_name_the_key(tmp_path):
    from memdistill.train.extractor import ExtractorConfig

    p = tmp_path / "c.yaml"
    p.write_text("model: x\nlearning_rat: 1e-4\n")
    with pytest.raises(ConfigError, match=r"c.yaml: unknown key 'learning_rat'"):
        load_config(ExtractorConfig, p)
    with pytest.raises(ConfigError, match="unknown key 'nope'"):
        load_config(ExtractorConfig, None, ["nope=1"])
    with pytest.raises(ConfigError, match="max_steps should be int"):
        load_config(ExtractorConfig, None, ["max_steps=many"])
    cfg = load_config(
        ExtractorConfig, REPO / "configs/training/extractor_cpu.yaml", ["max_steps=7", "learning_rate=1e-3"]
    )
    assert cfg.max_steps == 7 and cfg.learning_rate == 1e-3


def test_gpu_recipe_runs_the_same_code_on_a_tiny_qwen3(tiny_qwen3_dir, train_file, tmp_path):
    """The Qwen3-4B YAML, with only the model and data swapped for tiny ones, builds and steps."""
    from memdistill.train.extractor import ExtractorConfig, build_trainer

    cfg = load_config(
        ExtractorConfig,
        REPO / "configs/training/extractor_qwen3_4b.yaml",
        [
            f"model={tiny_qwen3_dir}",
            f"train_file={train_file}",
            "eval_file=null",
            f"output_dir={tmp_path / 'gpu'}",
            "max_steps=1",
        ],
    )
    assert cfg.gradient_checkpointing and cfg.dtype == "bfloat16" and cfg.max_length == 12288
    trainer = build_trainer(cfg)
    lora = trainer.model.peft_config["default"]  # what PEFT received from the YAML (Table 11 and the rest)
    assert (lora.r, lora.lora_alpha, lora.lora_dropout) == (16, 32, 0.05)
    assert set(lora.target_modules) == set(cfg.target_modules)
    # bf16 autocast and checkpointing as on the GPU (CPU autocast runs bf16 too)
    assert trainer.args.bf16 and trainer.accelerator.mixed_precision == "bf16"
    trainer.train()
    assert trainer.state.global_step == 1
    assert trainer.model.base_model.model.is_gradient_checkpointing  # the Trainer turns it on in train()


def test_qwen3_4b_recipe_arguments_on_a_cuda_device_are_the_cpu_ones(tmp_path, monkeypatch):
    """sft_args(cfg, use_cpu=False) is what a CUDA run trains with: bf16, checkpointing, batch 1 x 2; the
    device changes use_cpu and nothing the recipe sets."""
    import transformers.training_args as targs

    from memdistill.train.extractor import ExtractorConfig, sft_args

    cfg = load_config(ExtractorConfig, REPO / "configs/training/extractor_qwen3_4b.yaml", [f"output_dir={tmp_path}"])
    on_cpu = sft_args(cfg, use_cpu=True).to_dict()
    with pytest.raises(ValueError, match="doesn't support bf16/gpu"):  # transformers checks the hardware here
        sft_args(cfg, use_cpu=False)
    monkeypatch.setattr(targs, "is_torch_bf16_gpu_available", lambda: True)  # stand in for the H100's answer
    on_gpu = sft_args(cfg, use_cpu=False).to_dict()
    assert on_gpu["bf16"] and not on_gpu["fp16"] and on_gpu["gradient_checkpointing"]
    assert (on_gpu["per_device_train_batch_size"], on_gpu["gradient_accumulation_steps"]) == (1, 2)
    assert on_gpu["learning_rate"] == 5e-5 and on_gpu["max_length"] == 12288 and on_gpu["completion_only_loss"]
    # transformers itself turns pinned memory off on CPU
    assert {k for k in on_gpu if on_gpu[k] != on_cpu[k]} <= {"use_cpu", "dataloader_pin_memory"}


def test_qlora_recipe_quantizes_the_base_to_nf4():
    from memdistill.train.extractor import ExtractorConfig, quantization_config

    q = quantization_config(load_config(ExtractorConfig, REPO / "configs/training/extractor_qwen3_4b_qlora.yaml"))
    assert q.load_in_4bit and not q.load_in_8bit
    assert q.bnb_4bit_quant_type == "nf4" and q.bnb_4bit_use_double_quant and q.bnb_4bit_compute_dtype == torch.bfloat16
    assert quantization_config(load_config(ExtractorConfig, REPO / "configs/training/extractor_qwen3_4b.yaml")) is None


def test_qlora_recipe_trains_on_a_tiny_qwen3_on_cpu(tiny_qwen3_dir, train_file, tmp_path):
    """The QLoRA YAML end to end on bitsandbytes' CPU backend: 4-bit NF4 base, bf16 adapters that learn."""
    import bitsandbytes as bnb

    from memdistill.train.extractor import ExtractorConfig, build_trainer

    cfg = load_config(
        ExtractorConfig,
        REPO / "configs/training/extractor_qwen3_4b_qlora.yaml",
        [
            f"model={tiny_qwen3_dir}",
            f"train_file={train_file}",
            "eval_file=null",
            f"output_dir={tmp_path / 'q'}",
            "max_steps=1",
            "learning_rate=1e-2",
            "warmup_steps=0",
        ],
    )
    trainer = build_trainer(cfg)
    model = trainer.model
    assert model.base_model.model.is_loaded_in_4bit
    assert any(isinstance(m, bnb.nn.Linear4bit) for m in model.modules())
    lora = {k: p for k, p in model.named_parameters() if p.requires_grad}
    assert lora and all("lora_" in k and p.dtype == torch.bfloat16 for k, p in lora.items())
    before = {k: p.detach().clone() for k, p in lora.items()}
    untrained = _mean_training_loss(trainer)
    trainer.train()
    assert trainer.state.global_step == 1
    assert any(not torch.equal(before[k], p.detach()) for k, p in lora.items())
    assert _mean_training_loss(trainer) < untrained  # the adapters learned: lower than the untrained start


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="runs the QLoRA recipe on a CUDA device")
def test_qlora_variant_on_gpu(tiny_qwen3_dir, train_file, tmp_path):
    from memdistill.train.extractor import ExtractorConfig, build_trainer

    cfg = load_config(
        ExtractorConfig,
        REPO / "configs/training/extractor_qwen3_4b_qlora.yaml",
        [
            f"model={tiny_qwen3_dir}",
            f"train_file={train_file}",
            "eval_file=null",
            f"output_dir={tmp_path / 'q'}",
            "max_steps=2",
            "learning_rate=1e-2",
            "warmup_steps=0",
        ],
    )
    trainer = build_trainer(cfg)
    untrained = _mean_training_loss(trainer)
    trainer.train()
    assert trainer.state.global_step == 2
    assert _mean_training_loss(trainer) < untrained


def test_killed_run_resumes_from_its_checkpoint(tiny_qwen3_dir, train_file, tmp_path):
    out = tmp_path / "resume"
    cfg_path = tmp_path / "cfg.yaml"
    cfg_path.write_text(
        yaml.safe_dump(
            dict(
                model=tiny_qwen3_dir,
                train_file=train_file,
                eval_file=None,
                output_dir=str(out),
                learning_rate=1e-3,
                max_steps=40,
                per_device_train_batch_size=1,
                gradient_accumulation_steps=1,
                max_length=1024,
                dtype="float32",
                gradient_checkpointing=False,
                logging_steps=1,
                save_steps=5,
                save_total_limit=10,
                lora_r=4,
                lora_alpha=8,
            )
        )
    )
    cmd = [sys.executable, "-m", "memdistill.train.extractor", "--config", str(cfg_path)]
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.time() + 240
    while time.time() < deadline and not (out / "checkpoint-5" / "trainer_state.json").exists():
        assert proc.poll() is None, "training ended before its first checkpoint"
        time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    assert not (out / "summary.json").exists(), "the run finished before it could be killed"
    done = sorted(int(p.name.split("-")[1]) for p in out.glob("checkpoint-*") if (p / "trainer_state.json").exists())
    r = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["resumed_from"].endswith(f"checkpoint-{done[-1]}") and summary["steps"] == 40
    state = json.loads((out / "checkpoint-40" / "trainer_state.json").read_text())
    steps_logged = [h["step"] for h in state["log_history"] if "loss" in h]
    assert steps_logged == list(range(1, 41))  # history continues from the checkpoint, no gap, no repeat


def test_trl_pin_covers_the_private_name_the_cpu_speed_up_patches(monkeypatch):
    """TRL is pinned to the minor release whose private `_use_triton` the extractor patches; the installed TRL
    satisfies the pin and still has the name, and without it the patch refuses with a clear error."""
    import importlib.metadata as md

    import tomllib
    import trl.trainer.utils as trl_utils
    from packaging.requirements import Requirement

    from memdistill.train.extractor import score_completion_positions_only

    deps = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    pin = next(Requirement(d) for d in deps if Requirement(d).name == "trl")
    assert pin.specifier and not pin.specifier.contains("1.17.0") and pin.specifier.contains(md.version("trl"))
    assert callable(trl_utils._use_triton)
    monkeypatch.delattr(trl_utils, "_use_triton")
    with pytest.raises(RuntimeError, match="no private `_use_triton`"):
        score_completion_positions_only()
