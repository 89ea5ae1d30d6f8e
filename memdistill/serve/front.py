"""The mem0 compatibility front: mem0's own `Memory.add()` answered by the compact extractor.

  memdistill front --config configs/serving/front.yaml [key=value ...]   (started by `memdistill serve`)

An OpenAI-compatible endpoint in front of the served models. mem0 2.2.1 (pinned in constraints.txt) makes
one chat call per `add()`: a ~33,600-character system prompt and a user prompt in sections (Summary, Last
k Messages, Recently Extracted Memories, Existing Memories, New Messages, Observation Date, Current Date),
in JSON mode, expecting `{"memory": [{"id", "text", "attributed_to", "linked_memory_ids"}]}`. The front
recognises that request by its sections, cuts the new messages into the extractor's training windows
(the last-k messages as their context), runs the compact extractor with structured outputs and answers
in mem0's format as a normal chat completion:
  text = the record's content; attributed_to = the role of the record's source message;
  linked_memory_ids = the Existing Memories whose text is within `link_threshold` MiniLM cosine of the record
  (mem0 2.2.1 OSS stores attributed_to and does not read the links; they are there for clients that do).
Every other request under /v1 goes to `upstream` unchanged (streaming included), so nothing mem0 asks goes
unanswered. Each request is logged (stderr and `log`, JSONL) with the prompt tokens mem0 sent, counted with
the extractor's tokenizer, and the tokens the compact model used. A model output that does not parse is an
empty memory list with its problem logged, never a 5xx; an unreachable extractor is a 502, which mem0
raises as LLMError, as it would for its own provider.
"""

from __future__ import annotations

import asyncio
import json
import re
import sys
import time
import uuid
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from memdistill.core.config import env_key, job_config
from memdistill.spec.dialogue import Turn, Window, choose_window

MEM0_VERSION = "2.2.1"  # the mem0ai release whose prompt these sections are read from (constraints.txt)
# mem0's generate_additive_extraction_prompt writes these "## " sections in this order, then "# Output:".
SECTIONS = (
    "Summary",
    "Last k Messages",
    "Recently Extracted Memories",
    "Existing Memories",
    "New Messages",
    "Observation Date",
    "Current Date",
)
OPTIONAL_SECTIONS = ("Custom Instructions", "Language Requirement")
# What mem0's ADDITIVE_EXTRACTION_PROMPT asks for: the answer's fields, stated in its system prompt.
SYSTEM_MARKERS = ('"memory"', "attributed_to", "linked_memory_ids", "Memory Extractor")
_ROLE_LINE = re.compile(r"^(user|assistant|system): ?(.*)$")
# "Caroline: text" / "Maria Lopez: text": a speaker name written into the content, as mem0's own multi-speaker
# example (and its LoCoMo evaluation) does; without one the role names the speaker.
_NAMED = re.compile(r"^([A-Z][\w.'-]*(?: [A-Z][\w.'-]*){0,2}): (.*)$", re.S)


@dataclass
class FrontConfig:
    host: str = "127.0.0.1"
    port: int = 8200
    # The served extractor (one base URL per replica) and its served model name.
    extractor_urls: list = field(default_factory=lambda: ["http://127.0.0.1:8000/v1"])
    model: str = "memdistill-extractor"
    # The extractor's directory (training windows and tokenizer); null = the root the endpoint reports.
    model_dir: str | None = None
    # Where unrecognised requests go, unchanged (any OpenAI-compatible base URL, e.g. the teacher);
    # null = the first extractor URL.
    upstream: str | None = None
    upstream_api_key_env: str | None = None  # replaces the caller's key on forwarded requests when set
    api_key_env: str | None = None  # the key callers must send (and the front sends the extractor)
    max_tokens: int = 384  # per window, as configs/eval/e2e_cpu.yaml
    link_threshold: float = 0.7  # MiniLM cosine for linked_memory_ids (the extraction metric's threshold)
    embedder: str = "embedded:minilm"
    log: str | None = "runs/front/requests.jsonl"


# --- recognising and reading mem0's request ------------------------------------------------------------------


@dataclass
class Mem0Request:
    new_messages: list[dict]  # {"role", "content"} in order; system lines dropped
    last_k: list[dict]
    existing: list[dict]  # [{"id", "text"}] as mem0 sent them
    observation_date: str
    problems: list[str] = field(default_factory=list)


def _sections(text: str) -> dict[str, str] | None:
    """{section: body} when `text` is mem0's additive-extraction user prompt, else None: every section
    present once, in mem0's order, then only the optional ones, then "# Output:"."""
    names = SECTIONS + OPTIONAL_SECTIONS
    heads = list(re.finditer(r"(?:^|\n\n)## (" + "|".join(map(re.escape, names)) + r")\n", text))
    found = [m.group(1) for m in heads]
    if found[: len(SECTIONS)] != list(SECTIONS) or any(n not in OPTIONAL_SECTIONS for n in found[len(SECTIONS) :]):
        return None
    # after Current Date mem0 writes only its optional sections: any other heading there is a format we do not know
    tail = text[heads[len(SECTIONS) - 1].end() :]
    if any(h not in OPTIONAL_SECTIONS for h in re.findall(r"(?:^|\n)## ([^\n]+)\n", tail)):
        return None
    if not text.rstrip().endswith("# Output:"):
        return None
    ends = [m.start() for m in heads[1:]] + [text.rstrip().rindex("# Output:")]
    return {m.group(1): text[m.end() : end].strip() for m, end in zip(heads, ends)}


def recognise(body: dict) -> Mem0Request | None:
    """mem0's additive-extraction call, read; None for any other request (it is forwarded)."""
    msgs = body.get("messages") if isinstance(body, dict) else None
    if body.get("stream") or not isinstance(msgs, list) or len(msgs) != 2:
        return None
    system, user = msgs
    if not all(isinstance(m, dict) and isinstance(m.get("content"), str) for m in msgs):
        return None
    if system.get("role") != "system" or user.get("role") != "user":
        return None
    if not all(k in system["content"] for k in SYSTEM_MARKERS):
        return None
    sec = _sections(user["content"])
    if sec is None:
        return None
    problems = []
    try:
        existing = json.loads(sec["Existing Memories"] or "[]")
        existing = [m for m in existing if isinstance(m, dict) and "id" in m and isinstance(m.get("text"), str)]
    except (json.JSONDecodeError, TypeError):
        existing, problems = [], ["existing_memories_unreadable"]
    return Mem0Request(
        _messages(sec["New Messages"]), _messages(sec["Last k Messages"]), existing, sec["Observation Date"], problems
    )


def _messages(text: str) -> list[dict]:
    """mem0 writes messages as `role: content` lines (content may span lines), or as a JSON list."""
    if text.startswith("["):
        try:
            items = json.loads(text)
            return [
                {"role": m["role"], "content": m["content"]}
                for m in items
                if isinstance(m, dict) and m.get("role") in ("user", "assistant") and isinstance(m.get("content"), str)
            ]
        except (json.JSONDecodeError, TypeError, KeyError):
            pass
    out: list[dict] = []
    for line in text.split("\n"):
        m = _ROLE_LINE.match(line)
        if m:
            out.append({"role": m.group(1), "content": m.group(2)})
        elif out:
            out[-1]["content"] += "\n" + line
    return [m for m in out if m["role"] != "system" and m["content"].strip()]


def _turn(msg: dict, turn_id: str, ts: datetime) -> Turn:
    m = _NAMED.match(msg["content"].strip())
    speaker, text = (m.group(1), m.group(2)) if m else (msg["role"].title(), msg["content"].strip())
    return Turn(turn_id, speaker, msg["role"], text, ts)


def mem0_windows(req: Mem0Request, trained: dict | None) -> tuple[list[Window], str | None]:
    """The new messages in the extractor's training windows: each window's first O messages are context
    (the last-k messages mem0 sent, then earlier new ones), the rest new, as in training."""
    try:
        ts = datetime.fromisoformat(req.observation_date.strip())
    except ValueError:
        ts = datetime.now().replace(microsecond=0)
        req.problems.append("observation_date_unreadable")
    ctx = [_turn(m, f"ctx-{k}", ts) for k, m in enumerate(req.last_k, 1)]
    new = [_turn(m, f"new-{k}", ts) for k, m in enumerate(req.new_messages, 1)]
    named = any(_NAMED.match(m["content"].strip()) for m in req.new_messages)
    size, ov, note = choose_window("multi-party" if named else "user-assistant", trained)
    step, wins = size - ov, []
    for start in range(0, len(new), step):
        context = (ctx + new[:start])[max(0, len(ctx) + start - ov) :] if ov else []
        wins.append(Window("mem0", len(wins), context + new[start : start + step], len(context) + 1))
    return wins, note


def mem0_answer(memories: list, windows: list[Window], links: list[list[str]]) -> dict:
    """Extracted memories -> mem0's output object; attributed_to is the role of each record's source message."""
    roles = {t.turn_id: t.role for w in windows for t in w.turns}
    return {
        "memory": [
            {"id": str(i), "text": m.record.content, "attributed_to": roles[m.turn_id], "linked_memory_ids": linked}
            for i, (m, linked) in enumerate(zip(memories, links))
        ]
    }


# --- the ASGI app ---------------------------------------------------------------------------------------------


class Front:
    def __init__(self, cfg: FrontConfig):
        from memdistill.serve.client import MemoryModels

        self.cfg = cfg
        self.key = env_key(cfg.api_key_env, "api_key_env")
        self.upstream_key = env_key(cfg.upstream_api_key_env, "upstream_api_key_env")
        self.upstream = (cfg.upstream or cfg.extractor_urls[0]).rstrip("/")
        self.mm = MemoryModels(
            cfg.extractor_urls, api_key=self.key, model=cfg.model, max_tokens=cfg.max_tokens, model_dir=cfg.model_dir
        )
        self._tokenizer = self._embedder = None
        self.log_path = Path(cfg.log) if cfg.log else None

    # the tokenizer and embedder load on first use: a front that only forwards needs neither
    def tokenizer(self):
        if self._tokenizer is None and self.model_root():
            from transformers import AutoTokenizer

            self._tokenizer = AutoTokenizer.from_pretrained(self.model_root())
        return self._tokenizer

    def model_root(self) -> str | None:
        root = self.cfg.model_dir or self.mm.served_root()
        return root if root and (Path(root) / "config.json").exists() else None

    def links(self, texts: list[str], existing: list[dict]) -> list[list[str]]:
        if not existing or not texts:
            return [[] for _ in texts]
        if self._embedder is None:
            from memdistill.core.embedder import Embedder
            from memdistill.core.models import model_path

            self._embedder = Embedder(model_path(self.cfg.embedder))
        sims = self._embedder(texts) @ self._embedder([m["text"] for m in existing]).T
        return [
            [str(existing[j]["id"]) for j in range(len(existing)) if row[j] >= self.cfg.link_threshold] for row in sims
        ]

    def answer_mem0(self, body: dict, req: Mem0Request) -> tuple[dict, dict]:
        from memdistill.spec.render import prompt_ids

        t0 = time.time()
        wins, note = mem0_windows(req, self.mm.training_windows())
        result = self.mm.extract(wins) if wins else None
        memories = result.memories if result else []
        answer = mem0_answer(memories, wins, self.links([m.record.content for m in memories], req.existing))
        tok = self.tokenizer()
        problems = req.problems + ([] if wins else ["no_new_messages"])
        problems += [p.code for _, p in (result.problems if result else [])]
        stats = {
            "mem0_prompt_tokens": len(prompt_ids(tok, body["messages"])) if tok else None,
            "compact_prompt_tokens": result.prompt_tokens if result else 0,
            "compact_completion_tokens": result.completion_tokens if result else 0,
            "windows": len(wins),
            "new_messages": len(req.new_messages),
            "memories": len(answer["memory"]),
            "problems": problems,
            "latency_s": round(time.time() - t0, 3),
        }
        if note:
            stats["note"] = note
        return answer, stats

    def log(self, entry: dict) -> None:
        line = json.dumps({"time": datetime.now().isoformat(timespec="seconds"), **entry})
        print(f"[front] {line}", file=sys.stderr, flush=True)
        if self.log_path:
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
            with open(self.log_path, "a") as f:
                f.write(line + "\n")

    def app(self):
        import httpx
        from starlette.applications import Starlette
        from starlette.background import BackgroundTask
        from starlette.responses import JSONResponse, StreamingResponse
        from starlette.routing import Route

        from memdistill.serve.client import MemoryModelsError

        client = httpx.AsyncClient(timeout=httpx.Timeout(600.0, connect=10.0))

        def error(status: int, message: str, kind: str) -> JSONResponse:
            return JSONResponse({"error": {"message": message, "type": kind, "code": status}}, status_code=status)

        async def health(request):
            return JSONResponse({"status": "ok", "mem0_version": MEM0_VERSION})

        async def v1(request):
            if self.key and request.headers.get("authorization") != f"Bearer {self.key}":
                return error(401, "missing or wrong API key", "unauthorized")
            rest = request.path_params["rest"]
            raw = await request.body()
            if request.method == "POST" and rest == "chat/completions":
                try:
                    body = json.loads(raw)
                except ValueError:
                    body = None
                req = recognise(body) if isinstance(body, dict) else None
                if req is not None:
                    try:
                        answer, stats = await asyncio.to_thread(self.answer_mem0, body, req)
                    except MemoryModelsError as e:  # the extractor is down: mem0 raises LLMError, as it should
                        self.log({"kind": "mem0_add", "error": str(e)})
                        return error(502, f"memdistill front: the extractor did not answer: {e}", "upstream_error")
                    self.log({"kind": "mem0_add", **stats})
                    return JSONResponse(_completion(answer, body.get("model") or self.cfg.model, stats))
            t0 = time.time()
            headers = {k: v for k, v in request.headers.items() if k.lower() not in ("host", "content-length")}
            if self.upstream_key:
                headers["authorization"] = f"Bearer {self.upstream_key}"
            up = client.build_request(
                request.method, f"{self.upstream}/{rest}", params=request.query_params, headers=headers, content=raw
            )
            try:
                r = await client.send(up, stream=True)
            except httpx.HTTPError as e:
                self.log({"kind": "forward", "path": rest, "error": repr(e)})
                return error(502, f"memdistill front: upstream {self.upstream} did not answer: {e!r}", "upstream_error")
            self.log(
                {"kind": "forward", "path": rest, "status": r.status_code, "latency_s": round(time.time() - t0, 3)}
            )
            drop = ("content-length", "transfer-encoding", "connection")
            return StreamingResponse(
                r.aiter_raw(),
                status_code=r.status_code,
                headers={k: v for k, v in r.headers.items() if k.lower() not in drop},
                background=BackgroundTask(r.aclose),
            )

        methods = ["GET", "POST", "PUT", "PATCH", "DELETE"]
        return Starlette(routes=[Route("/health", health), Route("/v1/{rest:path}", v1, methods=methods)])


def _completion(answer: dict, model: str, stats: dict) -> dict:
    """A chat completion carrying mem0's JSON; usage is what the compact model used, and `memdistill` says
    what mem0's prompt would have cost."""
    pt, ct = stats["compact_prompt_tokens"], stats["compact_completion_tokens"]
    return {
        "id": f"chatcmpl-memdistill-{uuid.uuid4().hex}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": json.dumps(answer, ensure_ascii=False)},
                "finish_reason": "stop",
            }
        ],
        "usage": {"prompt_tokens": pt, "completion_tokens": ct, "total_tokens": pt + ct},
        "memdistill": stats,
    }


def main(argv=None) -> int:
    import uvicorn

    cfg = job_config(FrontConfig, argv, "memdistill front", __doc__)
    front = Front(cfg)
    print(f"[front] mem0-compatible chat completions on http://{cfg.host}:{cfg.port}/v1 (mem0ai {MEM0_VERSION})")
    print(f"[front] extractor {cfg.extractor_urls} as {cfg.model!r}; anything else goes to {front.upstream}")
    uvicorn.run(front.app(), host=cfg.host, port=cfg.port, log_level="warning")
    return 0


if __name__ == "__main__":
    sys.exit(main())
