"""The SmolLM2 study's table lists the runs that have logged a step, and only those (a run that
has just started has an empty metrics log while its first step runs)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import smollm2_rl


def _log(run: Path, rows: list[dict]) -> None:
    run.mkdir(parents=True)
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_table_skips_a_run_with_an_empty_log(tmp_path: Path) -> None:
    rows = [
        {"step": s, "reward/mean": 0.25 * s, "lld/disp_pos": d, "lld/frac_pos_fell": f}
        for s, d, f in ((1, 0.5, 0.0), (2, -0.25, 0.75))
    ]
    rows = [{**r, "time/step": 60.0} for r in rows]
    _log(smollm2_rl.run_dir(tmp_path, "GRPO", 0), rows)
    _log(smollm2_rl.run_dir(tmp_path, "GRPO+LLDS", 0), [])
    lines = smollm2_rl.table(tmp_path, [0]).splitlines()
    assert len(lines) == 3  # header, rule, the one run with rows
    cells = [c.strip() for c in lines[2].strip("|").split("|")]
    assert cells[:3] == ["GRPO", "0", "2"]
    assert cells[7] == "0.375 / 0.375"  # reward, mean of the first / last (up to) 10 steps
    assert cells[8] == "0.12 / 0.38"  # medians of disp_pos (0.5, -0.25), frac_pos_fell
    assert cells[9] == "1 of 2" and cells[10] == "2"  # steps with disp_pos < 0; minutes


def test_run_all_starts_only_the_chosen_arms(tmp_path: Path, monkeypatch) -> None:
    started: list[tuple[str, int]] = []

    def fake_config(out: Path, arm: str, seed: int, steps: int | None) -> tuple[str, int]:
        return arm, seed

    def record(jobs, parallel, poll_s):
        started.extend(jobs)

    monkeypatch.setattr(smollm2_rl, "arm_config", fake_config)
    monkeypatch.setattr(smollm2_rl, "run_unfinished", record)
    smollm2_rl.run_all(tmp_path, [0, 1], 1, None, ["GRPO+LLDS"])
    assert started == [("GRPO+LLDS", 0), ("GRPO+LLDS", 1)]
    started.clear()
    smollm2_rl.run_all(tmp_path, [2], 1, None)
    assert started == [("GRPO", 2), ("GRPO+LLDS", 2)]
