"""The collapse-duration reading of the LLD study's runs, on series worked out by hand."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import collapse_duration as cd


def test_a_late_drop_is_a_collapse_of_the_steps_left() -> None:
    # reward 0.6 for steps 1-70, then 0. The 10-step median first reaches half the peak (0.3)
    # when 5 of its 10 values are 0: the middle pair is (0, 0.6), median 0.3, at step 75
    steps = list(range(1, 101))
    reward = [0.6] * 70 + [0.0] * 30
    assert cd.collapsed_steps(steps, reward) == (75, 26)


def test_a_dip_that_recovers_is_no_collapse() -> None:
    steps = list(range(1, 101))
    reward = [0.6] * 40 + [0.0] * 30 + [0.6] * 30
    assert cd.collapsed_steps(steps, reward) == (None, 0)


def test_world_arm_and_seed_from_the_run_path(tmp_path: Path) -> None:
    organism = tmp_path / "GRPO_LLDS" / "seed11"
    factor = tmp_path / "larger-model" / "GRPO_LLDS-MA" / "seed2"
    assert cd.world_and_arm(tmp_path, organism) == ("organism", "GRPO+LLDS", "11")
    assert cd.world_and_arm(tmp_path, factor) == ("larger-model", "GRPO+LLDS-MA", "2")
