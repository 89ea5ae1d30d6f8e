"""Reference memory runtime in the DimMem manner: a memory bank with source pointers, tri-path retrieval,
optional type routing, recall planning and gating, and the evidence metrics that need no judge.

Memory bank: one `MemoryItem` per record, each pointing back to its source (conversation id, source
turn id, speaker, message timestamp). Built from any extractor endpoint (`MemoryBank.from_extracted`
over `serving.client.MemoryModels.extract`), from the gold seed records (an upper bound), or from a
JSONL file of records.

Retrieval, per conversation (DimMem section 3.3, Eq. 6-7):
- lexical: BM25 (bm25s, English stop words, no stemming) over the content plus the textual dimensions
  (location, reason, purpose, keywords); the query is the parsed query's anchor and keywords, or the
  plain question.
- dense: cosine of all-MiniLM-L6-v2 embeddings of the content and of the anchor (or question).
- dimension route (when a parsed query or a type router gives constraints): s_dim = the weighted mean
  of the active components only: target memory type, time (the query's range, memspec.query_parse.
  time_range, against the record's time, or the source message date when the record has none),
  location, keyword phrases and keyword tokens. Weights 1.5 / 3 / 2 / 1.5 / 1.5, the proportions of the
  DimMem case study (Table 8: 0.158 / 0.316 / 0.211 / 0.158 / 0.158).
Each route contributes its top `top_k` candidates (BM25 and dimension candidates only with a score
above zero); the union is ranked by fused score and deduplicated by content, like DimMem's
Dedup(R_bm25 U R_dim U R_dense).

Fusion. BM25 scores and cosines live on unrelated scales, so they enter by rank: reciprocal-rank
fusion, 1 / (rrf_k + rank) per route, rrf_k = 60 (Cormack et al., 2009). The dimension score is
already a calibrated agreement in [0, 1], so it enters by value: dim_weight * s_dim / (rrf_k + 1), i.e.
a record that meets every constraint gains what ranking first in `dim_weight` routes would give. A
third plain RRF vote could never overturn BM25 and dense agreeing on a record that breaks the query's
time or type constraint, which is the case the route exists for.

Hooks (plain callables, all optional):
- type_router(question) -> DimMem types; fills target types when the parsed query has none.
- planner(question) -> "simple" | "hybrid" | "complex"; picks the recall budget (plan_budgets).
- gate(question, complexity, candidate texts) -> kept 1-based ids among the budgeted candidates.
`sdk_hooks` builds them from a MemoryModels endpoint (classify_types, plan, gate); `score_gate` turns a
candidate scorer into a gate through memspec.recall_gate.select.

Metrics without a judge: evidence recall@k through source pointers (the share of a question's evidence
turns that are the source turn of one of the top-k records) and hit@k (at least one evidence turn
covered); recalled tokens per query (the rendered memory context the answer model would read).
"""

from __future__ import annotations

import json
import re
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import date, datetime
from pathlib import Path
from typing import Callable, Iterable

import numpy as np

from memspec import qa
from memspec.dialogue import Conversation, parse_timestamp
from memspec.extraction import Dimension, time_bounds
from memspec.query_parse import QueryAnalysis, QueryDimension, time_range
from memspec.recall_gate import BUDGETS, select

DIM_WEIGHTS = {"type": 1.5, "time": 3.0, "location": 2.0, "keyword_phrase": 1.5, "keyword_tokens": 1.5}
TRIMEM_TO_DIMMEM = {"EM": ("episodic",), "PM": ("profile", "fact"), "GM": ("fact",)}
LOCOMO_CATEGORIES = {1: "multi-hop", 2: "temporal", 3: "open-domain", 4: "single-hop", 5: "adversarial"}
_WORD = re.compile(r"[a-z0-9]+")
_STOP = set("""a an the of in on at to for from by with about into over after before is are was were be been being do
does did have has had what which who whom whose when where why how i me my you your we our they their he she his her
him it its this that these those and or not any there here can could would should will did user assistant""".split())


class BankError(ValueError):
    pass


def _fold(s: str) -> str:
    return " ".join(s.lower().split())


def _content_words(s: str) -> set[str]:
    return {w for w in _WORD.findall(s.lower()) if w not in _STOP}


# --- the memory bank ----------------------------------------------------------------------------

@dataclass
class MemoryItem:
    memory_id: str
    conversation_id: str
    turn_id: str  # the source turn: evidence recall is measured through this pointer
    content: str
    dimension: Dimension
    speaker: str | None = None
    timestamp: datetime | None = None  # of the source message

    def lexical_text(self) -> str:
        d = self.dimension
        return " ".join([self.content, d.location, d.reason, d.purpose, *d.keywords])

    def time_span(self) -> tuple[date, date] | None:
        if self.dimension.time:
            return time_bounds(self.dimension.time)
        if self.timestamp is not None:
            return self.timestamp.date(), self.timestamp.date()
        return None

    def render(self, reply: str | None = None) -> str:
        d = self.dimension
        return qa.render_memory(self.content, self.timestamp, d.time, d.location, d.reason, d.purpose, reply=reply)

    def to_json(self) -> dict:
        return {"memory_id": self.memory_id, "conversation_id": self.conversation_id, "turn_id": self.turn_id,
                "speaker": self.speaker, "timestamp": self.timestamp.isoformat() if self.timestamp else None,
                "content": self.content, "dimension": self.dimension.model_dump()}

    @classmethod
    def from_json(cls, row: dict, where: str, default_id: str = "") -> "MemoryItem":
        if not isinstance(row, dict):
            raise BankError(f"{where}: expected a JSON object")
        for key in ("conversation_id", "content", "dimension"):
            if key not in row:
                raise BankError(f"{where}: missing field {key!r}")
        turn = row.get("turn_id", row.get("source_turn_id"))
        if turn is None:
            raise BankError(f"{where}: missing field 'turn_id' (or 'source_turn_id'): the pointer to the source turn")
        try:
            dim = Dimension.model_validate_json(json.dumps(row["dimension"]))
        except ValueError as e:
            raise BankError(f"{where}: field 'dimension' is not a DimMem dimension: {str(e).splitlines()[0]}") from None
        ts = row.get("timestamp")
        try:
            ts = parse_timestamp(ts) if ts else None
        except ValueError as e:
            raise BankError(f"{where}: field 'timestamp': {e}") from None
        if not str(row["content"]).strip():
            raise BankError(f"{where}: field 'content' is empty")
        return cls(str(row.get("memory_id") or default_id), str(row["conversation_id"]), str(turn),
                   str(row["content"]), dim, row.get("speaker", row.get("source_speaker")), ts)


class MemoryBank:
    def __init__(self, items: Iterable[MemoryItem]):
        self.items = list(items)
        self._by_conv: dict[str, list[MemoryItem]] = defaultdict(list)
        for it in self.items:
            self._by_conv[it.conversation_id].append(it)

    def __len__(self) -> int:
        return len(self.items)

    def of(self, conversation_id: str) -> list[MemoryItem]:
        return self._by_conv.get(conversation_id, [])

    @classmethod
    def from_extracted(cls, memories) -> "MemoryBank":
        """From `MemoryModels.extract(...).memories` (ExtractedMemory: record + source pointers)."""
        return cls(MemoryItem(f"{m.conversation_id}-w{m.window_index}-{k}", m.conversation_id, m.turn_id,
                              m.record.content, m.record.dimension, m.speaker, parse_timestamp(m.timestamp))
                   for k, m in enumerate(memories))

    @classmethod
    def from_seed(cls, seed, conversation_ids=None) -> "MemoryBank":
        """The gold records of the seed corpus (data_gen.seed.Seed), optionally of some conversations."""
        keep = None if conversation_ids is None else set(conversation_ids)
        items = []
        for m in seed.memories:
            if keep is not None and m["conversation_id"] not in keep:
                continue
            turn = seed.conversations[m["conversation_id"]].turn(m["source_turn_id"])
            items.append(MemoryItem(m["memory_id"], m["conversation_id"], m["source_turn_id"], m["content"],
                                    Dimension(**m["dimension"]), turn.speaker, turn.timestamp))
        return cls(items)

    @classmethod
    def from_jsonl(cls, path) -> "MemoryBank":
        """One record a line: conversation_id, turn_id (or source_turn_id), content, dimension; optional
        memory_id, speaker (or source_speaker), timestamp (of the source message)."""
        from data_gen.sources import _jsonl  # the project's one JSONL reader (errors name file:line)

        path = Path(path)
        if not path.exists():
            raise BankError(f"{path}: no such file")
        return cls(MemoryItem.from_json(row, f"{path}:{lineno}", f"{path.stem}-{lineno}") for lineno, row in _jsonl(path))

    def save(self, path) -> None:
        Path(path).write_text("".join(json.dumps(it.to_json(), ensure_ascii=False) + "\n" for it in self.items),
                              encoding="utf-8")


# --- questions ----------------------------------------------------------------------------------

@dataclass
class Question:
    question_id: str
    conversation_id: str
    question: str
    question_date: datetime | None
    answer: str
    category: str
    evidence: list[str]  # turn ids that hold the answer
    query: QueryAnalysis | None = None  # gold query analysis, when the dataset has one


def _split_ids(value) -> list[str]:
    """LoCoMo evidence ids come as lists, sometimes with several ids in one string ("D8:6; D9:17")."""
    items = value if isinstance(value, list) else [value]
    return [p for x in items if x is not None for p in re.split(r"[;,\s]+", str(x)) if p]


def locomo_questions(conv: Conversation, include_adversarial: bool = False) -> tuple[list[Question], list[str]]:
    """Questions of a LoCoMo sample (kept in Conversation.meta["qa"] by data_gen.sources). Asked after the
    last session. Evidence ids absent from the conversation are dropped and reported."""
    turn_ids = {t.turn_id for t in conv.turns}
    asked = conv.sessions[-1].date_time
    out, notes = [], []
    for i, item in enumerate(conv.meta.get("qa") or [], 1):
        qid = f"{conv.conversation_id}-q{i:03d}"
        cat = LOCOMO_CATEGORIES.get(item.get("category"), str(item.get("category")))
        if cat == "adversarial" and not include_adversarial:
            continue
        if "question" not in item:
            raise BankError(f"{conv.conversation_id}: qa[{i - 1}] has no 'question'")
        answer = item.get("answer", item.get("adversarial_answer", ""))
        ev = _split_ids(item.get("evidence") or [])
        bad = [e for e in ev if e not in turn_ids]
        if bad:
            notes.append(f"{qid}: evidence {bad} not in the conversation, dropped")
        out.append(Question(qid, conv.conversation_id, str(item["question"]), asked, str(answer), cat,
                            [e for e in ev if e in turn_ids]))
    return out, notes


def longmemeval_question(conv: Conversation) -> Question:
    """The instance's one question. Evidence: the turns flagged has_answer, else every turn of the
    answer sessions (answer_session_ids)."""
    m = conv.meta
    ev = [t.turn_id for t in conv.turns if t.meta.get("has_answer")]
    if not ev:
        answer_sessions = set(m.get("answer_session_ids") or [])
        ev = [t.turn_id for s in conv.sessions if s.session_id in answer_sessions for t in s.turns]
    qd = parse_timestamp(m["question_date"]) if m.get("question_date") else None
    return Question(conv.conversation_id, conv.conversation_id, str(m.get("question") or ""), qd,
                    str(m.get("answer", "")), str(m.get("question_type") or "unknown"), ev)


def seed_questions(seed, split: str | None = "test") -> list[Question]:
    return [Question(q["question_id"], q["conversation_id"], q["question"], parse_timestamp(q["question_date"]),
                     str(q.get("answer", "")), q.get("category") or "unknown", list(q.get("evidence") or []),
                     QueryAnalysis.model_validate(q["query"]) if q.get("query") else None)
            for q in seed.rows("questions", split)]


def load_questions(fmt: str, path, split: str = "test", include_adversarial: bool = False):
    """(conversations by id, questions, notes, seed or None) for a LoCoMo file, a LongMemEval file or the
    seed corpus directory."""
    from data_gen import seed as seedlib
    from data_gen.sources import load

    if fmt == "seed":
        seed = seedlib.load(path)
        qs = seed_questions(seed, split)
        ids = {q.conversation_id for q in qs}
        return {c: seed.conversations[c] for c in seed.conversations if c in ids}, qs, [], seed
    convs = load(fmt, path)
    qs, notes = [], []
    for c in convs:
        if fmt == "locomo":
            got, n = locomo_questions(c, include_adversarial)
            qs += got
            notes += n
        elif fmt == "longmemeval":
            qs.append(longmemeval_question(c))
        else:
            raise BankError(f"format {fmt!r} has no questions; expected seed, locomo or longmemeval")
    return {c.conversation_id: c for c in convs}, qs, notes, None


# --- retrieval ----------------------------------------------------------------------------------

def _overlaps(span, rng) -> bool:
    lo, hi = rng
    return (lo is None or span[1] >= lo) and (hi is None or span[0] <= hi)


def dimension_score(item: MemoryItem, dim: QueryDimension, target_types=(), weights=DIM_WEIGHTS) -> float | None:
    """DimMem's s_dim: the weighted mean over the query's active constraints (None when none is active)."""
    parts = []  # (weight, score)
    types = list(target_types) or dim.target_memory_type
    if types:
        parts.append((weights["type"], float(item.dimension.memory_type in types)))
    rng = time_range(dim.time)
    if rng is not None:
        span = item.time_span()
        parts.append((weights["time"], float(span is not None and _overlaps(span, rng))))
    if dim.location.strip():
        q, loc = _fold(dim.location), _fold(item.dimension.location)
        hit = q in _fold(item.content) or q in loc or (bool(loc) and loc in q)
        parts.append((weights["location"], float(hit)))
    if dim.keywords:
        text = _fold(item.content)
        item_kws = [ik for ik in (_fold(k) for k in item.dimension.keywords) if ik]
        phrase = [fk in text or any(fk in ik or ik in fk for ik in item_kws) for fk in map(_fold, dim.keywords)]
        parts.append((weights["keyword_phrase"], sum(phrase) / len(phrase)))
        qw = set().union(*(_content_words(k) for k in dim.keywords))
        if qw:
            iw = _content_words(item.content + " " + " ".join(item.dimension.keywords))
            parts.append((weights["keyword_tokens"], len(qw & iw) / len(qw)))
    if not parts:
        return None
    return sum(w * s for w, s in parts) / sum(w for w, _ in parts)


@dataclass
class Hit:
    item: MemoryItem
    score: float
    ranks: dict = field(default_factory=dict)  # route -> 1-based rank inside that route's top-k
    dim_score: float | None = None


@dataclass
class Recall:
    hits: list[Hit]  # the fused, deduplicated ranking
    kept: list[Hit]  # what the answer model reads: the top `budget` hits, after the gate
    budget: int
    complexity: str | None = None
    target_types: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


class _ConvIndex:
    def __init__(self, items: list[MemoryItem], embed):
        import bm25s

        self.items = items
        self.bm25 = None
        if items:
            toks = bm25s.tokenize([it.lexical_text() for it in items], return_ids=False, show_progress=False,
                                  stopwords="en")
            self.bm25 = bm25s.BM25()
            self.bm25.index(toks, show_progress=False)
        self.vectors = embed([it.content for it in items]) if items else np.zeros((0, 1))

    def bm25_scores(self, text: str) -> np.ndarray:
        import bm25s

        q = bm25s.tokenize([text], return_ids=False, show_progress=False, stopwords="en")[0] if text.strip() else []
        if self.bm25 is None or not q:
            return np.zeros(len(self.items))
        return np.asarray(self.bm25.get_scores(q), dtype=float)


class MemoryRuntime:
    def __init__(self, bank: MemoryBank, embed: Callable | None = None, top_k: int = 20, rrf_k: int = 60,
                 dim_weight: float = 2.0, weights: dict | None = None, budget: int = 10,
                 plan_budgets: dict | None = None, type_router: Callable | None = None,
                 planner: Callable | None = None, gate: Callable | None = None,
                 conversations: dict[str, Conversation] | None = None):
        if embed is None:
            from eval.extraction_metrics import Embedder
            embed = Embedder()
        self.bank, self.embed = bank, embed
        self.top_k, self.rrf_k, self.dim_weight, self.budget = top_k, rrf_k, dim_weight, budget
        self.weights = {**DIM_WEIGHTS, **(weights or {})}
        self.plan_budgets = dict(plan_budgets or BUDGETS)
        self.type_router, self.planner, self.gate = type_router, planner, gate
        self.conversations = conversations or {}
        self._index: dict[str, _ConvIndex] = {}

    def index(self, conversation_id: str) -> _ConvIndex:
        if conversation_id not in self._index:
            self._index[conversation_id] = _ConvIndex(self.bank.of(conversation_id), self.embed)
        return self._index[conversation_id]

    def rank(self, question: str, conversation_id: str, query: QueryAnalysis | None = None, route: bool = True,
             target_types=()) -> list[Hit]:
        """The fused tri-path ranking (bi-path with route=False) of one conversation's memories."""
        idx = self.index(conversation_id)
        n = len(idx.items)
        if not n:
            return []
        anchor = query.query_anchor if query else question
        lexical = " ".join([anchor, *(query.dimension.keywords if query else [])])
        bm25 = idx.bm25_scores(lexical)
        cos = idx.vectors @ self.embed([anchor])[0]
        order = lambda s: sorted(range(n), key=lambda i: (-s[i], -cos[i], i))  # noqa: E731
        routes = {"bm25": [i for i in order(bm25) if bm25[i] > 0][: self.top_k], "dense": order(cos)[: self.top_k]}
        dim = [None] * n
        if route:
            qdim = query.dimension if query else QueryDimension()
            dim = [dimension_score(it, qdim, target_types, self.weights) for it in idx.items]
            if any(d is not None for d in dim):
                ds = np.array([d or 0.0 for d in dim])
                routes["dim"] = [i for i in order(ds) if ds[i] > 0][: self.top_k]
        fused: dict[int, Hit] = {}
        for name, ranked in routes.items():
            for r, i in enumerate(ranked, 1):
                hit = fused.setdefault(i, Hit(idx.items[i], 0.0, dim_score=dim[i]))
                hit.ranks[name] = r
                if name != "dim":
                    hit.score += 1.0 / (self.rrf_k + r)
        for i, hit in fused.items():
            if dim[i]:
                hit.score += self.dim_weight * dim[i] / (self.rrf_k + 1)
        ranked = sorted(fused.items(), key=lambda x: (-x[1].score, -cos[x[0]], x[0]))
        seen, out = set(), []
        for _, hit in ranked:  # Dedup: an extractor may write the same sentence twice
            key = _fold(hit.item.content)
            if key not in seen:
                seen.add(key)
                out.append(hit)
        return out

    def recall(self, question: str, conversation_id: str, query: QueryAnalysis | None = None, route: bool = True,
               gate_complexity: str = "hybrid") -> Recall:
        """Rank, then keep what the answer model reads: the planner sets the budget, the gate filters."""
        notes, types = [], []
        if route and self.type_router is not None and not (query and query.dimension.target_memory_type):
            types = list(self.type_router(question) or [])
        hits = self.rank(question, conversation_id, query, route, types)
        complexity, budget = None, self.budget
        if self.planner is not None:
            complexity = self.planner(question)
            if complexity in self.plan_budgets:
                budget = self.plan_budgets[complexity]
            else:
                notes.append(f"planner gave {complexity!r}; default budget {budget} used")
                complexity = None
        kept = hits[:budget]
        if self.gate is not None and kept:
            ids = self.gate(question, complexity or gate_complexity, [h.item.content for h in kept])
            if ids is None:
                notes.append("gate output unusable; every budgeted candidate kept")
            else:
                kept = [kept[i - 1] for i in ids if 1 <= i <= len(kept)]
        return Recall(hits, kept, budget, complexity, types, notes)

    def context(self, hits: list[Hit], assistant_replies: bool = False) -> str:
        """The memory block the answer model reads. With assistant_replies (the query asks what the
        assistant said), each memory carries the assistant message its source turn led to."""
        lines = []
        for h in hits:
            reply = self._assistant_reply(h.item) if assistant_replies else None
            lines.append(h.item.render(reply))
        return qa.render_memories(lines)

    def _assistant_reply(self, item: MemoryItem) -> str | None:
        conv = self.conversations.get(item.conversation_id)
        if conv is None:
            return None
        turns = conv.turns
        k = next((j for j, t in enumerate(turns) if t.turn_id == item.turn_id), None)
        if k is None:
            return None
        if turns[k].role == "assistant":
            return turns[k].text
        if k + 1 < len(turns) and turns[k + 1].role == "assistant":
            return turns[k + 1].text
        return None


# --- hooks from the SDK ---------------------------------------------------------------------------

def types_from_trimem(labels) -> list[str]:
    """TriMEM labels of a question -> the DimMem record types that hold such memories."""
    out = []
    for lab in labels or ():
        out += [t for t in TRIMEM_TO_DIMMEM.get(lab, ()) if t not in out]
    return out


def sdk_hooks(mm, which=("types", "plan", "gate")) -> dict:
    """type_router / planner / gate callables over a serving.client.MemoryModels endpoint."""
    hooks = {}
    if "types" in which:
        hooks["type_router"] = lambda q: types_from_trimem(mm.classify_types([q])[0].labels)
    if "plan" in which:
        hooks["planner"] = lambda q: (p.plan.complexity if (p := mm.plan(q)).ok else None)
    if "gate" in which:
        hooks["gate"] = lambda q, c, cands: mm.gate(q, c, cands).kept_ids
    unknown = set(which) - {"types", "plan", "gate"}
    if unknown:
        raise ValueError(f"unknown hooks {sorted(unknown)}; expected types, plan, gate")
    return hooks


def score_gate(score: Callable, threshold: float = 0.5) -> Callable:
    """A gate from a scorer (question, complexity, candidates) -> keep probabilities, e.g. a
    cross-encoder; ids kept under memspec.recall_gate's per-complexity thresholds and budgets."""
    return lambda q, c, cands: select(score(q, c, cands), c, threshold)


# --- metrics without a judge ----------------------------------------------------------------------

def evidence_coverage(hits: list[Hit], evidence: list[str]) -> tuple[float, bool]:
    """(share of evidence turns that are a source turn of these hits, at least one covered)."""
    if not evidence:
        raise ValueError("a question without evidence turns has no evidence recall")
    ev = set(evidence)
    covered = ev & {h.item.turn_id for h in hits}
    return len(covered) / len(ev), bool(covered)


class TokenCounter:
    """Tokens of the recalled context under one tokenizer (default: SmolLM2's, a 49k BPE)."""

    def __init__(self, model: str = "embedded:smollm2-135m-instruct"):
        from transformers import AutoTokenizer

        from training.base_models import model_path
        self.name = model
        self.tok = AutoTokenizer.from_pretrained(model_path(model))

    def __call__(self, text: str) -> int:
        return len(self.tok(text, add_special_tokens=False)["input_ids"])


class RecallScores:
    """Evidence recall@k, hit@k and recalled tokens, overall and per question category."""

    def __init__(self, ks=(1, 5, 10, 20)):
        self.ks = sorted(ks)
        self.rows: list[dict] = []

    def add(self, q: Question, recall: Recall, tokens_at: dict, kept_tokens: int) -> dict:
        row = {"question_id": q.question_id, "category": q.category, "evidence": bool(q.evidence),
               "tokens_at": {k: tokens_at[k] for k in self.ks}, "kept_tokens": kept_tokens, "kept": len(recall.kept)}
        if q.evidence:
            for k in self.ks:
                row[f"recall@{k}"], row[f"hit@{k}"] = evidence_coverage(recall.hits[:k], q.evidence)
            row["kept_recall"], row["kept_hit"] = evidence_coverage(recall.kept, q.evidence)
        self.rows.append(row)
        return row

    def _summ(self, rows: list[dict]) -> dict:
        ev = [r for r in rows if r["evidence"]]
        mean = lambda xs: round(float(np.mean(xs)), 4) if xs else 0.0  # noqa: E731
        out = {"questions": len(rows), "with_evidence": len(ev)}
        for k in self.ks:
            out[f"recall@{k}"] = mean([r[f"recall@{k}"] for r in ev])
            out[f"hit@{k}"] = mean([float(r[f"hit@{k}"]) for r in ev])
        for k in self.ks:
            out[f"tokens@{k}"] = round(float(np.mean([r["tokens_at"][k] for r in rows])), 1) if rows else 0.0
        out["kept_recall"] = mean([r["kept_recall"] for r in ev])
        out["kept_hit"] = mean([float(r["kept_hit"]) for r in ev])
        out["kept_per_query"] = round(float(np.mean([r["kept"] for r in rows])), 2) if rows else 0.0
        out["tokens_per_query"] = round(float(np.mean([r["kept_tokens"] for r in rows])), 1) if rows else 0.0
        return out

    def summary(self) -> dict:
        cats = sorted({r["category"] for r in self.rows})
        return {"overall": self._summ(self.rows),
                "by_category": {c: self._summ([r for r in self.rows if r["category"] == c]) for c in cats}}
