from datetime import datetime

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from memdistill.spec.dialogue import TimestampError, Window, parse_timestamp, render_message, windows
from tests.conftest import make_conversation


@pytest.mark.parametrize(
    "raw, want",
    [
        ("1:56 pm on 8 May, 2023", datetime(2023, 5, 8, 13, 56)),
        ("12:09 am on 13 September, 2023", datetime(2023, 9, 13, 0, 9)),
        ("12:30 pm on 1 Jan, 2024", datetime(2024, 1, 1, 12, 30)),
        ("10:37 am on 27 June 2023", datetime(2023, 6, 27, 10, 37)),
        ("2023/05/20 (Sat) 02:21", datetime(2023, 5, 20, 2, 21)),
        ("2023/5/2 (Tue) 14:05", datetime(2023, 5, 2, 14, 5)),
        ("2023-05-20T02:21:00", datetime(2023, 5, 20, 2, 21)),
        ("2023-05-20", datetime(2023, 5, 20)),
        ("2023-05-20T02:21:00Z", datetime(2023, 5, 20, 2, 21)),
        ("2023-05-20T02:21:00+02:00", datetime(2023, 5, 20, 2, 21)),
    ],
)
def test_timestamp_formats(raw, want):
    assert parse_timestamp(raw) == want


@pytest.mark.parametrize(
    "raw",
    [
        "",
        "yesterday",
        "1:56 pm on 8 Mayo, 2023",
        "2023/13/01 (Sat) 02:21",
        "31/12/2023",
        "25:00 pm on 8 May, 2023",
        None,
        12,
    ],
)
def test_bad_timestamps_name_the_value(raw):
    with pytest.raises(TimestampError) as e:
        parse_timestamp(raw)
    assert repr(raw) in str(e.value) or "empty" in str(e.value)


def test_render_line_format():
    conv = make_conversation(3)
    t = conv.turns[1]
    t.text = "Look at this!\nIt's   new."
    t.image_caption = "a photo of a red bike"
    assert (
        render_message(2, t)
        == "[2023-05-08T13:57:00, Mon] 2.Tom: Look at this! It's new. [shares a photo: a photo of a red bike]"
    )


def test_window_json_contract():
    w = windows(make_conversation(12), 6, 2)[1]
    d = w.to_json()
    assert set(d) == {"conversation_id", "window_index", "text", "extract_from", "messages"}
    assert d["extract_from"] == 3 and d["window_index"] == 1
    assert d["messages"][0] == {
        "n": 1,
        "turn_id": "D1:5",
        "speaker": "Maya",
        "role": "user",
        "timestamp": "2023-05-08T14:00:00",
    }
    assert d["text"].split("\n")[0] == "[2023-05-08T14:00:00, Mon] 1.Maya: message 5"
    back = Window.from_json(d)
    assert [t.turn_id for t in back.turns] == [t.turn_id for t in w.turns] and back.extract_from == 3


def test_window_arguments_checked():
    with pytest.raises(ValueError):
        windows(make_conversation(5), 3, 3)
    with pytest.raises(ValueError):
        windows(make_conversation(5), 0, 0)


@settings(max_examples=300, deadline=None)
@given(n=st.integers(0, 80), size=st.integers(1, 30), data=st.data())
def test_windowing_properties(n, size, data):
    overlap = data.draw(st.integers(0, size - 1))
    conv = make_conversation(n, per_session=data.draw(st.integers(1, 12)))
    ws = windows(conv, size, overlap)
    extractable = [t.turn_id for w in ws for _, t in w.extractable()]
    # every turn is extractable in exactly one window, in order
    assert extractable == [t.turn_id for t in conv.turns]
    for k, w in enumerate(ws):
        assert w.window_index == k and 1 <= len(w.turns) <= size
        assert w.extract_from == (1 if k == 0 else overlap + 1)
        assert w.extract_from <= len(w.turns)  # no window without a new message
        # overlap messages are the previous window's last messages, never sources
        if k:
            prev = ws[k - 1].turns
            assert [t.turn_id for t in w.turns[:overlap]] == [t.turn_id for t in prev[len(prev) - overlap :]]
        # pointers round-trip: message n -> turn -> n
        for num, t in enumerate(w.turns, 1):
            assert w.turn_for(num) is t
            assert w.text.split("\n")[num - 1].split("] ", 1)[1].startswith(f"{num}.{t.speaker}: ")
        rebuilt = Window.from_json(w.to_json())
        assert [t.turn_id for t in rebuilt.turns] == [t.turn_id for t in w.turns]


def test_choose_window_prefers_explicit_then_trained_then_preset():
    from memdistill.spec.dialogue import WINDOW_PRESETS, choose_window

    trained = {"multi-party": [[6, 1], [4, 1]], "user-assistant": [[4, 1]]}
    assert choose_window("multi-party", trained) == (6, 1, None)
    assert choose_window("user-assistant", trained) == (4, 1, None)
    assert choose_window("multi-party", trained, 4, 1) == (4, 1, None)  # a second training window is fine
    size, ov, note = choose_window("multi-party", trained, 25)
    assert (size, ov) == (25, 1) and "25/1 is not one the model was trained on (multi-party 6/1, 4/1)" in note
    size, ov, note = choose_window("multi-party", trained, 3)  # the overlap is capped below the window
    assert (size, ov) == (3, 1) and note
    assert choose_window("multi-party", None) == (*WINDOW_PRESETS["multi-party"], choose_window("multi-party")[2])
    assert "unknown" in choose_window("multi-party", None)[2]
    assert choose_window("multi-party", None, 10, 2) == (10, 2, None)  # explicit, nothing to compare with
    assert "no user-assistant windows" in choose_window("user-assistant", {"multi-party": [[6, 1]]})[2]


def test_topic_windows_hold_one_episode_each_and_every_turn_once():
    from memdistill.spec.dialogue import windows
    from tests.conftest import make_conversation

    conv = make_conversation(20)
    ids = [t.turn_id for t in conv.turns]
    starts = {ids[5], ids[6], ids[13]}  # two adjacent topic starts: a one-message episode
    ws = windows(conv, 4, 1, topic_starts=starts)
    opens = [ids.index(s) for s in starts | {ids[0]}]
    episode = {t: sum(o <= k for o in opens) for k, t in enumerate(ids)}
    assert all(len({episode[t.turn_id] for t in w.turns}) == 1 for w in ws)  # no window crosses a topic change
    extracted = [t.turn_id for w in ws for _, t in w.extractable()]
    assert extracted == ids  # every turn extractable exactly once, in order
    opening = [w for w in ws if w.turns[0].turn_id in starts]
    assert len(opening) == 3 and all(w.extract_from == 1 for w in opening)  # no context from another topic
    assert [len(w.turns) for w in ws] == [4, 2, 1, 3, 4, 2, 3, 4, 2]  # episodes of 5, 1, 7 and 7 turns
    assert windows(conv, 4, 1, topic_starts=set()) == windows(conv, 4, 1)  # no boundary: fixed windows
