"""Phase detector and alarms on constructed series with hand-computed change points."""

from __future__ import annotations

import math
import random
import re

import pytest

from llds.errors import ConfigError
from llds.monitor.alarms import (
    ACTIONABLE_KINDS,
    Alarm,
    AlarmConfig,
    AlarmMonitor,
    scan_alarms,
    should_act,
)
from llds.monitor.phases import PhaseConfig, PhaseTracker, detect_phases, phase_spans
from llds.monitor.robust import diff_noise, mad_sigma, median, spike_score, theil_sen, trend
from synthetic_logs import synthetic_rows

# With the defaults (window W=20, K=5, min slope 0.002) and a noiseless likelihood that is flat
# up to step 60 and then falls by s per step, the Theil-Sen slope over the window ending at
# step t is the median of the 190 pairwise slopes. Counting them by hand: with m = t - 60
# falling points, m=6 gives a median of -0.0955*s, m=7 gives -0.2265*s (the 95th/96th smallest
# pair slopes are cross pairs j in 61..67, i <= 60, with value -s*(j-60)/(j-i)).
# For s = 0.012: step 66 -> -0.00115 (not below -0.002), step 67 -> -0.00272 (falling).
# Falling from step 67, K = 5 falling steps -> steady decay first labelled at step 71.
DECAY_START, FAST_SLOPE, FIRST_DECAY_LABEL = 60, 0.012, 71
COLLAPSE_START = 120


def first(labels, phase):
    return next((lab.step for lab in labels if lab.phase == phase), None)


def kinds(alarms):
    return [a.kind for a in alarms]


# ------------------------------------------------------------------ robust statistics
def test_robust_helpers_match_hand_values():
    assert median([3, 1, 2]) == 2
    assert median([4, 1, 3, 2]) == 2.5
    # deviations from the median 3: 2,1,0,1,97 -> MAD 1
    assert mad_sigma([1, 2, 3, 4, 100]) == pytest.approx(1.4826)
    xs = list(range(10))
    ys = [2 * x + 1 for x in xs]
    ys[4] = 1000.0  # one wild point does not move a Theil-Sen line
    slope, intercept = theil_sen(xs, ys)
    assert slope == pytest.approx(2.0) and intercept == pytest.approx(1.0)
    # a pure linear trend has identical differences: zero noise
    assert diff_noise([0.5 * x for x in range(10)]) == 0.0
    assert diff_noise([1.0, None, 2.0]) is None
    s = spike_score([1.0, 1.0, 1.0, math.e], math.e**3, log_scale=True, min_scale=0.5)
    # log history 0,0,0,1 -> median 0, MAD 0 -> floor 0.5; log value 3 -> z = 6
    assert s is not None and s.z == pytest.approx(6.0) and s.ratio == pytest.approx(math.e**3)


def test_trend_needs_size_and_significance():
    xs = list(range(20))
    up = trend(xs, [0.01 * x for x in xs], min_slope=0.002, z=3, noise_floor=0.005)
    assert up.direction == 1 and up.slope == pytest.approx(0.01)
    tiny = trend(xs, [0.001 * x for x in xs], min_slope=0.002, z=3, noise_floor=0.005)
    assert tiny.direction == 0  # below min_slope
    noisy = trend(xs, [0.01 * x for x in xs], min_slope=0.002, z=3, noise_floor=0.5)
    assert noisy.direction == 0  # 0.01 < 3 * 0.5 / sqrt(665) = 0.058: not significant


def test_config_rejects_nonsense():
    with pytest.raises(ConfigError, match="window"):
        PhaseConfig(window=2)
    with pytest.raises(ConfigError, match="reward_drop_frac"):
        PhaseConfig(reward_drop_frac=1.5)


# ------------------------------------------------------------------ phases, noiseless
def test_noiseless_phases_hit_hand_computed_change_points():
    rows = synthetic_rows("collapse", noise=0.0, decay_slope=FAST_SLOPE)
    labels = detect_phases(rows)
    cfg = PhaseConfig()
    assert all(lab.phase == "warmup" for lab in labels[: cfg.window])
    # flat likelihood, rising reward right after warm-up (32-step window has enough points)
    assert labels[cfg.window].phase == "stagnation"
    assert first(labels, "steady_decay") == FIRST_DECAY_LABEL
    # entropy x3, grad norm x10 and ratio max x8 all at step 120: three spikes at once
    assert first(labels, "collapse") == COLLAPSE_START
    assert all(lab.phase == "collapse" for lab in labels[COLLAPSE_START - 1 :])
    spans = phase_spans(labels)
    assert [p for _, _, p in spans] == ["warmup", "stagnation", "steady_decay", "collapse"]
    assert spans[-1] == (COLLAPSE_START, 160, "collapse")


def test_noiseless_healthy_and_stagnation():
    healthy = detect_phases(synthetic_rows("healthy", noise=0.0, steps=140))
    assert {lab.phase for lab in healthy[20:]} == {"healthy"}
    stagnant = detect_phases(synthetic_rows("stagnation", noise=0.0, steps=130))
    assert {lab.phase for lab in stagnant[20:]} == {"stagnation"}


# ------------------------------------------------------------------ phases, noisy
@pytest.mark.parametrize("seed", range(4))
def test_noisy_collapse_run_detected_near_change_points(seed):
    labels = detect_phases(synthetic_rows("collapse", seed=seed, decay_slope=FAST_SLOPE))
    assert abs(first(labels, "steady_decay") - FIRST_DECAY_LABEL) <= 4
    assert abs(first(labels, "collapse") - COLLAPSE_START) <= 1
    before = [lab.phase for lab in labels if lab.step < DECAY_START]
    assert "steady_decay" not in before and "collapse" not in before


@pytest.mark.parametrize("seed", range(4))
def test_noisy_healthy_runs_stay_healthy(seed):
    labels = detect_phases(synthetic_rows("healthy", seed=seed, steps=140))
    after = [lab.phase for lab in labels[20:]]
    assert "steady_decay" not in after and "collapse" not in after
    assert after.count("healthy") >= 0.9 * len(after)


def test_noisy_stagnation_is_mostly_stagnation():
    labels = detect_phases(synthetic_rows("stagnation", seed=3, steps=130))
    after = [lab.phase for lab in labels[20:]]
    assert after.count("stagnation") >= 0.8 * len(after)
    assert "collapse" not in after


def test_majority_of_falling_correct_responses_counts_as_decay():
    # A huge noise floor makes the 0.006/step decline statistically insignificant
    # (3 * 0.1 / sqrt(665) = 0.0116 > 0.006); the LLD-majority rule still catches it when most
    # correct responses lost likelihood, and only then.
    cfg = PhaseConfig(logp_noise_floor=0.1)
    rows = synthetic_rows("steady_decay", noise=0.0)
    assert first(detect_phases(rows, cfg), "steady_decay") is None
    for r in rows:
        r["lld/frac_correct_fell"] = 0.9 if r["step"] > DECAY_START else 0.3
    assert first(detect_phases(rows, cfg), "steady_decay") is not None


def test_missing_and_non_finite_values_are_tolerated():
    rows = synthetic_rows("collapse", seed=5, decay_slope=FAST_SLOPE)
    rng = random.Random(0)
    for i, r in enumerate(rows):
        if i % 4 == 1:
            r["lld/logp_correct"] = None
        if i % 7 == 2:
            del r["reward/mean"]
        if rng.random() < 0.1:
            r["policy/entropy"] = float("nan")
        if i % 11 == 0:
            r["policy/grad_norm"] = "not a number"
    labels = detect_phases(rows)
    assert abs(first(labels, "steady_decay") - FIRST_DECAY_LABEL) <= 6
    assert abs(first(labels, "collapse") - COLLAPSE_START) <= 2
    # rows with none of the inputs: warm-up, then healthy (nothing to judge), no crash
    empty = detect_phases([{"step": i} for i in range(1, 40)])
    assert {lab.phase for lab in empty[:20]} == {"warmup"}
    assert {lab.phase for lab in empty[20:]} == {"healthy"}
    # missing "step" keys fall back to the row position
    assert [lab.step for lab in detect_phases([{}, {}, {}])] == [1, 2, 3]


def test_online_tracker_equals_batch_on_every_prefix():
    rows = synthetic_rows("collapse", seed=11)
    full = detect_phases(rows)
    tracker = PhaseTracker()
    online = [tracker.update(r) for r in rows]
    assert online == full
    for n in (1, 19, 20, 21, 64, 119, 120, 121, 160):
        assert detect_phases(rows[:n]) == full[:n]


# ------------------------------------------------------------------ alarms
def test_likelihood_decay_alarm_message_cites_steps_and_numbers():
    rows = synthetic_rows("steady_decay", noise=0.0, decay_slope=FAST_SLOPE)
    alarms = scan_alarms(rows)
    decay = [a for a in alarms if a.kind == "likelihood_decay"]
    assert len(decay) == 1
    a = decay[0]
    assert a.step == FIRST_DECAY_LABEL and a.severity == "warning"
    # decline starts after the last step whose 3-step median is still the flat -0.45: step 61;
    # at 71 the median of steps 69-71 is the value at 70 = -0.45 - 0.012 * 10 = -0.57.
    # Reward (5-step medians): 0.1 + 0.004 * 59 = 0.336 at 61, 0.1 + 0.004 * 69 = 0.376 at 71.
    assert a.message == (
        "correct-response log-likelihood fell from -0.45 to -0.57 over steps 61-71 "
        "while reward rose 0.34 -> 0.38"
    )
    assert a.since_step == 61
    assert a.evidence["logp_to"] == pytest.approx(-0.57)


def test_collapse_run_alarms_in_order_with_early_warning():
    alarms = scan_alarms(synthetic_rows("collapse", noise=0.0))
    serious = [a for a in alarms if a.severity != "info"]
    assert serious[0].kind == "likelihood_decay" and serious[0].step < 80
    at_collapse = {a.kind for a in alarms if a.step == COLLAPSE_START}
    assert at_collapse == {"collapse", "entropy_spike", "grad_norm_spike", "ratio_spike"}
    # peak: the 20-step median first reaches its maximum at step 120, the mean of 0.540 (step
    # 110) and 0.5413 (step 120: 0.58 * 14/15) = 0.5407. The 5-step median at 120+j is the raw
    # reward at step 118+j, (0.1 + 0.004 * (118+j)) * (1 - (j-1)/15): 0.2837 at j=9 and
    # 0.2448 at j=10, so it first reaches half the peak (0.2703) at step 130; it must stay
    # there 12 steps (reward_drop_steps), so the alarm fires at 130 + 11 = 141
    reward = [a for a in alarms if a.kind == "reward_collapse"]
    assert [a.step for a in reward] == [141]
    assert "peak 0.54 at step 120" in reward[0].message
    # de-duplicated: every kind fires once although the collapse lasts 40 steps
    assert len(kinds(alarms)) == len(set(kinds(alarms)))
    grad = next(a for a in alarms if a.kind == "grad_norm_spike")
    assert re.search(
        r"gradient norm spiked to 5\.000 at step 120: 10\.0x its median 0\.500", grad.message
    )


def small_batch_rows(steps: int = 160, seed: int = 0) -> list[dict]:
    """A healthy run at 8 prompts per step, shaped after real organism logs: the reward is the
    mean over 8 questions of very different difficulty (per-step sd ~0.15), a run of easy
    batches (steps 60-64 at 0.68) lifts the running peak of the 5-step median, a run of hard
    ones follows (steps 70-75 at 0.22, a third of that peak, for 6 steps), and at step 100 the
    max likelihood ratio jumps x3 while the reward sits ~30% below the peak."""
    rng = random.Random(seed)
    rows = synthetic_rows("healthy", steps=steps, seed=seed)
    fixed = {**dict.fromkeys(range(60, 65), 0.68), **dict.fromkeys(range(70, 76), 0.22)}
    fixed.update(zip(range(96, 101), (0.375, 0.5, 0.25, 0.375, 0.5), strict=True))
    for row in rows:
        step = row["step"]
        p = min(0.25 + 0.001 * step, 0.4)
        row["reward/mean"] = sum(rng.random() < rng.uniform(0, 2 * p) for _ in range(8)) / 8
        row["reward/mean"] = fixed.get(step, row["reward/mean"])
        if step == 100:
            row["policy/ratio_max"] *= 3
    return rows


@pytest.mark.parametrize("seed", range(4))
def test_transient_reward_dips_and_one_spike_are_not_a_collapse(seed):
    rows = small_batch_rows(seed=seed)
    alarms = scan_alarms(rows)
    # the spike is reported, but as a warning: one outlier of a heavy-tailed statistic
    assert 100 in [a.step for a in alarms if a.kind == "ratio_spike"]
    assert [a for a in alarms if a.severity == "critical"] == []
    assert "collapse" not in {lab.phase for lab in detect_phases(rows)}
    # the same run whose reward then stays at zero from step 121: a sustained drop is a
    # collapse, flagged once the fall also exceeds 3 per-step noise sigmas (the noise window
    # still holds the noisy steps for a while) and has held 12 steps
    for row in rows[120:]:
        row["reward/mean"] = 0.0
    fell = [a for a in scan_alarms(rows) if a.kind == "reward_collapse"]
    assert len(fell) == 1 and 121 + 11 <= fell[0].step <= 121 + 30
    assert detect_phases(rows)[-1].phase == "collapse"


@pytest.mark.parametrize("seed", range(6))
def test_noisy_healthy_series_raise_no_alarm(seed):
    assert scan_alarms(synthetic_rows("healthy", seed=seed, steps=140)) == []
    stagnant = scan_alarms(synthetic_rows("stagnation", seed=seed, steps=140))
    assert {a.kind for a in stagnant} <= {"stagnation"}
    assert all(a.severity == "info" for a in stagnant)


def _episodes_rows() -> list[dict]:
    """Flat to 30, fall to 55, recover to 75, flat to 100, fall again: two episodes."""
    logp, rows = -0.45, []
    for step in range(1, 131):
        if 30 < step <= 55 or step > 100:
            logp -= 0.012
        elif 55 < step <= 75:
            logp += 0.012
        rows.append({"step": step, "lld/logp_correct": logp, "reward/mean": 0.2 + 0.002 * step})
    return rows


def test_alarms_rearm_after_recovery_only():
    rows = _episodes_rows()
    decay = [a for a in scan_alarms(rows) if a.kind == "likelihood_decay"]
    # same window arithmetic as for FIRST_DECAY_LABEL (flat, then falling 0.012/step):
    # falling 7 steps after the change, alarm after K=5 falling steps -> 30+11 and 100+11
    assert [a.step for a in decay] == [41, 111]
    assert [a.since_step for a in decay] == [31, 101]
    never_rearm = AlarmConfig(rearm_steps=10_000)
    assert kinds(scan_alarms(rows, never_rearm)).count("likelihood_decay") == 1


def test_nonfinite_alarm_when_skips_increase():
    rows = synthetic_rows("healthy", noise=0.0, steps=80)
    total = 0
    for r in rows:
        total += r["step"] in (40, 41, 60)
        r["optim/skipped_total"] = total
    alarms = [a for a in scan_alarms(rows) if a.kind == "nonfinite"]
    assert [a.step for a in alarms] == [40, 60]  # 41 is the same episode as 40
    assert alarms[0].message.startswith("1 optimizer update(s) skipped at step 40")
    assert alarms[1].evidence["skipped_total"] == 3


def test_single_spike_warns_but_is_not_a_collapse():
    rows = synthetic_rows("healthy", noise=0.0, steps=80)
    rows[49]["policy/grad_norm"] = 8.0
    monitor = AlarmMonitor()
    raised = {}
    for r in rows:
        raised[r["step"]] = monitor.update(r)
        assert monitor.phase != "collapse"
    assert kinds(raised[50]) == ["grad_norm_spike"]
    assert should_act(raised[50], "stop").kind == "warn"


# ------------------------------------------------------------------ actions
def _alarm(kind: str, step: int = 10, since: int | None = None) -> Alarm:
    return Alarm(step, kind, "warning", f"{kind} happened", {"since_step": since})


def test_should_act_policies():
    assert should_act([], "stop").kind == "none"
    decay = _alarm("likelihood_decay", step=70, since=55)
    spike = _alarm("entropy_spike", step=72)
    assert should_act([decay], "warn").kind == "warn"
    assert should_act([spike], "rollback").kind == "warn"
    stop = should_act([spike, decay], "stop")
    assert stop.kind == "stop" and "likelihood_decay" in stop.reason
    assert "entropy_spike" not in stop.reason
    rb = should_act([decay, _alarm("collapse", step=80, since=80)], "rollback")
    assert rb.kind == "rollback" and rb.rollback_before_step == 55
    assert {
        "displacement_decay",
        "likelihood_decay",
        "collapse",
        "reward_collapse",
    } == ACTIONABLE_KINDS
    with pytest.raises(ConfigError, match="on_alarm"):
        should_act([decay], "panic")


def test_collapse_from_sharp_drop_without_spikes():
    # No entropy / grad-norm / ratio spikes: the likelihood leaving its own trend line decides.
    # First collapse step drops 1.5*(1-exp(-1/8)) = 0.176 below the trend, the second 0.33;
    # with the noise floor 0.02 both are > 6 sigmas, so two in a row first at step 121, while
    # the steady decay is still running -> collapse at 121.
    rows = synthetic_rows("collapse", noise=0.0)
    calm = synthetic_rows("steady_decay", noise=0.0)
    for r, c in zip(rows, calm, strict=True):
        for key in ("policy/entropy", "policy/grad_norm", "policy/ratio_max"):
            r[key] = c[key]
    labels = detect_phases(rows)
    assert first(labels, "collapse") == COLLAPSE_START + 1
    assert labels[COLLAPSE_START].evidence["signals"] == ["sharp_drop"]


# ------------------------------------------------------------------ the displacement path
# With `lld/disp_pos` in the log, "falling" is the 20-step rolling median of disp_pos below 0
# with the rolling median of frac_pos_fell >= 0.5. Noiseless, disp_pos is 0.25 up to step 60
# and -0.15 after: the window ending at step 70 holds 10 of each (median 0.05, not falling),
# the one ending at 71 holds 11 falling values (median -0.15): falling from 71, and K = 5
# falling steps make the first steady-decay label at step 75.
FIRST_DISP_DECAY_LABEL = 75


def test_noiseless_displacement_decay_hits_the_hand_computed_step():
    rows = synthetic_rows("steady_decay", noise=0.0, displacement=True)
    labels = detect_phases(rows)
    assert first(labels, "steady_decay") == FIRST_DISP_DECAY_LABEL
    assert labels[FIRST_DISP_DECAY_LABEL - 1].evidence["disp_pos"] == pytest.approx(-0.15)
    alarms = scan_alarms(rows)
    assert "likelihood_decay" not in kinds(alarms)  # the displacement decides
    decay = next(a for a in alarms if a.kind == "displacement_decay")
    assert decay.step == FIRST_DISP_DECAY_LABEL and decay.since_step == 71
    # a warning by default (the tune split did not choose it as critical), and it may still
    # stop or roll back a run
    assert decay.severity == "warning" and decay.actionable
    assert "responses GRPO pushes up" in decay.message and "steps 71-75" in decay.message


def test_displacement_overrides_the_rollout_likelihood():
    """A rollout-time likelihood that falls (selection bias can do that) is not a decay when
    the responses GRPO pushes up gain likelihood; a flat one with a falling displacement is."""
    falling_logp = synthetic_rows("steady_decay", noise=0.0, decay_slope=0.02)
    for r in falling_logp:
        r["lld/disp_pos"], r["lld/frac_pos_fell"] = 0.3, 0.1
    assert first(detect_phases(falling_logp), "steady_decay") is None
    flat_logp = synthetic_rows("stagnation", noise=0.0)
    for r in flat_logp:
        after = r["step"] > 60
        r["lld/disp_pos"], r["lld/frac_pos_fell"] = (-0.2, 0.8) if after else (0.2, 0.1)
    assert first(detect_phases(flat_logp), "steady_decay") == FIRST_DISP_DECAY_LABEL


@pytest.mark.parametrize("seed", range(3))
def test_noisy_displacement_runs(seed):
    healthy = detect_phases(synthetic_rows("healthy", seed=seed, steps=140, displacement=True))
    assert not {"steady_decay", "collapse"} & {lab.phase for lab in healthy}
    decay = detect_phases(synthetic_rows("steady_decay", seed=seed, displacement=True))
    assert abs(first(decay, "steady_decay") - FIRST_DISP_DECAY_LABEL) <= 4


# ------------------------------------------------------------------ search decline


def test_search_decline_alarm_fires_once_where_the_window_median_crosses_three_quarters():
    # reward and likelihood flat (no other alarm); 1.6 valid searches per rollout for steps
    # 1-40, then 1.0. The early median is 1.6 (steps 1-20), the threshold 0.75 x 1.6 = 1.2.
    # Window of steps 32-51: nine at 1.6, eleven at 1.0 -> median 1.0: first firing at 51
    # (steps 31-50 give ten and ten -> 1.3, above 1.2).
    rows = [
        {
            "step": s,
            "reward/mean": 0.5,
            "lld/logp_correct": -0.3,
            "rollout/valid_searches": 1.6 if s <= 40 else 1.0,
        }
        for s in range(1, 121)
    ]
    alarms = [a for a in scan_alarms(rows) if a.kind == "search_decline"]
    assert [a.step for a in alarms] == [51]  # held to the end: raised once, never re-armed
    (a,) = alarms
    # critical by default (chosen on the tune split), and still only a warning to the trainer
    assert a.severity == "critical" and not a.actionable
    assert should_act([a], "stop").kind == "warn"
    assert a.evidence["valid_searches"] == 1.0 and a.evidence["valid_searches_early"] == 1.6
    assert a.evidence["since_step"] == 32
    assert "1.00 valid searches per rollout over steps 32-51, against 1.60" in a.message


def test_search_decline_needs_a_real_baseline_and_a_quarter_less():
    def searches(early: float, late: float) -> list[dict]:
        return [
            {"step": s, "reward/mean": 0.5, "rollout/valid_searches": early if s <= 40 else late}
            for s in range(1, 101)
        ]

    assert not [a for a in scan_alarms(searches(1.6, 1.25)) if a.kind == "search_decline"]
    # a policy that hardly searched (0.4 per rollout) cannot search less
    assert not [a for a in scan_alarms(searches(0.4, 0.0)) if a.kind == "search_decline"]
    # logs without the metric (TRL, veRL) never raise it
    bare = [{"step": s, "reward/mean": 0.5} for s in range(1, 101)]
    assert not [a for a in scan_alarms(bare) if a.kind == "search_decline"]
