"""Each loader reads its real layout and fails on malformed input with an error naming file and record."""

import json

import pytest

from memdistill.data.sources import SourceError, load
from tests.conftest import FIXTURES


def test_locomo_loader():
    (conv,) = load("locomo", FIXTURES / "locomo_sample.json")
    assert conv.conversation_id == "conv-26" and conv.speakers == ["Caroline", "Melanie"]
    assert [s.session_id for s in conv.sessions] == ["session_1", "session_2", "session_3"]
    assert conv.turn("D1:6").image_caption.startswith("a painting") and len(conv.meta["qa"]) == 3


def test_longmemeval_loader_keeps_has_answer():
    (conv,) = load("longmemeval", FIXTURES / "longmemeval_sample.json")
    t = conv.turn("answer_280352e9:1")
    assert t.meta == {"has_answer": True} and t.role == "user" and t.speaker == "User"
    assert conv.meta["question_date"] == "2023/05/30 (Tue) 23:40" and conv.style == "user-assistant"


def test_chat_jsonl_loader_layouts_and_synthetic_time():
    u1, sg1, t1 = load("chat-jsonl", FIXTURES / "chat_sample.jsonl")
    assert [t.role for t in u1.turns] == ["user", "assistant"]  # system dropped
    assert sg1.turns[1].speaker == "Assistant" and sg1.meta["synthetic_time"] is True
    assert str(sg1.turns[0].timestamp) == "2024-01-02 09:00:00" and str(sg1.turns[1].timestamp) == "2024-01-02 09:01:00"
    assert t1.meta["synthetic_time"] is False and t1.turns[0].timestamp.year == 2023


def test_hf_loader_reads_a_local_file(tmp_path):
    convs = load("hf", FIXTURES / "chat_sample.jsonl")
    assert [c.conversation_id for c in convs] == ["u1", "sg1", "t1"]


def _locomo(tmp_path, mutate):
    data = json.loads((FIXTURES / "locomo_sample.json").read_text())
    mutate(data[0])
    p = tmp_path / "locomo.json"
    p.write_text(json.dumps(data))
    return p


@pytest.mark.parametrize(
    "mutate, msg",
    [
        (lambda s: s["conversation"].pop("speaker_a"), "sample 0 (conv-26): missing field 'speaker_a'"),
        (
            lambda s: s["conversation"].update(session_2_date_time="sometime in May"),
            "session_2_date_time: unrecognised timestamp 'sometime in May'",
        ),
        (lambda s: s["conversation"]["session_1"][2].pop("dia_id"), "session_1 turn 2: missing field 'dia_id'"),
        (lambda s: s["conversation"].update(session_3="oops"), "session_3 should be a list"),
    ],
)
def test_locomo_malformed(tmp_path, mutate, msg):
    p = _locomo(tmp_path, mutate)
    with pytest.raises(SourceError) as e:
        load("locomo", p)
    assert str(p) in str(e.value) and msg in str(e.value)


def test_locomo_not_json(tmp_path):
    p = tmp_path / "bad.json"
    p.write_text('[{"sample_id": 1,')
    with pytest.raises(SourceError, match="bad.json: not valid JSON"):
        load("locomo", p)


@pytest.mark.parametrize(
    "mutate, msg",
    [
        (lambda i: i["haystack_dates"].pop(), "differ in length"),
        (
            lambda i: i["haystack_sessions"][1][0].update(role="narrator"),
            "haystack_sessions[1] (answer_280352e9) message 1: role 'narrator'",
        ),
        (lambda i: i["haystack_dates"].__setitem__(0, "20/05/2023"), "haystack_dates[0]: unrecognised timestamp"),
        (lambda i: i.pop("question_id"), "instance 0: missing field 'question_id'"),
    ],
)
def test_longmemeval_malformed(tmp_path, mutate, msg):
    data = json.loads((FIXTURES / "longmemeval_sample.json").read_text())
    mutate(data[0])
    p = tmp_path / "lme.json"
    p.write_text(json.dumps(data))
    with pytest.raises(SourceError) as e:
        load("longmemeval", p)
    assert msg in str(e.value)


@pytest.mark.parametrize(
    "line, msg",
    [
        ("{not json", ":2: not valid JSON"),
        ('{"text": "hi"}', ":2: expected 'messages'"),
        ('{"messages": [{"role": "robot", "content": "x"}]}', ":2: message 1: role 'robot'"),
        ('{"messages": [{"role": "user", "content": 5}]}', ":2: message 1: content should be a string"),
        ('{"messages": [{"role": "user", "content": "x", "timestamp": "soon"}]}', "unrecognised timestamp 'soon'"),
        ("[1, 2]", ":2: expected a JSON object"),
    ],
)
def test_chat_jsonl_malformed(tmp_path, line, msg):
    p = tmp_path / "chat.jsonl"
    p.write_text('{"messages": [{"role": "user", "content": "fine"}]}\n' + line + "\n")
    with pytest.raises(SourceError) as e:
        load("chat-jsonl", p)
    assert f"{p}" in str(e.value) and msg in str(e.value)


def test_seed_malformed(tmp_path):
    p = tmp_path / "conv.jsonl"
    p.write_text(
        json.dumps(
            {
                "conversation_id": "x1",
                "sessions": [
                    {
                        "date_time": "2023-05-08T10:00:00",
                        "turns": [{"turn_id": "D1:1", "speaker": "A", "role": "bot", "text": "hi"}],
                    }
                ],
            }
        )
        + "\n"
    )
    with pytest.raises(SourceError, match=r"conv.jsonl:1 \(x1\): sessions\[0\].turns\[0\]: turn 'D1:1': role 'bot'"):
        load("seed", p)


def test_unknown_format_and_missing_file(tmp_path):
    with pytest.raises(SourceError, match="unknown format"):
        load("csv", tmp_path)
    with pytest.raises(SourceError, match="no such file"):
        load("seed", tmp_path / "none.jsonl")
