"""Metrics of the encoder tasks, shared by evaluation and by training (threshold tuning and dev figures):
router (MemoType Table 9 layout), planner (accuracy, macro-F1), gate (keep precision / recall / F1 and
the share of candidate tokens removed), consolidator (accuracy, macro-F1, per-action precision / recall,
beside the majority-action baseline, with 95% bootstrap intervals)."""

from __future__ import annotations

from collections import defaultdict

from memdistill.spec import consolidation, memory_type, recall_gate, recall_plan


def binary_prf(pred: list[bool], gold: list[bool]) -> dict:
    tp = sum(p and g for p, g in zip(pred, gold))
    fp = sum(p and not g for p, g in zip(pred, gold))
    fn = sum(g and not p for p, g in zip(pred, gold))
    prec = tp / (tp + fp) if tp + fp else 0.0
    rec = tp / (tp + fn) if tp + fn else 0.0
    return {
        "acc": sum(p == g for p, g in zip(pred, gold)) / len(gold) if gold else 0.0,
        "precision": prec,
        "recall": rec,
        "f1": 2 * prec * rec / (prec + rec) if prec + rec else 0.0,
        "tp": tp,
        "fp": fp,
        "fn": fn,
    }


def router_scores(pred: list[list[str] | None], gold: list[list[str]]) -> dict:
    """MemoType Table 9 layout. `None` = unreadable output (no label, never an exact match)."""
    out: dict = {"overall": {}, "n": len(gold)}
    f1s, tp, fp, fn = [], 0, 0, 0
    for lab in memory_type.LABELS:
        s = binary_prf([p is not None and lab in p for p in pred], [lab in g for g in gold])
        out[lab] = {k: round(s[k], 4) for k in ("acc", "f1", "precision", "recall")}
        f1s.append(s["f1"])
        tp, fp, fn = tp + s["tp"], fp + s["fp"], fn + s["fn"]
    exact = sum(p is not None and set(p) == set(g) for p, g in zip(pred, gold))
    micro = 2 * tp / (2 * tp + fp + fn) if tp else 0.0
    out["overall"] = {
        "acc": round(exact / len(gold), 4),
        "f1": round(sum(f1s) / len(f1s), 4),
        "micro_f1": round(micro, 4),
    }
    out["valid_rate"] = round(sum(p is not None for p in pred) / len(gold), 4)
    return out


def planner_scores(pred: list[str | None], gold: list[str]) -> dict:
    from sklearn.metrics import confusion_matrix, f1_score

    labs = list(recall_plan.COMPLEXITIES)
    p = [x if x in labs else "invalid" for x in pred]
    per = f1_score(gold, p, labels=labs, average=None, zero_division=0)
    return {
        "n": len(gold),
        "accuracy": round(sum(a == b for a, b in zip(p, gold)) / len(gold), 4),
        "macro_f1": round(float(per.mean()), 4),
        "f1": {lab: round(float(v), 4) for lab, v in zip(labs, per)},
        "valid_rate": round(sum(x in labs for x in pred) / len(gold), 4),
        "confusion (rows gold, cols pred: simple, hybrid, complex, invalid)": confusion_matrix(
            gold, p, labels=labs + ["invalid"]
        )[:3].tolist(),
    }


def gate_examples(rows: list[dict], scores: list[float] | None = None) -> list[dict]:
    """Built gate rows (one per candidate) regrouped into examples, candidates in id order."""
    groups: dict = defaultdict(list)
    for k, r in enumerate(rows):
        groups[r["gate_id"]].append((r["candidate_id"], r, scores[k] if scores is not None else None))
    out = []
    for gid, cands in groups.items():
        cands.sort(key=lambda x: x[0])
        r0 = cands[0][1]
        out.append(
            {
                "gate_id": gid,
                "complexity": r0["complexity"],
                "question": _question(r0),
                "candidates": [r["text"] for _, r, _ in cands],
                "scores": [s for _, _, s in cands],
                "gold": [i for i, (_, r, _) in enumerate(cands, 1) if r["label"] >= 0.5],
            }
        )
    return out


def _question(row: dict) -> str:
    prefix = recall_gate.pair_query("", row["complexity"])
    return row["query"][len(prefix) :].strip() if row["query"].startswith(prefix.strip()) else row["query"]


def gate_scores(examples: list[dict], kept: list[list[int] | None] | None = None, shift: float = 0.0) -> dict:
    """Keep precision / recall / F1 over all candidates and the share of candidate tokens removed.
    `kept` (1-based ids per example; None = unreadable, keeps all); by default `recall_gate.select` on
    the examples' scores, after subtracting `shift` from their logits (how tuning tries a threshold)."""
    import math

    if kept is None:

        def fold(s):
            s = min(max(s, 1e-7), 1 - 1e-7)
            return 1 / (1 + math.exp(-(math.log(s / (1 - s)) - shift)))

        kept = [recall_gate.select([fold(s) for s in e["scores"]], e["complexity"]) for e in examples]
    pred, gold, tokens, kept_tokens, gold_tokens, invalid, n_kept = [], [], 0, 0, 0, 0, 0
    for e, k in zip(examples, kept):
        if k is None:
            invalid += 1
            k = list(range(1, len(e["candidates"]) + 1))
        ks, gs = set(k), set(e["gold"])
        n_kept += len(ks)
        for i, c in enumerate(e["candidates"], 1):
            n = len(c.split())
            tokens += n
            kept_tokens += n * (i in ks)
            gold_tokens += n * (i in gs)
            pred.append(i in ks)
            gold.append(i in gs)
    s = binary_prf(pred, gold)
    return {
        "examples": len(examples),
        "candidates": len(pred),
        "keep_precision": round(s["precision"], 4),
        "keep_recall": round(s["recall"], 4),
        "keep_f1": round(s["f1"], 4),
        "tokens_removed_share": round(1 - kept_tokens / tokens, 4) if tokens else 0.0,
        "gold_tokens_removed_share": round(1 - gold_tokens / tokens, 4) if tokens else 0.0,
        "kept_per_example": round(n_kept / len(examples), 2) if examples else 0.0,
        "valid_rate": round(1 - invalid / len(examples), 4) if examples else 0.0,
    }


def bootstrap_ci(stat, n: int, reps: int = 1000, seed: int = 0) -> list[float]:
    """95% percentile bootstrap interval of `stat(indices)` over `n` items resampled with replacement."""
    import random

    if not n:
        return [0.0, 0.0]
    rng = random.Random(seed)
    vals = sorted(stat([rng.randrange(n) for _ in range(n)]) for _ in range(reps))
    return [round(vals[int(0.025 * reps)], 4), round(vals[int(0.975 * reps) - 1], 4)]


def consolidator_scores(pred: list[str | None], gold: list[str]) -> dict:
    """Action accuracy, macro-F1 and per-action precision / recall / F1 over the gold pairs (None or an
    unknown action = invalid, never right), the always-the-majority-action baseline, 95% bootstrap
    intervals for accuracy and macro-F1."""
    labs = list(consolidation.ACTIONS)

    def acc(idx):
        return sum(pred[i] == gold[i] for i in idx) / len(idx)

    def macro(idx):
        f = [binary_prf([pred[i] == a for i in idx], [gold[i] == a for i in idx])["f1"] for a in labs]
        return sum(f) / len(f)

    everything = list(range(len(gold)))
    majority = max(labs, key=lambda a: (gold.count(a), -labs.index(a)))
    per = {a: binary_prf([p == a for p in pred], [g == a for g in gold]) for a in labs}
    return {
        "n": len(gold),
        "accuracy": round(acc(everything), 4) if gold else 0.0,
        "accuracy_ci95": bootstrap_ci(acc, len(gold)),
        "macro_f1": round(macro(everything), 4) if gold else 0.0,
        "macro_f1_ci95": bootstrap_ci(macro, len(gold)),
        "per_action": {a: {k: round(per[a][k], 4) for k in ("precision", "recall", "f1")} for a in labs},
        "gold_share": {a: round(gold.count(a) / len(gold), 4) if gold else 0.0 for a in labs},
        "majority_baseline": {
            "action": majority,
            "accuracy": round(gold.count(majority) / len(gold), 4) if gold else 0.0,
            "macro_f1": round(binary_prf([True] * len(gold), [g == majority for g in gold])["f1"] / len(labs), 4),
        },
        "valid_rate": round(sum(p in labs for p in pred) / len(gold), 4) if gold else 0.0,
    }
