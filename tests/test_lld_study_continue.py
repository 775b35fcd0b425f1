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
