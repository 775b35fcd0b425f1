"""The in-sample alarm ceiling (`lld_study.ceiling`): event dating, the causal rolling
median, and the threshold sweep, against values worked out by hand on tiny runs."""

from __future__ import annotations

import math

import numpy as np

from lld_study import ceiling as ac


def test_fell_for_good_is_the_start_of_the_last_stretch_at_or_below_half() -> None:
    em = {"50": 0.3, "100": 0.5, "150": 0.2, "200": 0.25, "250": 0.1}
    assert ac.fell_for_good(em, start=0.5) == 150  # 50 recovered at 100; 150 on stays <= 0.25
    assert ac.fell_for_good({"50": 0.2, "100": 0.26}, start=0.5) is None
    assert ac.event_step({"collapse_step": 120, "eval_em": em}, 0.5) == 120
    assert ac.event_step({"collapse_step": None, "eval_em": {"50": 0.4}}, 0.5) is None


def test_rolling_median_is_causal_and_skips_missing_values() -> None:
    out = ac.rolling_median([1.0, None, 5.0, 2.0, 9.0], window=3)
    assert math.isnan(out[0]) and math.isnan(out[1])
    assert out[2:].tolist() == [3.0, 3.5, 5.0]  # median(1, 5); median(5, 2); median(5, 2, 9)


def _run(label: str, disp: list[float], event: int | None) -> ac.Run:
    rows = [{"step": i + 1, "lld/disp_pos": d} for i, d in enumerate(disp)]
    return ac.Run(label, rows, event)


def test_sweep_counts_false_alarms_and_leads_by_hand() -> None:
    signal = next(s for s in ac.SIGNALS if s.name == "lld/disp_pos")  # low is bad
    falls = _run("falls", [0.0, -1.0, -3.0, -3.0, -3.0, -3.0], event=6)
    wobbles = _run("wobbles", [0.0, -2.0, 0.0, 0.0, 0.0, 0.0], event=None)
    steps, worst = ac.badness(falls, signal, window=1)
    assert steps.tolist() == [1, 2, 3, 4, 5, 6]
    assert worst.tolist() == [0.0, 1.0, 3.0, 3.0, 3.0, 3.0]  # running worst, sign flipped
    assert ac.first_fire(steps, worst, 2.5) == 3 and ac.first_fire(steps, worst, 4.0) is None
    by_threshold = {o.threshold: o for o in ac.sweep([falls, wobbles], signal, window=1)}
    # "disp_pos <= -1": fires at step 2 in both runs: lead 4, one false alarm
    assert by_threshold[1.0].false_alarms == 1 and by_threshold[1.0].leads == [4.0]
    # "<= -3": only the falling run, at step 3: lead 3, no false alarm
    assert by_threshold[3.0].false_alarms == 0 and by_threshold[3.0].leads == [3.0]
    clean, timely = ac.best_rows(list(by_threshold.values()))
    assert clean is by_threshold[3.0] and clean.in_time == 0
    assert timely is None  # no threshold gets a 20-step lead here


def test_a_missed_event_counts_against_the_median_lead() -> None:
    o = ac.Outcome(threshold=1.0, false_alarms=0, leads=[30.0, -math.inf, 25.0])
    assert o.median_lead == 25.0 and o.in_time == 2
    o2 = ac.Outcome(threshold=1.0, false_alarms=0, leads=[30.0, -math.inf])
    assert o2.median_lead == -math.inf


def test_reward_signal_is_the_fall_from_its_running_peak() -> None:
    signal = next(s for s in ac.SIGNALS if s.name == "reward/mean")
    rows = [{"step": i + 1, "reward/mean": r} for i, r in enumerate([0.2, 0.6, 0.5, 0.1])]
    _, worst = ac.badness(ac.Run("r", rows, None), signal, window=1)
    assert np.allclose(worst, [0.0, 0.0, 0.1, 0.5])


def test_rules_and_leads_read_in_the_signals_own_units() -> None:
    by_name = {s.name: s for s in ac.SIGNALS}
    assert ac.rule(by_name["lld/disp_pos"], 6.08) == "<= -6.08"  # low is bad: sign flipped back
    assert ac.rule(by_name["policy/approx_kl"], 0.0999) == ">= 0.0999"
    assert ac.rule(by_name["reward/mean"], 0.25) == "peak - now >= 0.25"
    assert ac.lead_text(-math.inf) == "missed" and ac.lead_text(23.0) == "+23"
    assert ac.lead_text(-186.0) == "-186"
