"""The report draws the monitor's panels (LLD by group accuracy, mismatch, importance weights,
turns) where a run logs their metrics, each with its lines, and leaves them out otherwise; a
log axis drops values that are not positive."""

from __future__ import annotations

import math

from llds import metrics as keys
from llds.monitor.phases import detect_phases
from llds.report.plots import MONITOR_PANELS, Panel, RunSeries, draw_comparison, panel_series
from synthetic_logs import synthetic_rows


def _run(rows):
    return RunSeries("r", "#1f77b4", rows, detect_phases(rows), [], None)


def _titles(fig):
    return {ax.get_title(): ax for ax in fig.axes if ax.get_title()}


def test_monitor_panels_are_drawn_with_their_lines_where_logged():
    rows = synthetic_rows("healthy", seed=3, steps=40)
    for i, row in enumerate(rows):
        row.update(
            {
                keys.SHARE_POS_FELL_ACC_LO: 0.3,
                keys.SHARE_POS_FELL_ACC_HI: 0.45,
                keys.MISMATCH_K3_KL: 1e-4 * (1 + i),
                keys.MISMATCH_ABS_LOGP_DIFF_MAX: 0.2,
                keys.MISMATCH_IS_WEIGHT_MEAN: 0.99,
                keys.MISMATCH_IS_CLIPPED_FRAC: 0.01,
                keys.TURNS_VOID_SHARE: 0.1,
                keys.TURNS_VALID_SEARCH_SHARE: 0.4,
                keys.TURNS_PER_ROLLOUT: 2.5,
            }
        )
    titles = _titles(draw_comparison([_run(rows)]))
    for panel in MONITOR_PANELS:
        ax = next(ax for t, ax in titles.items() if t.startswith(panel.title))
        drawn = [line for line in ax.get_lines() if len(line.get_xdata()) == len(rows)]
        assert drawn, panel.title  # not an empty "not logged" panel
    plain = _titles(draw_comparison([_run(synthetic_rows("healthy", seed=3, steps=40))]))
    assert not any(t.startswith(p.title) for p in MONITOR_PANELS for t in plain)


def test_a_log_axis_drops_values_that_are_not_positive():
    rows = [{"step": i + 1, keys.GRAD_NORM: v} for i, v in enumerate([0.5, 0.0, 2.0, -1.0])]
    log = Panel("g", "norm", keys.GRAD_NORM, log_y=True)
    assert panel_series(rows, keys.GRAD_NORM, log) == ([1.0, 3.0], [0.5, 2.0])
    linear = Panel("g", "norm", keys.GRAD_NORM)
    _, ys = panel_series(rows, keys.GRAD_NORM, linear)
    assert ys == [0.5, 0.0, 2.0, -1.0] and not any(math.isnan(y) for y in ys)


def test_alarm_labels_keep_their_distance():
    from llds.report.plots import labelled_alarm_steps

    # 300 steps: labels at least 10 steps apart, the first always
    assert labelled_alarm_steps([5, 7, 9, 15, 16, 40, 41, 300], 300) == [5, 15, 40, 300]
    assert labelled_alarm_steps([], 300) == []
