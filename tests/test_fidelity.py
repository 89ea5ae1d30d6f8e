"""`memdistill eval-fidelity`: a student extractor scored against a teacher (the fake OpenAI-compatible
server on loopback, or the labels file the real labelling job wrote) on held-out gold-corpus windows."""

import asyncio
import json
from pathlib import Path

import pytest

from memdistill.core.config import load_config
from memdistill.data import label
from memdistill.data.fake_teacher import FakeOpenAI, answer
from memdistill.data.teacher import Teacher, settings_from_dict
from memdistill.eval import fidelity, generate
from memdistill.spec import extractor
from tests.conftest import REPO

WINDOWS = {"multi-party": [[5, 1]], "user-assistant": [[4, 1]]}  # the tiny student's "training windows"


@pytest.fixture(scope="module")
def tiny_student(tmp_path_factory, smollm2_dir):
    """A tiny random Llama with SmolLM2's tokenizer and chat template, carrying training windows in its
    metadata as a merged extractor does."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    out = tmp_path_factory.mktemp("tiny-student")
    tok = AutoTokenizer.from_pretrained(smollm2_dir)
    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )
    LlamaForCausalLM(cfg).save_pretrained(out)
    tok.save_pretrained(out)
    (out / "memdistill.json").write_text(json.dumps({"training_windows": WINDOWS}))
    return str(out)


def _cfg(tmp: Path, student: str, url: str | None = None, **over) -> fidelity.FidelityConfig:
    teacher = {"base_urls": [url], "model": "fake-teacher", "concurrency": 4, "timeout_s": 5, "max_retries": 0}
    args = [
        f"student={student}",
        f"teacher={json.dumps(teacher)}" if url else "teacher=null",
        f"teacher_cache_dir={tmp / 'teacher-cache'}",
        f"seed_dir={REPO / 'data/seed'}",
        "max_conversations=1",
        "max_windows=4",
        "backend=hf",
        "max_new_tokens=8",
        "similarity=token_f1",
        f"output_dir={tmp / 'out'}",
    ]
    args += [f"{k}={json.dumps(v) if not isinstance(v, str) else v}" for k, v in over.items()]
    return load_config(fidelity.FidelityConfig, REPO / "configs/eval/fidelity_cpu.yaml", args)


def _windows(cfg):
    wins, styles, _ = fidelity.held_out_windows(cfg, fidelity.student_windows(cfg))
    return wins, styles


def test_endpoint_teacher_one_request_per_window_and_rerun_asks_nothing(tiny_student, tmp_path, monkeypatch):
    with FakeOpenAI() as fake:
        cfg = _cfg(tmp_path, tiny_student, fake.url)
        wins, styles = _windows(cfg)
        assert len(wins) == 4 and all(len(w.turns) <= 5 for w in wins)
        out = fidelity.run(cfg)
        assert fake.requests == 4
        assert len({e["hash"] for e in fake.log}) == 4  # one request per window, none repeated
        m = json.loads((out / "metrics.json").read_text())
        # the fake teacher's answers, worked out from the same requests: its record count per window
        expected = [
            len(json.loads(answer(extractor.chat_messages(w, "teacher", styles[w.conversation_id])))["memories"])
            for w in wins
        ]
        assert m["teacher_records_per_window"]["mean"] == round(sum(expected) / 4, 4)
        assert m["student_vs_teacher"]["gold"] == sum(expected) and m["scored_windows"] == 4
        assert m["teacher_schema_valid_rate"]["rate"] == 1.0 and m["teacher_usable_rate"]["rate"] == 1.0
        assert m["student_vs_teacher"]["windows"] == 4 and "student_vs_gold" in m
        report = (out / "report.md").read_text()
        assert "| memory F1 |" in report and "[95% CI]" in report and (out / "fidelity.png").stat().st_size

        # the rerun: teacher replies come from the cache, student generations from the generation log
        monkeypatch.setattr(generate.HFGenerator, "__init__", lambda *a, **k: pytest.fail("generated again"))
        again = json.loads((fidelity.run(cfg) / "metrics.json").read_text())
        assert fake.requests == 4
        assert again["student_vs_teacher"] == m["student_vs_teacher"]


def _label_file(tmp: Path, cfg, fake) -> Path:
    """The labelling job's own code writes labels.jsonl for every window of the held-out conversations."""
    wins, _ = _windows(cfg)
    cids = {w.conversation_id for w in wins}
    srcs = [{"format": "seed", "path": str(REPO / "data/seed/conversations.jsonl"), "name": "seed"}]
    convs = [sc for sc in label.load_sources(srcs) if sc.conv.conversation_id in cids]
    items = label.extraction_items(convs, WINDOWS)
    for it in items:
        it.key = label.item_key(it, "fake-teacher")
    settings = settings_from_dict({"base_urls": [fake.url], "model": "fake-teacher", "max_retries": 0})

    async def go():
        async with Teacher(settings, tmp / "label-cache") as t:
            await label.run_job(items, t, tmp / "labels" / "extractor", progress=False)

    asyncio.run(go())
    return tmp / "labels" / "extractor" / "labels.jsonl"


def _student_answers(monkeypatch, edit=None):
    """A student that answers exactly as the fake teacher does (the fake recognises the student prompt too);
    `edit(index, memories)` changes the answer to the index-th prompt."""

    def call(self, convs, max_new_tokens=512, batch_size=8, progress=None, sink=None):
        gens = []
        for i, msgs in enumerate(convs):
            mems = json.loads(answer(msgs))["memories"]
            gens.append(generate.Generation(json.dumps({"memories": edit(i, mems) if edit else mems}), 100, 50))
            if sink:
                sink(i, gens[-1])
        return gens

    monkeypatch.setattr(generate.HFGenerator, "__init__", lambda self, *a, **k: None)
    monkeypatch.setattr(generate.HFGenerator, "__call__", call)


def _key(window_json: dict) -> str:
    return json.dumps(window_json, sort_keys=True)


def _drop_first_record(rows: list[dict], wins) -> list[dict]:
    """The labels with the first record of the first scored window that has one removed."""
    by_window = {_key(r["input"]["window"]): r for r in rows}
    for w in wins:
        r = by_window[_key(w.to_json())]
        if r["label"]["records"]:
            r["label"] = dict(r["label"], records=r["label"]["records"][1:])
            return rows
    raise AssertionError("no labelled record to remove")


def test_labels_file_reference_gives_exact_precision_recall(tiny_student, tmp_path, monkeypatch):
    with FakeOpenAI() as fake:
        cfg0 = _cfg(tmp_path, tiny_student)
        labels = _label_file(tmp_path, cfg0, fake)
    wins, _ = _windows(cfg0)
    rows = [json.loads(x) for x in labels.read_text().splitlines()]
    by_window = {_key(r["input"]["window"]): r for r in rows}
    n_ref = sum(len(by_window[_key(w.to_json())]["label"]["records"]) for w in wins)
    assert n_ref >= 2

    # the student writes exactly the teacher's labels: every rate is 1
    _student_answers(monkeypatch)
    m = json.loads(
        (fidelity.run(_cfg(tmp_path / "a", tiny_student, teacher_labels=str(labels))) / "metrics.json").read_text()
    )
    v = m["student_vs_teacher"]
    assert (v["memory_precision"], v["memory_recall"], v["memory_f1"]) == (1.0, 1.0, 1.0)
    assert (v["type_accuracy"], v["time_exact"], v["matched"]) == (1.0, 1.0, n_ref)
    assert m["teacher_schema_valid_rate"] is None and m["reference"] == "labels_file"

    # the reference loses one record: one student record has no partner, precision (n-1)/n, recall 1
    edited = _drop_first_record([dict(r) for r in rows], wins)
    less = tmp_path / "less" / "labels.jsonl"
    less.parent.mkdir()
    less.write_text("".join(json.dumps(r) + "\n" for r in edited))
    m = json.loads(
        (fidelity.run(_cfg(tmp_path / "b", tiny_student, teacher_labels=str(less))) / "metrics.json").read_text()
    )
    v = m["student_vs_teacher"]
    assert v["memory_recall"] == 1.0 and v["memory_precision"] == round((n_ref - 1) / n_ref, 4)

    # the student leaves one of the teacher's records out: recall (n-1)/n, precision 1
    dropped = []

    def drop_one(i, mems):
        if mems and not dropped:
            dropped.append(i)
            return mems[1:]
        return mems

    _student_answers(monkeypatch, drop_one)
    m = json.loads(
        (fidelity.run(_cfg(tmp_path / "c", tiny_student, teacher_labels=str(labels))) / "metrics.json").read_text()
    )
    v = m["student_vs_teacher"]
    assert len(dropped) == 1
    assert v["memory_precision"] == 1.0 and v["memory_recall"] == round((n_ref - 1) / n_ref, 4)
    assert v["memory_recall_ci95"][0] <= v["memory_recall"] <= v["memory_recall_ci95"][1]


def test_labels_for_other_windows_are_refused(tiny_student, tmp_path):
    with FakeOpenAI() as fake:
        labels = _label_file(tmp_path, _cfg(tmp_path, tiny_student), fake)
    cfg = _cfg(
        tmp_path,
        tiny_student,
        teacher_labels=str(labels.parent.parent),
        windows={"multi-party": [6, 1], "user-assistant": [3, 1]},
    )
    with pytest.raises(fidelity.FidelityError, match="no teacher label for 4 of 4 windows"):
        fidelity.run(cfg)


def test_teacher_that_never_answers_fails_naming_the_endpoint(tiny_student, tmp_path, capsys):
    from memdistill.cli import main
    from memdistill.serve.server import free_port

    url = f"http://127.0.0.1:{free_port()}/v1"  # nothing listens there
    teacher = {"base_urls": [url], "model": "fake-teacher", "max_retries": 0, "timeout_s": 2}
    rc = main(
        [
            "eval-fidelity",
            "--config",
            str(REPO / "configs/eval/fidelity_cpu.yaml"),
            f"student={tiny_student}",
            f"teacher={json.dumps(teacher)}",
            f"teacher_cache_dir={tmp_path / 'cache'}",
            f"seed_dir={REPO / 'data/seed'}",
            "max_windows=3",
            f"output_dir={tmp_path / 'out'}",
        ]
    )
    err = capsys.readouterr().err
    assert rc == 1
    assert url in err and "no answer for 3 of 3 windows" in err and "connection" in err
    assert not (tmp_path / "out").exists()
