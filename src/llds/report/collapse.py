"""When a run collapsed, read from its training reward alone, and for how long.

The LLD study fixed this definition before its runs (experiments/lld_study/PROTOCOL.md): a run
collapses at the first step from which the 10-step median training reward stays at or below half
of its running peak (a peak of at least 0.2) to the end of the run. Every study table, the
duration count and the continued runs read it from here, so they cannot drift apart.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence

SMOOTH = 10
"""Steps in the trailing median that smooths the training reward."""
DROP = 0.5
"""A collapse is the smoothed reward at or below this share of its running peak."""
MIN_PEAK = 0.2
"""A run whose smoothed reward never reached this has no peak to fall from."""
LLD_WINDOW = 50
"""Steps before a collapse in which the study looks for likelihood displacement."""
CENSOR_STEPS = 30
"""A collapse with fewer logged steps than this after it is censored: the collapse rule asks
the reward to stay down to the end of the log, and a log that ends a few steps after a fall
cannot say whether it would have recovered (continued runs overturned such end-of-log
collapses)."""


def median_window(values: Sequence[float | None], end: int, width: int) -> float | None:
    """Median of the known values among `values[end - width + 1 : end + 1]` (None if none)."""
    window = [v for v in values[max(0, end - width + 1) : end + 1] if v is not None]
    return statistics.median(window) if window else None


def _is_low(smooth: float, peak: float) -> bool:
    return peak >= MIN_PEAK and smooth <= DROP * peak


def collapse_step(steps: Sequence[int], reward: Sequence[float]) -> int | None:
    """The pre-registered collapse: the first step from which the 10-step median reward stays at
    or below half of the running peak (>= 0.2) of that median to the end of the run."""
    peak, low_since = 0.0, None
    for i in range(len(reward)):
        smooth = median_window(reward, i, SMOOTH)
        assert smooth is not None, "a reward series has no missing values"
        peak = max(peak, smooth)
        if not _is_low(smooth, peak):
            low_since = None
        elif low_since is None:
            low_since = i
    return steps[low_since] if low_since is not None else None


def censored(steps: Sequence[int], collapse: int | None) -> bool:
    """Whether a collapse at step `collapse` has fewer than `CENSOR_STEPS` logged steps after
    it (False without a collapse)."""
    return collapse is not None and sum(1 for s in steps if s > collapse) < CENSOR_STEPS


def collapsed_steps(steps: Sequence[int], reward: Sequence[float]) -> tuple[int | None, int]:
    """`(collapse step, steps from it to the run's last step, both counted)`; `(None, 0)`."""
    start = collapse_step(steps, reward)
    return (None, 0) if start is None else (start, steps[-1] - start + 1)


def first_fall_and_recovery(reward: Sequence[float]) -> tuple[int | None, bool]:
    """`(index of the first fall, recovered)`: the first index where the 10-step median reward is
    at or below half of its running peak (a peak of at least 0.2), as in the collapse
    definition, and whether the median is ever above half of its running peak after that."""
    peak, fall = 0.0, None
    for i in range(len(reward)):
        smooth = median_window(reward, i, SMOOTH)
        assert smooth is not None, "a reward series has no missing values"
        peak = max(peak, smooth)
        low = _is_low(smooth, peak)
        if fall is None and low:
            fall = i
        elif fall is not None and not low:
            return fall, True
    return fall, False


def deepest_dip(smooth: Sequence[float]) -> tuple[int, int]:
    """`(peak, trough)` indices of the largest fall of a series: the pair peak < trough that
    maximizes smooth[peak] - smooth[trough] (0, 0 for a series that never falls)."""
    best, best_pair, top = 0.0, (0, 0), 0
    for i, v in enumerate(smooth):
        if v > smooth[top]:
            top = i
        if smooth[top] - v > best:
            best, best_pair = smooth[top] - v, (top, i)
    return best_pair
