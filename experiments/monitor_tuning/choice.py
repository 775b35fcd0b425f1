"""The protocol's choice rule (PROTOCOL.md, "The choice"), over alarms already replayed (pure).

Each run's alarm steps per cell come from `grid.replay_cells`; every figure is
`llds.monitor.scoring.score` of the outcomes in which the alarms of a set of cells count as
critical. A cell is eligible when alone it warned at least one gradual collapse in time with at
most `MAX_FALSE_PER_10` healthy runs in 10 alarmed; the critical set is the combination of
eligible cells (at most one per detector) that warns most collapses in time within that bound,
ties broken toward fewer false runs, fewer alarms, fewer detectors, then the grid's order.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from llds.monitor.scoring import CorpusRun, Outcome, Scorecard, score
from monitor_tuning.grid import Cell

MAX_FALSE_PER_10 = 1
"""At most this many healthy runs in 10 with a critical alarm (issue 78's goal)."""
MIN_TIMELY = 1
"""A cell that predicted collapse warned at least this many tune collapses in time."""
MAX_COMBINATIONS = 200_000
"""More combinations of eligible cells than this is refused rather than searched for hours."""
SPLIT = "tune"


@dataclass(frozen=True)
class ReplayedRun:
    """One tune run: its manifest row, the causes the report names, each cell's alarm steps."""

    run: CorpusRun
    named: tuple[str, ...]
    steps: Mapping[Cell, tuple[int, ...]]


@dataclass(frozen=True)
class Figures:
    """The tune scorecard when the alarms of `cells` count as critical (in-sample)."""

    cells: tuple[Cell, ...]
    card: Scorecard

    @property
    def timely(self) -> int:
        return self.card.timely

    def _healthy(self, figure: str) -> int:
        h = self.card.healthy
        return getattr(h, figure) if h is not None else 0

    @property
    def healthy_usable(self) -> int:
        return self._healthy("usable")

    @property
    def healthy_false(self) -> int:
        """usable healthy runs with a critical alarm"""
        return self._healthy("with_critical")

    @property
    def healthy_alarms(self) -> int:
        """critical alarms on the usable healthy runs"""
        return self._healthy("critical_alarms")

    @property
    def all_alarms(self) -> int:
        return sum(r.critical_alarms for r in self.card.rows)

    @property
    def within_bound(self) -> bool:
        """`10 H / N <= MAX_FALSE_PER_10`, in integers."""
        return 10 * self.healthy_false <= MAX_FALSE_PER_10 * self.healthy_usable


def figures(runs: Sequence[ReplayedRun], cells: Sequence[Cell], lead: int | None = None) -> Figures:
    """`score` of the runs with the alarms of `cells` as the critical ones."""
    outcomes = []
    for r in runs:
        steps = sorted({s for c in cells for s in r.steps[c]})
        outcomes.append(Outcome(r.run, tuple(steps), r.named))
    card = score(outcomes, SPLIT) if lead is None else score(outcomes, SPLIT, lead)
    return Figures(tuple(cells), card)


def eligible(alone: Figures) -> bool:
    """The cell predicted collapse on the tune split: warned one in time, within the bound."""
    return alone.timely >= MIN_TIMELY and alone.within_bound


def _rank(f: Figures, order: Mapping[str, int]) -> tuple:
    place = tuple(sorted((order[c.detector], c.index) for c in f.cells))
    return (-f.timely, f.healthy_false, f.healthy_alarms, f.all_alarms, len(f.cells), place)


@dataclass(frozen=True)
class Choice:
    """The critical set and how it was reached."""

    chosen: Figures
    alone: Mapping[Cell, Figures]
    eligible: tuple[Cell, ...]
    searched: int
    """combinations of eligible cells compared (the empty one included)"""
    runner_up: Figures | None = field(default=None)
    """the best combination after the chosen one, to show how close the tie-breaks were"""


def choose(runs: Sequence[ReplayedRun], cells: Sequence[Cell]) -> Choice:
    """The protocol's choice over `cells` (in the grid's order) on the tune runs."""
    if not any(r.run.healthy for r in runs):
        raise ValueError("no usable healthy tune run: the false-alarm bound cannot be checked")
    alone = {c: figures(runs, [c]) for c in cells}
    ok = tuple(c for c in cells if eligible(alone[c]))
    order: dict[str, int] = {}
    for c in cells:
        order.setdefault(c.detector, len(order))
    by_detector: dict[str, list[Cell | None]] = {}
    for c in ok:
        by_detector.setdefault(c.detector, [None]).append(c)
    total = 1
    for options in by_detector.values():
        total *= len(options)
    if total > MAX_COMBINATIONS:
        raise ValueError(f"{total} combinations of eligible cells (more than {MAX_COMBINATIONS})")
    ranked = []
    for combo in itertools.product(*by_detector.values()):
        f = figures(runs, [c for c in combo if c is not None])
        if f.within_bound:
            ranked.append((_rank(f, order), f))
    ranked.sort(key=lambda x: x[0])
    runner_up = ranked[1][1] if len(ranked) > 1 else None
    return Choice(ranked[0][1], alone, ok, total, runner_up)
