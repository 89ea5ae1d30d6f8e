"""The CLI contracts later stages and users rely on, run as real subprocesses."""

import json
import subprocess
import sys

import pytest

from tests.conftest import FIXTURES, REPO


def run(*args, stdin=""):
    return subprocess.run(
        [sys.executable, "-m", "memdistill", *args], input=stdin, capture_output=True, text=True, cwd=REPO, timeout=120
    )


def test_windows_on_locomo_layout():
    r = run("windows", "--format", "locomo", str(FIXTURES / "locomo_sample.json"), "--window", "10", "--overlap", "3")
    assert r.returncode == 0, r.stderr
    lines = [json.loads(x) for x in r.stdout.splitlines()]
    assert [w["window_index"] for w in lines] == [0, 1, 2, 3]
    w0, w1 = lines[0], lines[1]
    assert set(w0) == {"conversation_id", "window_index", "text", "extract_from", "messages"}
    assert w0["conversation_id"] == "conv-26" and w0["extract_from"] == 1 and w1["extract_from"] == 4
    assert w0["messages"][0] == {
        "n": 1,
        "turn_id": "D1:1",
        "speaker": "Caroline",
        "role": "user",
        "timestamp": "2023-05-08T13:56:00",
    }
    assert (
        w0["text"].split("\n")[0]
        == "[2023-05-08T13:56:00, Mon] 1.Caroline: Hey Mel! Good to see you! How have you been?"
    )
    assert "[shares a photo: a painting of a sunrise over a lake with pink clouds]" in w0["text"].split("\n")[5]
    # windows cross sessions; the overlap repeats the previous window's last 3 messages
    assert [m["turn_id"] for m in w1["messages"][:3]] == ["D1:8", "D1:9", "D1:10"]
    assert w1["messages"][3]["turn_id"] == "D2:1" and w1["messages"][3]["timestamp"] == "2023-05-25T13:14:00"
    extractable = [m["turn_id"] for w in lines for m in w["messages"] if m["n"] >= w["extract_from"]]
    assert len(extractable) == len(set(extractable)) == 28


def test_windows_presets_and_other_formats():
    r = run("windows", "--format", "locomo", str(FIXTURES / "locomo_sample.json"))
    assert r.returncode == 0 and len(r.stdout.splitlines()) == 2  # 25/5 on 28 turns
    r = run("windows", "--format", "longmemeval", str(FIXTURES / "longmemeval_sample.json"))
    w = json.loads(r.stdout.splitlines()[0])
    assert w["messages"][2]["turn_id"] == "answer_280352e9:1" and "2.Assistant: Sure: 1. Hardcore History" in w["text"]
    r = run("windows", "--format", "chat-jsonl", str(FIXTURES / "chat_sample.jsonl"), "--window", "4", "--overlap", "1")
    assert [json.loads(x)["conversation_id"] for x in r.stdout.splitlines()] == ["u1", "sg1", "t1"]


@pytest.mark.parametrize(
    "args, msg",
    [
        (("windows", "--format", "locomo", "nope.json"), "nope.json: no such file"),
        (
            ("windows", "--format", "locomo", str(FIXTURES / "locomo_sample.json"), "--window", "5", "--overlap", "5"),
            "overlap",
        ),
        (("windows", "--format", "xml", "a"), "invalid choice"),
        (("parse", "--model", "nope"), "invalid choice"),
        (("parse", "--model", "query_parser", "--window", "x.jsonl"), "--window only applies"),
        (("parse", "--model", "extractor", "--window", "missing.jsonl"), "missing.jsonl"),
    ],
)
def test_usage_errors(args, msg):
    r = run(*args)
    assert r.returncode in (1, 2) and msg in r.stderr
    if args[0] == "parse" or "--overlap" in args or "xml" in args:
        assert r.returncode == 2


def test_parse_with_window_applies_overlap(tmp_path):
    r = run("windows", "--format", "locomo", str(FIXTURES / "locomo_sample.json"), "--window", "10", "--overlap", "3")
    win = tmp_path / "w.jsonl"
    win.write_text(r.stdout.splitlines()[1] + "\n")  # messages 1-3 are context
    out = {
        "memories": [
            {
                "source_id": 2,
                "content": "Caroline is looking into counseling certification programs.",
                "dimension": {"memory_type": "episodic", "keywords": ["counseling"]},
            },
            {
                "source_id": 4,
                "source_speaker": "Melanie",
                "content": "Melanie went camping at the beach with her kids.",
                "dimension": {
                    "memory_type": "Episodic",
                    "time": "2023-05-19/2023-05-21",
                    "location": "beach",
                    "keywords": "camping, beach, kids",
                },
            },
        ]
    }
    raw = "<think>ok</think>```json\n" + json.dumps(out) + "\n```"
    r = run("parse", "--model", "extractor", "--window", str(win), stdin=raw)
    assert r.returncode == 0, r.stderr
    res = json.loads(r.stdout)
    assert [x["source_id"] for x in res["records"]] == [4]
    assert res["records"][0]["dimension"]["keywords"] == ["camping", "beach", "kids"]
    assert {p["code"] for p in res["problems"]} >= {
        "source_in_overlap",
        "memory_type_normalised",
        "keywords_normalised",
    }


@pytest.mark.parametrize("task", ["extractor", "query_parser", "router", "planner", "gate"])
def test_parse_exits_zero_whatever_the_output(task):
    for raw in ["", "garbage {", '{"memories": [{"source_id": 1']:
        r = run("parse", "--model", task, stdin=raw)
        assert r.returncode == 0, r.stderr
        res = json.loads(r.stdout)
        assert set(res) == {"records", "problems"} and res["problems"]


def test_windows_default_to_the_models_training_windows(tmp_path):
    model = tmp_path / "merged"
    model.mkdir()
    (model / "memdistill.json").write_text(json.dumps({"training_windows": {"multi-party": [[6, 1]]}}))
    r = run("windows", "--format", "locomo", str(FIXTURES / "locomo_sample.json"), "--model", str(model))
    assert r.returncode == 0, r.stderr
    lines = [json.loads(x) for x in r.stdout.splitlines()]
    assert [len(w["messages"]) for w in lines[:2]] == [6, 6] and lines[1]["extract_from"] == 2
    assert r.stderr == ""
    r = run(
        "windows", "--format", "locomo", str(FIXTURES / "locomo_sample.json"), "--model", str(model), "--window", "10"
    )
    assert r.returncode == 0 and "10/1 is not one the model was trained on" in r.stderr  # allowed, reported
    r = run("windows", "--format", "locomo", str(FIXTURES / "locomo_sample.json"), "--model", str(tmp_path / "none"))
    assert r.returncode == 2 and "no such model directory" in r.stderr


def test_windows_piped_into_head_exits_quietly():
    # the gold corpus in 2-message windows is far more than a pipe buffer holds, so the writer hits the closed pipe
    p = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "memdistill",
            "windows",
            "--format",
            "seed",
            str(REPO / "data/seed/conversations.jsonl"),
            "--window",
            "2",
            "--overlap",
            "0",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=REPO,
    )
    first = p.stdout.readline()
    p.stdout.close()  # what `| head -1` does once it has its line
    err = p.stderr.read().decode()
    assert p.wait(timeout=120) == 0 and json.loads(first)["window_index"] == 0
    assert "Traceback" not in err and "BrokenPipe" not in err, err


def test_job_help_lists_every_setting_with_its_comment():
    r = run("train", "extractor", "--help")
    assert r.returncode == 0
    assert "layers_to_transform (list | None, default None): Only these decoder layers get adapters" in r.stdout
    assert "data_config (str, default 'configs/data/seed.yaml'): the build that writes train_file" in r.stdout
