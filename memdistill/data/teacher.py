"""Teacher client: any OpenAI-compatible chat endpoint (a GPT-class API, or Qwen3 served by vLLM).

    teacher = Teacher(settings_from_dict(cfg.teacher), cache_dir=".cache/teacher")
    async with teacher:
        reply = await teacher.complete(messages, schema=extractor.json_schema(), name="memories")

- Endpoints: one or several base URLs. Each request goes to the endpoint with the fewest requests in
  flight (ties broken round-robin); an endpoint that just dropped a connection sits out a short
  cool-down unless every endpoint does.
- Concurrency: one semaphore bounds the requests in flight over all endpoints.
- Retries: 429, 408, 5xx, timeouts, dropped connections and unreadable response bodies are retried
  with exponential back-off and full jitter; a Retry-After header (seconds or an HTTP date) is a lower
  bound on the wait. Other 4xx are the request's own fault and not retried (the caller rejects the
  item); 401, 403 and 404 raise TeacherFatal because every later request would fail the same way.
- Request body: built by memdistill.spec.request.chat_request (greedy, the spec's JSON Schema as
  `response_format`), then adjusted to `structured`: json_schema (structured outputs), json_object
  (JSON mode, for endpoints without schema support) or none. `qwen3_no_think` sends
  memdistill.spec.render.CHAT_TEMPLATE_KWARGS (enable_thinking false); turn it off for APIs that reject
  unknown fields.
- Cache: sqlite in WAL mode (synchronous NORMAL), keyed by sha256 of the request body (model, messages, generation
  parameters, response_format), never by the key or URL; a reply is committed before it is returned,
  so a rerun pays only for requests that never completed. Identical requests in flight are sent once.
- API key: read from the environment variable named by `api_key_env`, used only in the Authorization
  header; error text that contains it is redacted.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import json
import random
import sqlite3
import time
from collections import Counter
from dataclasses import dataclass, field
from email.utils import parsedate_to_datetime
from pathlib import Path

import httpx

from memdistill.core.config import ConfigError, env_key, from_mapping
from memdistill.spec.request import chat_request

STRUCTURED = ("json_schema", "json_object", "none")
RETRY_STATUS = {408, 409, 425, 429}  # plus every 5xx
FATAL_STATUS = {401, 403, 404}
ENDPOINT_COOLDOWN_S = 5.0


@dataclass
class TeacherSettings:
    base_urls: list
    model: str
    api_key_env: str | None = None  # the NAME of an environment variable; the key itself never goes in a config
    structured: str = "json_schema"
    qwen3_no_think: bool = True
    concurrency: int = 8
    timeout_s: float = 120.0  # whole request, connect to last byte
    max_retries: int = 6
    backoff_s: float = 1.0  # full-jitter back-off: uniform(0, min(backoff_max_s, backoff_s * 2**attempt))
    backoff_max_s: float = 60.0
    retry_after_max_s: float = (
        300.0  # a Retry-After beyond this is capped (a misbehaving proxy must not stall the job for a day)
    )
    max_tokens: int = 4096  # extraction; the short-answer jobs use their own smaller caps
    temperature: float = 0.0
    price_input_per_1m: float = 0.0  # USD per million prompt tokens, for the cost estimate
    price_output_per_1m: float = 0.0


def settings_from_dict(d: dict, where: str = "teacher") -> TeacherSettings:
    """The `teacher:` mapping of a data config -> TeacherSettings; unknown keys are an error."""
    if not isinstance(d, dict):
        raise ConfigError(f"{where}: should be a mapping, got {d!r}")
    if "api_key" in d:
        raise ConfigError(f"{where}: never put an API key in a config; name its environment variable in api_key_env")
    s = from_mapping(TeacherSettings, d, where)
    if not s.base_urls or not all(isinstance(u, str) and u.startswith(("http://", "https://")) for u in s.base_urls):
        raise ConfigError(f"{where}: base_urls should be a non-empty list of http(s) URLs")
    if s.structured not in STRUCTURED:
        raise ConfigError(f"{where}: structured {s.structured!r} is not one of {STRUCTURED}")
    if s.concurrency < 1 or s.max_retries < 0 or s.timeout_s <= 0:
        raise ConfigError(f"{where}: need concurrency >= 1, max_retries >= 0, timeout_s > 0")
    return s


class TeacherError(Exception):
    """A request that failed for good. `code` is stable: http_<status>, timeout, connection, bad_response."""

    def __init__(self, code: str, detail: str = ""):
        super().__init__(f"{code}: {detail}" if detail else code)
        self.code, self.detail = code, detail


def transport_rejection(e: TeacherError) -> dict:
    """The log fields of an item whose request failed for good: nothing was paid, so a rerun with
    retry_transport asks again."""
    return {
        "status": "rejected",
        "reasons": [f"transport_{e.code}"],
        "detail": e.detail[:300],
        "problems": [],
        "usage": {"prompt_tokens": 0, "completion_tokens": 0},
        "cached": False,
    }


class TeacherFatal(TeacherError):
    """Every request would fail the same way (bad key, wrong model or URL): stop the job."""


@dataclass
class Reply:
    text: str
    finish_reason: str | None
    prompt_tokens: int
    completion_tokens: int
    cached: bool = False  # served from the cache (or shared with an identical request in flight): nothing paid


@dataclass
class Stats:
    requests: int = 0  # HTTP attempts, retries included
    retries: int = 0
    cache_hits: int = 0
    prompt_tokens: int = 0  # paid in this run (fresh replies only)
    completion_tokens: int = 0
    retry_codes: Counter = field(default_factory=Counter)
    failures: Counter = field(default_factory=Counter)  # requests given up, by code

    def to_json(self, s: TeacherSettings) -> dict:
        return {
            "requests": self.requests,
            "retries": self.retries,
            "cache_hits": self.cache_hits,
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "cost_usd": round(cost(s, self.prompt_tokens, self.completion_tokens), 6),
            "retry_codes": dict(self.retry_codes),
            "failures": dict(self.failures),
        }


def cost(s: TeacherSettings, prompt_tokens: int, completion_tokens: int) -> float:
    return prompt_tokens / 1e6 * s.price_input_per_1m + completion_tokens / 1e6 * s.price_output_per_1m


def cache_key(body: dict) -> str:
    return hashlib.sha256(json.dumps(body, sort_keys=True, ensure_ascii=False).encode()).hexdigest()


def retry_after_seconds(value: str | None) -> float | None:
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        return max(0.0, parsedate_to_datetime(value).timestamp() - time.time())
    except (TypeError, ValueError):
        return None


class ReplyCache:
    """Replies by request hash, in sqlite (WAL). A committed row survives kill -9 of the writer."""

    def __init__(self, path: Path):
        path.parent.mkdir(parents=True, exist_ok=True)
        self.db = sqlite3.connect(str(path), isolation_level=None, check_same_thread=False, timeout=30)
        self.db.execute("PRAGMA journal_mode=WAL")
        # NORMAL in WAL mode: a committed reply is in the OS before put() returns, so it survives kill -9
        # of this process (only a power cut could lose the last few); FULL would fsync every reply.
        self.db.execute("PRAGMA synchronous=NORMAL")
        self.db.execute("CREATE TABLE IF NOT EXISTS replies (key TEXT PRIMARY KEY, reply TEXT NOT NULL)")

    def get(self, key: str) -> dict | None:
        row = self.db.execute("SELECT reply FROM replies WHERE key = ?", (key,)).fetchone()
        return json.loads(row[0]) if row else None

    def put(self, key: str, reply: dict) -> None:
        self.db.execute("INSERT OR REPLACE INTO replies (key, reply) VALUES (?, ?)", (key, json.dumps(reply)))

    def __len__(self) -> int:
        return self.db.execute("SELECT COUNT(*) FROM replies").fetchone()[0]

    def close(self) -> None:
        self.db.close()


@dataclass
class _Endpoint:
    index: int
    url: str
    inflight: int = 0
    down_until: float = 0.0


class Teacher:
    def __init__(self, settings: TeacherSettings, cache_dir, api_key: str | None = None):
        """`api_key` is for tests and embedding; jobs pass None and the key comes from `api_key_env`."""

        self.s = settings
        if api_key is None:
            api_key = env_key(settings.api_key_env, "teacher (api_key_env)")
        self._key = api_key or None
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._eps = [_Endpoint(i, u.rstrip("/")) for i, u in enumerate(settings.base_urls)]
        self._rr = 0
        self.cache = ReplyCache(Path(cache_dir) / "replies.sqlite")
        self.stats = Stats()
        self._inflight: dict[str, asyncio.Future] = {}
        self._sem: asyncio.Semaphore | None = None
        self._http: httpx.AsyncClient | None = None

    async def __aenter__(self) -> "Teacher":
        n = self.s.concurrency
        self._sem = asyncio.Semaphore(n)
        self._http = httpx.AsyncClient(
            timeout=httpx.Timeout(self.s.timeout_s),
            limits=httpx.Limits(max_connections=n * len(self._eps), max_keepalive_connections=n),
        )
        return self

    async def __aexit__(self, *exc) -> None:
        await self._http.aclose()
        self.cache.close()

    def redact(self, text: str) -> str:
        return text.replace(self._key, "[redacted]") if self._key and text else text

    def request_body(self, messages: list[dict], schema: dict | None, name: str, max_tokens: int | None) -> dict:
        s = self.s
        kwargs = chat_request(
            messages, s.model, max_tokens or s.max_tokens, schema if s.structured == "json_schema" else None, name
        )
        body = {k: v for k, v in kwargs.items() if k != "extra_body"}
        body["temperature"] = s.temperature
        if s.qwen3_no_think:
            body.update(kwargs["extra_body"])
        if s.structured == "json_object":
            body["response_format"] = {"type": "json_object"}
        return body

    async def complete(
        self, messages: list[dict], schema: dict | None = None, name: str = "output", max_tokens: int | None = None
    ) -> Reply:
        body = self.request_body(messages, schema, name, max_tokens)
        key = cache_key(body)
        hit = self.cache.get(key)
        if hit is not None:
            self.stats.cache_hits += 1
            return Reply(**hit, cached=True)
        if key in self._inflight:
            self.stats.cache_hits += 1
            return dataclasses.replace(await asyncio.shield(self._inflight[key]), cached=True)
        fut = asyncio.get_running_loop().create_future()
        fut.add_done_callback(lambda f: f.cancelled() or f.exception())  # no "never retrieved" warnings
        self._inflight[key] = fut
        try:
            reply = await self._fetch(body)
            self.cache.put(key, {k: v for k, v in dataclasses.asdict(reply).items() if k != "cached"})
            fut.set_result(reply)
            return reply
        except asyncio.CancelledError:
            fut.cancel()
            raise
        except BaseException as e:
            fut.set_exception(e)
            raise
        finally:
            del self._inflight[key]

    def _pick(self) -> _Endpoint:
        now = time.monotonic()
        ready = [e for e in self._eps if e.down_until <= now] or self._eps
        self._rr += 1
        n = len(self._eps)
        return min(ready, key=lambda e: (e.inflight, (e.index - self._rr) % n))

    async def _fetch(self, body: dict) -> Reply:
        s = self.s
        for attempt in range(s.max_retries + 1):
            wait_at_least = 0.0
            async with self._sem:
                ep = self._pick()
                ep.inflight += 1
                self.stats.requests += 1
                try:
                    r = await asyncio.wait_for(
                        self._http.post(f"{ep.url}/chat/completions", json=body, headers=self._headers), s.timeout_s
                    )
                    err = None
                except (asyncio.TimeoutError, httpx.TimeoutException):
                    err = TeacherError("timeout", f"no complete answer within {s.timeout_s:g} s")
                except httpx.TransportError as e:  # refused, reset, dropped mid-response
                    ep.down_until = time.monotonic() + ENDPOINT_COOLDOWN_S
                    err = TeacherError("connection", self.redact(f"{type(e).__name__}: {e}"))
                finally:
                    ep.inflight -= 1
            if err is None:
                if r.status_code == 200:
                    try:
                        return self._reply(r)
                    except (ValueError, KeyError, IndexError, TypeError) as e:
                        err = TeacherError("bad_response", f"unreadable 200 response ({type(e).__name__})")
                else:
                    detail = self.redact(r.text[:300])
                    if r.status_code in FATAL_STATUS:
                        raise TeacherFatal(
                            f"http_{r.status_code}", f"{detail} (check model, base_urls and api_key_env)"
                        )
                    err = TeacherError(f"http_{r.status_code}", detail)
                    if not (r.status_code in RETRY_STATUS or r.status_code >= 500):
                        self.stats.failures[err.code] += 1
                        raise err
                    wait_at_least = min(retry_after_seconds(r.headers.get("retry-after")) or 0.0, s.retry_after_max_s)
            if attempt == s.max_retries:
                self.stats.failures[err.code] += 1
                raise err
            self.stats.retries += 1
            self.stats.retry_codes[err.code] += 1
            await asyncio.sleep(max(wait_at_least, random.uniform(0, min(s.backoff_max_s, s.backoff_s * 2**attempt))))
        raise AssertionError("unreachable")  # pragma: no cover

    def _reply(self, r: httpx.Response) -> Reply:
        data = r.json()
        choice = data["choices"][0]
        usage = data.get("usage") or {}
        reply = Reply(
            text=choice["message"].get("content") or "",
            finish_reason=choice.get("finish_reason"),
            prompt_tokens=int(usage.get("prompt_tokens") or 0),
            completion_tokens=int(usage.get("completion_tokens") or 0),
        )
        self.stats.prompt_tokens += reply.prompt_tokens
        self.stats.completion_tokens += reply.completion_tokens
        return reply
