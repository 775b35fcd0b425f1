"""The LLD study's arms are override files of one recipe: each variant must change exactly the
one setting its name says against GRPO+LLDS, or the study compares more than it claims."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import lld_study

EXPECTED = {
    "GRPO": {"algo.llds.enabled": False},
    "GRPO+LLDS": {},
    "GRPO+LLDS-MA": {"algo.llds.mask_answer": True},
    "GRPO+LLDS-lam0.1": {"algo.llds.coef": 0.1},
    "GRPO+LLDS-lam0.01": {"algo.llds.coef": 0.01},
    "GRPO+LLDS-token": {"algo.llds.gate": "token"},
    "GRPO+LLDS-response": {"algo.llds.gate": "response"},
}


def _flat(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(_flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def _config(tmp_path: Path, arm: str) -> dict[str, Any]:
    cfg = lld_study.arm_config(tmp_path / "warm", tmp_path / "out", arm, 0)
    flat = _flat(dataclasses.asdict(cfg))
    flat.pop("run_dir")
    return flat


@pytest.mark.parametrize("arm", list(EXPECTED))
def test_each_arm_changes_only_what_its_name_says(tmp_path: Path, arm: str) -> None:
    assert set(lld_study.ARMS) == set(EXPECTED) and set(lld_study.COLORS) == set(EXPECTED)
    reference, config = _config(tmp_path, "GRPO+LLDS"), _config(tmp_path, arm)
    changed = {k: v for k, v in config.items() if v != reference[k]}
    assert changed == EXPECTED[arm]
    # the recipe itself: LLDS at lambda 0.2 on the action gate, 10 optimizer steps per batch
    assert reference["algo.llds.coef"] == 0.2 and reference["algo.llds.gate"] == "action"
    assert reference["optim.mini_batches"] == 10


def test_run_folders_of_the_arms_are_distinct(tmp_path: Path) -> None:
    dirs = {lld_study.run_dir(tmp_path, arm, 0) for arm in lld_study.ARMS}
    assert len(dirs) == len(lld_study.ARMS)


def _record(prediction: str | None, response: str):
    from llds.runs.eval_result import EvalRecord

    return EvalRecord(
        id="q",
        source="world",
        question="?",
        golds=["Pudrom"],
        prediction=prediction,
        em=0.0,
        f1=0.0,
        sub_em=0.0,
        valid_searches=1,
        answered=prediction is not None,
        response=response,
    )


def test_copied_share_counts_answers_found_in_retrieved_passages() -> None:
    passage = (
        "<search> x </search>\n"
        "<information>Doc 1 The currency of Dirdromro is Pudrom.</information>\n"
    )
    records = [
        _record("Pudrom", passage + "<answer> Pudrom </answer>"),  # copied
        _record("Dirdromro", passage + "<answer> Dirdromro </answer>"),  # copied, wrong
        _record("Varglar", passage + "<answer> Varglar </answer>"),  # not in any passage
        _record("Varglar", "<search> Varglar </search><answer> Varglar </answer>"),  # query only
        _record("pudrom).", passage + "<answer> pudrom). </answer>"),  # copied, as EM normalizes
        _record("Dirdrom", passage + "<answer> Dirdrom </answer>"),  # a prefix of a word only
        _record(None, passage),  # unanswered: not counted
    ]
    result = lld_study.EvalResult.of(records)
    assert lld_study.copied_share(result) == pytest.approx(3 / 6)
    assert lld_study.copied_share(lld_study.EvalResult.of([_record(None, passage)])) is None


def test_punctuation_run_share_counts_degenerate_responses() -> None:
    passage = "<search> river of Shuballor </search>\n<information>Doc 1 ...</information>\n"
    records = [
        _record("Kulban", passage + "<answer> Kulban </answer>"),  # clean
        _record("Kulban)))))", passage + "<answer> Kulban))))) </answer>"),  # 5 in a row
        _record("Kulban))))", passage + "<answer> Kulban)))) </answer>"),  # 4: not counted
        _record(None, "<search> river of Shuballor)))))))))) </search>"),  # in a query, unanswered
        _record("Kulban", passage + "<answer> Kulban </answer>...!!..."),  # mixed, no run of 5
        _record("x", "</search></search></search></search></search>"),  # tags are not a run
    ]
    result = lld_study.EvalResult.of(records)
    assert lld_study.punctuation_run_share(result) == pytest.approx(2 / 6)
    assert lld_study.punctuation_run_share(lld_study.EvalResult.of([])) is None


def test_the_trainer_and_the_study_count_punctuation_runs_alike() -> None:
    from llds.monitor.degenerate import PUNCTUATION_RUN, punctuation_run_frac

    # the study script keeps its own copy (it must import on the frozen study code)
    assert lld_study.PUNCTUATION_RUN.pattern == PUNCTUATION_RUN.pattern
    texts = ["<answer> Kulban))))) </answer>", "<answer> Kulban </answer>", "....!", "-----"]
    assert punctuation_run_frac(texts) == pytest.approx(2 / 4)
    assert punctuation_run_frac([]) == 0.0


def test_seeds_option_keeps_the_sets_order_and_rejects_seeds_outside_it() -> None:
    assert lld_study.select_seeds("judge", None) == (0, 1, 2)
    assert lld_study.select_seeds("judge", [2, 0]) == (0, 2)
    assert lld_study.select_seeds("tune", [11]) == (11,)
    with pytest.raises(ValueError, match=r"--seeds \[3\]: the judge set has seeds \[0, 1, 2\]"):
        lld_study.select_seeds("judge", [3])


def test_search_summary_is_the_last_steps_mean_and_the_lowest_sliding_window() -> None:
    # 60 steps: 2.0 searches for 30 steps, 1.0 for 20, then 1.5 for 10
    per_step = [2.0] * 30 + [1.0] * 20 + [1.5] * 10
    got = lld_study.search_summary(per_step)
    # last 50 steps: 20 x 2.0 + 20 x 1.0 + 10 x 1.5 = 75 -> 1.5
    assert got["last"] == pytest.approx(75 / 50)
    # lowest 25-step window: steps 30-54 = 20 x 1.0 + 5 x 1.5 = 27.5 -> 1.1
    assert got["lowest_window"] == pytest.approx(27.5 / 25)
    # a step without the metric is skipped; a run shorter than the window has one window
    assert lld_study.search_summary([None, 1.0, 3.0]) == {"last": 2.0, "lowest_window": 2.0}
    assert lld_study.search_summary([None]) == {"last": None, "lowest_window": None}


def test_variant_table_row_reads_the_summary() -> None:
    run = {
        "eval_em": {"100": 0.5, "50": 0.75},  # as the summaries' JSON keys them
        "collapse_step": None,
        "first_critical_alarm": 401,
        "first_critical_kind": "collapse",
        "lld_steps": 108,
        "worst_disp_pos": -16.284,
        "searches": {"last": 1.474, "lowest_window": 1.351},
        "punctuation_runs": {"50": 0.0, "100": 0.0125, "150": None},
    }
    row = lld_study.variant_table({"GRPO+LLDS-lam0.01": {0: run}}).splitlines()[2]
    assert row == (
        "| GRPO+LLDS-lam0.01 | 0 | 0.750 / 0.500 | none | 401 (collapse) | 108 / -16.28 "
        "| 0.500 | 1.47 / 1.35 | 0.01 (step 100) |"
    )
    # ties go to the earliest evaluation; no share at all prints a dash
    assert lld_study._largest_share({"250": 0.05, "100": 0.05}) == "0.05 (step 100)"
    assert lld_study._largest_share({}) == "-"
    assert lld_study._largest_share({"50": 0.0, "100": 0.0}) == "0.00"
