"""Search decline: the agent searching less than it did early in the run (pure, no I/O).

A search agent can lose its reward without any of the likelihood, entropy, mismatch or
step-size signatures: it asks fewer questions of the retriever and answers multi-hop questions
before it has read what they need. The signal is the number of valid searches per rollout
(`rollout/valid_searches`), compared as a 20-step median with its median over the run's first
20 steps. The same rule serves the live alarm (`SearchDeclineTracker`, inside
`llds.monitor.alarms`) and the offline attribution (`llds.report.attribution`).
"""

from __future__ import annotations

import statistics
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

SEARCHES_KEY = "rollout/valid_searches"
EARLY = 20
"""The run's first steps: the baseline."""
WINDOW = 20
"""The recent steps compared with it."""
MIN_POINTS = 5
"""A baseline or window with fewer known values is not judged."""
SEARCH_DECLINE = 0.75
"""Present when the window median is at or below this share of the early median (a quarter
fewer searches). Set after seeing the run it was added for (the theorem-world study's GRPO+LLDS
seed 1, 1.8 -> 1.1 valid searches per rollout while its reward fell): in-sample there; judged
unchanged on every run recorded before it (docs/diagnostics.md, "Attributing a collapse")."""
SEARCH_FLOOR = 0.5
"""An early median below this many searches per rollout is not a baseline: a policy that
hardly searched cannot search less."""


def declined(early: Sequence[float], window: Sequence[float]) -> tuple[bool, float, float] | None:
    """`(present, early median, window median)`, or None when either has too few values."""
    if len(early) < MIN_POINTS or len(window) < MIN_POINTS:
        return None
    base, now = statistics.median(early), statistics.median(window)
    return base >= SEARCH_FLOOR and now <= SEARCH_DECLINE * base, base, now


@dataclass(frozen=True)
class SearchDecline:
    """A step at which the rule holds, with the numbers behind it."""

    early_median: float
    window_median: float
    window_start: int


class SearchDeclineTracker:
    """Online form of the rule: `update(step, value)` once per step; a `SearchDecline` while it
    holds, None otherwise. The window is judged only once it lies after the baseline."""

    def __init__(self) -> None:
        self._early: list[float] = []
        self._recent: deque[tuple[int, float]] = deque(maxlen=WINDOW)
        self._seen = 0

    def update(self, step: int, value: float | None) -> SearchDecline | None:
        if value is None:
            return None
        self._seen += 1
        if len(self._early) < EARLY:
            self._early.append(value)
            return None
        self._recent.append((step, value))
        if self._seen < EARLY + WINDOW:
            return None
        verdict = declined(self._early, [v for _, v in self._recent])
        if verdict is None or not verdict[0]:
            return None
        return SearchDecline(verdict[1], verdict[2], self._recent[0][0])
