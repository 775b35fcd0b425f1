"""Continuing a study run must change its total steps and nothing else: the continued config
is the one `lld_study.py` started the run with, but for `steps`."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import lld_study
import lld_study_continue
from llds.train.config import load_config


@pytest.mark.parametrize(
    ("run", "arm", "seed"), [("GRPO/seed1", "GRPO", 1), ("GRPO_LLDS/seed2", "GRPO+LLDS", 2)]
)
def test_continued_config_differs_from_the_started_one_only_in_steps(tmp_path, run, arm, seed):
    out = tmp_path / "larger-model"
    started = lld_study.arm_config(out / "warm", out, arm, seed)
    path, overrides = lld_study_continue.run_overrides(out, run, 900)
    continued = load_config(path, overrides)
    assert continued.steps == 900 and started.steps == 600
    assert dataclasses.replace(continued, steps=started.steps) == started


@pytest.mark.parametrize("run", ["GRPO/1", "GRPO-LLDS/seed1", "PPO/seed0"])
def test_a_bad_run_name_is_named(tmp_path, run):
    with pytest.raises(ValueError, match=f"--runs '{run}'"):
        lld_study_continue.run_overrides(tmp_path, run, 900)


def test_last_step_reads_the_metrics_log(tmp_path):
    assert lld_study_continue.last_step(tmp_path) == 0
    (tmp_path / "metrics.jsonl").write_text('{"step": 1}\n{"step": 2}\n')
    assert lld_study_continue.last_step(tmp_path) == 2


def test_first_fall_and_recovery_by_hand():
    """10-step medians of 0.4 x 10, 0.1 x 10, 0.4 x 10: the median first reaches half the peak
    (0.2) at index 15 (four 0.4s, six 0.1s in its window) and rises above it at index 24 (five
    and five: 0.25)."""
    up, down = [0.4] * 10, [0.1] * 10
    assert lld_study_continue.first_fall_and_recovery(up + down + up) == (15, True)
    assert lld_study_continue.first_fall_and_recovery(up + down) == (15, False)
    assert lld_study_continue.first_fall_and_recovery([0.15] * 10 + [0.0] * 10) == (None, False)


@pytest.mark.parametrize("committed", [False, True])
def test_report_reads_a_run_collapsed_at_the_resume_step_and_after_it(tmp_path, committed):
    """A run whose reward falls at step 21 and stays down to step 40: collapsed at the resume
    step 30 and over the whole run, from step 26 (the first step whose 10-step median is 0.1);
    read from the live log or from its gzipped committed copy alike."""
    import gzip
    import json

    run = tmp_path / "GRPO" / "seed1"
    run.mkdir(parents=True)
    rewards = [0.4] * 20 + [0.1] * 20
    rows = [
        {"step": i + 1, "reward/mean": r, "time/step": 1.0, "eval/em": 0.5}
        | {"lld/disp_pos": -0.2 if i < 20 else 0.3, "lld/frac_pos_fell": 0.75}
        for i, r in enumerate(rewards)
    ]
    text = "".join(json.dumps(r) + "\n" for r in rows)
    if committed:
        (run / "metrics.jsonl.gz").write_bytes(gzip.compress(text.encode()))
    else:
        (run / "metrics.jsonl").write_text(text)
    table = lld_study_continue.report(tmp_path, ["GRPO/seed1"], since=30)
    cells = [c.strip() for c in table.splitlines()[-1].strip("|").split("|")]
    assert cells[:7] == ["GRPO/seed1", "40", "26", "26", "15", "26", "no"]
    # the 25 steps before the collapse at step 26: 20 at -0.2, then 5 at 0.3
    assert cells[-1] == "-0.20 / 0.75"
