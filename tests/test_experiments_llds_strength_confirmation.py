"""The LLDS-strength confirmation's tables and answers (CONFIRMATION.md), checked against
values computed by hand or by brute force."""

from __future__ import annotations

import math

import pytest

from brute_force import permutation_p as _brute_p
from llds.analysis.significance import fisher_p
from llds_strength.strength_confirmation import (
    arm_for,
    condition_lines,
    confirmation_summary,
    detectable_gap,
)


def test_fisher_p_and_detectable_gap_by_hand() -> None:
    # 3 of 3 against 0 of 3: the observed table and its mirror, each 1 / C(6, 3)
    assert fisher_p(3, 3, 0, 3) == pytest.approx(2 / 20)
    assert fisher_p(1, 3, 1, 3) == pytest.approx(1.0)
    assert fisher_p(0, 0, 1, 3) is None
    # (1.95996 + 0.84162) x 0.25 x sqrt(2 / n)
    assert detectable_gap(6) == pytest.approx(2.80158 * 0.25 * math.sqrt(1 / 3), rel=1e-4)
    assert detectable_gap(25) == pytest.approx(0.198, abs=1e-3)


def test_arm_for_names_the_dose_arm() -> None:
    assert arm_for(0.6) == "lam0.6"
    assert arm_for(2) == "lam2"
    with pytest.raises(ValueError, match=r"lambda 0\.3"):
        arm_for(0.3)


def _rows(collapse_at: int | None, em_300: float, fell: int, steps: int = 300) -> list[dict]:
    """A run: reward 0.6 until `collapse_at`, then 0.05; 10 positive responses a step of which
    `fell` lost likelihood; held-out EM at 300."""
    rows = []
    for s in range(1, steps + 1):
        low = collapse_at is not None and s >= collapse_at
        row = {"step": s, "reward/mean": 0.05 if low else 0.6}
        row.update({"lld/share_pos_fell": fell / 10, "lld/n_pos": 10})
        if s == 300:
            row["eval/em"] = em_300
        rows.append(row)
    return rows


def test_summary_counts_complete_runs_only() -> None:
    """Three complete GRPO runs (two collapse), two complete LLDS runs and a partial one: the
    answers use the five complete runs; every figure below is worked out by hand."""
    runs = {
        "lam0": {
            1: _rows(200, 0.30, fell=5),
            2: _rows(None, 0.50, fell=5),
            3: _rows(150, 0.20, fell=5),
        },
        "lam0.6": {
            1: _rows(None, 0.70, fell=2),
            2: _rows(None, 0.60, fell=2),
            3: _rows(None, 0.90, fell=2, steps=120),  # partial: out of every answer
        },
    }
    out = confirmation_summary(runs, "lam0.6")
    data, ans = out["json"], out["json"]["answers"]
    assert data["complete"] == {
        "lam0": {1: True, 2: True, 3: True},
        "lam0.6": {1: True, 2: True, 3: False},
    }
    # the collapse: the first step whose 10-step median reward is at or below half the peak
    assert [data["runs"]["lam0"][s]["collapse"] for s in (1, 2, 3)] == [205, None, 155]
    assert ans["complete_seeds"] == {"lam0": 3, "lam0.6": 2}
    assert ans["collapsed"] == {"lam0": 2, "lam0.6": 0}
    assert ans["collapse_fisher_p"] == pytest.approx(fisher_p(0, 2, 2, 3))
    assert ans["em_difference"] == pytest.approx(0.65 - (0.30 + 0.50 + 0.20) / 3)
    assert ans["em_permutation_p"] == pytest.approx(_brute_p([0.70, 0.60], [0.30, 0.50, 0.20]))
    assert ans["detectable_gap"] == pytest.approx(detectable_gap(2))
    # sample SDs by hand: GRPO's EMs 0.3, 0.5, 0.2 (mean 1/3); LLDS's 0.7, 0.6 (mean 0.65)
    sd_grpo = math.sqrt(((0.3 - 1 / 3) ** 2 + (0.5 - 1 / 3) ** 2 + (0.2 - 1 / 3) ** 2) / 2)
    assert ans["em_sd"]["lam0"] == pytest.approx(sd_grpo)  # 0.1528
    assert ans["em_sd"]["lam0.6"] == pytest.approx(math.sqrt(2 * 0.05**2))  # 0.0707
    assert "measured here: lam0 0.153, lam0.6 0.071." in out["markdown"]
    assert "**Collapses**: lam0 2 of 3, lam0.6 0 of 2 (Fisher" in out["markdown"]
    # 3 + 2 seeds: neither exact test can reach 0.05, whatever the data, and the page says so
    assert ans["smallest_p"] == pytest.approx({"em_permutation": 0.2, "collapse_fisher": 0.1})
    assert (
        "Power: with 3 + 2 complete seeds no EM gap, however large, can be called a difference: "
        "the exact permutation test cannot give a p below 0.05 there whatever the data (smallest "
        "possible p 0.200)" in out["markdown"]
    )
    assert "Nor can Fisher's test on the collapses (smallest possible p 0.100)." in out["markdown"]
    assert "detect an EM gap of about" not in out["markdown"]
    # shares before any fall: 0.5 in every window for GRPO (above the 0.40 rule: LLD in all
    # three), 0.2 for lam0.6 (none); 0.2 <= 0.5 / 2 and its EM is higher: "prevents it"
    assert ans["lld_under_grpo"].startswith("yes: LLD in 3 of 3")
    assert ans["prevention"] == "LLDS prevents it"
    assert "| lam0.6 | 3 | 120 (partial) |" in out["markdown"]
    assert "0.700 / 0.600; median 0.650" in out["markdown"]
    # the three conditions as sentences with the figures compared, not raw lists
    md = out["markdown"]
    assert "   - LLD in at most one lam0.6 run: yes (LLD in 0)\n" in md
    assert (
        "   - pooled share at most half of lam0's: yes (0.200 against 0.250, half of 0.500)" in md
    )
    assert (
        "   - held-out EM at 300 not below lam0's by more than 0.05: yes (0.650 against 0.333)"
        in md
    )
    assert "[True" not in md and "[False" not in md


def test_condition_lines_when_the_rule_fails() -> None:
    """The committed confirmation's shape at two seeds: LLD in none, share above half, EM up."""
    conditions = {
        "lld_in_at_most_one_run": [False, 2],
        "pooled_share_at_most_half": [False, 0.3070172169635537, 0.4819425730172888],
        "em_at_300_not_below_by_more_than_0.05": [False, 0.30, 0.43],
    }
    assert condition_lines(conditions, "lam0.6") == [
        "LLD in at most one lam0.6 run: no (LLD in 2)",
        "pooled share at most half of lam0's: no (0.307 against 0.241, half of 0.482)",
        "held-out EM at 300 not below lam0's by more than 0.05: no (0.300 against 0.430)",
    ]
    assert condition_lines(None, "lam0.6") == []
    with pytest.raises(ValueError, match="unknown prevention condition 'other'"):
        condition_lines({"other": [True, 1]}, "lam0.6")


def test_summary_before_any_complete_run_is_pending() -> None:
    out = confirmation_summary({"lam0": {1: _rows(None, 0.5, 5, steps=40)}}, "lam2")
    ans = out["json"]["answers"]
    assert ans["em_verdict"] == "pending"
    assert ans["prevention"] == "pending"
    assert ans["detectable_gap"] is None
    assert "no complete pair of seeds yet" in out["markdown"]


def test_summary_with_one_complete_seed_per_arm() -> None:
    """The first complete pair: every answer computes (no library refusal), by hand: EM p = 1
    (two splits), collapses 1 of 1 against 0 of 1 (Fisher: both tables have probability 1/2)."""
    runs = {"lam0": {1: _rows(272, 0.045, fell=5)}, "lam0.6": {1: _rows(None, 0.675, fell=3)}}
    out = confirmation_summary(runs, "lam0.6")
    ans = out["json"]["answers"]
    assert ans["em_difference"] == pytest.approx(0.675 - 0.045)
    assert ans["em_permutation_p"] == pytest.approx(1.0)
    assert ans["collapse_fisher_p"] == pytest.approx(1.0)
    assert "lam0 1 of 1, lam0.6 0 of 1" in out["markdown"]
    # one GRPO run cannot answer the LLD rule (it needs LLD in 2): pending, not "no"
    assert ans["lld_under_grpo"].startswith("pending: LLD in 1 of 1 complete grpo run")
    assert ans["prevention"] == "pending"
    # one seed a side: every split is as extreme as the observed one, so no gap can be called
    assert "with 1 + 1 complete seeds no EM gap, however large" in out["markdown"]
    assert "(smallest possible p 1.000)" in out["markdown"]


def test_summary_lists_each_runs_search_decline() -> None:
    """Valid searches 2.0 a rollout to step 50, then 1.0: the 20-step window reaches ten 1.0s at
    step 60, its median (1.0 + 2.0) / 2 = 1.5 = 3/4 of the first 20 steps' 2.0, so the warning
    fires there; the 25-step window means go 2.00 -> 1.00. A run that keeps searching has none."""
    declining = _rows(None, 0.5, fell=2)
    for row in declining:
        row["rollout/valid_searches"] = 2.0 if row["step"] <= 50 else 1.0
    steady = _rows(None, 0.5, fell=5)
    for row in steady:
        row["rollout/valid_searches"] = 1.8
    out = confirmation_summary({"lam0": {1: steady}, "lam0.6": {1: declining}}, "lam0.6")
    assert out["json"]["runs"]["lam0.6"][1]["search_decline_step"] == 60
    assert "| - | 60 | 2.00 -> 1.00 |" in out["markdown"]
    assert "| - | - | 1.80 -> 1.80 |" in out["markdown"]


def test_summary_at_four_seeds_per_arm_can_call_a_difference() -> None:
    """From 4 + 4 seeds the exact tests can go below 0.05 (2/70), so the page stops saying that
    no data could; here every LLDS EM is above every GRPO EM, so the rule calls a difference."""
    runs = {
        "lam0": {s: _rows(None, 0.2 + 0.01 * s, fell=5) for s in (1, 2, 3, 4)},
        "lam0.6": {s: _rows(None, 0.6 + 0.01 * s, fell=2) for s in (1, 2, 3, 4)},
    }
    out = confirmation_summary(runs, "lam0.6")
    ans = out["json"]["answers"]
    assert ans["smallest_p"]["em_permutation"] == pytest.approx(2 / 70)
    assert ans["em_permutation_p"] == pytest.approx(2 / 70)
    assert ans["em_verdict"] == "a difference"
    assert "4 seeds per arm detect an EM gap of about" in out["markdown"]
    assert "however large" not in out["markdown"] and "Nor can" not in out["markdown"]
