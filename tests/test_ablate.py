"""The ablation job's wiring (a whole variant trains and evaluates for minutes: `make ablate` runs it)."""

import pytest

from memdistill.eval.ablate import AblateConfig, eval_windows, run, run_variant


def test_a_variant_is_evaluated_on_its_own_training_windows():
    over = ["windows={multi-party: [[4, 2], [6, 1]], user-assistant: [[3, 1]]}"]
    assert eval_windows("configs/data/seed.yaml", over) == {"multi-party": [4, 2], "user-assistant": [3, 1]}


def test_unknown_variant_keys_and_names_are_refused(tmp_path):
    with pytest.raises(ValueError, match="unknown: \\['trian'\\]"):
        run_variant(AblateConfig(output_dir=str(tmp_path)), {"name": "x", "trian": ["max_steps=1"]})
    cfg = AblateConfig(output_dir=str(tmp_path), variants=[{"name": "a"}], only=["b"])
    with pytest.raises(ValueError, match="no variant named \\['b'\\]"):
        run(cfg)
