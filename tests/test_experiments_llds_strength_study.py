"""The LLDS-strength study's tables and rules (PROTOCOL.md) on logs whose values are set by
hand, and the committed tables recomputed from the committed logs."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from llds import metrics as keys
from llds_strength import strength_study as st

RESULTS = Path(__file__).resolve().parents[1] / "experiments" / "llds_strength" / "results"


def rows(
    share: float,
    *,
    n: int = 100,
    reward: float = 0.5,
    entropy: float = 0.4,
    em: float = 0.6,
    by_k: list[float] | None = None,
    steps: int = 50,
    time_update: float = 10.0,
) -> list[dict]:
    """`steps` logged rows: every step `n` pushed-up responses of which `share` fell (half in
    low-accuracy groups), 10 per mini-batch index with `by_k[k]` fell, held-out EM at 50."""

    def exact(p: float, count: int) -> float:  # a share over `count` that is a ratio of counts
        return round(p * count) / count

    out = []
    by_k = by_k or [share] * 10
    for step in range(1, steps + 1):
        row = {
            "step": step,
            keys.SHARE_POS_FELL: exact(share, n),
            keys.N_POS: n,
            keys.SHARE_POS_FELL_ACC_LO: exact(share, n // 2),
            keys.N_POS_ACC_LO: n // 2,
            keys.SHARE_POS_FELL_ACC_HI: exact(share, n // 2),
            keys.N_POS_ACC_HI: n // 2,
            keys.REWARD_MEAN: reward if step > 25 else 0.0,
            keys.ENTROPY: entropy,
            "time/update": time_update,
            "llds/loss": 0.01,
        }
        for k, p in enumerate(by_k):
            share_key, count_key = keys.minibatch_share_keys(k)
            row[share_key], row[count_key] = exact(p, n // 10), n // 10
        if step == 50:
            row["eval/em"] = em
        out.append(row)
    return out


def test_one_run_pools_over_responses() -> None:
    two = rows(0.5, n=10, steps=2)
    two[1].update({keys.SHARE_POS_FELL: 0.2, keys.N_POS: 5})
    r = st.run_summary(two)
    assert r["share"] == {"fell": 6, "responses": 15}  # 5 + 1 of 10 + 5, not the mean 0.35
    assert r["steps"] == 2 and not r["complete"]
    full = st.run_summary(rows(0.3, reward=0.7))
    assert full["complete"] and full["em"] == {50: 0.6}
    assert full["reward_26_50"] == pytest.approx(0.7)  # steps 1-25 (reward 0) left out
    assert full["by_minibatch"][3] == {"fell": 150, "responses": 500}


def test_arm_pools_over_seeds_with_its_standard_errors() -> None:
    arm = st.arm_summary({s: st.run_summary(rows(p)) for s, p in [(1, 0.3), (2, 0.4), (3, 0.5)]})
    assert arm["S"] == 0.4 and arm["shares"] == [0.3, 0.4, 0.5]
    assert arm["pooled"]["fell"] == 6000 and arm["pooled"]["responses"] == 15000
    assert arm["pooled"]["se"] == pytest.approx(math.sqrt(0.4 * 0.6 / 15000))
    assert arm["spread"]["se"] == pytest.approx(0.1 / math.sqrt(3))
    partial = st.arm_summary({1: st.run_summary(rows(0.3)), 2: st.run_summary(rows(0.3, steps=9))})
    assert partial["seeds"] == [1] and partial["started"] == [1, 2]


def _arms(spec: dict[str, tuple[list[float], float]], **kw) -> dict:
    return {
        arm: st.arm_summary(
            {
                s: st.run_summary(rows(p, reward=reward, **kw))
                for s, p in zip((1, 2, 3), shares, strict=True)
            }
        )
        for arm, (shares, reward) in spec.items()
    }


DOSE = {
    "lam0": ([0.40, 0.42, 0.44], 0.50),
    "lam0.2": ([0.36, 0.37, 0.38], 0.50),
    "lam0.6": ([0.30, 0.29, 0.31], 0.48),
    "lam2": ([0.20, 0.19, 0.21], 0.46),  # S 0.20 <= 0.21 and every seed below 0.40
    "lam6": ([0.10, 0.10, 0.10], 0.30),  # halves, but costs 0.2 reward
}


def test_dose_rule_picks_the_smallest_halving_lambda() -> None:
    arms = _arms(DOSE)
    dose = st.dose_answer(arms)
    assert dose["answer"] == "lambda = 2"
    assert dose["per_lambda"]["lam6"]["halves"] and not dose["per_lambda"]["lam6"]["affordable"]
    assert not dose["per_lambda"]["lam0.6"]["halves"]
    assert dose["per_lambda"]["lam2"]["reward_change"] == pytest.approx(-0.04)
    assert st.confirmation_lambda(arms) == 2.0
    # a seed at GRPO's level breaks 'halves' though the median halves
    arms = _arms({**DOSE, "lam2": ([0.20, 0.19, 0.45], 0.46)})
    assert st.dose_answer(arms)["answer"] == "lambda = 6"
    # lam6 halves but is not affordable: the affordable lambda with the lowest S (lam2's 0.20)
    assert st.confirmation_lambda(arms) == 2.0
    arms = _arms({**DOSE, "lam2": ([0.33, 0.32, 0.45], 0.46)})
    assert st.confirmation_lambda(arms) == 0.6  # S 0.30 < lam2's 0.33 < lam0.2's 0.37
    poor = {a: (s, 0.1 if a != "lam0" else 0.5) for a, (s, _) in DOSE.items()}
    assert st.confirmation_lambda(_arms(poor)) == 0.2  # none affordable


def test_rules_wait_for_three_complete_seeds() -> None:
    arms = _arms(DOSE)
    arms["lam0.6"] = st.arm_summary({1: st.run_summary(rows(0.3)), 2: st.run_summary(rows(0.3))})
    assert st.dose_answer(arms)["answer"].startswith("not yet")
    assert "lam0.6 2/3" in st.dose_answer(arms)["answer"]
    assert st.confirmation_lambda(arms) is None


def test_least_squares_slope_by_hand() -> None:
    slope, se = st.least_squares_slope([1, 2, 3, 4], [1, 3, 2, 5])
    assert slope == pytest.approx(1.1)
    assert se == pytest.approx(math.sqrt(0.27))


def test_mechanism_rules() -> None:
    wiggle = [0.0, 0.004, -0.003, 0.002, -0.004, 0.003, 0.0, -0.002, 0.004, -0.001]
    lld = [0.40 - 0.012 * k + wiggle[k] for k in range(10)]
    arms = {
        "lam0": _arms({"lam0": ([0.4] * 3, 0.5)})["lam0"],
        "lam0.2": st.arm_summary(
            {s: st.run_summary(rows(0.35, by_k=lld, n=1000)) for s in (1, 2, 3)}
        ),
        "mb1-lam0": _arms({"x": ([0.1] * 3, 0.5)})["x"],
    }
    arms["lam0"] = st.arm_summary({s: st.run_summary(rows(0.4, n=1000)) for s in (1, 2, 3)})
    got = st.mechanism_answers(arms)
    assert got["by_k"]["answer"] == "yes"
    assert got["by_k"]["R"][0]["R"] == pytest.approx(0.0, abs=1e-9)
    assert got["by_k"]["slope"] == pytest.approx(0.012, abs=1e-3)
    assert got["sequential"] == {"answer": "mostly the other mini-batches' updates", "ratio": 0.25}
    # a reduction already at k = 1 (flat): not the predicted shape
    flat = st.arm_summary(
        {s: st.run_summary(rows(0.3, by_k=[0.3] * 10, n=1000)) for s in (1, 2, 3)}
    )
    assert st.mechanism_answers({**arms, "lam0.2": flat})["by_k"]["answer"] == "no"


def test_variant_rule() -> None:
    arms = _arms(
        {"lam0": ([0.4] * 3, 0.5), "lam0.2": ([0.35] * 3, 0.5), "batch-lam0.2": ([0.18] * 3, 0.5)}
    )
    got = st.variant_answer(arms)
    assert got["answer"] == "yes" and got["further_than_minibatch"]
    assert got["time_update_ratio"] == pytest.approx(1.0)


def test_committed_tables_recompute_from_the_committed_logs() -> None:
    """Every committed figure of the study comes back from its committed per-step logs."""
    committed = json.loads((RESULTS / "study.json").read_text(encoding="utf-8"))
    runs = st.load_logs(RESULTS / "runs")
    assert runs, "the study's logs are committed under results/runs/"
    summary = st.study_summary(runs)
    assert json.loads(json.dumps(summary["json"])) == committed
    assert (RESULTS / "study.md").read_text(encoding="utf-8") == summary["markdown"]
