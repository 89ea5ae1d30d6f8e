"""TraceMem topic segmentation: the contract (context, encoder text, parser), the seed validator on
segments.jsonl, and the metrics against hand-computed fixtures."""

from __future__ import annotations

import json
from datetime import datetime

import pytest

from memdistill.data import seed as seedlib
from memdistill.metrics.encoders import binary_prf
from memdistill.metrics.segmentation import pk_counts, probe_width, windowdiff_counts
from memdistill.spec import segmenter as ts
from memdistill.spec.dialogue import Turn

T0 = datetime(2023, 5, 8, 13, 0)


def session(n: int) -> list[Turn]:
    return [Turn(f"D1:{k}", "Maya" if k % 2 else "Tom", "user", f"line {k}", T0) for k in range(1, n + 1)]


def test_each_decision_sees_two_utterances_on_each_side_within_the_session():
    turns = session(6)
    assert ts.decisions(turns) == [1, 2, 3, 4, 5]  # the first utterance opens an episode by construction
    assert ts.context(turns, 1) == (["Maya: line 1"], "Tom: line 2", ["Maya: line 3", "Tom: line 4"])
    assert ts.encoder_text(*ts.context(turns, 4)) == "Maya: line 3 | Tom: line 4 | >> Maya: line 5 << | Tom: line 6"
    lines = ts.user_message(*ts.context(turns, 5)).splitlines()
    assert lines == ["BEFORE: Tom: line 4", "BEFORE: Maya: line 5", "TARGET: Tom: line 6"]
    turns[2].image_caption = "a red kayak"
    assert "Maya: line 3 [shares a photo: a red kayak]" in ts.encoder_text(*ts.context(turns, 3))


@pytest.mark.parametrize(
    "raw, intent, problem",
    [
        ('{"intent": "CHANGE"}', "CHANGE", None),
        ('```json\n{"intent": "develop_topic"}\n```', "DEVELOP", None),
        ('{"intent": "TC"}', "CHANGE", None),
        ('{"intent": "maybe"}', "DEVELOP", "bad_intent"),
        ("the topic changes", "DEVELOP", "no_json"),
        ("", "DEVELOP", "empty_output"),
    ],
)
def test_the_parser_never_raises_and_reads_unreadable_as_no_cut(raw, intent, problem):
    r = ts.parse(raw)
    assert r.intent == intent
    assert [p.code for p in r.problems][-1:] == ([problem] if problem else [])


def test_flags_and_episodes_follow_the_change_ids():
    turns = session(6)
    assert ts.flags(turns, ["D1:3", "D1:6"]) == [False, True, False, False, True]
    assert [[t.turn_id for t in e] for e in ts.episodes(turns, ["D1:3", "D1:6"])] == [
        ["D1:1", "D1:2"],
        ["D1:3", "D1:4", "D1:5"],
        ["D1:6"],
    ]


def _errors(rows):
    seed = seedlib.load()
    rep = seedlib.Report()
    seedlib.check_segments(seed, rows, "segments.jsonl", rep, complete=False)
    return rep.errors


def test_the_validator_rejects_boundaries_on_turns_that_do_not_exist_or_open_the_session():
    assert _errors([{"conversation_id": "mp01", "session_id": "S1", "change_turn_ids": ["D1:5", "D1:9"]}]) == []
    (err,) = _errors([{"conversation_id": "mp01", "session_id": "S1", "change_turn_ids": ["D1:99"]}])
    assert "segments.jsonl line 1 (mp01 S1): change 'D1:99' is not a turn of this session" == err
    (err,) = _errors([{"conversation_id": "mp01", "session_id": "S1", "change_turn_ids": ["D2:3"]}])
    assert "'D2:3' is not a turn of this session" in err  # a real turn, of another session
    (err,) = _errors([{"conversation_id": "mp01", "session_id": "S1", "change_turn_ids": ["D1:1"]}])
    assert "is the session's first turn" in err
    (err,) = _errors([{"conversation_id": "mp01", "session_id": "S1", "change_turn_ids": ["D1:9", "D1:5"]}])
    assert "out of order" in err
    (err,) = _errors([{"conversation_id": "mp01", "session_id": "S9", "change_turn_ids": []}])
    assert "no such conversation / session" in err


# Hand-computed: 6 utterances, gold opens a topic at utterance 3 (slot 2); mean episode 3 -> k = 2; 4 probes.
GOLD = [False, False, True, False, False]


def test_pk_and_windowdiff_against_hand_computed_fixtures():
    assert probe_width(GOLD) == 2
    off_by_one = [False, False, False, True, False]
    # probes (slots 0-1, 1-2, 2-3, 3-4): gold any = F T T F, pred any = F F T T -> Pk 2/4; counts 0110 vs 0011 -> 2/4
    assert pk_counts(GOLD, off_by_one) == (2, 4)
    assert windowdiff_counts(GOLD, off_by_one) == (2, 4)
    doubled = [False, False, True, True, False]
    # any: F T T F vs F T T T -> Pk 1/4; counts 0 1 1 0 vs 0 1 2 1 -> WindowDiff 2/4 (it sees the extra boundary)
    assert pk_counts(GOLD, doubled) == (1, 4)
    assert windowdiff_counts(GOLD, doubled) == (2, 4)
    assert pk_counts(GOLD, GOLD) == windowdiff_counts(GOLD, GOLD) == (0, 4)
    p = binary_prf(doubled, GOLD)
    assert (p["precision"], p["recall"]) == (0.5, 1.0)
    with pytest.raises(ValueError, match="5 boundary slots, prediction 4"):
        pk_counts(GOLD, GOLD[:4])


def test_gold_boundaries_round_trip_through_rows_and_windows():
    from memdistill.data import build
    from memdistill.spec.dialogue import windows

    seed = seedlib.load()
    rows = build.gold_rows(seed, "segmenter", "test")
    gold = seed.rows("segments", "test")
    assert len(gold) == sum(len(c.sessions) for cid, c in seed.conversations.items() if seed.split[cid] == "test")
    for g in gold:
        mine = [r for r in rows if (r["conversation_id"], r["session_id"]) == (g["conversation_id"], g["session_id"])]
        session = next(s for s in seed.conversations[g["conversation_id"]].sessions if s.session_id == g["session_id"])
        assert [r["turn_id"] for r in mine] == [t.turn_id for t in session.turns[1:]]
        assert [r["turn_id"] for r in mine if r["label"] == "CHANGE"] == g["change_turn_ids"]
    conv = seed.conversations[gold[0]["conversation_id"]]
    changes = {i for g in gold if g["conversation_id"] == conv.conversation_id for i in g["change_turn_ids"]}
    seen = [t.turn_id for w in windows(conv, 6, 1) for _, t in w.extractable() if t.turn_id in changes]
    assert sorted(seen) == sorted(changes) and len(changes) > 5  # each boundary lands in exactly one window


def test_segmenter_scores_pool_sessions_and_sit_beside_never_and_always_cut():
    from memdistill.metrics.encoders import segmenter_scores

    def rows(cid, labels):
        return [{"conversation_id": cid, "session_id": "S1", "turn_id": f"D1:{k + 2}", "label": lab}
                for k, lab in enumerate(labels)]  # fmt: skip

    gold = rows("a", ["DEVELOP", "DEVELOP", "CHANGE", "DEVELOP", "DEVELOP"]) + rows("b", ["CHANGE", "DEVELOP"])
    pred = [False, False, False, True, False] + [True, None]
    s = segmenter_scores(pred, gold)
    assert (s["sessions"], s["decisions"], s["gold_change_share"]) == (2, 7, round(2 / 7, 4))
    assert (s["precision"], s["recall"], s["f1"], s["accuracy"]) == (0.5, 0.5, 0.5, round(5 / 7, 4))
    # session a: the off-by-one fixture above, 2 of 4 probes; session b (3 utterances, k = 1): 2 probes, none wrong
    assert s["pk"] == s["windowdiff"] == round(2 / 6, 4) and s["valid_rate"] == round(6 / 7, 4)
    # kappa: both cut 2 of 7; chance agreement (2/7)^2 + (5/7)^2 = 29/49, observed 35/49 -> (6/49) / (20/49)
    assert s["kappa"] == 0.3 and s["never_cut_baseline"]["kappa"] == s["always_cut_baseline"]["kappa"] == 0.0
    assert s["never_cut_baseline"]["accuracy"] == round(5 / 7, 4) and s["never_cut_baseline"]["recall"] == 0.0
    assert s["always_cut_baseline"]["recall"] == 1.0 and s["always_cut_baseline"]["precision"] == round(2 / 7, 4)
    assert s["precision_ci95"][0] <= s["precision"] <= s["precision_ci95"][1]


def test_the_rule_baseline_cuts_on_a_cue_or_on_no_shared_content_word():
    from memdistill.spec.segmenter import rule_change as rule_segmenter

    before = ["Maya: The marathon training is brutal this month", "Tom: How many miles are you running weekly?"]
    assert rule_segmenter({"before": before, "target": "Maya: About forty miles, mostly marathon pace runs"}) is False
    assert rule_segmenter({"before": before, "target": "Maya: By the way, I got the job!"}) is True
    assert (
        rule_segmenter({"before": before, "target": "Maya: My sister adopted two kittens yesterday afternoon"}) is True
    )
    assert rule_segmenter({"before": before, "target": "Maya: Ha, yes."}) is False


def test_the_second_labelling_covers_whole_conversations_and_scores_as_one_more_system(tmp_path):
    from memdistill.data import build
    from memdistill.eval.encoders import second_annotator_predictions

    seed = seedlib.load()
    rep = seedlib.Report()
    seedlib._check_whole_conversations(seed, [{"conversation_id": "mp01", "session_id": "S1"}], "second.jsonl", rep)
    assert rep.errors == ["second.jsonl: mp01 has no row for session(s) S2, S3, S4"]
    rows = build.gold_rows(seed, "segmenter", "test")
    gold = seed.rows("segments", "test")
    (tmp_path / "same.jsonl").write_text("".join(json.dumps(g) + "\n" for g in gold))
    flags, _ = second_annotator_predictions(str(tmp_path / "same.jsonl"), rows)
    assert flags == [r["label"] == "CHANGE" for r in rows] and sum(flags) > 20
    (tmp_path / "part.jsonl").write_text("".join(json.dumps(g) + "\n" for g in gold[1:]))
    flags, why = second_annotator_predictions(str(tmp_path / "part.jsonl"), rows)
    assert flags is None and f"does not label 1 session(s) of the split, e.g. {gold[0]['conversation_id']} S1" in why


def test_the_shipped_second_labelling_is_blind_to_training_and_covers_the_test_split():
    from memdistill.data import build

    seed = seedlib.load()
    second = {(r["conversation_id"], r["session_id"]) for r in seed.segments_second}
    assert {seed.split[c] for c, _ in second} <= {"dev", "test"}  # agreement only: never a training row
    assert {(r["conversation_id"], r["session_id"]) for r in build.gold_rows(seed, "segmenter", "test")} <= second
