"""memdistill.spec: the one contract every memdistill stage imports.

Each compact model's schema, prompts, parser, label set, training row, teacher request, decision rule
and metric live in exactly one module here, stated once as its `MODEL` record (`memdistill.spec.compact`);
`MODELS` below is the table every stage loops over:

- `memdistill.spec.dialogue`     turns, sessions, conversations, timestamps, overlapping windows, rendering
- `memdistill.spec.extraction`   DimMem memory records (extractor LM)
- `memdistill.spec.query_parse`  DimMem query analysis (same LM, same adapter)
- `memdistill.spec.memory_type`  TriMEM EM / PM / GM multi-labels (type router)
- `memdistill.spec.recall_plan`  TiMem recall complexity + keywords (planner)
- `memdistill.spec.recall_gate`  TiMem recall gating (gate)
- `memdistill.spec.consolidation`  DimMem memory update: MERGE / SUPERSEDE / KEEPBOTH (consolidator)
- `memdistill.spec.topic_segment`  TraceMem topic segmentation: CHANGE / DEVELOP per utterance (segmenter)
- `memdistill.spec.query_type`   MemoType query typing: hypothetical memories, the router's vote, type scope
  (query typer)

Parsers never raise on model output: they return what could be recovered plus `Problem`s with
reason codes (see `memdistill.spec.jsonout`).
"""

# Bumped whenever a schema, prompt or rendering changes in a way that invalidates trained models or
# datasets. Carried into every dataset row and model card; training refuses a mismatched dataset.
SCHEMA_VERSION = "1.1"  # 1.1: the student writes compact records (extraction.compact_record)

# The compact models, in teacher-job order (a job reads the labels of the jobs before it). Each spec module
# states its model once, as `MODEL` (memdistill.spec.compact.CompactModel); this is the only list of them.
_MODULES = (
    "extraction",
    "query_parse",
    "memory_type",
    "recall_plan",
    "recall_gate",
    "consolidation",
    "topic_segment",
    "query_type",
)


def _table() -> dict:
    import importlib

    return {m.name: m for m in (importlib.import_module(f"memdistill.spec.{mod}").MODEL for mod in _MODULES)}


MODELS = _table()  # name -> CompactModel
NAMES = tuple(MODELS)
ENCODERS = tuple(n for n, m in MODELS.items() if m.encoder)
TRAINING_SETS = tuple(dict.fromkeys(m.built for m in MODELS.values()))


def model(name: str):
    """The CompactModel called `name`; a ValueError lists the names there are."""
    if name not in MODELS:
        raise ValueError(f"unknown model {name!r}; expected one of {', '.join(NAMES)}")
    return MODELS[name]
