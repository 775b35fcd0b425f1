"""A run's own early steps as the baseline a later window is compared with (pure, no I/O).

An absolute threshold on a signal separates worlds (one world's healthy entropy or search count
is another's collapse) rather than states of one run. The drift detectors therefore compare the
median of a recent window with the median of the run's first known values: "twice its early
level", "a quarter fewer than it started with". `EarlyWindow` is that comparison, online.
"""

from __future__ import annotations

import statistics
from collections import deque
from dataclasses import dataclass


@dataclass(frozen=True)
class Comparison:
    """The early baseline and the recent window at one step."""

    early: float
    """median of the run's first known values"""
    now: float
    """median of the recent window"""
    early_first: int
    early_last: int
    """the steps the baseline spans"""
    window_start: int
    """the first step of the recent window"""
    window: tuple[float, ...]
    """the recent window's values, oldest first"""

    @property
    def ratio(self) -> float | None:
        """`now / early`; None when the baseline is 0."""
        return self.now / self.early if self.early else None

    def baseline_text(self) -> str:
        """`steps 1-20`: which steps the baseline is, for messages."""
        return f"steps {self.early_first}-{self.early_last}"


class EarlyWindow:
    """The first `early` known values of a series (its baseline), then the last `window` known
    values after them. `update(step, value)` once per step (None: not logged, skipped) returns
    a `Comparison` once the window is full, None before."""

    def __init__(self, early: int, window: int) -> None:
        if early < 1 or window < 1:
            raise ValueError(f"EarlyWindow needs early, window >= 1, got {early}, {window}")
        self.early_size = early
        self._early: list[tuple[int, float]] = []
        self._early_median: float | None = None
        self._recent: deque[tuple[int, float]] = deque(maxlen=window)

    def update(self, step: int, value: float | None) -> Comparison | None:
        if value is None:
            return None
        if len(self._early) < self.early_size:
            self._early.append((step, value))
            return None
        if self._early_median is None:
            self._early_median = statistics.median(v for _, v in self._early)
        self._recent.append((step, value))
        if len(self._recent) < (self._recent.maxlen or 0):
            return None
        values = tuple(v for _, v in self._recent)
        return Comparison(
            self._early_median,
            statistics.median(values),
            self._early[0][0],
            self._early[-1][0],
            self._recent[0][0],
            values,
        )
