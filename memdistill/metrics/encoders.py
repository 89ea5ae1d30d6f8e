"""Metrics of the encoder tasks, shared by evaluation and by training (threshold tuning and dev figures):
router (MemoType Table 9: per-type and overall ACC / F1, plus exact-set accuracy), planner (accuracy,
macro-F1), gate (keep precision / recall / F1 and the share of candidate tokens removed), consolidator
(accuracy, macro-F1, per-action precision / recall / F1). Every rate comes with its 95% bootstrap interval
over the task's units (`<name>_ci95`: snippets, questions, gate examples, pairs) and every accuracy with
its trivial baseline (`majority_baseline`, from the gold labels alone)."""

from __future__ import annotations

from collections import Counter, defaultdict

import numpy as np

# bootstrap_ci lives in stats; re-exported here for existing importers
from memdistill.metrics.stats import bootstrap_ci
from memdistill.spec import MODELS, consolidator, gate, planner, querytyper, router


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


def with_ci(stats: dict, n: int) -> dict:
    """Each `stat(unit indices)` on all `n` units, and as `<name>_ci95` its 95% bootstrap interval
    (the same resamples for every stat, so intervals of one table come from one bootstrap)."""
    everything = list(range(n))
    out: dict = {}
    for name, stat in stats.items():
        out[name] = round(float(stat(everything)), 4) if n else 0.0
        out[f"{name}_ci95"] = bootstrap_ci(stat, n)
    return out


def _div(a, b) -> float:
    return float(a / b) if b else 0.0


_PRF = {
    "precision": lambda tp, fp, fn: _div(tp, tp + fp),
    "recall": lambda tp, fp, fn: _div(tp, tp + fn),
    "f1": lambda tp, fp, fn: _div(2 * tp, 2 * tp + fp + fn),
}


def _prf_counts(tp: np.ndarray, fp: np.ndarray, fn: np.ndarray) -> dict:
    """precision / recall / F1 statistics of unit indices, pooled over the units' counts."""
    return {k: (lambda idx, f=f: f(tp[idx].sum(), fp[idx].sum(), fn[idx].sum())) for k, f in _PRF.items()}


def _prf(pred: np.ndarray, gold: np.ndarray) -> dict:
    """The same for binary decisions (bool arrays, one row per unit; several columns pool as micro)."""
    return _prf_counts(pred & gold, pred & ~gold, ~pred & gold)


def router_scores(pred: list[list[str] | None], gold: list[list[str]]) -> dict:
    """MemoType Table 9 (appendix B). Per type: ACC = accuracy of the binary decision "this type is
    present", F1 = binary F1 of that type. Overall ACC = mean of the three per-type ACC, overall F1 =
    mean of the three per-type F1: Table 9's rows are these means (GPT-4o-Mini (85.05 + 87.18 + 78.42) / 3
    = 83.55 ACC, (76.10 + 85.59 + 69.14) / 3 = 76.94 F1; MemoType's own row: ACC 92.10 = the mean, F1 91.75
    printed where the mean of its per-type F1 is 91.95). The project's stricter figures sit beside them
    under their own names: `exact_set` (the whole label set right, none = the empty set) and `micro_f1`.
    `None` = unreadable output: no label, never an exact set. Units: snippets."""
    labs = router.LABELS
    n = len(gold)
    P = np.array([[p is not None and lab in p for lab in labs] for p in pred], dtype=bool).reshape(n, len(labs))
    G = np.array([[lab in g for lab in labs] for g in gold], dtype=bool).reshape(n, len(labs))
    exact = np.array([p is not None and set(p) == set(g) for p, g in zip(pred, gold)], dtype=bool)
    valid = np.array([p is not None for p in pred], dtype=bool)
    acc = [lambda idx, k=k: float((P[idx, k] == G[idx, k]).mean()) for k in range(len(labs))]
    prf = [_prf(P[:, k], G[:, k]) for k in range(len(labs))]

    out: dict = {"n": n}
    for k, lab in enumerate(labs):
        out[lab] = with_ci({"acc": acc[k], **prf[k]}, n)
    out["overall"] = with_ci(
        {
            "acc": lambda idx: sum(a(idx) for a in acc) / len(acc),
            "f1": lambda idx: sum(s["f1"](idx) for s in prf) / len(prf),
            "exact_set": lambda idx: float(exact[idx].mean()),
            "micro_f1": _prf(P, G)["f1"],
        },
        n,
    )
    out.update(with_ci({"valid_rate": lambda idx: float(valid[idx].mean())}, n))
    # trivial baselines from gold alone: each type's majority decision; the most common whole label set
    present = G.mean(axis=0) > 0.5 if n else np.zeros(len(labs), dtype=bool)
    shares = [float(G[:, k].mean()) if n else 0.0 for k in range(len(labs))]
    sets = Counter(tuple(lab for lab in labs if lab in g) for g in gold).most_common(1)
    top, top_n = sets[0] if sets else ((), 0)
    base = {lab: {"acc": round(max(s, 1 - s), 4) if n else 0.0} for lab, s in zip(labs, shares)}
    out["majority_baseline"] = {
        **base,
        "labels": [lab for lab, p in zip(labs, present) if p],
        "overall": {
            "acc": round(sum(b["acc"] for b in base.values()) / len(labs), 4),
            "exact_set": round(top_n / n, 4) if n else 0.0,
        },
        "exact_set_labels": list(top),
    }
    return out


def class_scores(pred: list[str | None], gold: list[str], labels) -> dict:
    """Accuracy, macro-F1 and per-class F1 over `labels` (planner: simple / hybrid / complex; query typer:
    EM / PM / GM / none; an answer outside them is wrong), valid rate; intervals over questions;
    always-the-majority-class baseline."""
    from sklearn.metrics import confusion_matrix

    labs = list(labels)
    p = [x if x in labs else "invalid" for x in pred]
    P, G, n = np.array(p, dtype=object), np.array(gold, dtype=object), len(gold)
    f1 = {c: _prf(P == c, G == c)["f1"] for c in labs}
    majority = max(labs, key=lambda c: (gold.count(c), -labs.index(c)))
    return {
        "n": n,
        **with_ci(
            {
                "accuracy": lambda idx: float((P[idx] == G[idx]).mean()),
                "macro_f1": lambda idx: sum(f(idx) for f in f1.values()) / len(labs),
                "valid_rate": lambda idx: float((P[idx] != "invalid").mean()),
            },
            n,
        ),
        "f1": with_ci(f1, n),
        "majority_baseline": {
            "label": majority,
            "accuracy": round(gold.count(majority) / n, 4) if n else 0.0,
            "macro_f1": round(binary_prf([True] * n, [g == majority for g in gold])["f1"] / len(labs), 4),
        },
        f"confusion (rows gold, cols pred: {', '.join(labs)}, invalid)": confusion_matrix(
            gold, p, labels=labs + ["invalid"]
        )[: len(labs)].tolist()
        if n
        else [],
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
    prefix = gate.pair_query("", row["complexity"])
    return row["query"][len(prefix) :].strip() if row["query"].startswith(prefix.strip()) else row["query"]


def gate_scores(
    examples: list[dict], kept: list[list[int] | None] | None = None, shift: float = 0.0, ci: bool = True
) -> dict:
    """Keep precision / recall / F1 over all candidates and the share of candidate tokens (whitespace
    words) removed; intervals resample whole examples (questions). `kept` (1-based ids per example;
    None = unreadable, keeps all); by default `gate.select` on the examples' scores, after
    subtracting `shift` from their logits (how tuning tries a threshold; `ci=False` spares it the
    bootstrap). The keep-all baseline is what a stack without a gate passes on."""
    import math

    if kept is None:

        def fold(s):
            s = min(max(s, 1e-7), 1 - 1e-7)
            return 1 / (1 + math.exp(-(math.log(s / (1 - s)) - shift)))

        kept = [gate.select([fold(s) for s in e["scores"]], e["complexity"]) for e in examples]
    cols = ("tp", "fp", "fn", "tokens", "kept_tokens", "gold_tokens", "kept", "invalid", "candidates")
    per = {c: np.zeros(len(examples)) for c in cols}
    for j, (e, k) in enumerate(zip(examples, kept)):
        per["invalid"][j] = k is None
        ks = set(range(1, len(e["candidates"]) + 1) if k is None else k)
        gs = set(e["gold"])
        per["kept"][j], per["candidates"][j] = len(ks), len(e["candidates"])
        for i, c in enumerate(e["candidates"], 1):
            w = len(c.split())
            per["tokens"][j] += w
            per["kept_tokens"][j] += w * (i in ks)
            per["gold_tokens"][j] += w * (i in gs)
            per["tp"][j] += i in ks and i in gs
            per["fp"][j] += i in ks and i not in gs
            per["fn"][j] += i in gs and i not in ks

    def total(c, idx):
        return per[c][idx].sum()

    keep = _prf_counts(per["tp"], per["fp"], per["fn"])
    stats = {
        **{f"keep_{k}": f for k, f in keep.items()},
        "tokens_removed_share": lambda idx: 1 - _div(total("kept_tokens", idx), total("tokens", idx)),
        "gold_tokens_removed_share": lambda idx: 1 - _div(total("gold_tokens", idx), total("tokens", idx)),
        "kept_per_example": lambda idx: float(per["kept"][idx].mean()),
        "valid_rate": lambda idx: 1 - float(per["invalid"][idx].mean()),
    }
    n, everything = len(examples), list(range(len(examples)))
    gold_n, cands = total("tp", everything) + total("fn", everything), total("candidates", everything)
    keep_all_p = _div(gold_n, cands)
    return {
        "examples": n,
        "candidates": int(cands),
        **(with_ci(stats, n) if ci else {k: round(f(everything), 4) if n else 0.0 for k, f in stats.items()}),
        "keep_all_baseline": {
            "keep_precision": round(keep_all_p, 4),
            "keep_recall": 1.0 if gold_n else 0.0,
            "keep_f1": round(_div(2 * keep_all_p, keep_all_p + 1), 4) if gold_n else 0.0,
            "tokens_removed_share": 0.0,
        },
    }


def consolidator_scores(pred: list[str | None], gold: list[str]) -> dict:
    """Action accuracy, macro-F1 and per-action precision / recall / F1 over the gold pairs (None or an
    unknown action = invalid, never right), valid rate; intervals over pairs; the always-the-majority-
    action baseline."""
    labs = list(consolidator.ACTIONS)
    n = len(gold)
    P, G = np.array([p if p in labs else "invalid" for p in pred], dtype=object), np.array(gold, dtype=object)
    per = {a: _prf(P == a, G == a) for a in labs}
    majority = max(labs, key=lambda a: (gold.count(a), -labs.index(a)))
    return {
        "n": n,
        **with_ci(
            {
                "accuracy": lambda idx: float((P[idx] == G[idx]).mean()),
                "macro_f1": lambda idx: sum(per[a]["f1"](idx) for a in labs) / len(labs),
                "valid_rate": lambda idx: float((P[idx] != "invalid").mean()),
            },
            n,
        ),
        "per_action": {a: with_ci(per[a], n) for a in labs},
        "gold_share": {a: round(gold.count(a) / n, 4) if n else 0.0 for a in labs},
        "majority_baseline": {
            "action": majority,
            "accuracy": round(gold.count(majority) / n, 4) if n else 0.0,
            "macro_f1": round(binary_prf([True] * n, [g == majority for g in gold])["f1"] / len(labs), 4),
        },
    }


def segmenter_scores(pred: list[bool | None], rows: list[dict], ci: bool = True) -> dict:
    """TraceMem topic segmentation over the gold sessions: boundary precision / recall / F1, accuracy and
    Cohen's kappa over the decisions (every utterance but a session's first), Pk and WindowDiff
    (metrics.segmentation, probes pooled); `None` = an unreadable answer, read as no cut and counted in
    valid_rate. Intervals resample sessions (`ci=False` spares threshold tuning the bootstrap). Baselines from
    the gold labels alone: never cut (the majority decision) and always cut."""
    from memdistill.metrics.segmentation import pk_counts, windowdiff_counts

    sessions: dict = {}
    for k, r in enumerate(rows):
        sessions.setdefault((r["conversation_id"], r["session_id"]), []).append(k)
    gold = [[rows[k]["label"] == "CHANGE" for k in ks] for ks in sessions.values()]

    def figures(flags: list[list[bool]]) -> dict:
        cols = {"tp": [], "fp": [], "fn": [], "right": [], "n": [], "pk": [], "wd": [], "probes": []}
        for g, p in zip(gold, flags):
            cols["tp"].append(sum(a and b for a, b in zip(g, p)))
            cols["fp"].append(sum(b and not a for a, b in zip(g, p)))
            cols["fn"].append(sum(a and not b for a, b in zip(g, p)))
            cols["right"].append(sum(a == b for a, b in zip(g, p)))
            cols["n"].append(len(g))
            (pk, probes), (wd, _) = pk_counts(g, p), windowdiff_counts(g, p)
            cols["pk"].append(pk)
            cols["wd"].append(wd)
            cols["probes"].append(probes)
        return {k: np.array(v) for k, v in cols.items()}

    def stats(c: dict) -> dict:
        return {
            **_prf_counts(c["tp"], c["fp"], c["fn"]),
            "accuracy": lambda idx: _div(c["right"][idx].sum(), c["n"][idx].sum()),
            "pk": lambda idx: _div(c["pk"][idx].sum(), c["probes"][idx].sum()),
            "windowdiff": lambda idx: _div(c["wd"][idx].sum(), c["probes"][idx].sum()),
            "kappa": lambda idx: _kappa(c["tp"][idx].sum(), c["fp"][idx].sum(), c["fn"][idx].sum(), c["n"][idx].sum()),
        }

    by_session = [[pred[k] for k in ks] for ks in sessions.values()]
    c = figures([[bool(x) for x in s] for s in by_session])
    valid = np.array([sum(x is not None for x in s) for s in by_session])
    n = len(gold)
    out = {
        "sessions": n,
        "decisions": int(c["n"].sum()),
        "gold_change_share": round(_div(sum(map(sum, gold)), c["n"].sum()), 4),
    }
    everything = list(range(n))
    own = {**stats(c), "valid_rate": lambda idx: _div(valid[idx].sum(), c["n"][idx].sum())}
    out.update(with_ci(own, n) if ci else {k: round(float(f(everything)), 4) for k, f in own.items()})
    for name, cut in (("never_cut_baseline", False), ("always_cut_baseline", True)):
        b = figures([[cut] * len(g) for g in gold])
        out[name] = {k: round(float(f(everything)), 4) for k, f in stats(b).items()}
    return out


def _kappa(tp: int, fp: int, fn: int, n: int) -> float:
    """Cohen's kappa of two binary labellings from their confusion counts: agreement beyond what two
    labellers with the same change rates would reach by chance (0 when either never varies)."""
    if not n:
        return 0.0
    a, b = (tp + fn) / n, (tp + fp) / n
    chance = a * b + (1 - a) * (1 - b)
    return _div((n - fp - fn) / n - chance, 1 - chance)


# The graders the spec records name (`CompactModel.metric`): decisions on a model's items -> its figures.
# The gate's items are its examples (a question with its candidates), every other model's its built rows.
GRADERS = {
    "router_scores": lambda pred, rows: router_scores(pred, [r["labels"] for r in rows]),
    "planner_scores": lambda pred, rows: class_scores(pred, [r["label"] for r in rows], planner.COMPLEXITIES),
    "consolidator_scores": lambda pred, rows: consolidator_scores(pred, [r["label"] for r in rows]),
    "segmenter_scores": lambda pred, rows: segmenter_scores(pred, rows),
    "querytyper_scores": lambda pred, rows: class_scores(pred, [r["label"] for r in rows], querytyper.LABELS),
    "gate_scores": lambda pred, rows: gate_scores(gate_examples(rows), pred),
}


def score(name: str, pred, rows: list[dict]) -> dict:
    """A model's figures for its decisions on its built rows (gate: kept ids per example, or None)."""
    return GRADERS[MODELS[name].metric](pred, rows)


def decisions(name: str, probs: list[list[float]], rows: list[dict]) -> list:
    """Served probabilities on built rows -> the model's decisions, as the SDK makes them (the gate selects
    per example under its budgets)."""
    m = MODELS[name]
    if m.head != "pair_score":
        return [m.decide(p) for p in probs]
    return [gate.select(e["scores"], e["complexity"]) for e in gate_examples(rows, [m.decide(p) for p in probs])]
