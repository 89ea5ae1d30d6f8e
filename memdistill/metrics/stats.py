"""Statistics shared by every metrics module: percentile bootstrap intervals over evaluation units."""

from __future__ import annotations

import random


def bootstrap_ci(stat, n: int, reps: int = 1000, seed: int = 0) -> list[float]:
    """95% percentile bootstrap interval of `stat(indices)` over `n` items resampled with replacement."""
    if not n:
        return [0.0, 0.0]
    rng = random.Random(seed)
    vals = sorted(stat([rng.randrange(n) for _ in range(n)]) for _ in range(reps))
    return [round(vals[int(0.025 * reps)], 4), round(vals[int(0.975 * reps) - 1], 4)]


def mean_ci(values: list[float]) -> dict:
    """{"mean", "ci95"} of per-item values."""
    n = len(values)
    mean = sum(values) / n if n else 0.0
    return {"mean": round(mean, 4), "ci95": bootstrap_ci(lambda idx: sum(values[i] for i in idx) / len(idx), n)}


def rate_ci(flags: list[bool]) -> dict:
    """{"rate", "ci95", "n"} of per-item yes / no outcomes."""
    out = mean_ci([float(f) for f in flags])
    return {"rate": out["mean"], "ci95": out["ci95"], "n": len(flags)}


def percentile(values: list[float], q: float, ndigits: int = 3) -> float | None:
    """The q-quantile by nearest rank, no interpolation (latency p50 / p95 in every report); None without values."""
    if not values:
        return None
    s = sorted(values)
    return round(s[min(len(s) - 1, int(round(q * (len(s) - 1))))], ndigits)
