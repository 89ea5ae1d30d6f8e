"""A fake OpenAI-compatible teacher on loopback (real HTTP), for the data tests and `make bench`.

    with FakeOpenAI(latency=0.05, api_key="sk-test") as fake:
        fake.add_fault("429", index=0)                 # the first request gets 429 + Retry-After
        fake.add_fault("500", content=messages, times=None)   # this request fails every time
        ... point a teacher at fake.url ...
        fake.requests                                  # chat/completions requests received

Answers are deterministic and derived from the request, so a labelling job gets valid, checkable
labels: the task is recognised from the spec's teacher system prompt; extraction answers one record
per extractable message of four words or more; type decisions, recall plans, query analyses and gate
decisions follow simple word rules (below); a dialogue-writing request gets a small conversation built
from the two persona lines, with the asked numbers of sessions, messages and questions. Only the
teacher is faked: it is the one external service.

Faults (injected per request index, 0-based in arrival order, or per request content = the messages):
  429        status 429 with Retry-After (seconds)       500 / 503  a server error
  400        a bad request (not worth retrying)
  hang       no answer for `hang_s` seconds (longer than the client's timeout)
  drop       the connection is closed without a response
  bad_body   status 200 with a body that is not JSON
  malformed  a 200 whose message content is invalid JSON
  truncated  a 200 whose content stops half-way, finish_reason "length"
  python -m memdistill.data.fake_teacher --port 8001 --latency 0.2     (a standalone server for manual runs)
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
import time
from datetime import datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from memdistill.spec import (
    consolidator,
    dialogue_synthesis,
    extractor,
    gate,
    planner,
    query_parser,
    querytyper,
    router,
    segmenter,
)
from memdistill.spec.gate import BUDGETS

FAULTS = ("400", "429", "500", "503", "hang", "drop", "bad_body", "malformed", "truncated")
_LINE = re.compile(r"^\[(\d{4}-\d{2}-\d{2})T[^\]]*\] (\d+)\.([^:]+): (.*)$")
_WORD = re.compile(r"[A-Za-z][A-Za-z'-]+")
_EVENT = re.compile(
    r"\b(yesterday|last|ago|went|visited|tomorrow|next|bought|met|started|finished|moved|"
    r"adopted|signed|trip|weekend|tonight|today|planning|will)\b",
    re.I,
)
_PROFILE = re.compile(r"\b(love|like|likes|prefer|enjoy|favorite|favourite|hate|always|usually|never)\b", re.I)
_PERSONAL = re.compile(r"\b(i|i'm|my|me|mine)\b", re.I)
_GENERAL = re.compile(r"(^assistant:|\b(is a|are a|means|works by|you can|generally|typically)\b)", re.I | re.M)
_STOP = planner._STOP


def content_hash(messages: list[dict]) -> str:
    return hashlib.sha256(json.dumps(messages, sort_keys=True).encode()).hexdigest()[:16]


def _keywords(text: str, n: int = 2) -> list[str]:
    words = [w.lower() for w in _WORD.findall(text) if w.lower() not in _STOP and len(w) > 3]
    return sorted(dict.fromkeys(words), key=lambda w: (-len(w), w))[:n]


def _extraction(user: str) -> dict:
    m = re.search(r"Extract from messages? (\d+)", user)
    first = int(m.group(1)) if m else 1
    records = []
    for line in user.splitlines():
        lm = _LINE.match(line)
        if not lm or int(lm.group(2)) < first:
            continue
        day, n, speaker, text = lm.group(1), int(lm.group(2)), lm.group(3), lm.group(4)
        if len(text.split()) < 4:
            continue
        mt = "profile" if _PROFILE.search(text) else "episodic" if _EVENT.search(text) else "fact"
        records.append(
            {
                "source_id": n,
                "source_speaker": speaker,
                "content": f"{speaker} said: {' '.join(text.split()[:40])}",
                "dimension": {
                    "memory_type": mt,
                    "time": day if mt == "episodic" else "",
                    "location": "",
                    "reason": "",
                    "purpose": "",
                    "keywords": _keywords(text),
                },
            }
        )
    return {"memories": records}


def type_decision(label: str, snippet: str) -> bool:
    """EM: event words; PM: first person plus a preference or event; GM: an assistant line or general phrasing."""
    if label == "EM":
        return bool(_EVENT.search(snippet))
    if label == "PM":
        return bool(_PERSONAL.search(snippet) and (_PROFILE.search(snippet) or _EVENT.search(snippet)))
    return bool(_GENERAL.search(snippet))


def _plan(question: str) -> dict:
    q = question.lower()
    c = (
        "complex"
        if re.search(r"\b(would|likely|might|prefer|enjoy|think)\b", q)
        else "hybrid"
        if re.search(r"\b(how many|which|list|all|both)\b", q)
        else "simple"
    )
    return {"complexity": c, "keywords": planner.heuristic_keywords(question)}


def _query(question: str) -> dict:
    q = question.lower()
    ad = "time" if q.startswith("when") else "location" if q.startswith("where") else "content"
    return {
        "query_anchor": question.rstrip("?") + ".",
        "need_assistant_context": bool(re.search(r"\byou\b", q)),
        "dimension": {
            "target_memory_type": ["episodic"] if ad == "time" else ["fact"],
            "keywords": _keywords(question, 3),
            "time": "",
            "location": "",
        },
        "answer_dim": ad,
    }


def _gate(user: str) -> dict:
    complexity = re.search(r"Complexity: (\w+)", user).group(1)
    question = re.search(r"Question: (.*)", user).group(1)
    qwords = set(_keywords(question, 100))
    kept = [
        int(m.group(1)) for m in re.finditer(r"^(\d+)\. (.*)$", user, re.M) if qwords & set(_keywords(m.group(2), 100))
    ]
    return {"kept_ids": kept[: BUDGETS.get(complexity, 8)]}


def _consolidation(user: str) -> dict:
    """SUPERSEDE when the new record says "now"/"instead", MERGE when the two contents share half their
    words (the new wording kept), else KEEPBOTH."""
    old, new = (re.search(rf"{k} record: \[(\w+)\] \| ([^|]*)", user) for k in ("Existing", "New"))
    words = [set(_keywords(m.group(2), 100)) for m in (old, new)]
    if re.search(r"\b(now|instead)\b", new.group(2), re.I):
        return {"action": "SUPERSEDE", "merged": None}
    if words[0] and words[1] and len(words[0] & words[1]) >= 0.5 * len(words[0] | words[1]):
        dim = {
            "memory_type": new.group(1),
            "time": "",
            "location": "",
            "reason": "",
            "purpose": "",
            "keywords": sorted(words[1])[:3],
        }
        return {"action": "MERGE", "merged": {"content": new.group(2).strip(), "dimension": dim}}
    return {"action": "KEEPBOTH", "merged": None}


_PERSONA = re.compile(
    r"^Person ([AB]): ([^,]+), (\d+), (.*?), lives in (.*?)\. Traits: (.*?)\. Goals: (.*?)\. "
    r"Interests: (.*?)\.$",
    re.M,
)


def _dialogue(user: str) -> dict:
    """Sessions nine days apart from the asked start, the fewest asked messages each, the two people
    taking turns; every message says something about its speaker's persona, and one shares a photo."""
    people = [
        dict(zip(("name", "age", "job", "home", "traits", "goals", "interests"), m.groups()[1:]))
        for m in _PERSONA.finditer(user)
    ]
    n_sessions = int(re.search(r"^Sessions: (\d+)", user, re.M).group(1))
    fewest = int(re.search(r"^Messages per session: (\d+) to", user, re.M).group(1))
    n_questions = int(re.search(r"^Questions: (\d+)", user, re.M).group(1))
    start = datetime.fromisoformat(re.search(r"^First session: on or after (\S+?);", user, re.M).group(1))
    lines = (
        lambda p, o: f"Hi {o['name']}! I am still working as a {p['job']} in {p['home']}.",
        lambda p, o: f"Last weekend I spent a whole day on {p['interests'].split('; ')[0]} and loved it.",
        lambda p, o: f"I have decided to {p['goals'].split('; ')[0]} before the end of next year.",
        lambda p, o: f"Good to hear, {o['name']}. People say I am {p['traits'].split('; ')[0]}, which helps.",
    )
    sessions = []
    for s in range(n_sessions):
        turns = []
        for k in range(fewest):
            p, o = people[(s + k) % 2], people[(s + k + 1) % 2]
            caption = f"a photo of {p['name']}'s {p['interests'].split('; ')[-1]}" if (s, k) == (0, 1) else ""
            turns.append({"speaker": p["name"], "text": lines[(s + k) % len(lines)](p, o), "image_caption": caption})
        date = start + timedelta(days=9 * s, hours=s % 3)
        sessions.append({"date_time": date.strftime("%Y-%m-%dT%H:%M"), "turns": turns})
    asks = (
        lambda p: (f"What does {p['name']} do for a living?", p["job"]),
        lambda p: (f"Where does {p['name']} live?", p["home"]),
        lambda p: (f"What did {p['name']} decide to do?", p["goals"].split("; ")[0]),
    )
    questions = [dict(zip(("question", "answer"), asks[i % len(asks)](people[i % 2]))) for i in range(n_questions)]
    return {"sessions": sessions, "questions": questions}


def answer(messages: list[dict]) -> str:
    """The deterministic answer to a spec teacher (or student) request."""
    system, user = messages[0]["content"], messages[-1]["content"]
    after = lambda prefix: user.split(prefix, 1)[1].strip() if prefix in user else user  # noqa: E731
    if system.startswith(extractor.TEACHER_SYSTEM[:60]) or system in extractor.STUDENT_PROMPTS.values():
        out = _extraction(user)
    elif system in router.TEACHER_BINARY.values():
        label = next(k for k, v in router.TEACHER_BINARY.items() if v == system)
        out = {"present": type_decision(label, after("Snippet:"))}
    elif system in (router.TEACHER_SYSTEM, router.STUDENT_SYSTEM):
        out = {"labels": [lab for lab in router.LABELS if type_decision(lab, after("Snippet:"))]}
    elif system in (planner.TEACHER_SYSTEM, planner.STUDENT_SYSTEM):
        out = _plan(after("Question:"))
    elif system in (query_parser.TEACHER_SYSTEM, query_parser.STUDENT_SYSTEM):
        out = _query(after("Question:"))
    elif system in (gate.TEACHER_SYSTEM, gate.STUDENT_SYSTEM):
        out = _gate(user)
    elif system in (consolidator.TEACHER_SYSTEM, consolidator.STUDENT_SYSTEM):
        out = _consolidation(user)
    elif system in (segmenter.TEACHER_SYSTEM, segmenter.STUDENT_SYSTEM):
        target = next((ln for ln in user.splitlines() if ln.startswith("TARGET: ")), "").lower()
        shift = any(cue in target for cue in ("by the way", "anyway", "speaking of", "another thing"))
        out = {"intent": "CHANGE" if shift else "DEVELOP"}
    elif system in (querytyper.TEACHER_SYSTEM.format(k=querytyper.K), querytyper.STUDENT_SYSTEM.format(k=querytyper.K)):
        q = after("Question:").rstrip("?")
        out = {"memories": [f"User: {lead} {q.lower()}." for lead in ("I remember", "About", "Yes,", "So,", "Well,")]}
    elif system == dialogue_synthesis.TEACHER_SYSTEM:
        out = _dialogue(user)
    else:
        out = {"answer": "unknown task"}
    return json.dumps(out)


class FakeOpenAI:
    def __init__(
        self,
        latency: float = 0.0,
        api_key: str | None = None,
        hang_s: float = 3.0,
        retry_after: str = "1",
        model: str = "fake-teacher",
    ):
        self.latency, self.api_key, self.hang_s, self.retry_after, self.model = (
            latency,
            api_key,
            hang_s,
            retry_after,
            model,
        )
        self.requests = 0
        self.inflight = self.max_inflight = 0  # requests being answered now / at most at once
        self.log: list[dict] = []  # one entry per chat/completions request: index, hash, fault, body
        self._by_index: dict[int, str] = {}
        self._by_hash: dict[str, list] = {}  # hash -> [fault, remaining times or None for always]
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None

    # --- fault plan ---------------------------------------------------------------------------

    def add_fault(
        self, fault: str, index: int | None = None, content: list[dict] | str | None = None, times: int | None = 1
    ) -> None:
        """`content`: the request's messages (or their content_hash); `times` None = every time."""
        if fault not in FAULTS:
            raise ValueError(f"unknown fault {fault!r}; expected one of {FAULTS}")
        if index is not None:
            self._by_index[index] = fault
        else:
            h = content if isinstance(content, str) else content_hash(content)
            self._by_hash[h] = [fault, times]

    def clear_faults(self) -> None:
        self._by_index.clear()
        self._by_hash.clear()

    def _fault_for(self, index: int, h: str) -> str | None:
        if index in self._by_index:
            return self._by_index[index]
        entry = self._by_hash.get(h)
        if entry and (entry[1] is None or entry[1] > 0):
            if entry[1] is not None:
                entry[1] -= 1
            return entry[0]
        return None

    # --- server ---------------------------------------------------------------------------------

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}/v1"

    def start(self, port: int = 0) -> "FakeOpenAI":
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            disable_nagle_algorithm = True  # headers and body go out in two writes: no 40 ms delayed-ACK stall

            def log_message(self, *args):  # quiet: tests read counters, not logs
                pass

            def _send(self, status: int, payload, headers=None, raw: bytes | None = None):
                data = raw if raw is not None else json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json" if raw is None else "text/html")
                self.send_header("Content-Length", str(len(data)))
                for k, v in (headers or {}).items():
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):
                if self.path.rstrip("/").endswith("/models"):
                    self._send(200, {"object": "list", "data": [{"id": fake.model, "object": "model"}]})
                else:
                    self._send(404, {"error": {"message": "not found"}})

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
                if not self.path.rstrip("/").endswith("/chat/completions"):
                    return self._send(404, {"error": {"message": f"no route {self.path}"}})
                messages = body.get("messages") or []
                h = content_hash(messages)
                with fake._lock:
                    index = fake.requests
                    fake.requests += 1
                    fault = fake._fault_for(index, h)
                    fake.log.append({"index": index, "hash": h, "fault": fault, "body": body})
                if fake.api_key and self.headers.get("Authorization") != f"Bearer {fake.api_key}":
                    return self._send(401, {"error": {"message": "invalid api key"}})
                with fake._lock:
                    fake.inflight += 1
                    fake.max_inflight = max(fake.max_inflight, fake.inflight)
                try:
                    self._answer(fault, messages)
                except (BrokenPipeError, ConnectionResetError):  # the client gave up (timeout)
                    self.close_connection = True
                finally:
                    with fake._lock:
                        fake.inflight -= 1

            def _answer(self, fault, messages):
                if fake.latency:
                    time.sleep(fake.latency)
                if fault == "hang":
                    time.sleep(fake.hang_s)
                if fault == "drop":
                    self.close_connection = True
                    return
                if fault == "429":
                    return self._send(429, {"error": {"message": "rate limited"}}, {"Retry-After": fake.retry_after})
                if fault == "400":
                    return self._send(400, {"error": {"message": "bad request"}})
                if fault in ("500", "503"):
                    return self._send(int(fault), {"error": {"message": "server error"}})
                if fault == "bad_body":
                    return self._send(200, None, raw=b"<html>502 Bad Gateway</html>")
                text, finish = answer(messages), "stop"
                if fault == "malformed":
                    text = text.replace(":", ": :", 1)
                elif fault == "truncated":
                    text, finish = text[: len(text) // 2], "length"
                prompt_tokens = sum(len(m.get("content") or "") for m in messages) // 4
                self._send(
                    200,
                    {
                        "id": f"chatcmpl-{h_short(text)}",
                        "object": "chat.completion",
                        "created": 0,
                        "model": fake.model,
                        "choices": [
                            {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": finish}
                        ],
                        "usage": {
                            "prompt_tokens": prompt_tokens,
                            "completion_tokens": len(text) // 4,
                            "total_tokens": prompt_tokens + len(text) // 4,
                        },
                    },
                )

        class Server(ThreadingHTTPServer):
            daemon_threads = True
            request_queue_size = 256  # the default backlog of 5 drops SYNs under 64 concurrent clients (1 s stalls)

            def handle_error(self, request, client_address):  # a client that hung up is not news
                pass

        self._server = Server(("127.0.0.1", port), Handler)
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self) -> "FakeOpenAI":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def h_short(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:12]


if __name__ == "__main__":
    import argparse

    p = argparse.ArgumentParser(description="a fake OpenAI-compatible teacher on 127.0.0.1")
    p.add_argument("--port", type=int, default=8001)
    p.add_argument("--latency", type=float, default=0.0)
    a = p.parse_args()
    fake = FakeOpenAI(latency=a.latency).start(a.port)
    print(f"fake teacher on {fake.url} (Ctrl-C stops it)", flush=True)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        fake.stop()
