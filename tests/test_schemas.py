"""The JSON Schemas handed to structured-output backends accept exactly what the pydantic models accept."""

import copy
import json

import jsonschema
import pytest
from pydantic import ValidationError

from memdistill.spec import extractor, gate, planner, query_parser, router

REC = {
    "source_id": 3,
    "source_speaker": "Maya",
    "content": "Maya moved to Lisbon in 2023-04.",
    "dimension": {
        "memory_type": "fact",
        "time": "2023-04",
        "location": "Lisbon",
        "reason": "",
        "purpose": "",
        "keywords": ["Lisbon", "move"],
    },
}


def variants_extraction():
    base = {"memories": [REC]}
    out = [base, {"memories": []}]

    def mut(fn):
        d = copy.deepcopy(base)
        fn(d["memories"][0])
        out.append(d)

    mut(lambda r: r.pop("source_speaker"))
    mut(lambda r: r.update(source_speaker=None))
    mut(lambda r: r.update(source_id=0))
    mut(lambda r: r.update(source_id="3"))
    mut(lambda r: r.update(source_id=True))
    mut(lambda r: r.update(content=""))
    mut(lambda r: r.update(extra="x"))
    mut(lambda r: r.pop("dimension"))
    for t in [
        "",
        "2023",
        "2023-04-09",
        "2023-04-01/2023-04-30",
        "2023-4",
        "2023-04-31x",
        "April 2023",
        "2023/2024",
        "2023-00",
        "2023-12-32",
        "1999-01-01/2000",
    ]:
        mut(lambda r, t=t: r["dimension"].update(time=t))
    for mt in ["fact", "episodic", "profile", "Fact", "event", ""]:
        mut(lambda r, mt=mt: r["dimension"].update(memory_type=mt))
    mut(lambda r: r["dimension"].update(keywords="Lisbon"))
    mut(lambda r: r["dimension"].update(keywords=["a", 1]))
    mut(lambda r: r["dimension"].update(location=None))
    mut(lambda r: r["dimension"].pop("location"))
    mut(lambda r: r["dimension"].pop("memory_type"))
    mut(lambda r: r["dimension"].update(mood="happy"))
    out += [{"memories": {}}, {}, {"memories": [REC], "note": "x"}]
    return out


QA = {
    "query_anchor": "Where the user moved in 2023",
    "need_assistant_context": False,
    "dimension": {"target_memory_type": ["fact"], "keywords": ["move"], "time": "around 2023", "location": ""},
    "answer_dim": "location",
}


def variants_query():
    out = [QA]

    def mut(fn):
        d = copy.deepcopy(QA)
        fn(d)
        out.append(d)

    for t in [
        "",
        "on 2023-05-01",
        "between 2023-01-01 and 2023-04-29",
        "before 2023",
        "in 2023",
        "2023",
        "between 2023",
    ]:
        mut(lambda d, t=t: d["dimension"].update(time=t))
    for ad in ["", "content", "keywords", "who"]:
        mut(lambda d, ad=ad: d.update(answer_dim=ad))
    mut(lambda d: d.update(need_assistant_context="false"))
    mut(lambda d: d.update(query_anchor=""))
    mut(lambda d: d["dimension"].update(target_memory_type=["fact", "event"]))
    mut(lambda d: d.pop("answer_dim"))
    mut(lambda d: d.pop("dimension"))
    return out


CASES = [
    (extractor.ExtractionOutput, extractor.json_schema(), variants_extraction()),
    (query_parser.QueryAnalysis, query_parser.json_schema(), variants_query()),
    (
        router.TypeLabels,
        router.json_schema(),
        [
            {"labels": []},
            {"labels": ["EM", "GM"]},
            {"labels": ["em"]},
            {"labels": "EM"},
            {},
            {"labels": ["EM"], "x": 1},
        ],
    ),
    (
        router.TypeDecision,
        router.json_schema(binary=True),
        [{"present": True}, {"present": "yes"}, {"present": 1}, {}],
    ),
    (
        planner.RecallPlan,
        planner.json_schema(),
        [
            {"complexity": "simple", "keywords": ["a"]},
            {"complexity": "hybrid", "keywords": []},
            {"complexity": "complex", "keywords": ["a", "b", "c", "d"]},
            {"complexity": 0, "keywords": ["a"]},
            {"complexity": "Simple", "keywords": ["a"]},
            {"keywords": ["a"]},
        ],
    ),
    (
        gate.GateOutput,
        gate.json_schema(),
        [{"kept_ids": []}, {"kept_ids": [1, 2]}, {"kept_ids": ["1"]}, {"kept_ids": [1.5]}, {"relevant_ids": [1]}],
    ),
]


@pytest.mark.parametrize("model, schema, samples", CASES, ids=lambda x: getattr(x, "__name__", ""))
def test_schema_accepts_exactly_what_pydantic_accepts(model, schema, samples):
    validator = jsonschema.Draft202012Validator(schema)
    accepted = 0
    for sample in samples:
        try:
            model.model_validate_json(json.dumps(sample))
            by_pydantic = True
        except ValidationError:
            by_pydantic = False
        by_schema = validator.is_valid(sample)
        assert by_pydantic == by_schema, f"{model.__name__}: pydantic={by_pydantic} schema={by_schema} on {sample}"
        accepted += by_pydantic
    assert 0 < accepted < len(samples)  # the samples exercise both sides


def test_extraction_schema_is_self_contained():
    s = json.dumps(extractor.json_schema())
    assert "$ref" not in s and "$defs" not in s


def test_render_completion_round_trips():
    out = extractor.ExtractionOutput.model_validate(json.loads(json.dumps({"memories": [REC]})))
    text = extractor.render_completion(out.memories, compact=False)
    res = extractor.parse(text)
    assert res.problems == [] and res.records == out.memories


def test_compact_completion_leaves_out_speaker_and_empty_dimensions():
    rec = extractor.MemoryRecord.model_validate(REC)
    text = extractor.render_completion([rec])
    assert json.loads(text) == {
        "memories": [
            {
                "source_id": 3,
                "content": "Maya moved to Lisbon in 2023-04.",
                "dimension": {
                    "memory_type": "fact",
                    "time": "2023-04",
                    "location": "Lisbon",
                    "keywords": ["Lisbon", "move"],
                },
            }
        ]
    }
    assert len(text) < len(extractor.render_completion([rec], compact=False))


def test_compact_completion_parses_back_to_every_gold_record():
    """What the student writes (compact) comes back through the parser as exactly the record the full
    DimMem completion gives, speaker included, for every gold window of the corpus; and it validates
    against the decoding schema."""
    import jsonschema

    from memdistill.data import seed as seedlib
    from memdistill.spec.dialogue import windows
    from tests.conftest import REPO

    seed = seedlib.load(REPO / "data" / "seed")
    records = 0
    for conv in seed.conversations.values():
        for w in windows(conv, 6, 1):
            gold = seed.gold_records(w)
            text = extractor.render_completion(gold)
            jsonschema.validate(json.loads(text), extractor.json_schema(w))
            res, full = extractor.parse(text, w), extractor.parse(extractor.render_completion(gold, False), w)
            assert [r.model_dump() for r in res.records] == [r.model_dump() for r in full.records]
            assert [r.source_speaker for r in res.records] == [g.source_speaker for g in gold]
            assert not any(p.code == "speaker_mismatch" for p in full.problems)
            records += len(gold)
    assert records > 1500


def test_window_schema_admits_gold_and_bounds_a_loop():
    """The decoding schema of a window accepts every gold completion of the corpus at the CPU and paper
    windows, and refuses context sources, endless lists and endless strings."""
    import jsonschema

    from memdistill.data import seed as seedlib
    from memdistill.spec.dialogue import windows
    from tests.conftest import REPO

    seed = seedlib.load(REPO / "data" / "seed")
    checked = 0
    for conv in seed.conversations.values():
        for size, overlap in ((6, 1), (4, 1), (25, 5), (15, 3)):
            for w in windows(conv, size, overlap):
                gold = json.loads(extractor.render_completion(seed.gold_records(w)))
                jsonschema.validate(gold, extractor.json_schema(w))
                checked += 1
    assert checked > 500
    w = windows(next(iter(seed.conversations.values())), 6, 1)[1]
    schema = extractor.json_schema(w)
    rec = dict(REC, source_id=w.extract_from)
    ok = jsonschema.Draft202012Validator(schema).is_valid
    assert ok({"memories": [rec]})
    assert not ok({"memories": [dict(rec, source_id=1)]})  # message 1 is context
    assert not ok({"memories": [dict(rec, content="again " * 100)]})
    assert not ok({"memories": [rec] * (extractor.MAX_RECORDS_PER_MESSAGE * len(w.extractable()) + 1)})
