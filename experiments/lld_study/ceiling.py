"""The in-sample ceiling of single-signal alarms: could a threshold on one logged signal warn of a
collapse in time, even when tuned on the runs it is judged on?

For one signal, a causal rolling median over the last `window` steps, and an alarm that fires the
first time it crosses a threshold. Every threshold is tried on all runs at once, so the best row
per signal is what that signal could do at most on these runs: if no threshold meets the goal
there, no alarm on that signal can meet it out of sample either.

The goal is the LLD study's: a median lead of at least `GOAL_LEAD` steps over the runs with an
event, and no alarm in a run without one. A run's event is the earlier of its collapse and the
first evaluation from which held-out EM stays at most half the warm start's to the end ("fell
for good"); a run with an event that the alarm misses, or only sees at or after the event,
counts against the median.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

GOAL_LEAD = 20
"""Steps ahead of an event at which a warning counts as in time."""


@dataclass(frozen=True)
class Signal:
    """A logged signal: its name, how to read it from a metrics row, and which way is bad."""

    name: str
    read: Callable[[dict[str, Any]], float | None]
    high_is_bad: bool


def _key(k: str) -> Callable[[dict[str, Any]], float | None]:
    return lambda row: row.get(k)


def _clip(row: dict[str, Any]) -> float | None:
    lo, hi = row.get("policy/clip_frac_low"), row.get("policy/clip_frac_high")
    return None if lo is None or hi is None else lo + hi


SIGNALS = (
    Signal("lld/disp_pos", _key("lld/disp_pos"), high_is_bad=False),
    Signal("lld/frac_pos_fell", _key("lld/frac_pos_fell"), high_is_bad=True),
    Signal("lld/disp_correct", _key("lld/disp_correct"), high_is_bad=False),
    Signal("lld/logp_correct", _key("lld/logp_correct"), high_is_bad=False),
    Signal("policy/entropy", _key("policy/entropy"), high_is_bad=True),
    Signal("policy/approx_kl", _key("policy/approx_kl"), high_is_bad=True),
    Signal("policy/kl (to the start)", _key("policy/kl"), high_is_bad=True),
    Signal("policy/clip_frac (low + high)", _clip, high_is_bad=True),
    Signal("policy/ratio_max", _key("policy/ratio_max"), high_is_bad=True),
    Signal("policy/grad_norm", _key("policy/grad_norm"), high_is_bad=True),
    Signal("rollout/valid_searches", _key("rollout/valid_searches"), high_is_bad=False),
    Signal("reward/mean", _key("reward/mean"), high_is_bad=False),
)
"""Every signal the trainer logs that the paper or common sense links to collapse."""


@dataclass(frozen=True)
class Run:
    """One run's metrics rows and its event step (None: no event)."""

    label: str
    rows: list[dict[str, Any]]
    event: int | None  # the first step of the collapse or of the fall for good


def fell_for_good(eval_em: dict[str, float], start: float) -> int | None:
    """The first evaluation step from which held-out EM stays at most half the start's."""
    steps = sorted(int(s) for s in eval_em)
    first = None
    for s in steps:
        low = eval_em[str(s)] <= start / 2
        first = None if not low else (s if first is None else first)
    return first


def event_step(summary: dict[str, Any], start: float) -> int | None:
    """The earlier of a run summary's collapse step and its fall for good (None: neither)."""
    marks = [summary.get("collapse_step"), fell_for_good(summary["eval_em"], start)]
    marks = [m for m in marks if m is not None]
    return min(marks) if marks else None


def rolling_median(values: Sequence[float | None], window: int) -> np.ndarray:
    """Causal: entry t is the median of the finite values among steps t-window+1..t (NaN until
    `window` steps exist or when none is finite)."""
    x = np.array([np.nan if v is None else float(v) for v in values])
    out = np.full(len(x), np.nan)
    for t in range(window - 1, len(x)):
        part = x[t - window + 1 : t + 1]
        part = part[np.isfinite(part)]
        if len(part):
            out[t] = np.median(part)
    return out


def badness(run: Run, signal: Signal, window: int) -> tuple[np.ndarray, np.ndarray]:
    """(steps, running worst of the rolling median so far, oriented so that higher is worse)."""
    steps = np.array([int(r["step"]) for r in run.rows])
    med = rolling_median([signal.read(r) for r in run.rows], window)
    if signal.name == "reward/mean":  # the fall from the running peak of the rolling median
        peak = np.fmax.accumulate(np.where(np.isfinite(med), med, -np.inf))
        med = np.where(np.isfinite(med) & (peak > 0), peak - med, np.nan)
    elif not signal.high_is_bad:
        med = -med
    worst = np.fmax.accumulate(np.where(np.isfinite(med), med, -np.inf))
    return steps, worst


def first_fire(steps: np.ndarray, worst: np.ndarray, threshold: float) -> int | None:
    """The first step whose running worst reaches `threshold` (None: never)."""
    i = int(np.searchsorted(worst, threshold, side="left"))  # worst is non-decreasing
    return int(steps[i]) if i < len(steps) else None


@dataclass(frozen=True)
class Outcome:
    """One threshold over all runs: false alarms and, per event run, the lead (-inf: missed)."""

    threshold: float
    false_alarms: int
    leads: list[float]  # per event run: event - fire; -inf when missed

    @property
    def median_lead(self) -> float:
        return statistics.median(self.leads) if self.leads else math.nan

    @property
    def in_time(self) -> int:
        return sum(lead >= GOAL_LEAD for lead in self.leads)


def sweep(runs: Sequence[Run], signal: Signal, window: int) -> list[Outcome]:
    """Every threshold the runs' running worst values take, scored on all runs at once."""
    curves = [badness(r, signal, window) for r in runs]
    finite = np.concatenate([w[np.isfinite(w)] for _, w in curves])
    out = []
    for threshold in np.unique(finite):
        fires = [first_fire(s, w, threshold) for s, w in curves]
        pairs = list(zip(runs, fires, strict=True))
        false_alarms = sum(f is not None for r, f in pairs if r.event is None)
        leads = [
            -math.inf if f is None else float(r.event - f) for r, f in pairs if r.event is not None
        ]
        out.append(Outcome(float(threshold), false_alarms, leads))
    return out


def best_rows(outcomes: Sequence[Outcome]) -> tuple[Outcome | None, Outcome | None]:
    """(the best threshold without a false alarm, the one with the fewest false alarms among
    those whose median lead meets the goal)."""
    clean = [o for o in outcomes if o.false_alarms == 0]
    best_clean = max(clean, key=lambda o: (o.in_time, o.median_lead), default=None)
    timely = [o for o in outcomes if o.median_lead >= GOAL_LEAD]
    fewest = min(timely, key=lambda o: (o.false_alarms, -o.median_lead), default=None)
    return best_clean, fewest


def rule(signal: Signal, threshold: float) -> str:
    """The alarm's condition in the signal's own units."""
    if signal.name == "reward/mean":
        return f"peak - now >= {threshold:.3g}"
    return f">= {threshold:.3g}" if signal.high_is_bad else f"<= {-threshold:.3g}"


def lead_text(lead: float) -> str:
    """A lead in steps as the ceiling table prints it (`missed` for no warning)."""
    return "missed" if lead == -math.inf else f"{lead:+.0f}"
