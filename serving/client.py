"""Client SDK: plug the memdistill endpoint into any memory stack.

    from serving.client import MemoryModels
    mm = MemoryModels("http://127.0.0.1:8000/v1")
    result = mm.extract(conversation)              # every window, concurrently
    for m in result.memories:
        print(m.record.content, m.turn_id, m.record.dimension.memory_type)
    q = mm.parse_query("Where did I go hiking last month?", "2023-06-01T10:00:00")

Requests use memspec's prompts, structured outputs with memspec's JSON Schema, thinking off; every
output goes through memspec's parser, so malformed model output never raises into the caller: it comes
back as `problems`. Transport failures raise typed errors (EndpointUnavailable, EndpointTimeout,
BadRequest) after bounded retries. Several base URLs are used round-robin (replicas).
"""

from __future__ import annotations

import itertools
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import openai

from memspec import extraction, memory_type, query_parse, recall_gate, recall_plan
from memspec.dialogue import WINDOW_PRESETS, Conversation, Window, windows
from memspec.jsonout import Problem
from memspec.render import CHAT_TEMPLATE_KWARGS


class MemoryModelsError(Exception):
    """Base of the SDK's transport errors."""


class EndpointUnavailable(MemoryModelsError):
    pass


class EndpointTimeout(MemoryModelsError):
    pass


class BadRequest(MemoryModelsError):
    pass


@dataclass
class ExtractedMemory:
    record: extraction.MemoryRecord
    conversation_id: str
    window_index: int
    turn_id: str  # pointer to the source turn
    speaker: str
    timestamp: str
    source_text: str | None = None  # the original turn (e.g. an assistant reply), when asked for


@dataclass
class ExtractionResult:
    memories: list[ExtractedMemory] = field(default_factory=list)
    problems: list[tuple[int, Problem]] = field(default_factory=list)  # (window index, problem)
    prompt_tokens: int = 0
    completion_tokens: int = 0


def chat_request(messages: list[dict], model: str, max_tokens: int, schema: dict | None = None,
                 name: str = "output") -> dict:
    """Keyword arguments for `openai.OpenAI().chat.completions.create`: greedy, thinking off, and
    structured output with `schema` when given. Every memdistill request is built here."""
    body = {"model": model, "messages": messages, "temperature": 0.0, "max_tokens": max_tokens,
            "extra_body": {"chat_template_kwargs": dict(CHAT_TEMPLATE_KWARGS)}}
    if schema is not None:
        body["response_format"] = {"type": "json_schema", "json_schema": {"name": name, "schema": schema}}
    return body


class MemoryModels:
    def __init__(self, base_url: str | list[str], api_key: str | None = None, model: str = "memdistill-extractor",
                 timeout: float = 120.0, max_retries: int = 2, max_concurrency: int = 8, structured: bool = True,
                 max_tokens: int = 1024):
        urls = [base_url] if isinstance(base_url, str) else list(base_url)
        # vLLM wants some key when it was started with one; "EMPTY" is the convention when it was not.
        self._clients = [openai.OpenAI(base_url=u, api_key=api_key or "EMPTY", timeout=timeout, max_retries=max_retries)
                         for u in urls]
        self._next = itertools.cycle(range(len(self._clients)))
        self._lock = threading.Lock()
        self.model, self.structured, self.max_tokens = model, structured, max_tokens
        self.max_concurrency = max_concurrency

    # --- transport ----------------------------------------------------------------------------

    def _client(self) -> openai.OpenAI:
        with self._lock:
            return self._clients[next(self._next)]

    def chat(self, messages: list[dict], schema: dict | None = None, name: str = "output",
             max_tokens: int | None = None):
        body = chat_request(messages, self.model, max_tokens or self.max_tokens, schema if self.structured else None, name)
        try:
            resp = self._client().chat.completions.create(**body)
        except openai.APITimeoutError as e:
            raise EndpointTimeout(f"the endpoint did not answer in time: {e}") from e
        except openai.APIConnectionError as e:
            raise EndpointUnavailable(f"cannot reach the endpoint: {e}") from e
        except openai.BadRequestError as e:
            raise BadRequest(str(e)) from e
        except openai.APIStatusError as e:
            raise MemoryModelsError(f"endpoint error {e.status_code}: {e}") from e
        text = resp.choices[0].message.content or ""
        usage = resp.usage
        return text, (usage.prompt_tokens if usage else 0), (usage.completion_tokens if usage else 0)

    # --- extraction ---------------------------------------------------------------------------

    def extract(self, source: Window | Conversation | list[Window], window: int | None = None,
                overlap: int | None = None, include_source_text: bool = False) -> ExtractionResult:
        """Validated records for one window, a list of windows, or a whole conversation (windowed with
        its style's preset unless window/overlap are given), with pointers to their source turns."""
        if isinstance(source, Conversation):
            size, ov = WINDOW_PRESETS[source.style]
            wins = windows(source, window or size, ov if overlap is None else overlap)
        else:
            wins = [source] if isinstance(source, Window) else list(source)
        schema = extraction.json_schema()
        with ThreadPoolExecutor(self.max_concurrency) as pool:
            outs = list(pool.map(lambda w: self.chat(extraction.chat_messages(w), schema, "memories"), wins))
        result = ExtractionResult()
        for w, (text, pt, ct) in zip(wins, outs):
            parsed = extraction.parse(text, w)
            result.prompt_tokens += pt
            result.completion_tokens += ct
            result.problems += [(w.window_index, p) for p in parsed.problems]
            for r in parsed.records:
                t = w.turn_for(r.source_id)
                result.memories.append(ExtractedMemory(r, w.conversation_id, w.window_index, t.turn_id, t.speaker,
                                                       t.timestamp.isoformat(), t.text if include_source_text else None))
        return result

    # --- the other models, through the served LM -----------------------------------------------

    def parse_query(self, question: str, question_date) -> query_parse.ParseResult:
        text, _, _ = self.chat(query_parse.chat_messages(question, question_date), query_parse.json_schema(), "query",
                               max_tokens=256)
        return query_parse.parse(text)

    def classify_types(self, texts: list[str]) -> list[memory_type.ParseResult]:
        with ThreadPoolExecutor(self.max_concurrency) as pool:
            outs = list(pool.map(lambda t: self.chat(memory_type.chat_messages(t), memory_type.json_schema(), "labels",
                                                     max_tokens=32)[0], texts))
        return [memory_type.parse(o) for o in outs]

    def plan(self, question: str, names=()) -> recall_plan.ParseResult:
        text, _, _ = self.chat(recall_plan.chat_messages(question), recall_plan.json_schema(), "plan", max_tokens=64)
        return recall_plan.parse(text, names=names)

    def gate(self, question: str, complexity: str, candidates: list[str]) -> recall_gate.ParseResult:
        text, _, _ = self.chat(recall_gate.chat_messages(question, complexity, candidates), recall_gate.json_schema(),
                               "gate", max_tokens=128)
        return recall_gate.parse(text, n_candidates=len(candidates), complexity=complexity)
