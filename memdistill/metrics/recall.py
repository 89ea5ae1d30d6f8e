"""Retrieval metrics that need no judge: evidence recall@k through source pointers (the share of a
question's evidence turns that are the source turn of one of the top-k records), hit@k (at least one
evidence turn covered), recalled tokens per query (the memory context an answer model would read), and
answer coverage (the share of the gold answer's content words found in that context: it credits what a
summary holds, where evidence recall only credits records that point at an evidence turn).
"""

from __future__ import annotations

import re

import numpy as np

# function words an answer shares with any context; content words are what is left
_STOPWORDS = frozenset(
    "a an the and or but of to in on at for with by from as is are was were be been being it its this that these "
    "those he she they them his her their him i me my we our you your do does did has have had not no yes so than "
    "then there here about into over after before up out just also very can could would should will".split()
)


def content_words(text: str) -> set[str]:
    """Lower-cased words and numbers, function words left out, a plural -s folded (runs -> run)."""
    out = set()
    for w in re.findall(r"[a-z0-9]+", text.lower()):
        if w in _STOPWORDS or (len(w) == 1 and not w.isdigit()):
            continue
        out.add(w[:-1] if len(w) > 3 and w.endswith("s") and not w.endswith("ss") else w)
    return out


def answer_coverage(answer: str, context: str) -> float | None:
    """The share of the answer's content words present in the context; None when the answer has none."""
    words = content_words(answer)
    if not words:
        return None
    return len(words & content_words(context)) / len(words)


def evidence_coverage(hits: list, evidence: list[str]) -> tuple[float, bool]:
    """(share of evidence turns that are a source turn of these hits, at least one covered). A merged
    record (memdistill.runtime.consolidate) points to the turns of every record merged into it."""
    if not evidence:
        raise ValueError("a question without evidence turns has no evidence recall")
    ev = set(evidence)
    covered = ev & {t for h in hits for t in h.item.source_turns}
    return len(covered) / len(ev), bool(covered)


def ndcg_at(hits: list, evidence: list[str], k: int) -> float:
    """NDCG@k with binary relevance, as MemoType reports it beside Recall@k (Table 2): a hit is relevant
    when it points to an evidence turn no higher hit already covered (a bank may hold several records of
    one turn; the turn counts once), gain 1 / log2(rank + 1); the ideal ranking puts one hit per evidence
    turn first."""
    if not evidence:
        raise ValueError("a question without evidence turns has no NDCG")
    ev, seen, dcg = set(evidence), set(), 0.0
    for rank, h in enumerate(hits[:k], 1):
        new = (ev & set(h.item.source_turns)) - seen
        if new:
            seen |= new
            dcg += 1.0 / np.log2(rank + 1)
    ideal = sum(1.0 / np.log2(r + 1) for r in range(1, min(k, len(ev)) + 1))
    return float(dcg / ideal)


class TokenCounter:
    """Tokens of the recalled context under one tokenizer (default: SmolLM2's, a 49k BPE)."""

    def __init__(self, model: str = "embedded:smollm2-135m-instruct"):
        from transformers import AutoTokenizer

        from memdistill.core.models import model_path

        self.name = model
        self.tok = AutoTokenizer.from_pretrained(model_path(model))

    def __call__(self, text: str) -> int:
        return len(self.tok(text, add_special_tokens=False)["input_ids"])


class RecallScores:
    """Evidence recall@k, hit@k and recalled tokens, overall and per question category."""

    def __init__(self, ks=(1, 5, 10, 20)):
        self.ks = sorted(ks)
        self.rows: list[dict] = []

    def add(self, q, recall, tokens_at: dict, kept_tokens: int, context: str | None = None, seconds=None) -> dict:
        """`q`: a memdistill.data.questions.Question; `recall`: a memdistill.runtime.Recall; `context`: the
        memory block the answer model reads (what answer coverage is measured on)."""
        row = {
            "question_id": q.question_id,
            "category": q.category,
            "evidence": bool(q.evidence),
            "tokens_at": {k: tokens_at[k] for k in self.ks},
            "kept_tokens": kept_tokens,
            "kept": len(recall.kept),
        }
        if seconds is not None:
            row["recall_s"] = seconds
        if q.evidence:
            for k in self.ks:
                row[f"recall@{k}"], row[f"hit@{k}"] = evidence_coverage(recall.hits[:k], q.evidence)
            row["kept_recall"], row["kept_hit"] = evidence_coverage(recall.kept, q.evidence)
            if context is not None:
                row["answer_coverage"] = answer_coverage(q.answer, context)
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
        cov = [r["answer_coverage"] for r in ev if r.get("answer_coverage") is not None]
        if cov:
            out["answer_coverage"], out["answer_coverage_n"] = mean(cov), len(cov)
        lat = sorted(r["recall_s"] for r in rows if "recall_s" in r)
        if lat:  # recall latency (TiMem Table 6): planner, retrieval and gate, not the answer
            out["recall_p50_s"] = round(float(np.percentile(lat, 50)), 4)
            out["recall_p95_s"] = round(float(np.percentile(lat, 95)), 4)
        out["kept_per_query"] = round(float(np.mean([r["kept"] for r in rows])), 2) if rows else 0.0
        out["tokens_per_query"] = round(float(np.mean([r["kept_tokens"] for r in rows])), 1) if rows else 0.0
        return out

    def summary(self) -> dict:
        cats = sorted({r["category"] for r in self.rows})
        return {
            "overall": self._summ(self.rows),
            "by_category": {c: self._summ([r for r in self.rows if r["category"] == c]) for c in cats},
        }
