"""The SmolLM2 study's driver (`experiments/smollm2/run.py`), run as a user runs it with
`--dry-run`: the runs stage starts the chosen arms for each seed, and only the unfinished ones."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

DRIVER = Path(__file__).resolve().parents[1] / "experiments" / "smollm2" / "run.py"


def _planned(out: Path, *args: str) -> list[tuple[str, int]]:
    cmd = [sys.executable, str(DRIVER), "--out", str(out), "--stages", "runs", "--dry-run", *args]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    runs = [json.loads(line) for line in done.stdout.splitlines()]
    assert all(r["config"]["model"]["path"] == str(out / "sft" / "model") for r in runs)
    return [(r["arm"], r["seed"]) for r in runs]


def test_run_all_starts_only_the_chosen_arms(tmp_path: Path) -> None:
    assert _planned(tmp_path, "--seeds", "0,1", "--arms", "GRPO+LLDS") == [
        ("GRPO+LLDS", 0),
        ("GRPO+LLDS", 1),
    ]
    assert _planned(tmp_path, "--seeds", "2") == [("GRPO", 2), ("GRPO+LLDS", 2)]


def test_a_finished_run_is_not_started_again(tmp_path: Path) -> None:
    done = tmp_path / "GRPO" / "seed0"
    done.mkdir(parents=True)
    (done / "metrics.jsonl").write_text(json.dumps({"step": 60}) + "\n")  # the preset's 60 steps
    assert _planned(tmp_path, "--seeds", "0") == [("GRPO+LLDS", 0)]
    assert not (tmp_path / "data").exists()  # a dry run writes nothing
