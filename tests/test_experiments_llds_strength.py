"""The LLDS-strength study's driver (`experiments/llds_strength/run.py`): which runs a call
starts (`--dry-run`) when some logs are already committed and the work folder is new."""

from __future__ import annotations

import gzip
import json
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
