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
