"""The LLDS-strength study's driver (`experiments/llds_strength/run.py`): which runs a call
starts (`--dry-run`) when some logs are already committed and the work folder is new."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from pathlib import Path

from conftest import planned_runs

STUDY = Path(__file__).resolve().parents[1] / "experiments" / "llds_strength"


def _log(results: Path, arm: str, seed: int, steps: int) -> None:
    path = results / "runs" / arm / f"seed{seed}" / "metrics.jsonl.gz"
    path.parent.mkdir(parents=True)
    with gzip.open(path, "wt", encoding="utf-8") as f:
        f.writelines(
            json.dumps({"step": s, "reward/mean": 0.5}) + "\n" for s in range(1, steps + 1)
        )


def test_a_run_complete_in_the_committed_logs_is_not_run_again(tmp_path: Path) -> None:
    """On a new machine (empty work folder) a run whose committed log reaches step 50 is
    skipped; one whose log stops earlier, or has none, runs."""
    results = tmp_path / "results"
    _log(results, "lam0", 1, 50)
    _log(results, "lam0.2", 1, 22)
    args = ["--theorem", tmp_path / "theorem", "--work", tmp_path / "work"]
    args += ["--results", results, "--arms", "lam0", "lam0.2", "--seeds", "1", "2"]
    plan = {(r["arm"], r["seed"]): r for r in planned_runs(STUDY / "run.py", *args)}
    assert list(plan) == [("lam0", 1), ("lam0.2", 1), ("lam0", 2), ("lam0.2", 2)]
    assert {k: (r["committed_steps"], r["run"]) for k, r in plan.items()} == {
        ("lam0", 1): (50, False),
        ("lam0.2", 1): (22, True),
        ("lam0", 2): (0, True),
        ("lam0.2", 2): (0, True),
    }
    assert all(r["config"]["steps"] == 50 for r in plan.values())


def _study(tmp_path: Path, lam: float | None) -> Path:
    path = tmp_path / "study.json"
    path.write_text(json.dumps({"answers": {"confirmation_lambda": lam}}), encoding="utf-8")
    return path


def test_the_confirmation_runs_grpo_against_rule_5s_lambda_in_pairs(tmp_path: Path) -> None:
    """`confirm.py` reads rule 5's lambda from the study's tables and plans seed 1 of both arms,
    then seed 2, ..., each 300 steps; a committed complete log is not run again."""
    results = tmp_path / "confirm"
    _log(results, "lam0", 1, 300)
    args = ["--theorem", tmp_path / "theorem", "--work", tmp_path / "work", "--results", results]
    args += ["--study", _study(tmp_path, 0.6), "--seeds", "1", "2", "3"]
    plan = planned_runs(STUDY / "confirm.py", *args)
    assert [(r["arm"], r["seed"]) for r in plan] == [
        (arm, seed) for seed in (1, 2, 3) for arm in ("lam0", "lam0.6")
    ]
    assert [r["run"] for r in plan] == [False, True, True, True, True, True]
    assert {r["config"]["steps"] for r in plan} == {300}
    assert {r["config"]["optim"]["micro_batch_tokens"] for r in plan} == {4096}
    assert {r["config"]["optim"]["logprob_micro_batch_tokens"] for r in plan} == {16384}
    assert {r["config"]["algo"]["llds"]["coef"] for r in plan if r["arm"] == "lam0.6"} == {0.6}
    assert plan[3]["config"]["run_dir"] == str(tmp_path / "work" / "lam0.6" / "seed2")


def test_the_confirmation_waits_for_the_dose_response(tmp_path: Path) -> None:
    cmd = [sys.executable, str(STUDY / "confirm.py"), "--study", str(_study(tmp_path, None))]
    done = subprocess.run([*cmd, "--dry-run"], capture_output=True, text=True, timeout=300)
    assert done.returncode != 0
    assert "confirmation_lambda is null" in done.stderr


def test_the_figures_draw_from_the_committed_results(tmp_path: Path) -> None:
    """figures.py draws the study's two figures and the confirmation's runs (complete or not)
    from what is committed, into `--out`."""
    done = subprocess.run(
        [sys.executable, str(STUDY / "figures.py"), "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    for name in ("lambda", "minibatch", "confirmation"):
        png = tmp_path / f"llds-strength-{name}.png"
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", name
