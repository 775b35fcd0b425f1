"""Exact tests for the small samples a study has: a handful of seeds per arm, a few dozen
paired questions. Exact, because at 3 to 6 seeds an asymptotic p is off by more than the
differences it is asked about; each test comes with the smallest p it can give at a sample
size, so a table can say when no gap, however large, could have been called a difference.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from scipy import stats


def exact_permutation_p(a: Sequence[float], b: Sequence[float]) -> float | None:
    """Two-sided p of the difference of means over every split of the pooled values into groups
    of len(a) and len(b) (exact; None when either group is empty)."""
    if not a or not b:
        return None
    if min(len(a), len(b)) == 1:
        return _singleton_permutation_p(a, b)
    result = stats.permutation_test(
        (np.asarray(a, dtype=float), np.asarray(b, dtype=float)),
        lambda x, y, axis: np.mean(x, axis=axis) - np.mean(y, axis=axis),
        permutation_type="independent",
        alternative="two-sided",
        n_resamples=math.inf,
        vectorized=True,
    )
    return float(result.pvalue)


def _singleton_permutation_p(a: Sequence[float], b: Sequence[float]) -> float:
    """The exact test when one group holds a single value, which scipy refuses: each of the
    pooled values in turn is that group, so the p is the share of them whose difference of
    means is at least as large as the observed one."""
    pooled = np.asarray([*a, *b], dtype=float)
    rest_mean = (pooled.sum() - pooled) / (len(pooled) - 1)
    diffs = np.abs(pooled - rest_mean)
    observed = diffs[0] if len(a) == 1 else diffs[-1]  # the single value is first or last
    return float(np.mean(diffs >= observed - 1e-12))


def fisher_p(yes_a: int, n_a: int, yes_b: int, n_b: int) -> float | None:
    """Fisher's exact two-sided p for `yes_a` of `n_a` against `yes_b` of `n_b`."""
    if n_a == 0 or n_b == 0:
        return None
    table = [[yes_a, n_a - yes_a], [yes_b, n_b - yes_b]]
    return float(stats.fisher_exact(table, alternative="two-sided").pvalue)


def smallest_permutation_p(n_a: int, n_b: int) -> float | None:
    """The smallest two-sided p the exact permutation test can give for n_a and n_b seeds,
    whatever their values: that of two groups that do not overlap. At 2 + 2 seeds it is 1/3 and
    at 3 + 3 0.1, so no gap, however large, can be called a difference there; at 4 + 4, 2/70."""
    if n_a == 0 or n_b == 0:
        return None
    return exact_permutation_p([1000.0 + i for i in range(n_a)], [float(i) for i in range(n_b)])


def smallest_fisher_p(n_a: int, n_b: int) -> float | None:
    """The smallest two-sided p Fisher's exact test can give for n_a against n_b runs: every run
    of one arm collapsed and none of the other."""
    if n_a == 0 or n_b == 0:
        return None
    extremes = (fisher_p(n_a, n_a, 0, n_b), fisher_p(0, n_a, n_b, n_b))
    return min(p for p in extremes if p is not None)


def sign_test(k: int, n: int) -> float:
    """Two-sided exact sign test: the chance, with n fair coin flips, of a split at least as
    uneven as k against n - k. 1.0 when n is 0."""
    if not 0 <= k <= n:
        raise ValueError(f"sign_test: need 0 <= k <= n, got k={k}, n={n}")
    if n == 0:
        return 1.0
    tail = min(k, n - k)
    p = 2 * sum(math.comb(n, i) for i in range(tail + 1)) / 2**n
    return min(1.0, p)
