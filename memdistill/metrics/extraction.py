"""Extraction metrics: predicted DimMem records against gold records, window by window.

Matching: within a window, predicted and gold records are paired one to one (Hungarian assignment) by
content similarity, and a pair counts only at or above `threshold`. Similarity is the cosine of
all-MiniLM-L6-v2 sentence embeddings (DEFAULT_THRESHOLD = 0.7, chosen so that paraphrases of one fact
match while two facts about the same person do not), or, with `similarity="token_f1"`, the token F1
of the two contents (threshold 0.5). The threshold is reported with every result.

On matched pairs: memory_type accuracy, time exact match, location / reason / purpose agreement (case
and space folded; empty against empty agrees), keyword F1 (set of lower-cased phrases), the rate at
which a dimension is filled where gold leaves it empty, and source-pointer accuracy (same source_id).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import numpy as np

from memdistill.core.embedder import Embedder
from memdistill.spec.extraction import ExtractionOutput, MemoryRecord
from memdistill.spec.jsonout import load_json

DEFAULT_THRESHOLD = {"embedding": 0.7, "token_f1": 0.5}
FREE_DIMS = ("location", "reason", "purpose")
_TOK = re.compile(r"[a-z0-9]+")


def _tokens(s: str) -> list[str]:
    return _TOK.findall(s.lower())


def token_f1(a: str, b: str) -> float:
    ta, tb = _tokens(a), _tokens(b)
    if not ta or not tb:
        return float(ta == tb)
    common = sum(min(ta.count(t), tb.count(t)) for t in set(ta))
    if not common:
        return 0.0
    p, r = common / len(ta), common / len(tb)
    return 2 * p * r / (p + r)


def similarity_matrix(pred: list[str], gold: list[str], similarity: str, embedder=None) -> np.ndarray:
    if not pred or not gold:
        return np.zeros((len(pred), len(gold)))
    if similarity == "token_f1":
        return np.array([[token_f1(p, g) for g in gold] for p in pred])
    e = embedder or Embedder()
    return e(pred) @ e(gold).T


def match(
    pred: list[MemoryRecord], gold: list[MemoryRecord], threshold: float, similarity: str = "embedding", embedder=None
) -> list[tuple[int, int, float]]:
    """One-to-one pairs (pred index, gold index, similarity) maximising total similarity, >= threshold."""
    from scipy.optimize import linear_sum_assignment

    sim = similarity_matrix([r.content for r in pred], [r.content for r in gold], similarity, embedder)
    if sim.size == 0:
        return []
    rows, cols = linear_sum_assignment(-sim)
    return [(int(i), int(j), float(sim[i, j])) for i, j in zip(rows, cols) if sim[i, j] >= threshold]


def _fold(s: str) -> str:
    return " ".join(s.lower().split())


def keyword_f1(a: list[str], b: list[str]) -> float:
    sa, sb = {_fold(k) for k in a}, {_fold(k) for k in b}
    if not sa and not sb:
        return 1.0
    if not sa or not sb:
        return 0.0
    common = len(sa & sb)
    return 0.0 if not common else 2 * common / (len(sa) + len(sb))


def schema_valid(raw: str | None) -> bool:
    """The output's JSON validates against the schema exactly as written (no repair needed)."""
    value, problems = load_json(raw, list_key="memories")
    if value is None or any(p.code in ("truncated_output", "bare_list") for p in problems):
        return False
    try:
        ExtractionOutput.model_validate(value)
        return True
    except Exception:  # pydantic.ValidationError; anything else means invalid too
        return False


@dataclass
class ExtractionScores:
    threshold: float | None = None  # None: DEFAULT_THRESHOLD of the similarity
    similarity: str = "embedding"
    windows: int = 0
    json_valid: int = 0
    schema_valid: int = 0
    predicted: int = 0
    gold: int = 0
    matched: int = 0
    type_correct: int = 0
    time_exact: int = 0
    dim_agree: dict = field(default_factory=lambda: {d: 0 for d in FREE_DIMS})
    keyword_f1_sum: float = 0.0
    source_correct: int = 0
    overfill: int = 0  # a dimension filled where gold is empty
    gold_empty_dims: int = 0
    prompt_tokens: int = 0
    output_tokens: int = 0
    capped: int = 0  # outputs that ran to their token cap
    written: int = 0  # records in the outputs before the parser dropped or fixed any
    duplicates: int = 0  # records the parser dropped as repeats of an earlier record
    speaker_fixes: int = 0  # records whose source_speaker the parser corrected from the window

    def __post_init__(self):
        if self.threshold is None:
            self.threshold = DEFAULT_THRESHOLD[self.similarity]

    def add(
        self,
        raw: str | None,
        pred: list[MemoryRecord],
        gold: list[MemoryRecord],
        json_ok: bool,
        embedder=None,
        prompt_tokens: int = 0,
        output_tokens: int = 0,
        parsed=None,
        capped: bool = False,
    ) -> list[tuple[int, int, float]]:
        """One window. `parsed` (the spec's ParseResult of `raw`) adds the parser's repairs to the counts;
        `capped`: the output ran to its token cap."""
        self.windows += 1
        self.capped += bool(capped)
        if parsed is not None:
            self.written += parsed.raw_count
            codes = [p.code for p in parsed.problems]
            self.duplicates += codes.count("duplicate_record")
            self.speaker_fixes += codes.count("speaker_mismatch")
        self.json_valid += bool(json_ok)
        self.schema_valid += schema_valid(raw)
        self.predicted += len(pred)
        self.gold += len(gold)
        self.prompt_tokens += prompt_tokens
        self.output_tokens += output_tokens
        pairs = match(pred, gold, self.threshold, self.similarity, embedder)
        for i, j, _ in pairs:
            p, g = pred[i].dimension, gold[j].dimension
            self.matched += 1
            self.type_correct += p.memory_type == g.memory_type
            self.time_exact += p.time == g.time
            for d in FREE_DIMS:
                self.dim_agree[d] += _fold(getattr(p, d)) == _fold(getattr(g, d))
            self.keyword_f1_sum += keyword_f1(p.keywords, g.keywords)
            self.source_correct += pred[i].source_id == gold[j].source_id
            for d in ("time",) + FREE_DIMS:
                if not getattr(g, d):
                    self.gold_empty_dims += 1
                    self.overfill += bool(getattr(p, d))
        return pairs

    def summary(self) -> dict:
        def div(a, b):
            return round(a / b, 4) if b else 0.0

        precision, recall = div(self.matched, self.predicted), div(self.matched, self.gold)
        f1 = round(2 * precision * recall / (precision + recall), 4) if precision + recall else 0.0
        out = {
            "windows": self.windows,
            "json_valid_rate": div(self.json_valid, self.windows),
            "schema_valid_rate": div(self.schema_valid, self.windows),
            "predicted": self.predicted,
            "gold": self.gold,
            "matched": self.matched,
            "memory_precision": precision,
            "memory_recall": recall,
            "memory_f1": f1,
            "match_similarity": self.similarity,
            "match_threshold": self.threshold,
            "type_accuracy": div(self.type_correct, self.matched),
            "time_exact": div(self.time_exact, self.matched),
            **{f"{d}_agreement": div(self.dim_agree[d], self.matched) for d in FREE_DIMS},
            "keyword_f1": div(self.keyword_f1_sum, self.matched),
            "overfill_rate": div(self.overfill, self.gold_empty_dims),
            "source_accuracy": div(self.source_correct, self.matched),
            "capped_outputs": self.capped,
            "capped_rate": div(self.capped, self.windows),
            "records_written": self.written,
            "duplicate_rate": div(self.duplicates, self.written),
            "speaker_fix_rate": div(self.speaker_fixes, self.written),
            "prompt_tokens_per_window": div(self.prompt_tokens, self.windows),
            "output_tokens_per_window": div(self.output_tokens, self.windows),
        }
        return out
