"""MemoType query typing: the spec (hypothetical memories, vote, scope), typed banks, type-scoped retrieval that
never drops an untyped record, NDCG against a hand-computed fixture, the query typer trained on the router's
vote, the eval job end to end, and the LM's hypothetical memories under the served JSON Schema."""

import json
import math
from datetime import datetime

import pytest

from memdistill.data import seed as seedlib
from memdistill.metrics.recall import ndcg_at
from memdistill.runtime import MemoryBank, MemoryItem, MemoryRuntime
from memdistill.runtime.bank import BankError
from memdistill.spec import querytyper
from memdistill.spec.extractor import Dimension
from tests.conftest import encoder_rows, train_tiny_encoder


def test_parse_keeps_k_distinct_memories_and_names_problems():
    raw = json.dumps({"memories": ["Tom: I adopted a puppy.", " Tom:  I adopted a puppy. ", "", "Maya: Nice!"]})
    res = querytyper.parse(raw, k=5)
    assert res.memories == ["Tom: I adopted a puppy.", "Maya: Nice!"]
    assert [p.code for p in res.problems] == ["few_memories"]
    assert querytyper.parse(json.dumps({"memories": [f"m{i}" for i in range(7)]})).memories == [
        f"m{i}" for i in range(5)
    ]
    bad = querytyper.parse('{"answer": "yes"}')
    assert not bad.ok and "wrong_shape" in [p.code for p in bad.problems]
    assert not querytyper.parse("").ok and not querytyper.parse(None).ok


def test_vote_counts_memories_then_breaks_ties_by_probability_mass():
    # EM present in 2 memories, PM in 2: tie on counts, PM has more mass
    probs = [[0.9, 0.6, 0.1], [0.55, 0.95, 0.0], [0.1, 0.2, 0.3]]
    assert querytyper.vote(probs) == "PM"
    assert querytyper.vote([[0.9, 0.6, 0.1], [0.55, 0.4, 0.0]]) == "EM"  # EM in 2 memories, PM in 1
    assert querytyper.vote([[0.1, 0.2, 0.49]]) == querytyper.NONE
    assert querytyper.label_of([0.1, 0.2, 0.6, 0.1]) == "GM"


def test_scope_keeps_its_type_and_every_untyped_record():
    assert querytyper.in_scope(["EM", "PM"], "PM")
    assert not querytyper.in_scope(["GM"], "PM")
    assert querytyper.in_scope(None, "PM") and querytyper.in_scope([], "PM")
    assert querytyper.in_scope(["GM"], None) and querytyper.in_scope(["GM"], querytyper.NONE)


def _item(mid: str, content: str, types, turn: str) -> MemoryItem:
    return MemoryItem(
        mid, "c1", turn, content, Dimension(memory_type="episodic"), "Tom", datetime(2023, 5, 1), types=types
    )


def _bank() -> MemoryBank:
    return MemoryBank(
        [
            _item("em", "Tom ran the Lisbon half marathon in May.", ["EM"], "D1:1"),
            _item("pm", "Tom loves marathon training and running.", ["PM"], "D1:2"),
            _item("untyped", "Tom's marathon shoes are blue.", None, "D1:3"),
            _item("none", "Marathon chat, nothing else.", [], "D1:4"),
        ]
    )


def test_type_scoped_retrieval_never_drops_an_untyped_record():
    bank = _bank()
    rt = MemoryRuntime(bank, budget=None)
    unscoped = rt.recall("marathon", "c1", route=False)
    assert {h.item.memory_id for h in unscoped.hits} == {"em", "pm", "untyped", "none"}
    scoped = rt.but(query_typer=lambda q: "EM").recall("marathon", "c1", route=False)
    assert {h.item.memory_id for h in scoped.hits} == {"em", "untyped", "none"}
    assert scoped.query_type == "EM" and scoped.skipped == pytest.approx(0.25)
    none = rt.but(query_typer=lambda q: querytyper.NONE).recall("marathon", "c1", route=False)
    assert len(none.hits) == 4 and none.skipped == 0.0


def test_a_typed_bank_types_records_on_entry_and_keeps_types_through_jsonl(tmp_path):
    bank = MemoryBank([_item("a", "Tom adopted a puppy.", None, "D1:1")])
    seen = []

    def typer(texts):
        seen.extend(texts)
        return [["EM"] if "adopted" in t else ["PM"] for t in texts]

    assert bank.type_with(typer) == 1 and bank.get("a").types == ["EM"]
    bank.add(_item("b", "Tom likes tea.", None, "D1:2"))
    bank.add(_item("c", "Already typed.", ["GM"], "D1:3"))  # a record that carries types keeps them
    assert [it.types for it in bank.items] == [["EM"], ["PM"], ["GM"]]
    assert seen == ["Tom adopted a puppy.", "Tom likes tea."]
    bank.save(tmp_path / "bank.jsonl")
    again = MemoryBank.from_jsonl(tmp_path / "bank.jsonl")
    assert [it.types for it in again.items] == [["EM"], ["PM"], ["GM"]]
    row = json.loads((tmp_path / "bank.jsonl").read_text().splitlines()[0]) | {"types": ["XX"]}
    (tmp_path / "bad.jsonl").write_text(json.dumps(row) + "\n")
    with pytest.raises(BankError, match=r"bad.jsonl:1: field 'types'"):
        MemoryBank.from_jsonl(tmp_path / "bad.jsonl")


class _Hit:
    def __init__(self, turns):
        self.item = type("I", (), {"source_turns": turns})()


def test_ndcg_against_a_hand_computed_fixture():
    hits = [_Hit(["D1:9"]), _Hit(["D1:2"]), _Hit(["D1:2"]), _Hit(["D1:5"])]
    # relevant at ranks 2 and 4 (rank 3 repeats D1:2); ideal: ranks 1 and 2
    dcg = 1 / math.log2(3) + 1 / math.log2(5)
    assert ndcg_at(hits, ["D1:2", "D1:5"], 4) == pytest.approx(dcg / (1 + 1 / math.log2(3)))
    assert ndcg_at(hits, ["D1:2", "D1:5"], 1) == 0.0
    assert ndcg_at([_Hit(["D1:2"])], ["D1:2"], 10) == 1.0
    with pytest.raises(ValueError):
        ndcg_at(hits, [], 3)


def test_gold_rows_carry_the_evidence_turns_as_memories():
    seed = seedlib.load()
    questions = {q["question_id"]: q for q in seed.rows("questions", "test")}
    rows = encoder_rows("querytyper", len(questions), "test")
    assert [r["question_id"] for r in rows] == list(questions)
    # an answerable question's memories are its first K evidence turns; an unanswerable one has the look-alike
    # turns it lists, or none
    assert all(len(r["memories"]) == min(len(questions[r["question_id"]]["evidence"]), querytyper.K) for r in rows)
    assert all(r["memories"] for r in rows if questions[r["question_id"]]["category"] not in seedlib.UNANSWERABLE)
    first = rows[0]
    assert first["memories"][0].startswith("Priya: ") or ": " in first["memories"][0]
    assert "label" not in first  # the label is the router's vote, cast at training time


@pytest.fixture(scope="module")
def tiny_typing_models(tmp_path_factory):
    root = tmp_path_factory.mktemp("typing")
    _, router = train_tiny_encoder("router", root / "router")
    summary, typer = train_tiny_encoder("querytyper", root / "querytyper", label_router=str(router))
    return router, typer, summary


def test_query_typer_learns_the_router_vote(tiny_typing_models):
    from memdistill.core.encoder import Encoder
    from memdistill.train.encoder import read_rows

    router, typer, summary = tiny_typing_models
    enc = Encoder(str(typer))
    assert enc.task == "querytyper" and enc.meta["label_router"] == str(router)
    assert summary["steps"] == 4 and summary["first_loss"] > summary["final_loss"]
    rows = encoder_rows("querytyper", 12)
    path = typer.parent.parent / "rows.jsonl"
    labelled = read_rows(str(path), "querytyper", label_router=str(router))
    # the label is exactly the vote over the router's own scores of those memories
    r_enc = Encoder(str(router))
    for row in labelled:
        assert row["label"] == querytyper.vote(r_enc.scores([(m,) for m in row["memories"]]))
    assert {r["question_id"] for r in labelled} == {r["question_id"] for r in rows}
    assert all(p in querytyper.LABELS for p in enc.query_types([r["text"] for r in rows]))


def test_gpu_recipe_trains_the_query_typer_on_a_tiny_roberta(tiny_typing_models, tiny_roberta_dir, tmp_path):
    from memdistill.core.config import load_config
    from memdistill.core.encoder import Encoder
    from memdistill.core.models import REPO
    from memdistill.train.encoder import EncoderConfig

    gpu = load_config(EncoderConfig, REPO / "configs/training/querytyper_roberta_base.yaml")
    assert gpu.task == "querytyper" and gpu.label_router == "runs/router-roberta-base/model"
    summary, out = train_tiny_encoder(
        "querytyper", tmp_path, model=tiny_roberta_dir, dtype=gpu.dtype, label_router=str(tiny_typing_models[0])
    )
    assert summary["steps"] == 4 and summary["final_loss"] < summary["first_loss"]
    enc = Encoder(str(out))
    assert enc.model.config.model_type == "roberta" and enc.task == "querytyper"


def test_query_typer_rows_without_a_router_are_a_clear_error(tmp_path):
    from memdistill.train.encoder import read_rows

    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in encoder_rows("querytyper", 3)))
    with pytest.raises(ValueError, match="rows.jsonl: querytyper rows are labelled by a router's vote"):
        read_rows(str(path), "querytyper")
    with pytest.raises(FileNotFoundError, match="label_router .*run `make train-router`"):
        read_rows(str(path), "querytyper", label_router=str(tmp_path / "nothing"))


def test_eval_typing_scores_three_typings_and_scoped_retrieval(tiny_typing_models, tmp_path):
    from memdistill.core.config import load_config
    from memdistill.core.models import REPO
    from memdistill.data import build
    from memdistill.eval.query_types import ORACLE, RAW, RULES, TYPER, TypingEvalConfig, run

    router, typer, _ = tiny_typing_models
    data = tmp_path / "built"
    build.build(build.DataConfig(output_dir=str(data), tasks=["querytyper"]))
    cfg = load_config(
        TypingEvalConfig,
        REPO / "configs/eval/typing_cpu.yaml",
        [f"router={router}", f"querytyper={typer}", "lm_baseline=false", f"data_dir={data}",
         f"output_dir={tmp_path / 'out'}", "banks=[turns]"],
    )  # fmt: skip
    out = run(cfg)
    m = json.loads((out / "metrics.json").read_text())
    n_test = len(seedlib.load().rows("questions", "test"))
    assert set(m["typing"]) == {RAW, RULES, TYPER} and m["typing"][TYPER]["n"] == n_test
    assert m["skipped"] == ["router on K LM memories: lm_baseline is false"]
    scopes = m["retrieval"]["turns"]["scopes"]
    assert set(scopes) == {"unscoped", RAW, RULES, TYPER, ORACLE}
    assert scopes["unscoped"]["skipped"]["mean"] == 0.0
    preds = [json.loads(x) for x in (out / "predictions.jsonl").read_text().splitlines()]
    assert len(preds) == n_test and all(p["reference"] in querytyper.LABELS for p in preds)
    assert (out / "report.md").read_text().count("MemoType Table 2 layout") == 1
    assert (out / "retrieval.png").stat().st_size > 0 and (out / "typing.png").stat().st_size > 0


@pytest.mark.vllm
def test_the_lm_writes_k_hypothetical_memories_under_the_served_schema(mm):
    text, _, _ = mm.chat(querytyper.chat_messages("Where did Tom run his first half marathon?"),
                         querytyper.json_schema(), "memories", 400)  # fmt: skip
    assert len(json.loads(text)["memories"]) == querytyper.K
    res = mm.hypothetical_memories("Where did Tom run his first half marathon?")
    assert res.ok and 1 <= len(res.memories) <= querytyper.K
