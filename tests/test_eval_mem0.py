"""eval-mem0 on a real local mem0: sessions fed as mem0's LoCoMo evaluation feeds them, hits scored against
the gold evidence records (the raw-messages arm needs no LLM, so this runs without a server)."""

from __future__ import annotations

import json

import pytest

from memdistill.core.config import ConfigError
from memdistill.data import seed as seedlib
from memdistill.eval import mem0_compat


def test_sessions_go_in_as_mem0s_locomo_evaluation_writes_them():
    seed = seedlib.load()
    conv = next(c for c in seed.conversations.values() if c.style == "multi-party")
    msgs = mem0_compat.mem0_messages(conv, conv.sessions[0])
    first = conv.speakers[0]
    assert len(msgs) == len(conv.sessions[0].turns)
    for m, t in zip(msgs, conv.sessions[0].turns):
        assert m["role"] == ("user" if t.speaker == first else "assistant")
        assert m["content"].startswith(f"{t.speaker}: ")
    ua = next(c for c in seed.conversations.values() if c.style == "user-assistant")
    assert [m["role"] for m in mem0_compat.mem0_messages(ua, ua.sessions[0])] == [t.role for t in ua.sessions[0].turns]


def test_the_raw_messages_arm_stores_every_message_and_scores_each_question(tmp_path):
    cfg = mem0_compat.Mem0EvalConfig(
        output_dir=str(tmp_path / "out"), arms=[{"name": "raw", "via": "raw"}], conversations=1
    )
    report = mem0_compat.run(cfg) / "report.md"
    r = json.loads((tmp_path / "out" / "metrics.json").read_text())["arms"]["raw"]
    seed = seedlib.load()
    conv = next(c for cid, c in seed.conversations.items() if seed.split[cid] == "test")
    assert r["adds"] == len(conv.sessions) and r["adds_failed"] == 0
    assert r["memories_stored"] == len(conv.turns)  # infer=False: one memory per message
    per_q = json.loads((tmp_path / "out" / "arms" / "raw" / "questions.json").read_text())
    qs = seed.rows("questions", "test")
    n_q = sum(1 for q in qs if q["conversation_id"] == conv.conversation_id and q["evidence_memory_ids"])
    assert len(per_q) == r["questions"] == n_q > 0
    hit10 = sum(1 for q in per_q if q["first_match_rank"] and q["first_match_rank"] <= 10) / n_q
    assert r["hit"]["10"]["rate"] == round(hit10, 4)
    assert r["hit"]["5"]["rate"] <= r["hit"]["10"]["rate"]
    assert "| raw |" in report.read_text() and (tmp_path / "out" / "hit_at_k.png").exists()


def test_an_arm_without_an_extractor_is_a_config_error(tmp_path):
    cfg = mem0_compat.Mem0EvalConfig(output_dir=str(tmp_path), arms=[{"name": "a", "via": "front"}])
    with pytest.raises(ConfigError, match=r"arms\[0\] \(a\): via front needs an extractor"):
        mem0_compat.run(cfg)
