"""The spec's table of compact models is the one list every stage loops over: each model walks through build,
train (tiny), export, serve command and score from its record alone."""

import json

import pytest

from memdistill.core.config import load_config
from memdistill.data import build
from memdistill.data import seed as seedlib
from memdistill.spec import ENCODERS, MODELS, NAMES, TRAINING_SETS
from memdistill.spec.compact import HEADS, UNITS
from tests.conftest import REPO, encoder_rows, train_tiny_encoder


def _units(figures: dict) -> int:
    """How many items a grader scored (its own count field)."""
    return next(figures[k] for k in ("n", "examples", "decisions") if k in figures)


def test_sdk_takes_encoder_urls_by_name_or_mapping_and_refuses_names_outside_the_table():
    from memdistill.serve.client import MemoryModels

    by_name = MemoryModels(None, router_url="http://127.0.0.1:1/", gate_url=None)
    by_map = MemoryModels(None, encoder_urls={"router": "http://127.0.0.1:1"})
    assert by_name.encoder_urls == by_map.encoder_urls == {"router": "http://127.0.0.1:1"}
    with pytest.raises(TypeError, match="routr_url"):
        MemoryModels(None, routr_url="http://127.0.0.1:1")
    with pytest.raises(TypeError, match="extractor"):
        MemoryModels(None, encoder_urls={"extractor": "http://127.0.0.1:1"})


@pytest.mark.parametrize("name", ENCODERS)
def test_every_encoder_builds_trains_exports_serves_and_scores_from_its_record(name, tmp_path):
    from memdistill.core.encoder import Encoder
    from memdistill.core.models import read_meta
    from memdistill.eval.encoders import items
    from memdistill.metrics.encoders import decisions, score
    from memdistill.serve.client import MemoryModels
    from memdistill.serve.server import ServeConfig, encoder_command
    from memdistill.train.encoder import vote_labels

    m = MODELS[name]
    built = build.gold_rows(seedlib.load(), name, "dev")  # build: the spec's row builder over the gold corpus
    assert built and all(len(m.inputs(r)) == (2 if m.head == "pair_score" else 1) for r in built)
    extra = {}
    if m.labelled_by:  # its label is another model's vote: that model is trained first
        extra["label_router"] = str(train_tiny_encoder(m.labelled_by, tmp_path / m.labelled_by)[1])
    _, model_dir = train_tiny_encoder(name, tmp_path / name, **extra)  # train + export
    meta = read_meta(model_dir)
    assert meta["task"] == name and meta["labels"] == list(m.labels) and meta["decision"]
    cfg = load_config(ServeConfig, REPO / "configs/serving/cpu.yaml", [f"{name}={model_dir}"])
    cmd = encoder_command(cfg, name, getattr(cfg, name), 18100)  # serve: a field and a pooling server per encoder
    assert cmd[cmd.index("--model") + 1] == str(model_dir) and "pooling" in cmd and f"memdistill-{name}" in cmd
    sdk = MemoryModels(None, **{f"{name}_url": "http://127.0.0.1:18100/"})
    assert sdk.encoder_urls == {name: "http://127.0.0.1:18100"}
    rows = encoder_rows(name, 24, "test")
    if m.labelled_by:
        vote_labels(rows, extra["label_router"])
    probs = Encoder(str(model_dir)).scores([m.inputs(r) for r in rows])
    pred = decisions(name, probs, rows)  # score: decisions as the SDK makes them, graded by the record's metric
    figures = score(name, pred, rows)
    assert _units(figures) == len(pred) and figures["valid_rate"] == 1.0
    rule = [m.rule(x) for x in items(name, rows)]
    assert _units(score(name, rule, rows)) == len(rule)


@pytest.mark.parametrize("name", [n for n in NAMES if MODELS[n].head == "lm"])
def test_every_lm_task_row_parses_back_to_its_gold_label(name):
    """The LM's training rows (extractor windows, query-parser questions) are completions its own parser reads
    back without a problem, and they land in the set the record names."""
    m = MODELS[name]
    rows = [r for r in build.gold_rows(seedlib.load(), m.built, "dev") if r["task"] == name]
    assert rows and m.built in TRAINING_SETS
    for r in rows[:50]:
        text = r["completion"][0]["content"]
        res = m.parse(text)
        assert res.ok and not [p for p in res.problems if p.code != "speaker_fixed"], (r["row_id"], res.problems)
        assert json.loads(text)


def test_the_table_is_the_only_list_of_models():
    """Every record is complete for its head, names are unique, and the training configs, make targets and
    serving config name each trained set the table has."""
    from memdistill.serve.server import ServeConfig

    assert len(set(NAMES)) == len(NAMES) == len(MODELS)
    assert {m.head for m in MODELS.values()} <= set(HEADS) and {m.unit for m in MODELS.values()} <= set(UNITS)
    make = (REPO / "Makefile").read_text()
    for name, m in MODELS.items():
        assert m.requests and m.read and m.parse and m.gold_label and m.rows, name
        if m.encoder:
            assert m.labels and m.inputs and m.decide and m.metric and m.dev_metric and m.rule, name
            assert (REPO / f"configs/training/{name}_cpu.yaml").exists(), name
            assert name in ServeConfig.__dataclass_fields__, name
    for s in TRAINING_SETS:
        assert f"train-{s}" in make, s
