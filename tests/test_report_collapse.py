"""The LLD study's reward-based collapse (`llds.report.collapse`): when a run collapsed, for how
long, and its first fall, on series worked out by hand."""

from __future__ import annotations

from llds.report import collapse as cd


def test_a_late_drop_is_a_collapse_of_the_steps_left() -> None:
    # reward 0.6 for steps 1-70, then 0. The 10-step median first reaches half the peak (0.3)
    # when 5 of its 10 values are 0: the middle pair is (0, 0.6), median 0.3, at step 75
    steps = list(range(1, 101))
    reward = [0.6] * 70 + [0.0] * 30
    assert cd.collapsed_steps(steps, reward) == (75, 26)
    assert cd.collapse_step(steps, reward) == 75


def test_a_dip_that_recovers_is_no_collapse() -> None:
    steps = list(range(1, 101))
    reward = [0.6] * 40 + [0.0] * 30 + [0.6] * 30
    assert cd.collapsed_steps(steps, reward) == (None, 0)


def test_a_run_that_never_reached_the_minimum_peak_cannot_collapse() -> None:
    # the smoothed reward peaks at 0.15 < 0.2 and ends at 0: a slide from a low start
    steps = list(range(1, 41))
    assert cd.collapsed_steps(steps, [0.15] * 20 + [0.0] * 20) == (None, 0)


def test_first_fall_and_recovery_by_hand() -> None:
    """10-step medians of 0.4 x 10, 0.1 x 10, 0.4 x 10: the median first reaches half the peak
    (0.2) at index 15 (four 0.4s, six 0.1s in its window) and rises above it at index 24 (five
    and five: 0.25)."""
    up, down = [0.4] * 10, [0.1] * 10
    assert cd.first_fall_and_recovery(up + down + up) == (15, True)
    assert cd.first_fall_and_recovery(up + down) == (15, False)
    assert cd.first_fall_and_recovery([0.15] * 10 + [0.0] * 10) == (None, False)


def test_median_window_skips_missing_values_and_clips_at_the_start() -> None:
    values = [1.0, None, 5.0, 2.0]
    assert cd.median_window(values, 0, 10) == 1.0
    assert cd.median_window(values, 3, 2) == 3.5  # median(5, 2)
    assert cd.median_window([None, None], 1, 10) is None


def test_deepest_dip_is_the_largest_fall_from_an_earlier_peak() -> None:
    # falls: 0.8 -> 0.5 (0.3) and then 0.9 -> 0.2 (0.7); a rise is no fall
    assert cd.deepest_dip([0.1, 0.8, 0.5, 0.9, 0.4, 0.2, 0.6]) == (3, 5)
    assert cd.deepest_dip([0.1, 0.2, 0.3]) == (0, 0)
