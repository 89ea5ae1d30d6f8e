"""memdistill.spec: the one contract every memdistill stage imports.

Each compact model's schema, prompts, parser and label set live in exactly one module here:

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

TASKS = (
    "extraction",
    "query_parse",
    "memory_type",
    "recall_plan",
    "recall_gate",
    "consolidation",
    "topic_segment",
    "query_type",
)


def task_module(task: str):
    """The spec module that owns `task` (one of TASKS)."""
    import importlib

    if task not in TASKS:
        raise ValueError(f"unknown task {task!r}; expected one of {', '.join(TASKS)}")
    return importlib.import_module(f"memdistill.spec.{task}")
