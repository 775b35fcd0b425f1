"""Search decline: the agent searching less than it did early in the run (pure, no I/O).

A search agent can lose its reward without any of the likelihood, entropy, mismatch or
step-size signatures: it asks fewer questions of the retriever and answers multi-hop questions
before it has read what they need. The signal is the number of valid searches per rollout
(`rollout/valid_searches`), compared as a 20-step median with its median over the run's first
20 steps. The same rule serves the live alarm (`search_decline`, registered here) and the
offline attribution (`llds.report.attribution`).
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from pydantic import Field

from llds.config.schema import section
from llds.monitor.baseline import EarlyWindow
from llds.monitor.registry import DetectorSettings, Firing, StepView, register_detector
from llds.monitor.robust import as_float

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


def declined(
    early: Sequence[float],
    window: Sequence[float],
    decline: float = SEARCH_DECLINE,
    floor: float = SEARCH_FLOOR,
) -> tuple[bool, float, float] | None:
    """`(present, early median, window median)`, or None when either has too few values."""
    if len(early) < MIN_POINTS or len(window) < MIN_POINTS:
        return None
    base, now = statistics.median(early), statistics.median(window)
    return base >= floor and now <= decline * base, base, now


@dataclass(frozen=True)
class SearchDecline:
    """A step at which the rule holds, with the numbers behind it."""

    early_median: float
    window_median: float
    window_start: int


@section(key="monitor.alarms.search_decline")
class SearchDeclineSettings(DetectorSettings):
    """The agent making fewer valid searches per rollout than over its first steps: the
    tool-use path to a collapse, invisible to the likelihood signals."""

    early: int = Field(default=EARLY, ge=MIN_POINTS)
    """the run's first steps with the metric: its own baseline, since how much an agent
    searches depends on the world and the warm start"""
    window: int = Field(default=WINDOW, ge=MIN_POINTS)
    """recent steps whose median is compared with the baseline: long enough that a few
    steps of easy questions (answered without searching) do not fire it"""
    decline: float = Field(default=SEARCH_DECLINE, gt=0, lt=1)
    """fires when the window median is at most this share of the early median"""
    floor: float = Field(default=SEARCH_FLOOR, ge=0)
    """an early median below this many searches per rollout is no baseline: a policy that
    hardly searched cannot search less"""


@register_detector(
    "search_decline",
    severity="critical",
    mechanism="tool",
    settings=SearchDeclineSettings,
    describe=lambda s, p: (
        f"the {s.window}-step median of valid searches per rollout (`{SEARCHES_KEY}`) at "
        f"most {s.decline:g}x its median over the run's first {s.early} steps (which is at "
        f"least {s.floor:g}): the agent searches less than it did."
    ),
)
class SearchDeclineDetector:
    """Online form of the rule: the window is judged only once it lies after the baseline."""

    def __init__(self, settings: SearchDeclineSettings | None = None) -> None:
        self.settings = settings or SearchDeclineSettings()
        self._baseline = EarlyWindow(self.settings.early, self.settings.window)

    def check(self, step: int, value: float | None) -> SearchDecline | None:
        """A `SearchDecline` while the rule holds at `step`, None otherwise."""
        got = self._baseline.update(step, value)
        s = self.settings
        if got is None or got.early < s.floor or got.now > s.decline * got.early:
            return None
        return SearchDecline(got.early, got.now, got.window_start)

    def update(self, view: StepView) -> Firing | None:
        found = self.check(view.step, as_float(view.row.get(SEARCHES_KEY)))
        if found is None:
            return None
        return Firing(
            f"the agent searches less: median {found.window_median:.2f} valid searches per "
            f"rollout over steps {found.window_start}-{view.step}, against "
            f"{found.early_median:.2f} over its first {self.settings.early} steps",
            {
                "valid_searches": found.window_median,
                "valid_searches_early": found.early_median,
                "since_step": found.window_start,
            },
        )
