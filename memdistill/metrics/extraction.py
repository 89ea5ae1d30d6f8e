"""Extraction metrics: predicted DimMem records against gold records, window by window.

Matching: within a window, predicted and gold records are paired one to one (Hungarian assignment) by
content similarity, and a pair counts only at or above `threshold`. Similarity is the cosine of
all-MiniLM-L6-v2 sentence embeddings (DEFAULT_THRESHOLD = 0.7, chosen so that paraphrases of one fact
match while two facts about the same person do not), or, with `similarity="token_f1"`, the token F1
of the two contents (threshold 0.5). The threshold is reported with every result.

On matched pairs: memory_type accuracy, time exact match, location / reason / purpose agreement (case
and space folded; empty against empty agrees), keyword F1 (set of lower-cased phrases), the rate at
which a dimension is filled where gold leaves it empty, and source-pointer accuracy (same source_id).
Each matched-pair accuracy sits beside its trivial baseline on the same pairs: always the majority
memory_type / source_id of all gold records, always "" for time and the free dimensions, always [] for
keywords. Every rate carries `<key>_ci95`, a 95% bootstrap interval over windows: windows are resampled
and the pooled metric is recomputed from the resampled counts (F1 from pooled matches, not a mean of
per-window F1s).

Query analysis (`query_scores`): DimMem's assistant-recall trigger as a confusion matrix with precision /
recall / F1 and trigger rates (DimMem Table 6, section 4.6; trigger rate as in 4.4); time, location and
target types each as exact match over the questions whose gold sets them plus the rate at which the model
sets them where gold does not. Baselines and intervals as above, with questions as the unit.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from dataclasses import dataclass, field

import numpy as np

from memdistill.core.embedder import Embedder
from memdistill.metrics.stats import bootstrap_ci
from memdistill.spec import query_parser
from memdistill.spec.extractor import MEMORY_TYPES, ExtractionOutput, MemoryRecord
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


def _div(a, b) -> float:
    return a / b if b else 0.0


def _majority(counts: dict, order=None):
    """The most frequent key (ties: first in `order`, else the smallest key) and its count."""
    if not counts:
        return None, 0
    rank = (lambda k: order.index(k) if k in order else len(order)) if order else (lambda k: k)
    best = min(counts, key=lambda k: (-counts[k], rank(k)))
    return best, counts[best]


def _with_intervals(units: list[Counter], rates, ci_keys) -> dict:
    """rates(pooled counts) at every unit, plus `<key>_ci95` for `ci_keys`, resampling units."""
    cols = sorted(set().union(*units)) if units else []
    arr = np.array([[u[c] for c in cols] for u in units], dtype=float).reshape(len(units), len(cols))

    seen = {}  # every key's bootstrap draws the same resamples (same seed): pool each one once

    def pooled(idx) -> dict:
        key = tuple(idx)
        if key not in seen:
            seen[key] = rates(dict(zip(cols, arr[list(idx)].sum(0).tolist())))
        return seen[key]

    out = {k: round(v, 4) for k, v in pooled(range(len(units))).items()}
    for k in ci_keys:
        out[f"{k}_ci95"] = bootstrap_ci(lambda idx, k=k: pooled(idx)[k], len(units))
    return out


EXTRACTION_CI_KEYS = (
    "json_valid_rate",
    "schema_valid_rate",
    "memory_precision",
    "memory_recall",
    "memory_f1",
    "type_accuracy",
    "time_exact",
    *(f"{d}_agreement" for d in FREE_DIMS),
    "keyword_f1",
    "overfill_rate",
    "source_accuracy",
    "capped_rate",
    "duplicate_rate",
    "speaker_fix_rate",
)


@dataclass
class ExtractionScores:
    threshold: float | None = None  # None: DEFAULT_THRESHOLD of the similarity
    similarity: str = "embedding"
    units: list = field(default_factory=list)  # one Counter per window: the bootstrap resamples these

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
        c = Counter(windows=1, capped=bool(capped), json_valid=bool(json_ok), schema_valid=schema_valid(raw))
        if parsed is not None:
            codes = [p.code for p in parsed.problems]
            c.update(
                written=parsed.raw_count,  # records in the output before the parser dropped or fixed any
                duplicates=codes.count("duplicate_record"),
                speaker_fixes=codes.count("speaker_mismatch"),
            )
        c.update(predicted=len(pred), gold=len(gold), prompt_tokens=prompt_tokens, output_tokens=output_tokens)
        c.update(f"gold_type:{g.dimension.memory_type}" for g in gold)
        c.update(f"gold_source:{g.source_id}" for g in gold)
        pairs = match(pred, gold, self.threshold, self.similarity, embedder)
        for i, j, _ in pairs:
            p, g = pred[i].dimension, gold[j].dimension
            c["matched"] += 1
            c["type_correct"] += p.memory_type == g.memory_type
            c["time_exact"] += p.time == g.time
            for d in FREE_DIMS:
                c[f"{d}_agree"] += _fold(getattr(p, d)) == _fold(getattr(g, d))
            c["keyword_f1_sum"] += keyword_f1(p.keywords, g.keywords)
            c["source_correct"] += pred[i].source_id == gold[j].source_id
            for d in ("time",) + FREE_DIMS:
                if not getattr(g, d):
                    c["gold_empty_dims"] += 1
                    c["overfill"] += bool(getattr(p, d))
            # what the trivial baselines need: the gold side of every matched pair
            c[f"pair_type:{g.memory_type}"] += 1
            c[f"pair_source:{gold[j].source_id}"] += 1
            c["pair_no_keywords"] += not g.keywords
            for d in ("time",) + FREE_DIMS:
                c[f"pair_empty_{d}"] += not getattr(g, d)
        self.units.append(c)
        return pairs

    def summary(self) -> dict:
        total = sum(self.units, Counter())
        maj_type, _ = _majority({k[10:]: v for k, v in total.items() if k.startswith("gold_type:")}, MEMORY_TYPES)
        maj_source, _ = _majority({int(k[12:]): v for k, v in total.items() if k.startswith("gold_source:")})

        def rates(t: dict) -> dict:
            g = lambda k: t.get(k, 0)  # noqa: E731
            precision, recall, m = _div(g("matched"), g("predicted")), _div(g("matched"), g("gold")), g("matched")
            return {
                "json_valid_rate": _div(g("json_valid"), g("windows")),
                "schema_valid_rate": _div(g("schema_valid"), g("windows")),
                "memory_precision": precision,
                "memory_recall": recall,
                "memory_f1": _div(2 * precision * recall, precision + recall),
                "type_accuracy": _div(g("type_correct"), m),
                "type_accuracy_baseline": _div(g(f"pair_type:{maj_type}"), m),
                "time_exact": _div(g("time_exact"), m),
                "time_exact_baseline": _div(g("pair_empty_time"), m),
                **{f"{d}_agreement": _div(g(f"{d}_agree"), m) for d in FREE_DIMS},
                **{f"{d}_agreement_baseline": _div(g(f"pair_empty_{d}"), m) for d in FREE_DIMS},
                "keyword_f1": _div(g("keyword_f1_sum"), m),
                "keyword_f1_baseline": _div(g("pair_no_keywords"), m),  # keyword_f1([], []) = 1, else 0
                "overfill_rate": _div(g("overfill"), g("gold_empty_dims")),
                "source_accuracy": _div(g("source_correct"), m),
                "source_accuracy_baseline": _div(g(f"pair_source:{maj_source}"), m),
                "capped_rate": _div(g("capped"), g("windows")),
                "duplicate_rate": _div(g("duplicates"), g("written")),
                "speaker_fix_rate": _div(g("speaker_fixes"), g("written")),
            }

        out = {
            "windows": len(self.units),
            "predicted": total["predicted"],
            "gold": total["gold"],
            "matched": total["matched"],
            "match_similarity": self.similarity,
            "match_threshold": self.threshold,
            "capped_outputs": total["capped"],
            "records_written": total["written"],
            "prompt_tokens_per_window": round(_div(total["prompt_tokens"], len(self.units)), 4),
            "output_tokens_per_window": round(_div(total["output_tokens"], len(self.units)), 4),
            **_with_intervals(self.units, rates, EXTRACTION_CI_KEYS),
        }
        out["baseline_of"] = {
            "type_accuracy": f'always "{maj_type}" (majority memory_type of all gold records)',
            "time_exact": 'always ""',
            **{f"{d}_agreement": 'always ""' for d in FREE_DIMS},
            "keyword_f1": "always []",
            "source_accuracy": f"always source_id {maj_source} (majority of all gold records)",
        }
        return out


QUERY_FIELDS = {  # name -> the value of a QueryAnalysis compared for exact match
    "time": lambda q: q.dimension.time,
    "location": lambda q: _fold(q.dimension.location),
    "target_type": lambda q: frozenset(q.dimension.target_memory_type),
}


def _show(v) -> str:
    return json.dumps(sorted(v) if isinstance(v, frozenset) else v)


def query_scores(outputs: list[str | None], questions: list[dict]) -> dict:
    """Query analysis over the questions (each a gold row with a `query`). An output the spec cannot parse
    is wrong wherever it is scored and triggers nothing, fills nothing."""
    golds = [query_parser.QueryAnalysis.model_validate(q["query"]) for q in questions]
    preds = [query_parser.parse(raw).query for raw in outputs]
    units = []
    for p, g in zip(preds, golds):
        fire, need = bool(p and p.need_assistant_context), g.need_assistant_context
        c = Counter(n=1, valid=p is not None, tp=fire and need, fp=fire and not need, fn=need and not fire)
        c.update(
            nac_correct=p is not None and p.need_assistant_context == need,
            answer_dim_correct=p is not None and p.answer_dim == g.answer_dim,
            keyword_f1_sum=keyword_f1(p.dimension.keywords, g.dimension.keywords) if p else 0.0,
        )
        for name, get in QUERY_FIELDS.items():
            gv, pv = get(g), get(p) if p else None
            c.update({f"{name}_gold": bool(gv), f"{name}_exact": bool(gv) and pv == gv})
            c.update({f"{name}_gold_empty": not gv, f"{name}_filled": not gv and bool(pv)})
        units.append(c)

    def rates(t: dict) -> dict:
        g = lambda k: t.get(k, 0)  # noqa: E731
        precision, recall = _div(g("tp"), g("tp") + g("fp")), _div(g("tp"), g("tp") + g("fn"))
        out = {
            "valid_rate": _div(g("valid"), g("n")),
            "assistant_trigger_precision": precision,
            "assistant_trigger_recall": recall,
            "assistant_trigger_f1": _div(2 * precision * recall, precision + recall),
            "assistant_trigger_rate": _div(g("tp") + g("fp"), g("n")),
            "assistant_trigger_gold_rate": _div(g("tp") + g("fn"), g("n")),
            "need_assistant_context_acc": _div(g("nac_correct"), g("n")),
            "answer_dim_acc": _div(g("answer_dim_correct"), g("n")),
            "keyword_f1": _div(g("keyword_f1_sum"), g("n")),
        }
        for name in QUERY_FIELDS:
            out[f"{name}_exact_where_gold"] = _div(g(f"{name}_exact"), g(f"{name}_gold"))
            out[f"{name}_filled_where_gold_empty"] = _div(g(f"{name}_filled"), g(f"{name}_gold_empty"))
        return out

    out = {"questions": len(golds), **_with_intervals(units, rates, list(rates({})))}
    tp, fp, fn = (sum(u[k] for u in units) for k in ("tp", "fp", "fn"))
    out["assistant_trigger_confusion"] = {"tp": tp, "fp": fp, "fn": fn, "tn": len(golds) - tp - fp - fn}
    for name, get in QUERY_FIELDS.items():
        out[f"{name}_gold_questions"] = sum(bool(get(g)) for g in golds)

    # trivial baselines from the gold of the same questions
    baseline_of = {}

    def majority(key: str, values: list) -> None:
        best, count = _majority(Counter(values), sorted(set(values), key=_show))
        out[f"{key}_baseline"] = round(_div(count, len(values)), 4)
        baseline_of[key] = f"always {_show(best)}" if values else "no questions"

    majority("need_assistant_context_acc", [g.need_assistant_context for g in golds])
    majority("answer_dim_acc", [g.answer_dim for g in golds])
    # always triggering: precision = gold rate, recall = 1, so F1 = 2 * need / (questions + need)
    out["assistant_trigger_f1_baseline"] = round(_div(2 * (tp + fn), len(golds) + tp + fn), 4)
    baseline_of["assistant_trigger_f1"] = "always trigger (precision = gold rate, recall = 1)"
    out["keyword_f1_baseline"] = round(_div(sum(not g.dimension.keywords for g in golds), len(golds)), 4)
    baseline_of["keyword_f1"] = "always []"
    for name, get in QUERY_FIELDS.items():
        gv = [get(g) for g in golds if get(g)]
        majority(f"{name}_exact_where_gold", gv)
    out["baseline_of"] = baseline_of
    return out
