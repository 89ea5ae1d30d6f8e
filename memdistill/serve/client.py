"""Client SDK: plug the memdistill endpoint into any memory stack.

    from memdistill.serve.client import MemoryModels
    mm = MemoryModels("http://127.0.0.1:8000/v1")
    result = mm.extract(conversation)              # every window, concurrently
    for m in result.memories:
        print(m.record.content, m.turn_id, m.record.dimension.memory_type)
    q = mm.parse_query("Where did I go hiking last month?", "2023-06-01T10:00:00")

Requests use the spec's prompts, structured outputs with the spec's JSON Schema, thinking off; every
output goes through the spec's parser, so malformed model output never raises into the caller: it comes
back as `problems`. Transport failures raise typed errors (EndpointUnavailable, EndpointTimeout,
BadRequest) after bounded retries. Several base URLs are used round-robin (replicas).

The encoders (`memdistill serve` starts each on its own vLLM pooling server) answer in milliseconds:

    mm = MemoryModels("http://127.0.0.1:8000/v1", router_url="http://127.0.0.1:8100",
                      planner_url="http://127.0.0.1:8101", gate_url="http://127.0.0.1:8102")
    mm.classify_types(["Last Friday I presented my thesis in Lyon."])   # POST /classify on the router
    mm.plan("Would Maya enjoy a beach holiday?", names=["Maya"])        # POST /classify on the planner
    mm.gate("When did Tom adopt his dog?", "simple", candidates)        # POST /score on the gate
    mm.consolidate(new_record, existing_record)                         # POST /classify on the consolidator

With an encoder URL set, that method uses the encoder (base_url may then be None); without, it prompts
the LM. The exported router and gate carry their dev-tuned thresholds folded into the classifier bias,
so 0.5 is the cut on served probabilities (see training/encoder.py).
"""

from __future__ import annotations

import itertools
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import httpx
import openai

from memdistill.core.models import trained_prompt, trained_windows
from memdistill.spec import (
    ENCODERS,
    consolidator,
    extractor,
    gate,
    planner,
    query_parser,
    querytyper,
    router,
    segmenter,
    summarizer,
)
from memdistill.spec.dialogue import Conversation, Window, choose_window, windows
from memdistill.spec.jsonout import Problem
from memdistill.spec.request import chat_request


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
    record: extractor.MemoryRecord
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
    windows: dict = field(default_factory=dict)  # style -> (W, O) a conversation was cut with
    notes: list[str] = field(default_factory=list)  # e.g. a window the model was not trained on


def as_window(item) -> Window:
    if isinstance(item, Window):
        return item
    if isinstance(item, dict):
        try:
            return Window.from_json(item)
        except (KeyError, TypeError, ValueError) as e:
            raise TypeError(f"not a window line as `memdistill windows` prints it: {e!r}") from None
    raise TypeError(f"expected a Window or a window line (dict), got {type(item).__name__}")


class MemoryModels:
    def __init__(
        self,
        base_url: str | list[str] | None,
        api_key: str | None = None,
        model: str = "memdistill-extractor",
        timeout: float = 120.0,
        max_retries: int = 2,
        max_concurrency: int = 8,
        structured: bool = True,
        max_tokens: int = 1024,
        encoder_urls: dict[str, str] | None = None,
        windows: dict | None = None,
        model_dir: str | None = None,
        qwen3_no_think: bool = True,
        student_prompt: str | None = None,
        **named_urls: str | None,
    ):
        """`windows` ({style: [[W, O], ...]}) and `student_prompt` (a name in `extractor.STUDENT_PROMPTS`)
        say what the extractor was trained with, or `model_dir` (a merged model or adapter directory) holds
        both in its metadata; without them, `extract` asks the endpoint which model it serves and reads that
        model's metadata when the directory is readable here (else: the paper windows, prompt "student").
        `qwen3_no_think=False` leaves vLLM's chat_template_kwargs out of requests (APIs such as OpenAI's
        reject unknown fields). Encoders: `encoder_urls` ({name: server root URL}) or `<name>_url=` for any
        name in the spec's table (`router_url=...`); an encoder without a URL is answered by the LM."""
        urls = [base_url] if isinstance(base_url, str) else list(base_url or [])
        # encoder name -> server root URL (/classify and /score live at the root, not under /v1)
        unknown = [k for k in named_urls if not (k.endswith("_url") and k.removesuffix("_url") in ENCODERS)]
        if unknown:
            raise TypeError(f"MemoryModels: unknown argument(s) {unknown}; encoder URLs are <name>_url for {ENCODERS}")
        given = {**(encoder_urls or {}), **{k.removesuffix("_url"): v for k, v in named_urls.items()}}
        self.encoder_urls = {n: u.rstrip("/") for n, u in given.items() if u}
        if set(self.encoder_urls) - set(ENCODERS):
            raise TypeError(f"MemoryModels: encoder_urls names {sorted(set(self.encoder_urls) - set(ENCODERS))}, "
                            f"not in {ENCODERS}")  # fmt: skip
        # connection failures are retried by the transport; HTTP errors are answers and are not
        self._http = httpx.Client(
            timeout=timeout,
            transport=httpx.HTTPTransport(retries=max_retries),
            headers={"Authorization": f"Bearer {api_key}"} if api_key else None,
        )
        # vLLM wants some key when it was started with one; "EMPTY" is the convention when it was not.
        self._clients = [
            openai.OpenAI(base_url=u, api_key=api_key or "EMPTY", timeout=timeout, max_retries=max_retries)
            for u in urls
        ]
        self._next = itertools.cycle(range(len(self._clients)))
        self._lock = threading.Lock()
        self.model, self.structured, self.max_tokens = model, structured, max_tokens
        self.max_concurrency, self.qwen3_no_think = max_concurrency, qwen3_no_think
        if student_prompt is not None and student_prompt not in extractor.STUDENT_PROMPTS:
            raise ValueError(f"student_prompt {student_prompt!r}: expected one of {sorted(extractor.STUDENT_PROMPTS)}")
        self._windows, self._prompt = windows, student_prompt
        self._windows_known = windows is not None
        self._model_dir = model_dir
        self._root: str | None = None

    # --- transport ----------------------------------------------------------------------------

    def _client(self) -> openai.OpenAI:
        if not self._clients:
            raise MemoryModelsError("no LM endpoint configured (base_url is None)")
        with self._lock:
            return self._clients[next(self._next)]

    def chat(
        self, messages: list[dict], schema: dict | None = None, name: str = "output", max_tokens: int | None = None
    ):
        body = chat_request(
            messages, self.model, max_tokens or self.max_tokens, schema if self.structured else None, name
        )
        if not self.qwen3_no_think:
            body.pop("extra_body")
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

    def trained_dir(self) -> str | None:
        """Where the extractor's metadata is read: `model_dir`, else the directory the endpoint serves."""
        if self._model_dir is None:
            self._model_dir = self.served_root() or ""
        return self._model_dir or None

    def training_windows(self) -> dict | None:
        """The extractor's training windows ({style: [[W, O], ...]}), or None when they cannot be known."""
        # read once: the mem0 front asks on every add, and a model without windows must not mean a read each time
        if not self._windows_known:
            self._windows_known = True
            d = self.trained_dir()
            self._windows = trained_windows(d) if d else None
        return self._windows

    def student_prompt(self) -> str:
        """The student prompt `extract` sends: the one the extractor was trained with."""
        if self._prompt is None:
            d = self.trained_dir()
            self._prompt = trained_prompt(d) if d else "student"
        return self._prompt

    def served_root(self) -> str | None:
        """The directory the endpoint serves `model` from (vLLM's /v1/models `root`), when it says."""
        if self._root is None:
            try:
                roots = [getattr(m, "root", None) for m in self._client().models.list().data if m.id == self.model]
            except (openai.OpenAIError, MemoryModelsError):
                roots = []
            self._root = next((r for r in roots if r), "")
        return self._root or None

    def extract(
        self, source, window: int | None = None, overlap: int | None = None, include_source_text: bool = False
    ) -> ExtractionResult:
        """Validated records, with pointers to their source turns, for a whole conversation, one window or
        a list of windows (a Window, or a window line as `memdistill windows` prints it).

        A conversation is cut with the windows the model was trained on for its style (see
        `training_windows`); an explicit window/overlap wins. A window the model was not trained on is
        allowed and reported in `result.notes`."""
        result = ExtractionResult()
        if isinstance(source, Conversation):
            size, ov, note = choose_window(source.style, self.training_windows(), window, overlap)
            wins = windows(source, size, ov)
            result.windows[source.style] = (size, ov)
            if note:
                result.notes.append(note)
        else:
            items = [source] if isinstance(source, (Window, dict)) else source
            if not isinstance(items, (list, tuple)):
                raise TypeError(
                    f"extract() takes a Conversation, a Window, a window line (dict) or a list of them, "
                    f"not {type(source).__name__}"
                )
            wins = [as_window(w) for w in items]
        prompt = self.student_prompt()
        with ThreadPoolExecutor(self.max_concurrency) as pool:
            outs = list(
                pool.map(
                    lambda w: self.chat(extractor.chat_messages(w, prompt), extractor.json_schema(w), "memories"),
                    wins,
                )
            )
        for w, (text, pt, ct) in zip(wins, outs):
            parsed = extractor.parse(text, w)
            result.prompt_tokens += pt
            result.completion_tokens += ct
            if ct >= self.max_tokens:  # what the parser salvaged is kept; the cut is reported
                result.problems.append((w.window_index, Problem("token_cap", f"output ran to {ct} tokens, the cap")))
            result.problems += [(w.window_index, p) for p in parsed.problems]
            for r in parsed.records:
                t = w.turn_for(r.source_id)
                result.memories.append(
                    ExtractedMemory(
                        r,
                        w.conversation_id,
                        w.window_index,
                        t.turn_id,
                        t.speaker,
                        t.timestamp.isoformat(),
                        t.text if include_source_text else None,
                    )
                )
        return result

    # --- the encoders (vLLM pooling servers) -----------------------------------------------------

    def _pool(self, name: str, path: str, body: dict) -> dict:
        url = self.encoder_urls.get(name)
        if url is None:
            raise MemoryModelsError(f"no {name} endpoint configured ({name}_url)")
        try:
            r = self._http.post(f"{url}{path}", json={"model": f"memdistill-{name}", **body})
        except httpx.TimeoutException as e:
            raise EndpointTimeout(f"the {name} endpoint {url} did not answer in time: {e}") from e
        except httpx.TransportError as e:
            raise EndpointUnavailable(f"cannot reach the {name} endpoint {url}: {e}") from e
        if r.status_code >= 400:
            try:
                msg = r.json()["error"]["message"]
            except (ValueError, KeyError, TypeError):
                msg = r.text[:500]
            err = BadRequest if 400 <= r.status_code < 500 else MemoryModelsError
            raise err(f"{name} {path}: HTTP {r.status_code}: {msg}")
        return r.json()

    def classify(self, name: str, texts: list[str]) -> list[list[float]]:
        """Probabilities from an encoder's `/classify`, one vector per text in id2label order (router:
        sigmoid per label, thresholds folded in; planner: softmax over COMPLEXITIES)."""
        if not texts:
            return []
        data = self._pool(name, "/classify", {"input": list(texts)})["data"]
        return [d["probs"] for d in sorted(data, key=lambda d: d["index"])]

    def keep_scores(self, question: str, complexity: str, candidates: list[str]) -> list[float]:
        """Keep probabilities from the gate's `/score` for (pair_query(question, complexity), candidate)."""
        if not candidates:
            return []
        data = self._pool(
            "gate", "/score", {"text_1": gate.pair_query(question, complexity), "text_2": list(candidates)}
        )["data"]
        return [d["score"] for d in sorted(data, key=lambda d: d["index"])]

    # --- the other models: the encoder when its URL is set, else the served LM -------------------

    def parse_query(self, question: str, question_date) -> query_parser.ParseResult:
        text, _, _ = self.chat(
            query_parser.chat_messages(question, question_date), query_parser.json_schema(), "query", max_tokens=256
        )
        return query_parser.parse(text)

    def classify_types(self, texts: list[str]) -> list[router.ParseResult]:
        if "router" in self.encoder_urls:
            probs = self.classify("router", [router.encoder_text(t) for t in texts])
            return [router.ParseResult(labels=router.from_probs(p)) for p in probs]
        with ThreadPoolExecutor(self.max_concurrency) as pool:
            outs = list(
                pool.map(
                    lambda t: self.chat(router.chat_messages(t), router.json_schema(), "labels", max_tokens=32)[0],
                    texts,
                )
            )
        return [router.parse(o) for o in outs]

    def plan(self, question: str, names=(), keywords: str = "heuristic") -> planner.ParseResult:
        """With the planner encoder, keywords come from `planner.heuristic_keywords` ("heuristic") or
        from the LM query parser ("query_parser": one more LM call; the heuristic when it fails)."""
        if "planner" in self.encoder_urls:
            probs = self.classify("planner", [" ".join(question.split())])[0]
            complexity = planner.complexity_of(probs)
            kws, problems = planner.heuristic_keywords(question, names), []
            if keywords == "query_parser":
                q = self.parse_query(question, None)
                found = planner.drop_names(q.query.dimension.keywords, names)[: planner.MAX_KEYWORDS] if q.ok else []
                if found:
                    kws = found
                else:
                    problems.append(Problem("keywords_heuristic", "the query parser gave no keywords; heuristic used"))
            elif keywords != "heuristic":
                raise ValueError(f"keywords={keywords!r}: expected 'heuristic' or 'query_parser'")
            return planner.ParseResult(planner.RecallPlan(complexity=complexity, keywords=kws), problems)
        text, _, _ = self.chat(planner.chat_messages(question), planner.json_schema(), "plan", max_tokens=64)
        return planner.parse(text, names=names)

    def gate(self, question: str, complexity: str, candidates: list[str]) -> gate.ParseResult:
        if "gate" in self.encoder_urls:
            return gate.ParseResult(gate.select(self.keep_scores(question, complexity, candidates), complexity))
        text, _, _ = self.chat(
            gate.chat_messages(question, complexity, candidates),
            gate.json_schema(),
            "gate",
            max_tokens=128,
        )
        return gate.parse(text, n_candidates=len(candidates), complexity=complexity)

    def topic_changes(self, turns: list) -> list[bool]:
        """A session's utterances (spec.dialogue.Turn, in order) -> whether each opens a topic (TraceMem's
        CHANGE_TOPIC); the first opens the session's first episode. Segmenter: one /classify request; without
        it, the LM answers per utterance. Cut episodes with `segmenter.episodes`."""
        idx = segmenter.decisions(turns)
        if not idx:
            return [True] if turns else []
        if "segmenter" in self.encoder_urls:
            probs = self.classify("segmenter", [segmenter.encoder_text(*segmenter.context(turns, i)) for i in idx])
            return [True] + [segmenter.label_of(p) == "CHANGE" for p in probs]

        with ThreadPoolExecutor(self.max_concurrency) as pool:
            return [True] + list(pool.map(lambda i: self.topic_change(*segmenter.context(turns, i)).change, idx))

    def query_type(self, question: str) -> str:
        """MemoType's query type of a question (EM / PM / GM / none; memdistill.spec.querytyper): the query
        typer's one /classify call when served, else MemoType's own procedure: the LM writes K hypothetical
        memories and the type router's majority vote over them decides (none when the LM writes nothing)."""
        if "querytyper" in self.encoder_urls:
            return querytyper.label_of(self.classify("querytyper", [querytyper.encoder_text(question)])[0])
        memories = self.hypothetical_memories(question).memories
        if not memories:
            return querytyper.NONE
        if "router" in self.encoder_urls:
            return querytyper.vote(self.classify("router", [router.encoder_text(m) for m in memories]))
        labels = [r.labels or [] for r in self.classify_types(memories)]
        return querytyper.vote([router.to_vector(x) for x in labels])

    def hypothetical_memories(self, question: str, k: int | None = None) -> querytyper.ParseResult:
        """The LM's k (default querytyper.K) hypothetical one-sentence messages that would answer `question`
        (MemoType Eq. 2)."""
        k = k or querytyper.K  # a default argument would read this class's query_type method, not the module
        text, _, _ = self.chat(querytyper.chat_messages(question, k=k), querytyper.json_schema(k), "memories", 400)
        return querytyper.parse(text, k)

    def topic_change(self, before: list[str], target: str, after: list[str]) -> segmenter.ParseResult:
        """The LM's decision for one utterance (lines as `segmenter.context` renders them)."""
        text, _, _ = self.chat(segmenter.chat_messages(before, target, after), segmenter.json_schema(), "intent", 16)
        return segmenter.parse(text)

    def summarize(self, request: dict, prompt: str = "student", max_tokens: int | None = None):
        """One memory-tree node (`memdistill.spec.summarizer.request` builds what it holds) -> its ParseResult
        (text, level-5 profile, problems): the level summarizer, or any LM asked with the same prompt."""
        level = request["level"]
        cap = max_tokens or summarizer.MAX_TOKENS[level]
        text, _, _ = self.chat(summarizer.chat_messages(request, prompt), summarizer.json_schema(level), "node", cap)
        return summarizer.parse(text, level, request["people"])

    def consolidate(self, new, existing) -> consolidator.ParseResult:
        """One memory-update decision for (new, existing) records (StoredRecord, or dicts with content,
        dimension, source_speaker, source_timestamp). MERGE comes with a merged record: the LM's when it
        wrote a usable one, else `consolidator.merge_rule`."""
        return self.consolidate_pairs([(new, existing)])[0]

    def consolidate_pairs(self, pairs) -> list[consolidator.ParseResult]:
        """Decisions for many pairs (the consolidator: one /classify request; the LM: concurrent chats)."""
        pairs = [tuple(r if isinstance(r, consolidator.StoredRecord) else consolidator.StoredRecord.from_json(r)
                       for r in p) for p in pairs]  # fmt: skip
        if not pairs:
            return []
        if "consolidator" in self.encoder_urls:
            probs = self.classify("consolidator", [consolidator.encoder_text(n, o) for n, o in pairs])
            out = []
            for (n, o), p in zip(pairs, probs):
                action = consolidator.action_of(p)
                merged = consolidator.merge_rule(n, o) if action == "MERGE" else None
                out.append(consolidator.ParseResult(action, merged, ok=True))
            return out

        def one(pair):
            text, _, _ = self.chat(
                consolidator.chat_messages(*pair), consolidator.json_schema(), "decision", max_tokens=384
            )
            return consolidator.parse(text, *pair)

        with ThreadPoolExecutor(self.max_concurrency) as pool:
            return list(pool.map(one, pairs))
