"""Encoder jobs (router, planner, gate, consolidator, segmenter): training moves the loss, the export reloads
with the same labels and thresholds, thresholds fold exactly, bad data is refused by file and line; metrics
and rules."""

import json
import math

import pytest
import torch

from memdistill.core.config import ConfigError, load_config
from memdistill.core.encoder import Encoder
from memdistill.spec import MODELS, gate, planner, router
from memdistill.train.encoder import EncoderConfig, model_inputs, validate
from tests.conftest import REPO, encoder_rows, train_tiny_encoder

TASKS = ("router", "planner", "gate", "consolidator", "segmenter")


def _unfolded_probs(model_dir, rows, task):
    """Raw (pre-fold) probabilities: add logit(t) back to the exported bias."""
    from memdistill.train.encoder import _out_layer

    enc = Encoder(str(model_dir))
    meta = json.loads((model_dir / "thresholds.json").read_text())
    with torch.no_grad():
        for lab, t in meta["thresholds"].items():
            _out_layer(enc.model).bias[enc.model.config.label2id[lab]] += math.log(t / (1 - t))
    return enc.scores([model_inputs(task, r) for r in rows]), meta["thresholds"]


@pytest.mark.parametrize("task", TASKS)
@pytest.mark.parametrize("base", ["minilm", "tiny_roberta"])
def test_training_moves_loss_and_export_reloads(task, base, request, tmp_path):
    """CPU YAML on MiniLM; the roberta-base YAML on a tiny random RoBERTa (same code path)."""
    yaml_path = REPO / "configs/training" / (f"{task}_cpu.yaml" if base == "minilm" else f"{task}_roberta_base.yaml")
    gpu = load_config(EncoderConfig, yaml_path)
    validate(gpu)
    model = "embedded:minilm" if base == "minilm" else request.getfixturevalue("tiny_roberta_dir")
    summary, out = train_tiny_encoder(
        task, tmp_path, model=model, dtype=gpu.dtype, lr_scheduler_type=gpu.lr_scheduler_type
    )
    assert summary["steps"] == 4 and summary["final_loss"] < summary["first_loss"], summary
    assert (tmp_path / "run" / "loss.png").stat().st_size > 1000 and (tmp_path / "run" / "summary.json").exists()

    enc = Encoder(str(out))
    cfg = enc.model.config
    labels = list(MODELS[task].labels)
    assert [cfg.id2label[i] for i in range(cfg.num_labels)] == labels and cfg.label2id == {
        lab: i for i, lab in enumerate(labels)
    }
    saved = json.loads((out / "thresholds.json").read_text())
    assert saved["thresholds"] == summary["thresholds"] == cfg.memdistill["thresholds"] == enc.meta["thresholds"]
    if task == "segmenter":  # a two-way softmax with its dev-tuned cut on P(CHANGE) folded in
        assert set(saved["thresholds"]) == {"CHANGE"} and saved["thresholds_folded"]
    elif MODELS[task].softmax:
        assert saved["thresholds"] == {} and not saved["thresholds_folded"]
    else:
        assert set(saved["thresholds"]) == set(labels) and saved["thresholds_folded"]
        assert all(t in (0.3, 0.7) for t in saved["thresholds"].values())
    card = (out / "README.md").read_text()
    assert "schema" in card and all(lab in card for lab in labels) and "Evaluation: dev split" in card
    assert "tokenizer.json" in {p.name for p in out.iterdir()}

    rows = encoder_rows(task, 12 if task != "gate" else 16)
    scores = enc.scores([model_inputs(task, r) for r in rows])
    assert len(scores) == len(rows) and all(len(s) == len(labels) for s in scores)
    if task == "segmenter":  # argmax of the folded head == the raw P(CHANGE) cut at the tuned threshold
        raw, th = _unfolded_probs(out, rows, task)
        assert all(abs(sum(s) - 1) < 1e-5 for s in scores)
        assert [f[1] >= f[0] for f in scores] == [r[1] >= th["CHANGE"] for r in raw]
    elif MODELS[task].softmax:
        assert all(abs(sum(s) - 1) < 1e-5 for s in scores)  # softmax, as vLLM serves a 3-class head
    else:  # decisions at 0.5 on the exported head == decisions at the tuned thresholds on the raw head
        raw, th = _unfolded_probs(out, rows, task)
        for r_vec, f_vec in zip(raw, scores):
            for lab, r, f in zip(labels, r_vec, f_vec):
                assert (r >= th[lab]) == (f >= 0.5)


def test_threshold_folding_is_exact():
    from transformers import BertConfig, BertForSequenceClassification

    from memdistill.train.encoder import fold_thresholds

    torch.manual_seed(0)
    model = BertForSequenceClassification(
        BertConfig(
            vocab_size=50,
            hidden_size=16,
            num_hidden_layers=1,
            num_attention_heads=2,
            intermediate_size=32,
            num_labels=3,
            id2label=dict(enumerate(router.LABELS)),
            label2id={lab: i for i, lab in enumerate(router.LABELS)},
        )
    ).eval()
    ids = torch.randint(1, 50, (64, 7))
    with torch.no_grad():
        before = torch.sigmoid(model(input_ids=ids).logits)
        th = {"EM": 0.2, "PM": 0.5, "GM": 0.83}
        fold_thresholds(model, th)
        after = torch.sigmoid(model(input_ids=ids).logits)
    for k, lab in enumerate(router.LABELS):
        assert torch.equal(before[:, k] >= th[lab], after[:, k] >= 0.5)
    assert torch.allclose(after[:, 1], before[:, 1])


def test_bad_rows_are_refused_with_file_and_line(tmp_path):
    from memdistill.train.encoder import read_rows

    good = encoder_rows("router", 2)
    p = tmp_path / "r.jsonl"
    p.write_text(json.dumps(good[0]) + "\n" + json.dumps({**good[1], "labels": ["EM", "XX"]}) + "\n")
    with pytest.raises(ValueError, match=r"r.jsonl:2: labels \['XX'\]"):
        read_rows(str(p), "router")
    p.write_text(json.dumps({**good[0], "schema_version": "0.1"}) + "\n")
    with pytest.raises(ValueError, match=r"r.jsonl:1: schema_version '0.1'"):
        read_rows(str(p), "router")
    q = encoder_rows("planner", 1)[0]
    p.write_text(json.dumps({**q, "label": "medium"}) + "\n")
    with pytest.raises(ValueError, match=r"r.jsonl:1: label 'medium'"):
        read_rows(str(p), "planner")
    g = {k: v for k, v in encoder_rows("gate", 16)[0].items() if k != "query"}
    p.write_text(json.dumps(g) + "\n")
    with pytest.raises(ValueError, match=r"r.jsonl:1: missing field 'query'"):
        read_rows(str(p), "gate")


def test_cli_task_must_match_config():
    from memdistill.train.encoder import main

    with pytest.raises(ConfigError, match="trains task 'planner', not 'router'"):
        main(["--config", str(REPO / "configs/training/planner_cpu.yaml")], task="router")
    with pytest.raises(ConfigError, match="task 'ranker'"):
        validate(EncoderConfig(task="ranker"))
    with pytest.raises(ConfigError, match="threshold_grid"):
        validate(EncoderConfig(threshold_grid=[0.5, 1.0]))


def test_every_encoder_yaml_parses():
    from memdistill.eval.encoders import EncoderEvalConfig

    for task in (*TASKS, "querytyper"):
        for name in (f"{task}_cpu.yaml", f"{task}_roberta_base.yaml"):
            cfg = load_config(EncoderConfig, REPO / "configs/training" / name)
            validate(cfg)
            assert cfg.task == task and task in cfg.train_file and task in cfg.eval_file
    gpu = load_config(EncoderConfig, REPO / "configs/training/router_roberta_base.yaml")
    assert "roberta-base" in gpu.model and gpu.dtype == "bfloat16"
    load_config(EncoderEvalConfig, REPO / "configs/eval/encoders_cpu.yaml")


def test_gpu_encoder_recipes_train_in_mixed_precision_on_any_device(tmp_path):
    """The *_roberta_base.yaml arguments are the same here as on a GPU (bf16 autocast; CPU autocast runs it
    too, so the tiny-RoBERTa test above trains in bf16); the CPU defaults stay in float32."""
    from memdistill.train.encoder import training_args

    for task in (*TASKS, "querytyper"):
        gpu = load_config(
            EncoderConfig, REPO / f"configs/training/{task}_roberta_base.yaml", [f"output_dir={tmp_path}"]
        )
        args = training_args(gpu, use_cpu=True)
        assert args.bf16 and not args.fp16, task
        cpu = load_config(EncoderConfig, REPO / f"configs/training/{task}_cpu.yaml", [f"output_dir={tmp_path}"])
        args = training_args(cpu, use_cpu=True)
        assert not args.bf16 and not args.fp16, task


# --- metrics and rules (eval/encoder_eval.py) -----------------------------------------------------


def _inside(s: dict) -> list[str]:
    """Names of the figures in `s` (one level) that lie outside their own 95% interval."""
    return [k for k in s if f"{k}_ci95" in s and not s[f"{k}_ci95"][0] <= s[k] <= s[f"{k}_ci95"][1]]


def test_router_overall_is_memotype_mean_of_per_type_and_exact_set_has_its_own_name():
    from memdistill.metrics.encoders import router_scores
    from memdistill.metrics.stats import bootstrap_ci

    gold = [["EM"], ["EM", "PM"], [], ["GM"], ["EM"]]
    pred = [["EM"], ["EM"], [], None, ["EM", "GM"]]  # None: unreadable output
    s = router_scores(pred, gold)
    # per type by hand: EM 5/5 right (F1 1); PM 4/5 (tp 0, fn 1: F1 0); GM 3/5 (tp 0, fp 1, fn 1: F1 0)
    assert (s["EM"]["acc"], s["PM"]["acc"], s["GM"]["acc"]) == (1.0, 0.8, 0.6)
    assert (s["EM"]["f1"], s["PM"]["f1"], s["GM"]["f1"]) == (1.0, 0.0, 0.0)
    assert s["GM"]["precision"] == 0.0 and s["PM"]["recall"] == 0.0
    assert s["overall"]["acc"] == 0.8  # MemoType Table 9: (1.0 + 0.8 + 0.6) / 3, not an exact-set match
    assert s["overall"]["f1"] == round(1 / 3, 4)  # mean of the per-type F1
    assert s["overall"]["exact_set"] == 0.4  # rows 1 and 3 only
    assert s["overall"]["micro_f1"] == round(2 * 3 / (2 * 3 + 1 + 2), 4)  # tp 3 (EM), fp 1 (GM), fn 2
    assert s["valid_rate"] == 0.8
    # trivial baselines from gold alone: EM present in 3/5 (always EM: 0.6), PM and GM absent in 4/5
    base = s["majority_baseline"]
    assert base["labels"] == ["EM"] and (base["EM"]["acc"], base["PM"]["acc"], base["GM"]["acc"]) == (0.6, 0.8, 0.8)
    assert base["overall"]["acc"] == round((0.6 + 0.8 + 0.8) / 3, 4)
    assert base["exact_set_labels"] == ["EM"] and base["overall"]["exact_set"] == 0.4
    # intervals resample snippets and hold their figure
    exact = [1, 0, 1, 0, 0]
    assert s["overall"]["exact_set_ci95"] == bootstrap_ci(lambda idx: sum(exact[i] for i in idx) / len(idx), 5)
    assert s["overall"]["exact_set_ci95"][0] < 0.4 < s["overall"]["exact_set_ci95"][1]
    assert not _inside(s["overall"]) and not _inside(s) and not any(_inside(s[lab]) for lab in router.LABELS)
    perfect = router_scores(gold, gold)
    assert perfect["overall"]["acc_ci95"] == perfect["overall"]["exact_set_ci95"] == [1.0, 1.0]


def test_planner_gate_and_consolidator_scores_carry_intervals_and_trivial_baselines():
    from memdistill.metrics.encoders import class_scores, consolidator_scores, gate_examples, gate_scores

    s = class_scores(
        ["simple", "complex", None, "simple"], ["simple", "hybrid", "complex", "simple"], planner.COMPLEXITIES
    )
    assert s["accuracy"] == 0.5 and s["valid_rate"] == 0.75 and s["f1"]["simple"] == 1.0
    assert s["macro_f1"] == round(1 / 3, 4) and not _inside(s) and not _inside(s["f1"])
    assert s["majority_baseline"] == {"label": "simple", "accuracy": 0.5, "macro_f1": round(2 / 3 / 3, 4)}
    rows = [
        {
            "gate_id": g,
            "candidate_id": i,
            "complexity": "simple",
            "query": gate.pair_query("Q?", "simple"),
            "text": "a b c d" if i == 1 else "x y",
            "label": float(i == 1),
        }
        for g in ("g1", "g2")
        for i in (2, 1, 3)
    ]
    ex = gate_examples(rows, [0.4, 0.9, 0.1] * 2)  # rows out of id order on purpose
    assert ex[0]["question"] == "Q?" and ex[0]["gold"] == [1] and ex[0]["scores"] == [0.9, 0.4, 0.1]
    s = gate_scores(ex)  # select keeps id 1 only (0.9 >= 0.6)
    assert s["keep_precision"] == 1.0 and s["keep_recall"] == 1.0 and s["tokens_removed_share"] == round(4 / 8, 4)
    assert s["keep_f1_ci95"] == [1.0, 1.0] and s["examples"] == 2 and s["candidates"] == 6
    assert s["keep_all_baseline"] == {
        "keep_precision": round(1 / 3, 4),
        "keep_recall": 1.0,
        "keep_f1": 0.5,
        "tokens_removed_share": 0.0,
    }
    assert {k: v for k, v in gate_scores(ex, ci=False).items()} == {k: v for k, v in s.items() if "_ci95" not in k}
    s = gate_scores(ex, [None, [1]])  # unreadable: keeps everything; intervals resample the two examples
    assert s["valid_rate"] == 0.5 and s["valid_rate_ci95"] == [0.0, 1.0] and s["keep_precision"] == 0.5
    assert s["tokens_removed_share"] == 0.25 and not _inside(s)
    c = consolidator_scores(["MERGE", None, "KEEPBOTH", "MERGE"], ["MERGE", "SUPERSEDE", "KEEPBOTH", "KEEPBOTH"])
    assert c["accuracy"] == 0.5 and c["valid_rate"] == 0.75 and not _inside(c)
    assert c["per_action"]["MERGE"]["precision"] == 0.5 and c["per_action"]["KEEPBOTH"]["recall"] == 0.5
    assert not any(_inside(v) for v in c["per_action"].values())
    assert c["majority_baseline"]["action"] == "KEEPBOTH" and c["majority_baseline"]["accuracy"] == 0.5


def test_rule_baselines_follow_their_documented_rules():
    from memdistill.spec.gate import rule_keep as rule_gate
    from memdistill.spec.planner import rule_complexity as rule_planner
    from memdistill.spec.router import rule_labels as rule_router

    assert rule_router("Ben: We're driving up to Inverness next Saturday for my cousin's wedding.") == ["EM"]
    assert rule_router("Lena: I'm terrified of heights, though.") == ["PM"]
    assert rule_router("Hannah: Show-off!") == []
    assert "GM" in rule_router(
        "Assistant: You can usually cook lentils without soaking them; for example, red lentils take about 20 minutes."
    )
    assert rule_planner("Would Jonah enjoy a desk job?") == "complex"
    assert rule_planner("How many cities did they visit?") == "hybrid"
    assert rule_planner("Who teaches Lena's pottery class?") == "simple"
    assert rule_gate("When did Tom adopt his dog?", "simple", ["Tom adopted a dog.", "Tom likes jazz."]) == [1]
    many = [f"adopted dog number {i}" for i in range(30)]
    assert len(rule_gate("Which dogs were adopted?", "simple", many)) == gate.BUDGETS["simple"]
    questions = [r["text"] for split in ("train", "test") for r in encoder_rows("planner", 10_000, split)]
    answers = {rule_planner(q) for q in questions}
    assert len(questions) >= 50 and answers <= set(planner.COMPLEXITIES), answers  # within the spec's set
    snippets = [r["text"] for r in encoder_rows("router", 10_000, "test")]
    assert len(snippets) >= 50 and all(set(rule_router(t)) <= set(router.LABELS) for t in snippets)


def test_a_missing_encoder_dataset_names_the_command_that_builds_it(tmp_path):
    from memdistill.train.encoder import EncoderConfig, build_trainer

    cfg = EncoderConfig(task="router", train_file=str(tmp_path / "none.jsonl"), output_dir=str(tmp_path / "run"))
    with pytest.raises(
        FileNotFoundError,
        match=r"none.jsonl: no such dataset; build it first with "
        r"`memdistill data --config configs/data/seed.yaml`",
    ):
        build_trainer(cfg)
    assert not (tmp_path / "none.jsonl").exists()


def _write_split(root, n: int = 4) -> dict:
    rows = {}
    for task in TASKS:
        rows[task] = encoder_rows(task, n if task != "gate" else 32, "test")
        (root / task).mkdir(parents=True)
        (root / task / "test.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows[task]))
    return rows


def test_lm_baseline_asks_the_endpoint_named_in_the_config_and_the_report_names_it(tmp_path, monkeypatch):
    from memdistill.data.fake_teacher import FakeOpenAI
    from memdistill.eval.encoders import SECOND, EncoderEvalConfig, LMBaseline, run, second_annotator_predictions
    from memdistill.metrics.encoders import gate_examples

    rows = _write_split(tmp_path / "data")
    monkeypatch.setenv("MEMDISTILL_TEST_LM_KEY", "sk-test")
    with FakeOpenAI(api_key="sk-test", model="fake-4o-mini") as fake:
        url = fake.url
        cfg = load_config(
            EncoderEvalConfig,
            REPO / "configs/eval/encoders_cpu.yaml",
            [
                f"data_dir={tmp_path / 'data'}",
                f"output_dir={tmp_path / 'out'}",
                "models={}",
                "write_cards=false",
                f"lm_baseline={{base_url: '{fake.url}', model: fake-4o-mini, api_key_env: MEMDISTILL_TEST_LM_KEY, "
                "name: 'Fake 4o-mini, loopback'}",
            ],  # fmt: skip
        )
        assert isinstance(cfg.lm_baseline, LMBaseline) and cfg.lm_baseline.base_url == url
        out = run(cfg)
        bodies = [e["body"] for e in fake.log]
    expected = sum(len(rows[t]) for t in TASKS if t != "gate") + len(gate_examples(rows["gate"]))
    assert fake.requests == expected  # one chat per snippet, question, gate example and pair: all went there
    assert all(b["model"] == "fake-4o-mini" and "chat_template_kwargs" not in json.dumps(b) for b in bodies)
    row = "LM zero-shot (Fake 4o-mini, loopback)"
    res = json.loads((out / "metrics.json").read_text())
    assert res["lm"] == {"row": row, "base_url": url, "model": "fake-4o-mini"}
    for t in TASKS:
        second = {SECOND} if t == "segmenter" else set()  # the blind relabelling covers the test sessions
        assert set(res["results"][t]) == {"rules", row} | second and res["results"][t][row]["valid_rate"] == 1.0, t
    flags, _ = second_annotator_predictions("data/seed/segments_second.jsonl", rows["segmenter"])
    assert res["results"]["segmenter"][SECOND]["accuracy"] == sum(
        f == (r["label"] == "CHANGE") for f, r in zip(flags, rows["segmenter"])
    ) / len(flags)
    report = (out / "report.md").read_text()
    assert report.count(f"| {row} |") == len(TASKS) and f"at {url}" in report and f"| {SECOND} |" in report
    assert "| majority (always" in report and "| keep all (no gate) |" in report and "exact set" in report


def test_lm_baseline_config_forms_and_default_row_names(tmp_path, monkeypatch):
    from memdistill.eval.encoders import EncoderEvalConfig, LMBaseline, local_lm_name, run

    base = REPO / "configs/eval/encoders_cpu.yaml"
    assert load_config(EncoderEvalConfig, base).lm_baseline is True
    assert load_config(EncoderEvalConfig, base, ["lm_baseline=false"]).lm_baseline is False
    with pytest.raises(ConfigError, match=r"lm_baseline: unknown key\(s\) \['api_key'\]"):
        load_config(EncoderEvalConfig, base, ["lm_baseline={base_url: http://x/v1, model: m, api_key: sk-1}"])
    with pytest.raises(ConfigError, match=r"lm_baseline: missing required key\(s\) \['model'\]"):
        load_config(EncoderEvalConfig, base, ["lm_baseline={base_url: http://x/v1}"])
    with pytest.raises(ConfigError, match="lm_baseline should be true, false or a mapping"):
        load_config(EncoderEvalConfig, base, ["lm_baseline=gpt-4o-mini"])
    monkeypatch.delenv("MEMDISTILL_UNSET_KEY", raising=False)
    cfg = EncoderEvalConfig(
        lm_baseline=LMBaseline("http://127.0.0.1:9/v1", "m", api_key_env="MEMDISTILL_UNSET_KEY"),
        data_dir=str(tmp_path), tasks=[], write_cards=False, output_dir=str(tmp_path / "out"),
    )  # fmt: skip
    with pytest.raises(ConfigError, match="MEMDISTILL_UNSET_KEY"):
        run(cfg)
    # the local LM's row says what it is: the LoRA extractor on its base model, or the bare base model
    merged = tmp_path / "merged"
    merged.mkdir()
    (merged / "memdistill.json").write_text(json.dumps({"base_model": "embedded:smollm2-135m-instruct"}))
    cfg = EncoderEvalConfig(lm=str(merged))
    assert local_lm_name(cfg, str(merged)) == "smollm2-135m-instruct LoRA extractor, local vLLM"
    assert local_lm_name(cfg, "/cache/smollm2-135m-instruct") == "smollm2-135m-instruct base model, local vLLM"
    cfg = EncoderEvalConfig(lm="nowhere", fallback_lm="Qwen/Qwen3-4B")
    assert local_lm_name(cfg, "Qwen/Qwen3-4B") == "Qwen3-4B base model, local vLLM"
