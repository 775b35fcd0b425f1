"""The attribution rules on series built by hand: each fires on its mechanism's signature and
stays silent without it, with the numbers that decided it."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from llds.monitor.alarms import Alarm
from llds.report import attribution as att
from llds.report.text import attribution_paragraph

STEPS = 60
EVENT = 60  # the window is steps 41..60; the early baseline steps 1..20


def series(**curves: Callable[[int], float]) -> dict[str, list[tuple[int, float]]]:
    """Metric name (with `__` for `/`) -> its values at steps 1..STEPS."""
    return {
        name.replace("__", "/"): [(s, f(s)) for s in range(1, STEPS + 1)]
        for name, f in curves.items()
    }


def late(before: float, after: float, start: int = 41) -> Callable[[int], float]:
    return lambda s: after if s >= start else before


def rising_reward(s: int) -> float:
    return min(0.1 + 0.01 * s, 0.6)


def test_lld_fires_on_falling_likelihood_while_reward_holds():
    sig = series(reward__mean=rising_reward, lld__share_pos_fell=late(0.2, 0.8))
    f = att.lld_rule(sig, EVENT)
    assert f.status == "present"
    assert f.numbers["lld/share_pos_fell"] == pytest.approx(0.8)
    assert f.numbers["reward_at_window_start"] == pytest.approx(f.numbers["reward_peak"])
    # negative displacement alone is also the signature
    neg = series(reward__mean=rising_reward, lld__disp_pos=late(0.2, -0.3))
    assert att.lld_rule(neg, EVENT).status == "present"


def test_search_decline_fires_when_searches_fall_by_a_quarter_from_a_real_baseline():
    # 1.8 searches per rollout early, 1.35 (= 0.75 x 1.8) in the window: present, at the edge
    edge = series(rollout__valid_searches=late(1.8, 1.35))
    f = att.search_decline_rule(edge, EVENT)
    assert f.status == "present"
    assert f.numbers == pytest.approx({"rollout/valid_searches": 1.35, "valid_searches_early": 1.8})
    assert att.search_decline_rule(
        series(rollout__valid_searches=late(1.8, 1.4)), EVENT
    ).status == ("absent")
    # a policy that hardly searched early cannot search less: 0.4 -> 0.1 is not judged present
    low = series(rollout__valid_searches=late(0.4, 0.1))
    assert att.search_decline_rule(low, EVENT).status == "absent"
    assert att.search_decline_rule(series(reward__mean=rising_reward), EVENT).status == (
        "not logged"
    )


def test_lld_absent_when_likelihood_rises_or_reward_had_already_fallen():
    healthy = series(reward__mean=rising_reward, lld__share_pos_fell=lambda s: 0.2)
    assert att.lld_rule(healthy, EVENT).status == "absent"
    # the same displacement, but the reward fell to a third of its peak before the window
    fallen = series(reward__mean=late(0.6, 0.2, start=25), lld__share_pos_fell=late(0.2, 0.8))
    f = att.lld_rule(fallen, EVENT)
    assert f.status == "absent" and f.numbers["reward_at_window_start"] == pytest.approx(0.2)
    # a log with only the older frac_pos_fell is read through it
    old = series(reward__mean=rising_reward, lld__frac_pos_fell=late(0.2, 0.9))
    assert att.lld_rule(old, EVENT).numbers == pytest.approx(
        {
            "lld/frac_pos_fell": 0.9,
            "lld/frac_pos_fell_early": 0.2,
            "reward_at_window_start": 0.465,
            "reward_peak": 0.465,
        }
    )
    assert att.lld_rule(series(reward__mean=rising_reward), EVENT).status == "not logged"


def test_mismatch_fires_on_rising_k3_or_logp_diff_or_low_ess():
    k3 = series(mismatch__k3_kl=late(0.001, 0.01))
    assert att.mismatch_rule(k3, EVENT).status == "present"
    diff = series(mismatch__abs_logp_diff_max=late(0.8, 3.0))
    assert att.mismatch_rule(diff, EVENT).status == "present"
    ess = series(mismatch__is_ess=late(0.95, 0.3, start=55))
    f = att.mismatch_rule(ess, EVENT)
    assert f.status == "present" and f.numbers["mismatch/is_ess"] == pytest.approx(0.3)


def test_mismatch_absent_when_flat_or_below_its_floor():
    flat = series(
        mismatch__k3_kl=lambda s: 0.004,
        mismatch__abs_logp_diff_max=lambda s: 2.0,
        mismatch__is_ess=lambda s: 0.9,
    )
    assert att.mismatch_rule(flat, EVENT).status == "absent"
    # doubling from a negligible level is not a rise: under the floors
    tiny = series(mismatch__k3_kl=late(1e-5, 1e-4), mismatch__abs_logp_diff_max=late(0.1, 0.5))
    assert att.mismatch_rule(tiny, EVENT).status == "absent"
    assert att.mismatch_rule(series(policy__entropy=lambda s: 1.0), EVENT).status == "not logged"


def test_void_turns_fire_on_a_rising_share_only():
    assert att.void_turn_rule(series(turns__void_share=late(0.05, 0.3)), EVENT).status == "present"
    # doubled but by less than VOID_RISE_MIN
    small = series(turns__void_share=late(0.02, 0.06))
    assert att.void_turn_rule(small, EVENT).status == "absent"
    assert att.void_turn_rule(series(turns__void_share=lambda s: 0.3), EVENT).status == "absent"
    assert att.void_turn_rule(series(), EVENT).status == "not logged"


def test_entropy_fires_on_collapse_and_blow_up():
    collapse = att.entropy_rule(series(policy__entropy=late(0.8, 0.02)), EVENT)
    assert collapse.status == "present" and collapse.reason.startswith("collapse")
    blowup = att.entropy_rule(series(policy__entropy=late(0.8, 2.5, start=58)), EVENT)
    assert blowup.status == "present" and blowup.reason.startswith("blow-up")
    drift = att.entropy_rule(series(policy__entropy=lambda s: 0.8 - 0.005 * s), EVENT)
    assert drift.status == "absent" and drift.numbers["entropy_early"] == pytest.approx(0.7475)


def test_entropy_is_not_judged_without_early_steps():
    f = att.entropy_rule(series(policy__entropy=lambda s: 5.0 if s > 10 else 0.1), 15)
    assert f.status == "absent" and "no early steps" in f.reason


def test_lr_divergence_fires_when_updates_grow_past_their_early_size():
    # approx-KL 0.01 early, 0.1 in the window: 10 x its early median and above 0.05
    kl = series(policy__approx_kl=late(0.01, 0.1))
    f = att.lr_divergence_rule(kl, EVENT)
    assert f.status == "present" and "over its steps 1-20" in f.reason
    # low and high clipped shares add up: 0.06 + 0.06 early, 0.15 + 0.15 in the window
    both = series(
        policy__clip_frac_low=late(0.06, 0.15),
        policy__clip_frac_high=late(0.06, 0.15),
    )
    f = att.lr_divergence_rule(both, EVENT)
    assert f.status == "present" and f.numbers["policy/clip_frac"] == pytest.approx(0.3)
    grad = series(policy__approx_kl=lambda s: 0.08, policy__grad_norm=late(0.5, 8.0))
    f = att.lr_divergence_rule(grad, EVENT)
    assert f.status == "present" and f.numbers["grad_norm_growth"] == pytest.approx(16.0)


def test_lr_divergence_absent_when_the_updates_were_always_that_large():
    # large from the first step on: the run's own baseline, not a divergence
    steady = series(policy__approx_kl=lambda s: 0.1, policy__clip_frac_high=lambda s: 0.3)
    assert att.lr_divergence_rule(steady, EVENT).status == "absent"
    # a tenfold KL that stays below KL_LARGE is not one either
    small = series(policy__approx_kl=late(0.001, 0.01), policy__grad_norm=late(0.5, 2.0))
    assert att.lr_divergence_rule(small, EVENT).status == "absent"
    assert att.lr_divergence_rule(series(), EVENT).status == "not logged"


def test_a_share_above_half_from_the_first_step_is_not_lld():
    """The world's own level: more than half of the reinforced responses lose likelihood from
    step 1 on in some worlds, in runs that never collapse; only a rise over it is a signature."""
    always = series(reward__mean=rising_reward, lld__share_pos_fell=lambda s: 0.62)
    f = att.lld_rule(always, EVENT)
    assert f.status == "absent" and "against 0.62 over its steps 1-20" in f.reason
    rose = series(reward__mean=rising_reward, lld__share_pos_fell=late(0.55, 0.66))
    assert att.lld_rule(rose, EVENT).status == "present"  # 0.66 >= 0.55 + 0.1
    barely = series(reward__mean=rising_reward, lld__share_pos_fell=late(0.55, 0.64))
    assert att.lld_rule(barely, EVENT).status == "absent"
    # a displacement negative from the start is the baseline too
    neg = series(reward__mean=rising_reward, lld__disp_pos=lambda s: -0.1)
    assert att.lld_rule(neg, EVENT).status == "absent"


def test_low_ess_counts_only_where_it_was_high_early():
    always = series(mismatch__is_ess=lambda s: 0.3)
    assert att.mismatch_rule(always, EVENT).status == "absent"


def test_run_events_attributes_the_collapse_and_serious_alarms_only():
    rows = [
        {
            "step": s,
            "reward/mean": rising_reward(s) if s < 45 else 0.0,
            "lld/share_pos_fell": 0.8 if s > 25 else 0.2,
            "policy/entropy": 0.8,
        }
        for s in range(1, STEPS + 1)
    ]
    alarms = [
        Alarm(30, "stagnation", "info", ""),
        Alarm(40, "displacement_decay", "critical", ""),
        Alarm(50, "collapse", "critical", ""),  # the detector's alarm, not the definition's
    ]
    events = att.run_events(rows, alarms)
    assert [(e.kind, e.step) for e in events] == [
        (att.COLLAPSE, 50),
        ("displacement_decay", 40),
        ("collapse", 50),
    ]
    collapse = events[0]
    assert [f.mechanism for f in collapse.with_status("present")] == ["LLD"]
    assert [f.mechanism for f in collapse.with_status("absent")] == ["entropy"]
    assert {f.mechanism for f in collapse.with_status("not logged")} == {
        "mismatch",
        "void turns",
        "learning-rate divergence",
        "search decline",
    }
    text = attribution_paragraph(events)
    assert "Signatures present before the collapse at step 50 (steps 31&ndash;50): LLD (" in text
    assert "before the alarm <code>displacement_decay</code> at step 40" in text
    assert "before the alarm <code>collapse</code> at step 50" in text
    assert text.count("before the collapse at step") == 1
    assert "not logged: mismatch, void turns, learning-rate divergence, search decline" in text
    assert "not its established cause" in text and "stagnation" not in text


def test_alarms_at_one_step_share_a_sentence_and_late_ones_are_counted():
    rows = [{"step": s, "reward/mean": rising_reward(s)} for s in range(1, STEPS + 1)]
    alarms = [Alarm(20, "entropy_spike", "warning", ""), Alarm(20, "ratio_spike", "warning", "")]
    alarms += [Alarm(21 + i, "grad_norm_spike", "warning", "") for i in range(8)]
    text = attribution_paragraph(att.run_events(rows, alarms))
    assert text.startswith("<p class='attribution'>No collapse by the pre-registered definition.")
    assert "alarms <code>entropy_spike</code>, <code>ratio_spike</code> at step 20" in text
    assert text.count("Signatures present before") == 6  # step 20, then 21..25
    assert "Alarms at 3 later steps are not spelled out." in text


def test_paragraph_without_events_says_there_is_nothing_to_attribute():
    rows = [{"step": s, "reward/mean": rising_reward(s)} for s in range(1, 40)]
    assert att.run_events(rows, []) == []
    assert "nothing to attribute" in attribution_paragraph([])


def test_lld_reads_the_pre_mini_batch_share_of_a_trl_or_verl_run():
    sig = series(reward__mean=rising_reward, lld__premb_share_pos_fell=late(0.1, 0.7))
    f = att.lld_rule(sig, EVENT)
    assert f.status == "present" and f.numbers["lld/premb_share_pos_fell"] == pytest.approx(0.7)
    # the native pooled share wins when both are logged
    both = series(
        reward__mean=rising_reward,
        lld__share_pos_fell=lambda s: 0.1,
        lld__premb_share_pos_fell=late(0.1, 0.7),
    )
    assert att.lld_rule(both, EVENT).status == "absent"


def test_entropy_doubling_is_a_blow_up():
    f = att.entropy_rule(series(policy__entropy=late(0.8, 1.7)), EVENT)
    assert f.status == "present" and "blow-up" in f.reason
    assert att.entropy_rule(series(policy__entropy=late(0.8, 1.5)), EVENT).status == "absent"


def test_lld_reads_a_verl_log_of_only_the_keys_verl_emits():
    """Rows as veRL 0.9 names its metrics, plus the LLDS loss's flattened pre-mini-batch counts,
    mapped as the report reads a veRL log: the LLD rule judges them (it is not "not logged")."""
    from llds.report.sources import VERL_NAMES, map_row

    rows = []
    for step in range(1, STEPS + 1):
        fell = 70 if step >= 41 else 10
        logged = {
            "critic/score/mean": rising_reward(step),
            "actor/entropy": 0.8,
            "actor/ppo_kl": 0.001,
            "actor/lld_premb_n_pos_fell": float(fell),
            "actor/lld_premb_n_pos": 100.0,
        }
        rows.append(map_row(step, logged, VERL_NAMES))
    assert not any(k in rows[0] for k in ("lld/disp_pos", "lld/frac_pos_fell"))  # veRL's own
    finding = att.lld_rule(att.signal_series(rows), EVENT)
    assert finding.status == "present"
    assert finding.numbers["lld/premb_share_pos_fell"] == pytest.approx(0.7)


def test_gradient_growth_at_a_constant_logged_learning_rate_is_not_lr_divergence():
    grad = late(0.5, 8.0)
    constant = series(policy__grad_norm=grad, lr=lambda s: 1e-6)
    f = att.lr_divergence_rule(constant, EVENT)
    assert f.status == "absent" and f.numbers["lr_growth"] == pytest.approx(1.0)
    rising = series(policy__grad_norm=grad, lr=late(1e-6, 3e-6))
    assert att.lr_divergence_rule(rising, EVENT).status == "present"


def test_a_logged_rising_learning_rate_needs_only_the_relative_rise_of_the_updates():
    """With `lr` logged and risen 3x, a tenfold approx-KL below the 0.05 floor is a
    divergence; the same KL at a constant logged rate, or with no rate logged, is not."""
    kl = late(0.001, 0.01)  # 10 x its early median, a fifth of KL_LARGE
    rising = series(policy__approx_kl=kl, lr=late(1e-4, 3e-4))
    f = att.lr_divergence_rule(rising, EVENT)
    assert f.status == "present" and f.numbers["lr_growth"] == pytest.approx(3.0)
    assert att.lr_divergence_rule(series(policy__approx_kl=kl), EVENT).status == "absent"
    flat = series(policy__approx_kl=kl, lr=lambda s: 1e-4)
    assert att.lr_divergence_rule(flat, EVENT).status == "absent"
    # the relative rise is still needed: a rate risen 3x over updates of constant size
    still = series(policy__approx_kl=lambda s: 0.01, lr=late(1e-4, 3e-4))
    assert att.lr_divergence_rule(still, EVENT).status == "absent"


def test_every_mechanism_sits_in_exactly_one_causal_tier():
    tiers = [m for tier in att.CAUSAL_TIERS for m in tier]
    assert sorted(tiers) == sorted(att.MECHANISMS) and len(tiers) == len(set(tiers))


@pytest.mark.parametrize(
    ("present", "named"),
    [
        (["LLD", "mismatch", "entropy"], ("mismatch",)),
        (["entropy", "learning-rate divergence"], ("learning-rate divergence",)),
        (["mismatch", "learning-rate divergence"], ("mismatch", "learning-rate divergence")),
        (["LLD", "void turns", "entropy", "search decline"], ("void turns", "search decline")),
        (["LLD", "entropy"], ("LLD",)),
        (["entropy"], ("entropy",)),
        ([], ()),
    ],
)
def test_the_named_cause_is_the_most_upstream_signature_present(present, named):
    assert att.most_upstream(present) == named


def test_a_learning_rate_finding_without_the_rate_sits_after_lld():
    """Grown updates with no `lr` in the log are what the death spiral produces: LLD is named
    before them; with entropy they share a tier; a logged rate puts them first again."""
    both = ["LLD", "entropy", "learning-rate divergence"]
    unknown = {"learning-rate divergence"}
    assert att.most_upstream(both, unknown) == ("LLD",)
    assert att.most_upstream(both[1:], unknown) == ("entropy", "learning-rate divergence")
    assert att.most_upstream(both) == ("learning-rate divergence",)
