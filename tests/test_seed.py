"""The gold seed corpus: it validates, the validator catches what it should, gold records follow windows,
and nothing that trains sees the test split."""

import json
import shutil
import subprocess
import sys

import pytest

from memdistill.data import seed as seedlib
from memdistill.spec.dialogue import windows
from tests.conftest import REPO

SEED = REPO / "data" / "seed"


@pytest.fixture(scope="module")
def seed():
    return seedlib.load(SEED)


def test_corpus_validates_with_the_required_counts():
    r = subprocess.run(
        [sys.executable, "-m", "memdistill", "check-seed", str(SEED)],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=300,
    )
    assert r.returncode == 0, r.stdout[-3000:]
    assert "0 error(s)" in r.stdout and "## Counts per split" in r.stdout


def _copy(tmp_path):
    d = tmp_path / "seed"
    shutil.copytree(SEED, d)
    return d


def _edit(path, fn, line=0):
    rows = [json.loads(x) for x in path.read_text().splitlines()]
    fn(rows[line])
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


@pytest.mark.parametrize(
    "file, fn, msg",
    [
        ("memories.jsonl", lambda r: r.update(source_turn_id="D9:99"), "has no turn 'D9:99'"),
        ("memories.jsonl", lambda r: r["dimension"].update(memory_type="event"), "dimension invalid"),
        (
            "memories.jsonl",
            lambda r: (
                r["dimension"].update(
                    time="2031-01-01",
                )
                or r.update(is_plan=False)
            ),
            "is after its source message",
        ),
        ("memories.jsonl", lambda r: r["dimension"].update(time="2023-02-30"), "not a calendar date"),
        ("types.jsonl", lambda r: r.update(labels=["EM", "XM"]), "labels"),
        ("types.jsonl", lambda r: r.update(text=r["text"] + " extra"), "text differs from turns"),
        ("questions.jsonl", lambda r: r.update(evidence=["D7:77"]), "evidence turn 'D7:77'"),
        ("questions.jsonl", lambda r: r["plan"].update(complexity="medium"), "plan invalid"),
        ("questions.jsonl", lambda r: r["query"].update(answer_dim="who"), "query invalid"),
        ("gate.jsonl", lambda r: r.update(kept_ids=[99]), "kept_ids not among candidate ids"),
        ("conversations.jsonl", lambda r: r.update(split="holdout"), "split 'holdout'"),
        ("consolidation.jsonl", lambda r: r.update(action="DELETE"), "action 'DELETE'"),
        ("consolidation.jsonl", lambda r: r.update(new=r["existing"]), "is not after the existing record's turn"),
        ("consolidation.jsonl", lambda r: r.update(action="MERGE", merged=None), "merged invalid"),
        ("consolidation.jsonl", lambda r: r.update(action="KEEPBOTH", merged={"content": "x"}), "merged must be null"),
        ("consolidation.jsonl", lambda r: r.update(existing="mp01-m999"), "no gold memory 'mp01-m999'"),
        ("consolidation.jsonl", lambda r: r.update(new={"source_turn_id": "D1:1"}), "an inline new record has"),
        (
            "questions.jsonl",
            lambda r: r.update(update={"current": r["evidence_memory_ids"][0], "replaced": "mp01-m001"}),
            "update:",
        ),
    ],
)
def test_validator_catches_errors(tmp_path, file, fn, msg):
    d = _copy(tmp_path)
    _edit(d / file, fn)
    rep = seedlib.check(d)
    assert not rep.ok and any(msg in e for e in rep.errors), rep.errors[:5]


def test_knowledge_update_questions_name_a_labelled_supersede_pair(seed):
    ku = [q for q in seed.questions if q.get("update")]
    assert len(ku) >= 40 and {seed.split[q["conversation_id"]] for q in ku} == {"train", "dev", "test"}
    supersede = {
        (p["new"], p["existing"]) for p in seed.pairs if p["action"] == "SUPERSEDE" and isinstance(p["new"], str)
    }
    for q in ku:
        assert (q["update"]["current"], q["update"]["replaced"]) in supersede, q["question_id"]
        assert q["update"]["current"] in q["evidence_memory_ids"]


def test_check_pairs_cli_validates_a_part_file(tmp_path, seed):
    part = tmp_path / "pairs_mp01.jsonl"
    rows = [p for p in seed.pairs if p["conversation_id"] == "mp01"]
    part.write_text("".join(json.dumps(r) + "\n" for r in rows))
    ok = subprocess.run([sys.executable, "-m", "memdistill.data.seed", "check-pairs", str(part)],
                        capture_output=True, text=True, cwd=REPO, timeout=120)  # fmt: skip
    assert ok.returncode == 0 and "pairs valid" in ok.stdout
    rows[0]["action"] = "MERGE" if rows[0]["action"] != "MERGE" else "KEEPBOTH"
    part.write_text("".join(json.dumps(r) + "\n" for r in rows))
    bad = subprocess.run([sys.executable, "-m", "memdistill.data.seed", "check-pairs", str(part)],
                         capture_output=True, text=True, cwd=REPO, timeout=120)  # fmt: skip
    assert bad.returncode == 1 and f"{part}:1 ({rows[0]['pair_id']})" in bad.stdout


def test_validator_catches_leak_between_splits(tmp_path, seed):
    d = _copy(tmp_path)
    rows = [json.loads(x) for x in (d / "types.jsonl").read_text().splitlines()]
    test_row = next(r for r in rows if r.get("conversation_id") and seed.split[r["conversation_id"]] == "test")
    rows.append(
        {
            "snippet_id": "sa-leak",
            "conversation_id": None,
            "turn_ids": [],
            "text": test_row["text"],
            "labels": test_row["labels"],
            "split": "train",
        }
    )
    (d / "types.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert any("splits: types text in ['test', 'train']" in e for e in seedlib.check(d).errors)


def test_gold_records_follow_the_window(seed):
    conv = next(c for c in seed.conversations.values() if c.style == "multi-party")
    total = 0
    for size, overlap in ((25, 5), (10, 2), (6, 1)):
        got = [r for w in windows(conv, size, overlap) for r in seed.gold_records(w)]
        assert len(got) == len(seed.memories_of(conv.conversation_id))  # every record in exactly one window
        total += len(got)
    w = windows(conv, 10, 2)[1]
    recs = seed.gold_records(w)
    assert recs and all(w.extract_from <= r.source_id <= len(w.turns) for r in recs)
    for r in recs:
        assert w.turn_for(r.source_id).speaker == r.source_speaker


def test_windows_cli_on_the_seed_corpus():
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "memdistill",
            "windows",
            "--format",
            "seed",
            str(SEED / "conversations.jsonl"),
            "--window",
            "25",
            "--overlap",
            "5",
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    ws = [json.loads(x) for x in r.stdout.splitlines()]
    assert len({w["conversation_id"] for w in ws}) == len(seedlib.load(SEED).conversations) and all(
        w["text"] for w in ws
    )


def test_gate_file_is_what_the_builder_makes(seed):
    assert seedlib.build_gate(seed) == seed.gate


def test_built_training_sets_never_touch_the_test_split(tmp_path, seed):
    from memdistill.core.config import load_config
    from memdistill.data.build import DataConfig, build

    cfg = load_config(DataConfig, REPO / "configs/data/seed.yaml", [f"output_dir={tmp_path / 'built'}"])
    stats = build(cfg)
    test_convs = {c for c, s in seed.split.items() if s == "test"}
    test_text = {" ".join(t.text.split()) for c in test_convs for t in seed.conversations[c].turns}
    for task in cfg.tasks:
        for split in ("train", "dev"):
            for line in (tmp_path / "built" / task / f"{split}.jsonl").read_text().splitlines():
                row = json.loads(line)
                assert row.get("conversation_id") not in test_convs
                if task == "extractor":
                    user = row["prompt"][1]["content"]
                    assert not any(t in user for t in test_text if len(t) > 40)
        assert stats["tasks"][task]["train"]["rows"] > 0
    import datasets

    ds = datasets.load_dataset("json", data_files=str(tmp_path / "built" / "router" / "train.jsonl"), split="train")
    assert set(ds.column_names) >= {"text", "labels", "label_vector"}


def test_extraction_rows_are_rendered_with_the_configured_student_prompt(tmp_path, seed):
    from memdistill.core.config import ConfigError
    from memdistill.data.build import DataConfig, build
    from memdistill.spec import extractor

    out = tmp_path / "built"
    build(DataConfig(output_dir=str(out), tasks=["extractor"], student_prompt="student-short"))
    rows = [json.loads(x) for x in (out / "extractor" / "train.jsonl").read_text().splitlines()]
    ext = [r for r in rows if r["task"] == "extractor"]
    assert len(ext) > 50
    assert {r["student_prompt"] for r in ext} == {"student-short"}
    assert {r["prompt"][0]["content"] for r in ext} == {extractor.STUDENT_PROMPTS["student-short"]}
    with pytest.raises(ConfigError, match="student_prompt: 'short' is not a student prompt"):
        build(DataConfig(output_dir=str(tmp_path / "bad"), tasks=["extractor"], student_prompt="short"))
    assert not (tmp_path / "bad").exists()
    with pytest.raises(ValueError, match="unknown extraction prompt 'short'"):
        extractor.chat_messages(windows(next(iter(seed.conversations.values())), 6, 1)[0], "short")


def _rows(path):
    return [json.loads(x) for x in path.read_text().splitlines()]


def _write(path, rows):
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))


def test_unanswerable_questions_have_no_evidence_records_and_answerable_ones_have_both(tmp_path, seed):
    d = _copy(tmp_path)
    qs = _rows(d / "questions.jsonl")
    mp = next(i for i, q in enumerate(qs) if seed.conversations[q["conversation_id"]].style == "multi-party")
    qs[mp]["category"] = "adversarial"  # still carries its evidence records
    ua = next(i for i, q in enumerate(qs) if seed.conversations[q["conversation_id"]].style == "user-assistant")
    qs[ua]["evidence_memory_ids"] = []  # answerable, no evidence records
    _write(d / "questions.jsonl", qs)
    errors = seedlib.check(d, minimums=False).errors
    assert any(f"({qs[mp]['question_id']}): a adversarial question has no evidence records" in e for e in errors)
    assert any(f"({qs[ua]['question_id']}): an answerable question needs evidence" in e for e in errors)


def test_long_conversations_are_reported_apart_and_need_their_questions(tmp_path, seed):
    long = [c for c in seed.conversations.values() if seedlib.length(c) == "long"]
    assert long and all(len(c.sessions) >= seedlib.LONG_SESSIONS for c in long)
    cid = long[0].conversation_id
    d = _copy(tmp_path)
    _write(d / "questions.jsonl", [q for q in _rows(d / "questions.jsonl") if q["conversation_id"] != cid][:-1])
    errors = seedlib.check(d, minimums=False).errors
    assert any(f"long conversation {cid} has 0 questions, {seedlib.LONG_QUESTIONS}+ needed" in e for e in errors)


def test_merge_parts_puts_a_part_back_exactly_and_refuses_it_twice(tmp_path):
    """The corpus's last conversation, taken out into a part and merged back, gives the same files (gate.jsonl
    rebuilt included); merging a conversation the corpus has is refused before anything is written."""
    d = _copy(tmp_path)
    before = {f: (d / f).read_text() for f in ("conversations.jsonl", *seedlib.FILES.values()) if (d / f).exists()}
    cid = _rows(d / "conversations.jsonl")[-1]["conversation_id"]
    part = d / "parts" / cid
    part.mkdir(parents=True, exist_ok=True)
    for f in ("conversations.jsonl", *seedlib.FILES.values()):
        if f in ("gate.jsonl", "segments_second.jsonl") or not (d / f).exists():
            continue
        rows = _rows(d / f)
        _write(d / f, [r for r in rows if r.get("conversation_id") != cid])
        _write(part / f, [r for r in rows if r.get("conversation_id") == cid])
    assert seedlib.check(part, minimums=False).ok
    rep = seedlib.merge_parts([part], d)
    assert rep.ok, rep.errors[:3]
    assert not part.exists() and {f: (d / f).read_text() for f in before} == before
    again = d / "parts" / "again"
    shutil.copytree(d, again, ignore=shutil.ignore_patterns("parts", "plans", "second_reading", "*.md"))
    with pytest.raises(seedlib.SourceError, match="exist"):
        seedlib.merge_parts([again], d)
    assert {f: (d / f).read_text() for f in before} == before


def test_second_reading_agreement_is_what_the_files_say():
    """agreement.json (the figures DATA_CARD.md quotes) is recomputed from the two readings, and the matcher
    pairs records of one turn by shared words, one to one."""
    from memdistill.data import agreement

    second = SEED / "second_reading"
    assert json.loads((second / "agreement.json").read_text()) == agreement.report(SEED, second)
    g = [{"source_turn_id": "D1:1", "content": "Maya adopted a puppy named Biscuit."},
         {"source_turn_id": "D1:1", "content": "Maya works as a nurse."}]  # fmt: skip
    s = [{"source_turn_id": "D1:1", "content": "Maya works night shifts as a nurse."},
         {"source_turn_id": "D1:2", "content": "Maya adopted a puppy named Biscuit."}]  # fmt: skip
    assert agreement.match(g, s) == [(g[1], s[0])]
    assert agreement.token_f1("a b c", "a b c") == 1.0 and agreement.token_f1("a", "b") == 0.0


def test_the_tree_second_reading_weights_claims_and_names_unknown_nodes():
    from memdistill.data.agreement import tree_check

    seed = seedlib.load()
    first, second = seed.tree[0], seed.tree[1]  # a session node, then its day
    zero = {"wrong": 0, "unsupported": 0, "foreknowledge": 0, "omissions": 0}
    rows = [
        {**zero, "node_id": first["node_id"], "claims": 10, "supported": 9, "wrong": 1, "omissions": 1},
        {**zero, "node_id": second["node_id"], "claims": 30, "supported": 30},
    ]
    out = tree_check(seed, rows)
    assert out["overall"]["supported"]["rate"] == 0.975 and out["overall"]["wrong"]["rate"] == 0.025
    assert out["by_level"]["L2"]["claims"] == 10 and out["by_level"]["L3"]["supported"]["rate"] == 1.0
    assert out["overall"]["omissions_per_node"]["mean"] == 0.5
    with pytest.raises(ValueError, match="not in tree.jsonl"):
        tree_check(seed, [{**zero, "node_id": "nowhere-L2-S1", "claims": 1, "supported": 1}])
