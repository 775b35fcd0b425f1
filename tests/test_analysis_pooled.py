"""Pooled LLD shares against values worked out by hand on small series."""

from __future__ import annotations

import pytest

from llds.analysis.pooled import (
    pooled_share,
    probe_fell,
    quartiles,
    step_counts,
    summarize,
)


def _row(step: int, fell: int, n: int) -> dict[str, float]:
    # float32-like rounding of the logged share, as in the committed logs
    return {"step": step, "lld/frac_pos_fell": fell / n + 1e-9, "lld/pos_responses": float(n)}


ROWS = [_row(1, 0, 10), _row(2, 0, 10), _row(3, 3, 10), _row(4, 1, 2), {"step": 5}]


def test_pooled_share_weights_each_step_by_its_responses() -> None:
    # (0 + 0 + 3 + 1) / (10 + 10 + 10 + 2) = 4 / 32; the mean of shares would be 0.2
    assert pooled_share(ROWS) == pytest.approx(4 / 32)


def test_pooled_share_over_chosen_steps_and_over_none() -> None:
    assert pooled_share(ROWS, steps=range(3, 5)) == pytest.approx(4 / 12)
    assert pooled_share(ROWS, steps={1, 2}) == 0.0
    assert pooled_share(ROWS, steps={5}) is None


def test_steps_without_positive_responses_are_left_out() -> None:
    rows = [*ROWS, {"step": 6, "lld/frac_pos_fell": float("nan"), "lld/pos_responses": 0.0}]
    assert step_counts(rows) == [(1, 0, 10), (2, 0, 10), (3, 3, 10), (4, 1, 2)]


def test_a_share_that_is_not_a_ratio_over_the_count_is_refused() -> None:
    with pytest.raises(ValueError, match="step 7"):
        step_counts([{"step": 7, "lld/frac_pos_fell": 0.25, "lld/pos_responses": 10.0}])


def test_summary_gives_the_per_step_distribution_beside_the_pooled_share() -> None:
    s = summarize(ROWS)
    assert (s.fell, s.responses, s.steps, s.steps_none_fell) == (4, 32, 4, 2)
    # shares 0, 0, 0.3, 0.5: the median is 0.15, the upper quartile 0.35
    assert s.quartiles == pytest.approx((0.0, 0.15, 0.35))


def test_quartiles_interpolate_between_order_statistics() -> None:
    assert quartiles([4.0, 1.0, 3.0, 2.0, 5.0]) == (2.0, 3.0, 4.0)
    assert quartiles([1.0, 2.0]) == pytest.approx((1.25, 1.5, 1.75))
    assert quartiles([]) is None


def test_probe_counts_responses_questions_and_mean_changes() -> None:
    results = [
        {"n_correct": 4, "frac_correct_fell": 0.25, "disp_correct": 0.01},
        {"n_correct": 3, "frac_correct_fell": 2 / 3, "disp_correct": -0.002},
        {"n_correct": 5, "frac_correct_fell": 0.0, "disp_correct": 0.2},
    ]
    p = probe_fell(results)
    assert (p.fell, p.correct, p.questions) == (3, 12, 3)
    assert (p.questions_with_fall, p.questions_mean_below_zero) == (2, 1)
    assert p.share == pytest.approx(0.25)
    with pytest.raises(ValueError):
        probe_fell([{"n_correct": 3, "frac_correct_fell": 0.5, "disp_correct": 0.0}])
