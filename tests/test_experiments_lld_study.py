"""The LLD study's drivers (`experiments/lld_study/`), run as a user runs them, with `--dry-run`
(each run's config printed, nothing trained or built).

Its arms are override files of one recipe: each variant must change exactly the one setting its
name says against GRPO+LLDS, or the study compares more than it claims; and continuing a run
must change its total steps and nothing else."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

STUDY = Path(__file__).resolve().parents[1] / "experiments" / "lld_study"
EXPECTED = {
    "GRPO": {"algo.llds.enabled": False},
    "GRPO+LLDS": {},
    "GRPO+LLDS-MA": {"algo.llds.mask_answer": True},
    "GRPO+LLDS-lam0.1": {"algo.llds.coef": 0.1},
    "GRPO+LLDS-lam0.01": {"algo.llds.coef": 0.01},
    "GRPO+LLDS-token": {"algo.llds.gate": "token"},
    "GRPO+LLDS-response": {"algo.llds.gate": "response"},
}


def _driver(script: str, *args: str | Path) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, str(STUDY / script), *map(str, args)]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300)


def _planned(script: str, *args: str | Path) -> list[dict[str, Any]]:
    done = _driver(script, "--dry-run", *args)
    assert done.returncode == 0, done.stderr
    return [json.loads(line) for line in done.stdout.splitlines()]


def _flat(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(_flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


@pytest.fixture(scope="module")
def judge_runs(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    """Every arm on every judge seed, as `run.py` would start them."""
    root = tmp_path_factory.mktemp("study")
    demo, out = root / "warm", root / "out"
    return _planned("run.py", "--demo", demo, "--out", out, "--set", "judge", "--arms", *EXPECTED)


def _config(runs: list[dict[str, Any]], arm: str, seed: int = 0) -> dict[str, Any]:
    run = next(r for r in runs if r["arm"] == arm and r["seed"] == seed)
    flat = _flat(run["config"])
    flat.pop("run_dir")
    return flat


@pytest.mark.parametrize("arm", list(EXPECTED))
def test_each_arm_changes_only_what_its_name_says(judge_runs, arm: str) -> None:
    assert {r["arm"] for r in judge_runs} == set(EXPECTED)
    reference, config = _config(judge_runs, "GRPO+LLDS"), _config(judge_runs, arm)
    changed = {k: v for k, v in config.items() if v != reference[k]}
    assert changed == EXPECTED[arm]
    # the recipe itself: LLDS at lambda 0.2 on the action gate, 10 optimizer steps per batch
    assert reference["algo.llds.coef"] == 0.2 and reference["algo.llds.gate"] == "action"
    assert reference["optim.mini_batches"] == 10


def test_every_arm_has_its_own_colour_and_run_folder(judge_runs) -> None:
    seed0 = [r for r in judge_runs if r["seed"] == 0]
    assert len({r["color"] for r in seed0}) == len(EXPECTED)
    dirs = {r["config"]["run_dir"] for r in seed0}
    assert len(dirs) == len(EXPECTED)
    assert any(d.endswith("GRPO_LLDS-MA/seed0") for d in dirs)


def test_the_judge_set_is_seeds_0_1_2_in_order(judge_runs) -> None:
    assert [r["seed"] for r in judge_runs if r["arm"] == "GRPO"] == [0, 1, 2]


@pytest.mark.parametrize(
    ("seed_args", "expected"),
    [(["--set", "judge", "--seeds", "2", "0"], [0, 2]), (["--set", "tune", "--seeds", "11"], [11])],
)
def test_seeds_option_keeps_the_sets_order(tmp_path, seed_args, expected) -> None:
    runs = _planned("run.py", "--demo", tmp_path, "--out", tmp_path, "--arms", "GRPO", *seed_args)
    assert [r["seed"] for r in runs] == expected


def test_a_seed_outside_the_set_is_refused(tmp_path) -> None:
    done = _driver("run.py", "--dry-run", "--out", tmp_path, "--set", "judge", "--seeds", "3")
    assert done.returncode == 2 and done.stdout == ""
    assert "--seeds [3]: the judge set has seeds [0, 1, 2]" in done.stderr


@pytest.mark.parametrize(
    ("run", "arm", "seed"), [("GRPO/seed1", "GRPO", 1), ("GRPO_LLDS/seed2", "GRPO+LLDS", 2)]
)
def test_continued_config_differs_from_the_started_one_only_in_steps(tmp_path, run, arm, seed):
    factor = ["--factor", "larger-model", "--set", "judge", "--arms", arm, "--seeds", str(seed)]
    (started,) = _planned("run.py", "--out", tmp_path, *factor)
    out = tmp_path / "larger-model"
    (continued,) = _planned("continue_runs.py", "--out", out, "--steps", "900", "--runs", run)
    assert continued["run"] == run
    assert continued["config"]["steps"] == 900 and started["config"]["steps"] == 600
    assert {**continued["config"], "steps": 600} == started["config"]


@pytest.mark.parametrize("run", ["GRPO/1", "GRPO-LLDS/seed1", "PPO/seed0"])
def test_a_bad_run_name_is_named(tmp_path, run):
    done = _driver(
        "continue_runs.py", "--dry-run", "--out", tmp_path, "--steps", "900", "--runs", run
    )
    assert done.returncode == 2
    assert f"--runs '{run}'" in done.stderr
