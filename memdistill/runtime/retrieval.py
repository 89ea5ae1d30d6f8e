"""Retrieval over a memory bank after DimMem's tri-path retrieval: BM25, dense and a dimension route, fused
either by memdistill's reciprocal-rank fusion or by DimMem's own union; optional type routing, recall
planning and gating (TiMem), and assistant-reply recall.

Routes, per conversation (DimMem section 3.3, Eq. 6-7):
- lexical: BM25 (bm25s, English stop words, no stemming) over the content plus the textual dimensions
  (location, reason, purpose, keywords); the query is the parsed query's anchor and keywords, or the
  plain question.
- dense: cosine of all-MiniLM-L6-v2 embeddings of the content and of the anchor (or question).
- dimension route (when a parsed query or a type router gives constraints): s_dim = the weighted mean
  of the active components only: target memory type, time (the query's range, memdistill.spec.query_parser.
  time_range, against the record's time, or the source message date when the record has none),
  location, keyword phrases and keyword tokens. Weights 1.5 / 3 / 2 / 1.5 / 1.5, the proportions of the
  DimMem case study (Table 8: 0.158 / 0.316 / 0.211 / 0.158 / 0.158).
Each route contributes its top `top_k` candidates (BM25 and dimension candidates only with a score above
zero; DimMem Table 11: 20 per route on LongMemEval-S, 15 on LoCoMo).

Fusion (`fusion`):
- "dimmem_union": DimMem's Eq. 6, R(q) = Dedup(R_bm25 U R_dim U R_dense): every route's top-k, duplicate
  contents removed (case and whitespace folded), the first copy kept. Eq. 6 is a set and states no order;
  the order here is that of DimMem's released QA script (run_qa_from_three_retrievals.py), which
  concatenates the dimension route, then dense, then BM25. DimMem hands the whole union to the answer
  model, so memdistill.eval.e2e runs it with budget=None (no cut).
- "rrf": memdistill's own fusion, not DimMem's. BM25 scores and cosines live on unrelated scales, so they
  enter by rank: reciprocal-rank fusion, 1 / (rrf_k + rank) per route, rrf_k = 60 (Cormack et al., 2009).
  The dimension score is already an agreement in [0, 1], so it enters by value with a hand-set weight:
  dim_weight * s_dim / (rrf_k + 1), i.e. a record that meets every constraint gains what ranking first in
  `dim_weight` routes would give (a third plain RRF vote could never overturn BM25 and dense agreeing on
  a record that breaks the query's time or type constraint, the case the route exists for). The fused
  ranking is deduplicated by content like the union and cut to `budget`.

Hooks (plain callables, all optional):
- router(question) -> DimMem types; fills target types when the parsed query has none.
- planner(question) -> "simple" | "hybrid" | "complex"; picks the budget from `plan_budgets`
  (default memdistill.spec.gate.BUDGETS, flat caps that are memdistill's choice: TiMem's planner
  sets per-level budgets of a memory hierarchy instead, Table 7, which a flat bank has no levels for).
- gate(question, complexity, candidate texts) -> kept 1-based ids among the budgeted candidates.
- query_typer(question) -> MemoType query type (EM / PM / GM / none, memdistill.spec.querytyper): retrieval is
  scoped to records the type router gave that type when they entered the bank (MemoryBank.type_with);
  records never typed or typed none stay searchable, so scoping only skips records typed otherwise.
  Recall.skipped is the share of the conversation's records it skipped (MemoType: about 20%, section 2.2).
A planner that always answers one complexity is TiMem's fixed-scope setting (Table 3, "w/o Planner").
Consolidated banks (memdistill.runtime.consolidate): current records rank before superseded or merged
ones (`history="after"`: by score, but never above the record that replaced them), or the latter are dropped
(`"drop"`) or ranked by score alone (`"mixed"`).
`hooks_from_models` builds them from a MemoryModels endpoint (classify_types, plan, gate); `score_gate` turns a
candidate scorer into a gate through memdistill.spec.gate.select.
"""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from memdistill.core.embedder import Embedder
from memdistill.runtime.bank import MemoryBank, MemoryItem
from memdistill.spec import qa
from memdistill.spec import querytyper as query_type_spec
from memdistill.spec.consolidator import below_successors
from memdistill.spec.dialogue import Conversation
from memdistill.spec.gate import BUDGETS, select
from memdistill.spec.query_parser import QueryAnalysis, QueryDimension, time_range

# Where records that consolidation marked superseded or merged go in a ranking: after every current one, nowhere,
# or wherever their score puts them (as if the bank were not consolidated). After: by score, except that a record
# never ranks above what replaced it, so a false SUPERSEDE of the newer record by a later one (both then history)
# cannot put the answer it replaced back above it.
HISTORY = ("after", "drop", "mixed")
FUSIONS = ("rrf", "dimmem_union")
UNION_ORDER = ("dim", "dense", "bm25")  # DimMem's released QA script concatenates the routes in this order
DIM_WEIGHTS = {"type": 1.5, "time": 3.0, "location": 2.0, "keyword_phrase": 1.5, "keyword_tokens": 1.5}
TRIMEM_TO_DIMMEM = {"EM": ("episodic",), "PM": ("profile", "fact"), "GM": ("fact",)}
_WORD = re.compile(r"[a-z0-9]+")
_STOP = set(
    """a an the of in on at to for from by with about into over after before is are was were be been being do
does did have has had what which who whom whose when where why how i me my you your we our they their he she his her
him it its this that these those and or not any there here can could would should will did user assistant""".split()
)


def _fold(s: str) -> str:
    return " ".join(s.lower().split())


def _content_words(s: str) -> set[str]:
    return {w for w in _WORD.findall(s.lower()) if w not in _STOP}


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
    query_type: str | None = None
    skipped: float = 0.0  # share of the conversation's records outside the query type's scope


class _ConvIndex:
    def __init__(self, items: list[MemoryItem], embed):
        import bm25s

        self.items = list(items)  # a copy: the bank's list grows as records arrive
        self.bm25 = None
        if items:
            toks = bm25s.tokenize(
                [it.lexical_text() for it in items], return_ids=False, show_progress=False, stopwords="en"
            )
            self.bm25 = bm25s.BM25()
            self.bm25.index(toks, show_progress=False)
        self.vectors = embed([it.content for it in items]) if items else np.zeros((0, 1))

    def bm25_scores(self, text: str) -> np.ndarray:
        import bm25s

        q = bm25s.tokenize([text], return_ids=False, show_progress=False, stopwords="en")[0] if text.strip() else []
        if self.bm25 is None or not q:
            return np.zeros(len(self.items))
        return np.asarray(self.bm25.get_scores(q), dtype=float)


def gated(gate: Callable | None, question: str, complexity: str, hits: list[Hit], notes: list[str]) -> list[Hit]:
    """What the gate keeps of the candidates (all of them without a gate, or when its output is unusable)."""
    if gate is None or not hits:
        return hits
    ids = gate(question, complexity, [h.item.content for h in hits])
    if ids is None:
        notes.append("gate output unusable; every candidate kept")
        return hits
    return [hits[i - 1] for i in ids if 1 <= i <= len(hits)]


class MemoryRuntime:
    def __init__(
        self,
        bank: MemoryBank,
        embed: Callable | None = None,
        top_k: int = 20,
        rrf_k: int = 60,
        dim_weight: float = 2.0,
        weights: dict | None = None,
        budget: int | None = 10,
        plan_budgets: dict | None = None,
        router: Callable | None = None,
        planner: Callable | None = None,
        gate: Callable | None = None,
        query_typer: Callable | None = None,
        conversations: dict[str, Conversation] | None = None,
        history: str = "after",
        fusion: str = "rrf",
    ):
        if embed is None:
            embed = Embedder()
        self.bank, self.embed = bank, embed
        self.top_k, self.rrf_k, self.dim_weight, self.budget = top_k, rrf_k, dim_weight, budget
        self.weights = {**DIM_WEIGHTS, **(weights or {})}
        self.plan_budgets = dict(plan_budgets or BUDGETS)
        self.router, self.planner, self.gate, self.query_typer = router, planner, gate, query_typer
        self.conversations = conversations or {}
        if history not in HISTORY:
            raise ValueError(f"history={history!r}: expected one of {HISTORY}")
        self.history = history
        if fusion not in FUSIONS:
            raise ValueError(f"fusion={fusion!r}: expected one of {FUSIONS}")
        self.fusion = fusion
        self._index: dict[str, _ConvIndex] = {}

    def but(self, **changes) -> MemoryRuntime:
        """A copy with other settings (hooks, fusion, budget) that shares this one's indexes."""
        new = copy.copy(self)
        for key, value in changes.items():
            if key not in vars(self) or key.startswith("_"):
                raise TypeError(f"MemoryRuntime has no setting {key!r}")
            setattr(new, key, value)
        if new.fusion not in FUSIONS:
            raise ValueError(f"fusion={new.fusion!r}: expected one of {FUSIONS}")
        return new

    def _successor(self, memory_id: str) -> str | None:
        it = self.bank.get(memory_id)
        return (it.superseded_by or it.merged_into) if it else None

    def index(self, conversation_id: str) -> _ConvIndex:
        idx = self._index.get(conversation_id)
        if idx is None or len(idx.items) != len(self.bank.of(conversation_id)):  # records added since
            self._index[conversation_id] = _ConvIndex(self.bank.of(conversation_id), self.embed)
        return self._index[conversation_id]

    def rank(
        self,
        question: str,
        conversation_id: str,
        query: QueryAnalysis | None = None,
        route: bool = True,
        target_types=(),
        query_type: str | None = None,
    ) -> list[Hit]:
        """The fused tri-path ranking (bi-path with route=False) of one conversation's memories; with a
        `query_type`, of those in its scope only (memdistill.spec.querytyper.in_scope)."""
        idx = self.index(conversation_id)
        n = len(idx.items)
        if not n:
            return []
        allowed = [query_type_spec.in_scope(it.types, query_type) for it in idx.items]
        anchor = query.query_anchor if query else question
        lexical = " ".join([anchor, *(query.dimension.keywords if query else [])])
        bm25 = idx.bm25_scores(lexical)
        cos = idx.vectors @ self.embed([anchor])[0]
        order = lambda s: sorted((i for i in range(n) if allowed[i]), key=lambda i: (-s[i], -cos[i], i))  # noqa: E731
        routes = {"bm25": [i for i in order(bm25) if bm25[i] > 0][: self.top_k], "dense": order(cos)[: self.top_k]}
        dim = [None] * n
        if route:
            qdim = query.dimension if query else QueryDimension()
            dim = [dimension_score(it, qdim, target_types, self.weights) for it in idx.items]
            if any(d is not None for d in dim):
                ds = np.array([d or 0.0 for d in dim])
                routes["dim"] = [i for i in order(ds) if ds[i] > 0][: self.top_k]
        fused: dict[int, Hit] = {}
        union = self.fusion == "dimmem_union"
        for name in [r for r in UNION_ORDER if r in routes] if union else list(routes):
            for r, i in enumerate(routes[name], 1):
                hit = fused.setdefault(i, Hit(idx.items[i], 0.0, dim_score=dim[i]))
                hit.ranks[name] = r
                if not union and name != "dim":
                    hit.score += 1.0 / (self.rrf_k + r)
        if union:  # the concatenation order, as a score that falls with position
            for p, hit in enumerate(fused.values(), 1):
                hit.score = 1.0 / p
        else:
            for i, hit in fused.items():
                if dim[i]:
                    hit.score += self.dim_weight * dim[i] / (self.rrf_k + 1)
        # Consolidated banks: current records first, then (history="after") what they superseded or merged.
        first = (lambda h: not h.item.current) if self.history != "mixed" else (lambda h: False)
        ranked = sorted(fused.items(), key=lambda x: (first(x[1]), -x[1].score, 0.0 if union else -cos[x[0]], x[0]))
        if self.history == "drop":
            ranked = [x for x in ranked if x[1].item.current]
        elif self.history == "after":
            ranked = [ranked[k] for k in below_successors([h.item.memory_id for _, h in ranked], self._successor)]
        seen, out = set(), []
        for _, hit in ranked:  # Dedup by content (DimMem Eq. 6); an extractor may write the same sentence twice
            key = _fold(hit.item.content)
            if key not in seen:
                seen.add(key)
                out.append(hit)
        return out

    def recall(
        self,
        question: str,
        conversation_id: str,
        query: QueryAnalysis | None = None,
        route: bool = True,
        gate_complexity: str = "hybrid",
    ) -> Recall:
        """Rank, then keep what the answer model reads: the planner sets the budget (else `budget`; None
        keeps the whole ranking, as DimMem reads its whole union), the gate filters."""
        notes, types, qtype, skipped = [], [], None, 0.0
        if route and self.router is not None and not (query and query.dimension.target_memory_type):
            types = list(self.router(question) or [])
        if self.query_typer is not None:
            qtype = self.query_typer(question)
            items = self.bank.of(conversation_id)
            if items:
                skipped = sum(not query_type_spec.in_scope(it.types, qtype) for it in items) / len(items)
        hits = self.rank(question, conversation_id, query, route, types, qtype)
        complexity, budget = None, len(hits) if self.budget is None else self.budget
        if self.planner is not None:
            complexity = self.planner(question)
            if complexity in self.plan_budgets:
                budget = self.plan_budgets[complexity]
            else:
                notes.append(f"planner gave {complexity!r}; default budget {budget} used")
                complexity = None
        kept = gated(self.gate, question, complexity or gate_complexity, hits[:budget], notes)
        return Recall(hits, kept, budget, complexity, types, notes, qtype, skipped)

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


def hooks_from_models(mm, which=("router", "planner", "gate")) -> dict:
    """router / planner / gate / query_typer callables for MemoryRuntime over a memdistill.serve.client.
    MemoryModels endpoint (or anything with its classify_types, plan, gate and query_type methods)."""
    unknown = set(which) - {"router", "planner", "gate", "query_typer"}
    if unknown:
        raise ValueError(f"unknown hooks {sorted(unknown)}; expected router, planner, gate, query_typer")
    hooks = {}
    if "router" in which:
        hooks["router"] = lambda q: types_from_trimem(mm.classify_types([q])[0].labels)
    if "planner" in which:
        hooks["planner"] = lambda q: p.plan.complexity if (p := mm.plan(q)).ok else None
    if "gate" in which:
        hooks["gate"] = lambda q, c, cands: mm.gate(q, c, cands).kept_ids
    if "query_typer" in which:
        hooks["query_typer"] = mm.query_type
    return hooks


def score_gate(score: Callable, threshold: float = 0.5) -> Callable:
    """A gate from a scorer (question, complexity, candidates) -> keep probabilities, e.g. a
    cross-encoder; ids kept under memdistill.spec.gate's per-complexity thresholds and budgets."""
    return lambda q, c, cands: select(score(q, c, cands), c, threshold)
