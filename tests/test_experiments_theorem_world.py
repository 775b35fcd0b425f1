"""The theorem-world study's driver and tables (`experiments/theorem_world/`): the runs it would
start (`--dry-run`), and the pre-registered rules applied to logged rows built by hand."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from conftest import planned_runs
from theorem_world import theorem_study as tables

STUDY = Path(__file__).resolve().parents[1] / "experiments" / "theorem_world"


def _planned(*args: str | Path) -> list[dict[str, Any]]:
    return planned_runs(STUDY / "run.py", *args)


def _flat(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        out.update(_flat(v, f"{prefix}{k}.") if isinstance(v, dict) else {f"{prefix}{k}": v})
    return out


def test_the_arms_differ_in_llds_alone_and_keep_the_protocols_settings(tmp_path) -> None:
    runs = _planned("study", "--work", tmp_path, "--lr", "3e-4")
    assert [(r["run_dir"].split("/")[-2], r["seed"]) for r in runs] == [
        (arm, s) for s in (1, 2, 3) for arm in ("grpo", "grpo-llds", "grpo-llds-ma")
    ]
    grpo, llds, ma = _flat(runs[0]), _flat(runs[1]), _flat(runs[2])
    changed = {k for k in grpo if grpo[k] != llds[k]}
    assert changed == {"run_dir", "algo.llds.enabled"} and llds["algo.llds.coef"] == 0.2
    # version 3's arm: LLDS with the answer span weighted by the paper's schedule, nothing else
    assert {k for k in llds if llds[k] != ma[k]} == {"run_dir", "algo.llds.mask_answer"}
    assert ma["algo.llds.mask_answer"] is True and ma["algo.llds.answer_weight"] is None
    assert grpo["rollout.group_size"] == 8 and grpo["prompts_per_step"] == 40
    assert grpo["optim.mini_batches"] == 10 and grpo["optim.minibatch_order"] == "rollout"
    assert grpo["optim.epochs"] == 1 and grpo["optim.lr"] == 3e-4 and grpo["steps"] == 300
    assert grpo["eval_every"] == 25 and grpo["diagnostics.probe_every"] == 25
    assert grpo["diagnostics.probe_questions"] == 64 and grpo["data.eval_limit"] == 200
    assert grpo["model.path"] == str(tmp_path / "model")


def test_the_calibration_runs_the_grid_on_its_own_seeds(tmp_path) -> None:
    runs = _planned("calibrate", "--work", tmp_path)
    got = {(r["optim"]["lr"], r["seed"]) for r in runs}
    assert got == {(lr, s) for lr in (1e-4, 3e-4, 1e-3, 3e-3) for s in (101, 102)}
    assert all(r["steps"] == 10 and not r["algo"]["llds"]["enabled"] for r in runs)


def _row(step: int, reward: float = 0.5, fell: int = 0, pos: int = 10, **extra: float) -> dict:
    row = {"step": step, "reward/mean": reward, "lld/share_pos_fell": fell / pos, "lld/n_pos": pos}
    return {**row, **extra}


def test_window_shares_pool_over_responses_and_stop_at_the_fall() -> None:
    rows = [_row(s, fell=1 if s <= 25 else 0, pos=10) for s in range(1, 51)]
    rows[3]["lld/n_pos"], rows[3]["lld/share_pos_fell"] = 20, 0.25  # 5 of 20 at step 4
    w = tables.window_shares(rows, collapse=40, steps=50)
    assert (w[0]["fell"], w[0]["responses"]) == (24 + 5, 24 * 10 + 20)
    assert w[0]["share"] == pytest.approx(29 / 260) and w[0]["before_fall"]
    assert (w[1]["fell"], w[1]["share"], w[1]["before_fall"]) == (0, 0.0, False)  # 26-50 > 40


def test_lld_rule_one_a_window_above_40_percent_before_any_fall() -> None:
    rows = [_row(s, fell=5 if 26 <= s <= 50 else 1) for s in range(1, 301)]
    r = tables.run_summary(rows)
    assert r["collapse"] is None and r["lld_window"] == "26-50" and r["lld"]
    assert r["windows"][1]["share"] == pytest.approx(0.5)
    # the same shares after a reward fall do not count
    falling = [
        _row(s, reward=0.5 if s < 20 else 0.05, fell=5 if s > 25 else 1) for s in range(1, 301)
    ]
    r = tables.run_summary(falling)
    assert r["collapse"] is not None and r["collapse"] < 26 and not r["lld"]
    # exactly 0.40 is not above it
    assert not tables.run_summary([_row(s, fell=4) for s in range(1, 301)])["lld"]


def _probe(step: int, hi: int, share_hi: float) -> dict:
    return _row(
        step,
        **{
            "probe/groups_acc_hi": hi,
            "probe/first_order_lld_share_acc_hi": share_hi,
            "probe/groups_acc_lo": 3,
            "probe/first_order_lld_share_acc_lo": 0.0,
            "probe/correct_responses": 40,
            "probe/correct_first_order_fell_share": 0.1,
        },
    )


def test_lld_rule_two_needs_five_high_accuracy_groups_and_ten_percent() -> None:
    base = [_row(s) for s in range(1, 301)]
    few = [*base[:24], _probe(25, hi=4, share_hi=0.5), *base[25:]]
    assert not tables.run_summary(few)["lld"]  # 4 groups are too few
    low = [*base[:24], _probe(25, hi=10, share_hi=0.09), *base[25:]]
    assert not tables.run_summary(low)["lld"]
    hit = [*base[:49], _probe(50, hi=10, share_hi=0.1), *base[50:]]
    r = tables.run_summary(hit)
    assert r["lld_probe_step"] == 50 and r["lld_window"] is None and r["lld"]
    assert r["probes"][0]["groups_hi"] == 10 and r["probes"][0]["correct"] == 40


def _summary(lld: bool, fell: int, em: float, decline: int | None = None) -> dict:
    return {
        "lld": lld,
        "pooled_before_fall": {"all": {"fell": fell, "responses": 1000}},
        "em": {300: em},
        "search_decline_step": decline,
    }


def _answers(grpo, llds, complete=True, ma=None):
    runs = {"grpo": dict(enumerate(grpo, 1)), "grpo-llds": dict(enumerate(llds, 1))}
    if ma is not None:
        runs["grpo-llds-ma"] = dict(enumerate(ma, 1))
    done = {arm: {s: complete for s in by_seed} for arm, by_seed in runs.items()}
    return tables.answers(runs, done)


def test_version_three_search_questions_follow_their_rules() -> None:
    calm = [_summary(False, 100, 0.5)] * 3
    declining = [_summary(False, 100, 0.3, decline=150)] * 2 + [_summary(False, 100, 0.5)]
    got = _answers(calm, declining)
    assert got["llds_searches_less"].startswith("yes: search_decline in 2 of 3 grpo-llds runs")
    assert got["llds_ma_prevents_it"] == "pending" and "llds_ma" not in got
    # LLDS-MA: the warning in 1 of 3 runs and EM 0.45 >= LLDS's mean (0.3 + 0.3 + 0.5) / 3
    ma = [_summary(False, 100, 0.45, decline=200)] + [_summary(False, 100, 0.45)] * 2
    got = _answers(calm, declining, ma=ma)
    assert got["llds_ma_prevents_it"].startswith("LLDS-MA prevents LLDS's search decline")
    lower = [_summary(False, 100, 0.35)] * 3  # no warning, but EM below LLDS's 0.367
    assert _answers(calm, declining, ma=lower)["llds_ma_prevents_it"].startswith("it does not")
    # GRPO searching less too (2 of 3): the answer is no, and LLDS-MA is not asked
    also = [_summary(False, 100, 0.5, decline=100)] * 2 + [_summary(False, 100, 0.5)]
    got = _answers(also, declining, ma=ma)
    assert got["llds_searches_less"].startswith("no:") and got["llds_ma_prevents_it"] == (
        "not asked"
    )
    # LLDS-MA against LLD: version 1's conditions with LLDS-MA in LLDS's place
    lld = [_summary(True, 300, 0.5)] * 3
    got = _answers(lld, calm, ma=[_summary(False, 200, 0.5)] * 3)  # 600/3000 > half of 900
    assert got["llds"] == "LLDS prevents it" and got["llds_ma"] == "LLDS-MA does not prevent it"
    assert got["conditions_ma"]["pooled_share_at_most_half"][0] is False


def test_the_answers_follow_the_pre_registered_rules() -> None:
    lld = [_summary(True, 300, 0.5)] * 2 + [_summary(False, 300, 0.5)]
    calm = [_summary(False, 100, 0.5)] * 3
    assert _answers(lld, calm)["llds"] == "LLDS prevents it"
    assert _answers(lld, calm, complete=False)["lld_under_grpo"] == "pending"
    one = [_summary(True, 300, 0.5)] + [_summary(False, 300, 0.5)] * 2
    got = _answers(one, calm)
    assert (got["lld_under_grpo"], got["llds"]) == ("no: LLD in 1 of 3 grpo runs", "not testable")
    still = [_summary(True, 100, 0.5)] * 2 + [_summary(False, 100, 0.5)]
    assert _answers(lld, still)["llds"] == "LLDS reduces but does not prevent it"
    worse_em = [_summary(False, 100, 0.44)] * 3  # 0.06 below GRPO's 0.5
    assert _answers(lld, worse_em)["llds"] == "LLDS does not prevent it"
    more_than_half = [_summary(False, 151, 0.5)] * 3  # 453/3000 > half of 900/3000
    assert _answers(lld, more_than_half)["llds"] == "LLDS does not prevent it"


def test_calibration_picks_the_rate_closest_to_1e3_in_the_band() -> None:
    def rows(kl: float) -> list[list[dict]]:
        return [[{"step": s, "policy/approx_kl": kl} for s in range(1, 11)]] * 2

    got = tables.calibration_summary({1e-4: rows(1e-5), 3e-4: rows(5e-4), 1e-3: rows(2.5e-3)})
    assert got["json"]["chosen"] == 3e-4  # a factor 2 from 1e-3 beats a factor 2.5
    got = tables.calibration_summary({1e-4: rows(1e-5), 3e-4: rows(2e-4)})
    assert got["json"]["chosen"] is None and got["json"]["extend_to"] == pytest.approx(9e-4)
    got = tables.calibration_summary({1e-3: rows(5e-3), 3e-3: rows(2e-2)})
    assert got["json"]["extend_to"] == pytest.approx(1e-3 / 3)
    assert "**chosen**" not in got["markdown"]


def _batch_of(groups: list[list[int]]) -> Any:
    """A stand-in with the two fields the sampling stop reads: group ids and rewards."""
    import torch

    ids = [f"q{g}" for g, rewards in enumerate(groups) for _ in rewards]
    rewards = torch.tensor([float(r) for rewards in groups for r in rewards])
    return type("Batch", (), {"group_ids": ids, "rewards": rewards})()


def test_smollm2_probe_counts_high_accuracy_mixed_groups_and_stops_on_enough() -> None:
    from theorem_world import warm_start_report as probe

    # 3 of 4 right counts; 2 of 4 (half) is low; 4 of 4 and 0 of 4 are not mixed
    first = _batch_of([[1, 1, 1, 0], [1, 1, 0, 0], [1, 1, 1, 1], [0, 0, 0, 0]])
    second = _batch_of([[1, 0, 1, 1], [1, 1, 1, 0]])
    assert probe.high_accuracy_mixed(first) == 1 and probe.high_accuracy_mixed(second) == 2
    seen = {"chunks": 0, "high_mixed": 0}
    third = _batch_of([[1, 1, 1, 0]])
    taken = list(probe.until_enough(iter([first, second, third]), 3, float("inf"), seen))
    assert taken == [first, second] and seen == {"chunks": 2, "high_mixed": 3}
    seen = {"chunks": 0, "high_mixed": 0}  # a passed deadline stops after the first chunk
    assert list(probe.until_enough(iter([first, second]), 9, 0.0, seen)) == [first]


def test_search_decline_table_reads_a_run_log_by_hand(tmp_path: Path) -> None:
    from theorem_world import search_decline_table as search_decline

    # reward 0.6 until step 60, then 0.2: the 10-step median is 0.4 at step 65 (five of each)
    # and 0.2 from step 66, so the collapse is at 66. Searches 1.6 per rollout until step 40,
    # then 1.0: the 20-step window median is 1.3 at step 50 (above 0.75 x 1.6 = 1.2) and 1.0
    # from step 51 (eleven of twenty at 1.0), so the rule first holds at 51
    run = tmp_path / "arm" / "seed0"
    run.mkdir(parents=True)
    rows = [
        {
            "step": s,
            "reward/mean": 0.6 if s <= 60 else 0.2,
            "rollout/valid_searches": 1.6 if s <= 40 else 1.0,
        }
        for s in range(1, 101)
    ]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    got = search_decline.judge(run)
    assert got["collapse"] == 66
    assert got["at_collapse"] == "present" and got["first_present"] == 51
    assert got["others"] == "none" and got["searches_last"] == 1.0
    flat = tmp_path / "flat" / "seed0"
    flat.mkdir(parents=True)
    calm = [{"step": s, "reward/mean": 0.6, "rollout/valid_searches": 1.6} for s in range(1, 101)]
    (flat / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in calm))
    assert search_decline.judge(flat)["first_present"] is None
    table = search_decline.table([got, search_decline.judge(flat)])
    assert "Collapsed: 1, of which the signature is present at the collapse in 1." in table


def test_window_means_of_reward_and_searches_by_hand() -> None:
    rows = [_row(s, reward=0.2 if s <= 25 else 0.6) for s in range(1, 51)]
    for r in rows[:10]:
        r["rollout/valid_searches"] = 2.0  # steps 1-10 only: the window's mean is over those
    assert tables.window_means(rows, "reward/mean", steps=75) == pytest.approx([0.2, 0.6, None])
    assert tables.window_means(rows, "rollout/valid_searches", steps=50) == [2.0, None]


def test_arm_over_seeds_keeps_every_complete_seed_and_leaves_partial_ones_out() -> None:
    def run(fell: int, n: int, em: float | None, collapse: int | None) -> dict[str, Any]:
        ems = {} if em is None else {tables.STEPS: em}
        return {
            "pooled_before_fall": {"all": {"fell": fell, "responses": n}},
            "em": ems,
            "collapse": collapse,
        }

    by_seed = {1: run(45, 100, 0.0, 196), 2: run(30, 60, 0.6, None), 3: run(1, 2, None, None)}
    got = tables.arm_over_seeds(by_seed, {1: True, 2: True, 3: False})
    assert got["seeds"] == [1, 2]
    assert got["share"] == pytest.approx([0.45, 0.5])
    assert got["share_spread"]["median"] == pytest.approx(0.475)
    assert got["share_spread"]["se"] == pytest.approx(0.025)  # s.d. 0.03536 / sqrt(2)
    assert got["em_300"] == [0.0, 0.6]
    assert got["collapses"] == [196, None]
