"""A study's run summaries and tables (`lld_study.study_summary`, `lld_study.study_tables`):
each cell against values worked out by hand on runs built for the test."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from lld_study.study_summary import search_summary, summarize_run
from lld_study.study_tables import continued_table, largest_share, variant_table


def test_search_summary_is_the_last_steps_mean_and_the_lowest_sliding_window() -> None:
    # 60 steps: 2.0 searches for 30 steps, 1.0 for 20, then 1.5 for 10
    per_step = [2.0] * 30 + [1.0] * 20 + [1.5] * 10
    got = search_summary(per_step)
    # last 50 steps: 20 x 2.0 + 20 x 1.0 + 10 x 1.5 = 75 -> 1.5
    assert got["last"] == pytest.approx(75 / 50)
    # lowest 25-step window: steps 30-54 = 20 x 1.0 + 5 x 1.5 = 27.5 -> 1.1
    assert got["lowest_window"] == pytest.approx(27.5 / 25)
    # a step without the metric is skipped; a run shorter than the window has one window
    assert search_summary([None, 1.0, 3.0]) == {"last": 2.0, "lowest_window": 2.0}
    assert search_summary([None]) == {"last": None, "lowest_window": None}


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
    row = variant_table({"GRPO+LLDS-lam0.01": {0: run}}).splitlines()[2]
    assert row == (
        "| GRPO+LLDS-lam0.01 | 0 | 0.750 / 0.500 | none | 401 (collapse) | 108 / -16.28 "
        "| 0.500 | 1.47 / 1.35 | 0.01 (step 100) |"
    )
    # ties go to the earliest evaluation; no share at all prints a dash
    assert largest_share({"250": 0.05, "100": 0.05}) == "0.05 (step 100)"
    assert largest_share({}) == "-"
    assert largest_share({"50": 0.0, "100": 0.0}) == "0.00"


def _rows(rewards: list[float], disp: list[float]) -> list[dict]:
    return [
        {"step": i + 1, "reward/mean": r, "time/step": 1.0, "eval/em": 0.5}
        | {"lld/disp_pos": d, "lld/frac_pos_fell": 0.75, "rollout/valid_searches": 1.0}
        for i, (r, d) in enumerate(zip(rewards, disp, strict=True))
    ]


@pytest.mark.parametrize("committed", [False, True])
def test_continued_table_reads_a_run_collapsed_at_the_resume_step_and_after_it(
    tmp_path: Path, committed: bool
) -> None:
    """A run whose reward falls at step 21 and stays down to step 40: collapsed at the resume
    step 30 and over the whole run, from step 26 (the first step whose 10-step median is 0.1);
    read from the live log or from its gzipped committed copy alike."""
    run = tmp_path / "GRPO" / "seed1"
    run.mkdir(parents=True)
    rows = _rows([0.4] * 20 + [0.1] * 20, [-0.2] * 20 + [0.3] * 20)
    text = "".join(json.dumps(r) + "\n" for r in rows)
    if committed:
        (run / "metrics.jsonl.gz").write_bytes(gzip.compress(text.encode()))
    else:
        (run / "metrics.jsonl").write_text(text)
    table = continued_table(tmp_path, ["GRPO/seed1"], since=30)
    cells = [c.strip() for c in table.splitlines()[-1].strip("|").split("|")]
    assert cells[:7] == ["GRPO/seed1", "40", "26", "26", "15", "26", "no"]
    assert cells[7] == "0.500 / - / - / - / - / - / -"  # EM at 30, none logged at 80-330
    assert cells[8] == "1.00"  # valid searches over the last 50 steps
    # the 25 steps before the collapse at step 26: 20 at -0.2, then 5 at 0.3
    assert cells[-1] == "-0.20 / 0.75"


def test_summarize_run_reads_collapse_displacement_and_searches(tmp_path: Path) -> None:
    rewards = [0.4] * 20 + [0.1] * 20
    disp = [0.5] * 10 + [-1.5] + [0.2] * 9 + [-0.5] * 20
    (tmp_path / "metrics.jsonl").write_text(
        "".join(json.dumps(r) + "\n" for r in _rows(rewards, disp))
    )
    s = summarize_run(tmp_path)
    assert s["steps"] == 40 and s["collapse_step"] == 26
    assert s["lld_steps"] == 21 and s["worst_disp_pos"] == -1.5
    assert s["searches"] == {"last": 1.0, "lowest_window": 1.0}
    assert s["wall_s"] == 40.0 and s["eval_em"][40] == 0.5
    # the 25 steps before the collapse: 10 at 0.5, one at -1.5, 9 at 0.2, 5 at -0.5
    assert s["before_collapse"]["disp_pos_median"] == 0.2
    assert s["dip"]["peak"] == pytest.approx(0.4) and s["dip"]["trough"] == pytest.approx(0.1)
    assert s["punctuation_runs"] == {} and s["probe_final"] is None  # no eval/, no probe
