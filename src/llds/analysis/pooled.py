"""LLD shares pooled over responses, from the per-step shares a run logs.

A step logs `lld/frac_pos_fell`, the share of its positive-advantage responses whose summed
log-likelihood change was `<= 0`, beside `lld/pos_responses`, how many there were. With about
ten positive responses a step, most steps have none fall, so the median over steps of the share
is 0 even when one response in ten falls: the median hides what it summarises. The pooled share
(responses that fell over responses, all steps together) does not; the per-step distribution
says how the falls spread over steps.
"""

from __future__ import annotations

import math
from collections.abc import Container, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

POS_SHARE = "lld/frac_pos_fell"
POS_COUNT = "lld/pos_responses"
INTEGER_TOLERANCE = 1e-3
"""how far `share x count` may sit from an integer (shares are logged as float32)"""


def _value(row: Mapping[str, Any], key: str) -> float | None:
    """The row's finite number under `key`, or None."""
    v = row.get(key)
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
        return None
    return float(v)


def step_counts(
    rows: Iterable[Mapping[str, Any]],
    share_key: str = POS_SHARE,
    count_key: str = POS_COUNT,
    steps: Container[int] | None = None,
) -> list[tuple[int, int, int]]:
    """`(step, fell, count)` for every step with a positive count (in `steps` when given).

    `fell` is `share x count` rounded; a product that is not an integer means the share is not
    a ratio over that count, and pooling it would be wrong, so it raises."""
    out = []
    for row in rows:
        share, count = _value(row, share_key), _value(row, count_key)
        if share is None or count is None or count <= 0:
            continue
        step = int(row["step"])
        if steps is not None and step not in steps:
            continue
        fell = share * count
        if abs(fell - round(fell)) > INTEGER_TOLERANCE or abs(count - round(count)) > 0:
            raise ValueError(f"step {step}: {share_key} x {count_key} = {fell}, not a count")
        out.append((step, round(fell), round(count)))
    return out


def pooled_share(
    rows: Iterable[Mapping[str, Any]],
    share_key: str = POS_SHARE,
    count_key: str = POS_COUNT,
    steps: Container[int] | None = None,
) -> float | None:
    """Responses that fell over responses, all steps (in `steps`) together; None over none."""
    counts = step_counts(rows, share_key, count_key, steps)
    total = sum(n for _, _, n in counts)
    return sum(f for _, f, _ in counts) / total if total else None


@dataclass(frozen=True)
class ShareSummary:
    """One run's pooled share and how its per-step shares spread."""

    pooled: float | None
    fell: int
    responses: int
    steps: int
    steps_none_fell: int
    quartiles: tuple[float, float, float] | None
    """25th, 50th and 75th percentile of the per-step shares"""


def quartiles(values: Sequence[float]) -> tuple[float, float, float] | None:
    """Quartiles by linear interpolation between order statistics (numpy's default)."""
    if not values:
        return None
    s = sorted(values)

    def at(q: float) -> float:
        pos = q * (len(s) - 1)
        lo = math.floor(pos)
        hi = min(lo + 1, len(s) - 1)
        return s[lo] + (s[hi] - s[lo]) * (pos - lo)

    return at(0.25), at(0.5), at(0.75)


def summarize(
    rows: Iterable[Mapping[str, Any]],
    share_key: str = POS_SHARE,
    count_key: str = POS_COUNT,
    steps: Container[int] | None = None,
) -> ShareSummary:
    """The pooled share of a run with the per-step distribution beside it."""
    counts = step_counts(rows, share_key, count_key, steps)
    fell = sum(f for _, f, _ in counts)
    total = sum(n for _, _, n in counts)
    return ShareSummary(
        pooled=fell / total if total else None,
        fell=fell,
        responses=total,
        steps=len(counts),
        steps_none_fell=sum(1 for _, f, _ in counts if f == 0),
        quartiles=quartiles([f / n for _, f, n in counts]),
    )


@dataclass(frozen=True)
class ProbeFell:
    """The one-step probe's correct responses that lost likelihood, counted three ways."""

    fell: int
    """correct responses whose summed change was `< 0`, over all questions"""
    correct: int
    questions: int
    questions_with_fall: int
    """questions where at least one correct response fell"""
    questions_mean_below_zero: int
    """questions whose correct responses' mean change was `< 0` (the probe's `lld_share`)"""

    @property
    def share(self) -> float | None:
        """Correct responses that fell over correct responses, pooled over questions."""
        return self.fell / self.correct if self.correct else None


def probe_fell(results: Iterable[Mapping[str, Any]]) -> ProbeFell:
    """Count from a probe's per-question `results` (`probe.json`); each question's
    `frac_correct_fell x n_correct` must be a whole number of responses."""
    rows = list(results)
    fell = []
    for r in rows:
        f = float(r["frac_correct_fell"]) * int(r["n_correct"])
        if abs(f - round(f)) > INTEGER_TOLERANCE:
            raise ValueError(f"{r.get('example_id')}: {f} correct responses fell, not a count")
        fell.append(round(f))
    return ProbeFell(
        fell=sum(fell),
        correct=sum(int(r["n_correct"]) for r in rows),
        questions=len(rows),
        questions_with_fall=sum(1 for f in fell if f > 0),
        questions_mean_below_zero=sum(1 for r in rows if float(r["disp_correct"]) < 0),
    )
