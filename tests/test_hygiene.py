"""Benchmark hygiene (memdistill.data.hygiene): a teacher build that would train on a set an eval config
evaluates on stops before its first teacher request, naming the source file, the eval set and the
overlap, whatever the file is called; an explicit override goes into every card."""

import json
import shutil
from pathlib import Path

import pytest
import yaml

from memdistill.core.config import ConfigError, load_config
from memdistill.data import hygiene, label
from memdistill.data.build import DataConfig, build
from memdistill.data.fake_teacher import FakeOpenAI
from tests.conftest import FIXTURES, REPO

KEY = "sk-hygiene-test"

# configs/data/teacher_vllm_qwen3.yaml as it stood when issue 15 was filed (comments dropped): it labelled
# the LoCoMo and LongMemEval files that configs/eval/e2e_locomo.yaml and e2e_longmemeval.yaml evaluate on.
AT_SCALE_RECIPE_ISSUE_15 = """
output_dir: data/built-teacher
seed_dir: data/seed
teacher:
  base_urls: [http://127.0.0.1:8001/v1]
  model: qwen3-teacher
  api_key_env: TEACHER_API_KEY
  structured: json_schema
  qwen3_no_think: true
  concurrency: 64
  timeout_s: 300
  max_retries: 8
  max_tokens: 4096
  price_input_per_1m: 0.0
  price_output_per_1m: 0.0
sources:
  - {format: locomo, path: data/raw/locomo10.json, name: locomo}
  - {format: longmemeval, path: data/raw/longmemeval_s.json, name: longmemeval}
  - {format: seed, path: data/seed/conversations.jsonl, name: seed}
jobs: [extractor, query_parser, router, planner, gate, consolidator]
windows:
  multi-party: [[25, 5]]
  user-assistant: [[15, 3]]
train_extra_windows: []
type_mode: binary
gate_candidates: 20
gate_min_candidates: 5
pair_cascade: {jaccard_min: 0.0, cosine_min: 0.5, keywords_then_cosine: false}
max_items: {router: 20000}
include_seed: true
dev_fraction: 0.05
near_dup_threshold: 0.9
test_overlap_threshold: 0.8
cache_dir: .cache/teacher
tasks: [extractor, router, planner, gate, consolidator]
"""


def _write_cfg(tmp: Path, d: dict) -> Path:
    p = tmp / "data.yaml"
    p.write_text(yaml.safe_dump(d))
    return p


def _locomo_as_chat(dst: Path) -> list[str]:
    """The LoCoMo fixture converted to chat-jsonl, one line per session: a copy no file name gives away."""
    sample = json.loads((FIXTURES / "locomo_sample.json").read_text())[0]["conversation"]
    rows, texts = [], []
    for k in sorted(int(key.split("_")[1]) for key in sample if key.count("_") == 1 and key.startswith("session_")):
        turns = sample[f"session_{k}"]
        speakers = sorted({t["speaker"] for t in turns})
        rows.append(
            {
                "id": f"mine-{k}",
                "messages": [
                    {"role": "user" if t["speaker"] == speakers[0] else "assistant", "content": t["text"]}
                    for t in turns
                ],
            }
        )
        texts += [t["text"] for t in turns]
    dst.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return texts


def test_the_issue_15_at_scale_recipe_is_refused_before_any_request(tmp_path, capsys, monkeypatch):
    from memdistill.cli import main

    monkeypatch.chdir(REPO)  # the eval configs as shipped

    raw = tmp_path / "raw"
    raw.mkdir()
    shutil.copy(FIXTURES / "locomo_sample.json", raw / "locomo10.json")
    shutil.copy(FIXTURES / "longmemeval_sample.json", raw / "longmemeval_s.json")
    d = yaml.safe_load(AT_SCALE_RECIPE_ISSUE_15)
    with FakeOpenAI(api_key=KEY) as fake:
        d["teacher"]["base_urls"] = [fake.url]
        d.update(output_dir=str(tmp_path / "out"), cache_dir=str(tmp_path / "cache"), progress=False)
        d["sources"][0]["path"] = str(raw / "locomo10.json")
        d["sources"][1]["path"] = str(raw / "longmemeval_s.json")
        d["sources"][2]["path"] = str(REPO / "data/seed/conversations.jsonl")
        with pytest.raises(hygiene.EvalOverlap) as e:
            build(load_config(DataConfig, _write_cfg(tmp_path, d)))
        msg = str(e.value)
        assert (
            f"source locomo ({raw / 'locomo10.json'}) is in the locomo format, a benchmark that "
            "configs/eval/e2e_locomo.yaml evaluates on: 1 conversation(s) [conv-26]"
        ) in msg
        assert (
            f"source longmemeval ({raw / 'longmemeval_s.json'}) is in the longmemeval format, a benchmark that "
            "configs/eval/e2e_longmemeval.yaml evaluates on: 1 conversation(s) [e47becba], 1 question(s)"
        ) in msg
        assert "seed (" not in msg  # the gold corpus with its own splits is no leak
        assert "allow_eval_overlap" in msg
        # the command exits 1 with the same message, and nothing was asked or written
        assert main(["data", "--config", str(_write_cfg(tmp_path, d))]) == 1
        err = capsys.readouterr().err
        assert "memdistill data: the build overlaps data that an eval config evaluates on" in err
        assert str(raw / "locomo10.json") in err and str(raw / "longmemeval_s.json") in err
        assert fake.requests == 0 and not (tmp_path / "out").exists()


def test_a_renamed_converted_copy_of_an_evaluated_file_is_caught_by_content(tmp_path, monkeypatch):
    """An eval config whose data_path exists is fingerprinted: its conversations come back as chat-jsonl
    under another name, and a gold test conversation comes back as seed format marked train."""
    monkeypatch.chdir(REPO)  # paths under it are printed relative to it
    bench = tmp_path / "bench" / "locomo10.json"
    bench.parent.mkdir()
    shutil.copy(FIXTURES / "locomo_sample.json", bench)
    evals = tmp_path / "evals"
    evals.mkdir()
    (evals / "e2e_mine.yaml").write_text(yaml.safe_dump({"dataset": "locomo", "data_path": str(bench)}))
    (evals / "extractor_mine.yaml").write_text(yaml.safe_dump({"seed_dir": str(REPO / "data/seed"), "split": "test"}))
    chats = tmp_path / "my_chats.jsonl"
    copied = _locomo_as_chat(chats)
    gold = [json.loads(x) for x in (REPO / "data/seed/conversations.jsonl").read_text().splitlines()]
    test_conv = next(c for c in gold if c["split"] == "test")
    relabelled = tmp_path / "more_dialogues.jsonl"
    relabelled.write_text(json.dumps(dict(test_conv, conversation_id="fresh-1", split="train")) + "\n")
    d = {
        "teacher": {"base_urls": ["http://127.0.0.1:9/v1"], "model": "m"},
        "eval_configs": str(evals),
        "seed_dir": str(REPO / "data/seed"),
        "output_dir": str(tmp_path / "out"),
        "sources": [
            {"format": "chat-jsonl", "path": str(chats), "name": "chats"},
            {"format": "seed", "path": str(relabelled), "name": "more"},
            {"format": "seed", "path": str(REPO / "data/seed/conversations.jsonl"), "name": "seed"},
        ],
    }
    cfg = load_config(DataConfig, _write_cfg(tmp_path, d))
    convs = label.load_sources(cfg.sources)
    with pytest.raises(hygiene.EvalOverlap) as e:
        hygiene.check(cfg, convs)
    msg = str(e.value)
    n_sessions = chats.read_text().count("\n")
    long_turns = sum(1 for t in copied if hygiene.fingerprint(t, hygiene.MIN_TURN_WORDS))
    assert n_sessions >= 2 and long_turns >= 1
    assert (f"source chats ({chats}): {n_sessions} conversation(s) [mine-1, mine-2") in msg
    by = evals / "e2e_mine.yaml"
    assert f"share {long_turns} turn(s) and 0 question(s) with the locomo file {bench} (evaluated by {by})" in msg
    assert "its conversation(s) [conv-26]" in msg
    n_test_turns = sum(
        1 for s in test_conv["sessions"] for t in s["turns"] if hygiene.fingerprint(t["text"], hygiene.MIN_TURN_WORDS)
    )
    assert (f"source more ({relabelled}): 1 conversation(s) [fresh-1] share {n_test_turns} turn(s)") in msg
    assert "with the gold test split of data/seed" in msg and f"[{test_conv['conversation_id']}]" in msg
    assert "source seed (data/seed/conversations.jsonl)" not in msg


def test_clean_sources_pass_and_every_registered_set_is_named(tmp_path, monkeypatch):
    monkeypatch.chdir(REPO)  # the eval configs as shipped
    d = {
        "teacher": {"base_urls": ["http://127.0.0.1:9/v1"], "model": "m"},
        "sources": [
            {"format": "chat-jsonl", "path": str(FIXTURES / "chat_sample.jsonl"), "name": "chat"},
            {"format": "seed", "path": "data/seed/conversations.jsonl", "name": "seed"},
        ],
    }
    cfg = load_config(DataConfig, _write_cfg(tmp_path, d))
    report = hygiene.check(cfg, label.load_sources(cfg.sources))
    assert report["overlaps"] == [] and report["allowed"] is None
    sets = report["eval_sets"]
    assert "the locomo benchmark format" in sets and "the longmemeval benchmark format" in sets
    assert any(s.startswith("gold dev split of data/seed") for s in sets)
    test_set = next(s for s in sets if s.startswith("gold test split of data/seed"))
    assert "configs/eval/extractor_cpu.yaml" in test_set and "configs/eval/e2e_cpu.yaml" in test_set


def test_the_override_is_written_into_the_dataset_card_and_the_model_cards(tmp_path, monkeypatch):
    from memdistill.core.report import card_overlap, dataset_overlap

    monkeypatch.chdir(REPO)
    monkeypatch.setenv("FAKE_TEACHER_KEY", KEY)
    chats = tmp_path / "my_chats.jsonl"
    _locomo_as_chat(chats)
    reason = "ablation: how much does training on LoCoMo inflate LoCoMo recall"
    d = yaml.safe_load((REPO / "configs/data/teacher_fake.yaml").read_text())
    with FakeOpenAI(api_key=KEY) as fake:
        d["teacher"]["base_urls"] = [fake.url]
        d.update(
            output_dir=str(tmp_path / "out"),
            cache_dir=str(tmp_path / "cache"),
            seed_dir=str(REPO / "data/seed"),
            progress=False,
            jobs=["extractor"],
            tasks=["extractor"],
            allow_eval_overlap=reason,
            sources=[{"format": "locomo", "path": str(FIXTURES / "locomo_sample.json"), "name": "locomo"}],
        )
        stats = build(load_config(DataConfig, _write_cfg(tmp_path, d)))
        assert fake.requests > 0
    out = tmp_path / "out"
    assert stats["eval_overlap"]["allowed"] == reason and len(stats["eval_overlap"]["overlaps"]) == 1
    line = stats["eval_overlap"]["summary"][0]
    assert line.startswith("source locomo (tests/fixtures/locomo_sample.json) is in the locomo format")
    card = (out / "DATASET_CARD.md").read_text()
    assert "## Benchmark hygiene" in card and f'allowed by the data config: "{reason}"' in card and line in card
    assert json.loads((out / "stats.json").read_text())["eval_overlap"]["allowed"] == reason
    # what train/extractor.py and train/encoder.py put into memdistill.json, and the model cards print
    meta = {"eval_overlap": dataset_overlap(out / "extractor" / "train.jsonl")}
    assert meta["eval_overlap"] == {"allowed": reason, "overlaps": [line], "dataset": str(out)}
    lines = card_overlap(meta)
    assert "## Benchmark overlap" in lines and f"- {line}" in lines and any(reason in x for x in lines)
    assert card_overlap({"eval_overlap": None}) == []


def test_an_override_without_a_reason_is_a_config_error(tmp_path):
    d = {
        "teacher": {"base_urls": ["http://127.0.0.1:9/v1"], "model": "m"},
        "allow_eval_overlap": "  ",
        "sources": [{"format": "chat-jsonl", "path": str(FIXTURES / "chat_sample.jsonl")}],
    }
    cfg = load_config(DataConfig, _write_cfg(tmp_path, d))
    with pytest.raises(ConfigError, match="allow_eval_overlap: give the reason"):
        hygiene.check(cfg, label.load_sources(cfg.sources))
