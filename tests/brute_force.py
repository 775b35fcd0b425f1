"""Exact p values by enumeration, the slow way: what the exact tests are checked against."""

from __future__ import annotations

import itertools
import statistics


def permutation_p(a: list[float], b: list[float]) -> float:
    """Every relabelling of the pooled values, counted by hand."""
    pooled, k = a + b, len(a)
    observed = abs(statistics.mean(a) - statistics.mean(b))
    hits = total = 0
    for chosen in itertools.combinations(range(len(pooled)), k):
        x = [pooled[i] for i in chosen]
        y = [pooled[i] for i in range(len(pooled)) if i not in chosen]
        total += 1
        hits += abs(statistics.mean(x) - statistics.mean(y)) >= observed - 1e-12
    return hits / total
