"""memdistill.spec: the one contract every memdistill stage imports.

Each compact model's schema, prompts, parser, label set, training row, teacher request, decision rule
and metric live in exactly one module here, stated once as its `MODEL` record (`memdistill.spec.compact`);
`MODELS` below is the table every stage loops over:

- `memdistill.spec.compact`      the record (CompactModel) and what it is made of (heads, units, requests)
- `memdistill.spec.dialogue`     turns, sessions, conversations, timestamps, overlapping windows, rendering
- `memdistill.spec.<name>`       one module per compact model, named as the model everywhere else:
  extractor (DimMem records), query_parser (DimMem query analysis; the extractor's LM and adapter),
  router (TriMEM EM / PM / GM), planner (TiMem recall complexity), gate (TiMem recall gating), consolidator
  (DimMem memory update), segmenter (TraceMem topic segmentation), querytyper (MemoType query typing),
  summarizer (TiMem memory-tree nodes: session, day, week, month)

Parsers never raise on model output: they return what could be recovered plus `Problem`s with
reason codes (see `memdistill.spec.jsonout`).
"""

# Bumped whenever a schema, prompt or rendering changes in a way that invalidates trained models or
# datasets. Carried into every dataset row and model card; training refuses a mismatched dataset.
SCHEMA_VERSION = "1.1"  # 1.1: the student writes compact records (extractor.compact_record)

# The compact models, in teacher-job order (a job reads the labels of the jobs before it). Each is the module
# memdistill.spec.<name>, whose `MODEL` (memdistill.spec.compact.CompactModel) states it once; this tuple is the
# only list of them.
_NAMES = (
    "extractor",
    "query_parser",
    "router",
    "planner",
    "gate",
    "consolidator",
    "segmenter",
    "querytyper",
    "summarizer",
)


def _table() -> dict:
    import importlib

    table = {n: importlib.import_module(f"memdistill.spec.{n}").MODEL for n in _NAMES}
    wrong = [n for n, m in table.items() if m.name != n]
    if wrong:
        raise RuntimeError(f"spec modules {wrong} state a MODEL named otherwise: a model's module carries its name")
    return table


MODELS = _table()  # name -> CompactModel
NAMES = tuple(MODELS)
ENCODERS = tuple(n for n, m in MODELS.items() if m.encoder)
TRAINING_SETS = tuple(dict.fromkeys(m.built for m in MODELS.values()))


def model(name: str):
    """The CompactModel called `name`; a ValueError lists the names there are."""
    if name not in MODELS:
        raise ValueError(f"unknown model {name!r}; expected one of {', '.join(NAMES)}")
    return MODELS[name]
