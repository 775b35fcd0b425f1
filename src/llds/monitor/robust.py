"""Robust statistics for short, noisy training curves (pure Python, no numpy needed).

Training metrics are noisy and occasionally wild (a single NaN step, one huge gradient): medians,
MADs and Theil-Sen slopes keep one bad point from deciding a trend or a baseline.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import pairwise
from typing import Any

MAD_TO_SIGMA = 1.4826
"""MAD * 1.4826 estimates the standard deviation of Gaussian noise."""


def as_float(value: Any) -> float | None:
    """A finite float, or None for missing / null / NaN / inf / non-numeric values."""
    if isinstance(value, bool) or value is None:
        return None
    try:
        x = float(value)
    except (TypeError, ValueError):
        return None
    return x if math.isfinite(x) else None


def median(values: Sequence[float]) -> float:
    """Median of a non-empty sequence."""
    s = sorted(values)
    n = len(s)
    if n == 0:
        raise ValueError("median of an empty sequence")
    mid = n // 2
    return s[mid] if n % 2 else 0.5 * (s[mid - 1] + s[mid])


def mad_sigma(values: Sequence[float]) -> float:
    """Robust standard deviation: 1.4826 * median absolute deviation from the median."""
    m = median(values)
    return MAD_TO_SIGMA * median([abs(v - m) for v in values])


def theil_sen(xs: Sequence[float], ys: Sequence[float]) -> tuple[float, float]:
    """Theil-Sen line: (slope, intercept) = medians of pairwise slopes and of y - slope * x.

    Breakdown point ~29%: up to about a quarter of the points can be arbitrary outliers.
    """
    if len(xs) != len(ys) or len(xs) < 2:
        raise ValueError("theil_sen needs at least two (x, y) pairs of equal length")
    slopes = [
        (ys[j] - ys[i]) / (xs[j] - xs[i])
        for i in range(len(xs))
        for j in range(i + 1, len(xs))
        if xs[j] != xs[i]
    ]
    if not slopes:
        raise ValueError("theil_sen needs at least two distinct x values")
    slope = median(slopes)
    intercept = median([y - slope * x for x, y in zip(xs, ys, strict=True)])
    return slope, intercept


@dataclass(frozen=True)
class Trend:
    """Direction of a windowed series: +1 rising, -1 falling, 0 flat / not significant."""

    direction: int
    slope: float
    stderr: float
    n: int


def trend(
    xs: Sequence[float],
    ys: Sequence[float],
    *,
    min_slope: float,
    z: float,
    noise_floor: float,
    noise: float | None = None,
) -> Trend:
    """Theil-Sen slope, called a trend only if both large (|slope| > min_slope) and significant.

    Significance: |slope| > z * stderr, where stderr is the least-squares standard error of a
    slope computed with a robust noise estimate: `noise` if given (e.g. from a longer history,
    see `diff_noise`), else the MAD of the residuals; floored at `noise_floor` so a perfectly
    smooth series does not turn every tiny wiggle into a trend.
    """
    slope, intercept = theil_sen(xs, ys)
    if noise is None:
        noise = mad_sigma([y - (slope * x + intercept) for x, y in zip(xs, ys, strict=True)])
    sigma = max(noise, noise_floor)
    xbar = sum(xs) / len(xs)
    sxx = sum((x - xbar) ** 2 for x in xs)
    stderr = sigma / math.sqrt(sxx) if sxx > 0 else math.inf
    direction = 0
    if abs(slope) > min_slope and abs(slope) > z * stderr:
        direction = 1 if slope > 0 else -1
    return Trend(direction, slope, stderr, len(xs))


def diff_noise(ys: Sequence[float | None]) -> float | None:
    """Noise level of a series from its successive differences: MAD(diff) / sqrt(2).

    Unaffected by a linear trend (it shifts every difference equally) and, taken over a longer
    span than a trend window, far steadier than residuals of a short fit.
    """
    diffs = [b - a for a, b in pairwise(ys) if a is not None and b is not None]
    if len(diffs) < 3:
        return None
    return mad_sigma(diffs) / math.sqrt(2)


@dataclass(frozen=True)
class Spike:
    """How far the newest value sits above a robust baseline of the values before it."""

    z: float
    ratio: float
    baseline: float


def spike_score(
    history: Sequence[float],
    value: float,
    *,
    log_scale: bool,
    min_scale: float,
) -> Spike | None:
    """Robust z-score of `value` against `history` (median / MAD), or None if not computable.

    With `log_scale` the score is taken on log values (gradient norms and likelihood ratios
    blow up multiplicatively); non-positive values then cannot be scored.
    """
    if not history:
        return None
    if log_scale:
        if value <= 0 or any(h <= 0 for h in history):
            return None
        hist = [math.log(h) for h in history]
        x = math.log(value)
    else:
        hist, x = list(history), value
    base = median(hist)
    scale = max(mad_sigma(hist), min_scale)
    baseline = math.exp(base) if log_scale else base
    ratio = value / baseline if baseline > 0 else math.inf
    return Spike((x - base) / scale, ratio, baseline)
