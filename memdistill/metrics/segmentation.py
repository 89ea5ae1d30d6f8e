"""Topic segmentation metrics: the standard Pk (Beeferman et al., 1999) and WindowDiff (Pevzner and Hearst,
2002) over a session's utterances (boundary precision / recall / F1: `metrics.encoders.binary_prf`).

A segmentation of n utterances is its boundary flags b[0..n-2] (b[j] = a topic opens at utterance j+1).
Pk and WindowDiff slide a probe of width k over the session (k = half the mean gold episode length, rounded,
at least 1, the usual choice) and count the probes that disagree: Pk when gold and prediction disagree on
whether the probe's two ends lie in the same episode, WindowDiff when they count a different number of
boundaries inside it. Both are error rates (lower is better); over a corpus each is the mean over every
probe of every session (probes pooled), so long sessions weigh by length.
"""

from __future__ import annotations


def probe_width(gold: list[bool]) -> int:
    n = len(gold) + 1
    return max(1, round(n / (sum(gold) + 1) / 2))


def _disagreements(gold: list[bool], pred: list[bool], k: int | None, differ) -> tuple[int, int]:
    if len(gold) != len(pred):
        raise ValueError(f"gold has {len(gold)} boundary slots, prediction {len(pred)}")
    k = k or probe_width(gold)
    probes = [(gold[i : i + k], pred[i : i + k]) for i in range(len(gold) + 1 - k)]
    return sum(bool(differ(g, p)) for g, p in probes), len(probes)


def pk_counts(gold: list[bool], pred: list[bool], k: int | None = None) -> tuple[int, int]:
    """(disagreeing probes, probes) for Pk: do the probe's ends lie in one episode?"""
    return _disagreements(gold, pred, k, lambda g, p: any(g) != any(p))


def windowdiff_counts(gold: list[bool], pred: list[bool], k: int | None = None) -> tuple[int, int]:
    """(disagreeing probes, probes) for WindowDiff: how many boundaries lie inside the probe?"""
    return _disagreements(gold, pred, k, lambda g, p: sum(g) != sum(p))
