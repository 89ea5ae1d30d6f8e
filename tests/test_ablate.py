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


def test_table_cells_and_chart_error_bars_carry_each_figures_interval():
    from matplotlib.container import ErrorbarContainer

    from memdistill.core.report import bars_of, draw_grouped_bars, pyplot
    from memdistill.eval.ablate import _get

    r = {"eval": {"memory_f1": 0.35, "memory_f1_ci95": [0.3, 0.4], "capped_outputs": 2, "windows": 221}}
    assert _get(r, ("eval", "memory_f1")) == "0.350 [0.300, 0.400]" and _get(r, ("eval", "capped_outputs")) == 2
    values, intervals = bars_of({"a": r["eval"]}, ["memory_f1", "capped_outputs"])
    assert values == {"a": [0.35, 2]} and intervals == {"a": [[0.3, 0.4], None]}
    fig, ax = pyplot().subplots()
    draw_grouped_bars(ax, values, ["F1", "capped"], "t", ylim=None, intervals=intervals)
    (bars,) = [c for c in ax.containers if isinstance(c, ErrorbarContainer)]  # one bar, the one with an interval
    ((lo, hi),) = [(seg[0][1], seg[1][1]) for seg in bars.lines[2][0].get_segments()]
    assert (round(lo, 6), round(hi, 6)) == (0.3, 0.4)
    pyplot().close(fig)
