"""The SmolLM2 trivia-wiki study: its pre-registered answer on evaluations set by hand, the
GGUF's parts (cut, joined, checked), and the GPU command run as a user runs it (`--smoke`)."""

from __future__ import annotations

import json
import math
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from llds.models.gguf_parts import join_parts, split_file
from llds.runs.eval_result import EvalRecord, EvalResult, eval_file
from smollm2_wiki.answer import binomial_se, study_answer

FOLDER = Path(__file__).resolve().parents[1] / "experiments" / "smollm2_wiki"


def _write_eval(path: Path, test_right: int, test_n: int, transfer_right: int = 1) -> None:
    def rec(i: int, source: str, right: bool) -> EvalRecord:
        em = 1.0 if right else 0.0
        return EvalRecord(f"{source}{i}", source, "q", ["a"], "a", em, em, em, 1, True)

    records = [rec(i, "held-out", i < test_right) for i in range(test_n)]
    records += [rec(i, "transfer", i < transfer_right) for i in range(4)]
    EvalResult.of(records).write(path)


def _study(tmp_path: Path, warm: int, ems: dict[str, list[int]], step: int = 120) -> str:
    """`ems`: arm -> right answers of 100 test questions, per seed, at `step`."""
    start = eval_file(tmp_path / "sft", 0)
    start.parent.mkdir(parents=True)
    _write_eval(start, warm, 100)
    runs = {}
    for arm, per_seed in ems.items():
        for seed, right in enumerate(per_seed):
            run = tmp_path / arm / f"seed{seed}"
            path = eval_file(run, step)
            path.parent.mkdir(parents=True)
            _write_eval(path, right, 100)
            runs[(arm, seed)] = run
    return study_answer(runs, start, 120)


def test_binomial_standard_error_by_hand() -> None:
    assert binomial_se(0.2, 100) == pytest.approx(0.04)
    assert binomial_se(0.5, 25) == pytest.approx(0.1)
    assert math.isnan(binomial_se(0.5, 0))


def test_yes_needs_the_median_above_the_warm_start_by_005_and_one_standard_error(
    tmp_path: Path,
) -> None:
    # warm start 0.20 (se 0.04); GRPO seeds 0.30, 0.18, 0.26: median 0.26, gain +0.06
    got = _study(tmp_path, 20, {"GRPO": [30, 18, 26], "GRPO+LLDS": [21, 22, 23]})
    assert "| GRPO | 3 | 0.300 (seed 0), 0.180 (seed 1), 0.260 (seed 2) | 0.260 | +0.060 |" in got
    assert "| GRPO+LLDS | 3 |" in got and "| 0.220 | +0.020 |" in got
    assert got.endswith("+0.060 (one standard error 0.040; at least 0.05 needed): **yes**.")


def test_a_gain_under_005_is_a_no_even_above_one_standard_error(tmp_path: Path) -> None:
    # warm start 0.02 (se 0.014): +0.04 is three standard errors, but under 0.05
    got = _study(tmp_path, 2, {"GRPO": [6, 6, 6]})
    assert got.endswith("**no**.") and "+0.040" in got


def test_no_answer_before_every_seed_has_reached_the_step(tmp_path: Path) -> None:
    got = _study(tmp_path, 20, {"GRPO": [40, 40]})
    assert got.endswith("Not answered yet: 2 of 3 GRPO seeds evaluated at step 120.")
    later = tmp_path / "later"
    assert "| GRPO | 0 | - |" in _study(later, 20, {"GRPO": [40, 40, 40]}, step=80)


def test_parts_join_to_the_same_bytes_and_a_damaged_part_is_named(tmp_path: Path) -> None:
    blob = bytes(range(256)) * 4000 + b"tail"  # 1,024,004 bytes
    src = tmp_path / "model.gguf"
    src.write_bytes(blob)
    manifest = split_file(src, tmp_path / "parts", 300_000)
    assert [p["bytes"] for p in manifest["parts"]] == [300_000, 300_000, 300_000, 124_004]
    assert sorted(p.name for p in (tmp_path / "parts").iterdir()) == [
        "00",
        "01",
        "02",
        "03",
        "manifest.json",
    ]
    assert join_parts(tmp_path / "parts", tmp_path / "joined.gguf").read_bytes() == blob
    third = tmp_path / "parts" / "02" / "part-02"
    third.write_bytes(b"x" + third.read_bytes()[1:])
    with pytest.raises(ValueError, match=r"02/part-02: damaged"):
        join_parts(tmp_path / "parts", tmp_path / "again.gguf")
    third.unlink()
    with pytest.raises(ValueError, match=r"02/part-02: missing"):
        join_parts(tmp_path / "parts", tmp_path / "again.gguf")
    assert not (tmp_path / "again.gguf").exists()
    assert not (tmp_path / "again.gguf.partial").exists()


@pytest.mark.slow
def test_the_gpu_command_runs_every_stage_and_a_second_call_keeps_them(tmp_path: Path) -> None:
    """`gpu.py --smoke` (tiny model and world, on the CPU): warm start, its evaluation, both
    arms; the results folder has the table, the logs and the progress; called again it starts
    nothing and prints the same table."""
    out, results = tmp_path / "out", tmp_path / "results"
    cmd = [sys.executable, str(FOLDER / "gpu.py"), "--smoke", "--seeds", "0"]
    cmd += ["--out", str(out), "--results", str(results), "--write-every", "1"]
    first = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    assert first.returncode == 0, first.stderr[-3000:]
    progress = [json.loads(line) for line in (results / "progress.jsonl").read_text().splitlines()]
    assert progress[-1] == {**progress[-1], "event": "done", "unfinished": []}
    table = (results / "table.md").read_text()
    assert "| GRPO | 0 | 2 |" in table and "| GRPO+LLDS | 0 | 2 |" in table
    assert "Not answered yet: 1 of 3 GRPO seeds evaluated at step 2." in table
    with tarfile.open(results / "runs.tar.gz") as tar:
        names = set(tar.getnames())
    expected = {"warm_start_eval.json", "GRPO/seed0/metrics.jsonl", "GRPO/seed0/eval"}
    assert expected | {"GRPO_LLDS/seed0/metrics.jsonl", "GRPO_LLDS/seed0/config.json"} <= names
    with tarfile.open(results / "runs.tar.gz") as tar:
        config = json.load(tar.extractfile("GRPO_LLDS/seed0/config.json"))
    assert config["algo"]["llds"]["enabled"] is True and config["steps"] == 2
    rows = [json.loads(line) for line in (out / "eval.jsonl").read_text().splitlines()]
    assert [r["data_source"] for r in rows] == ["held-out"] * 6 + ["transfer"] * 4
    second = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert second.returncode == 0, second.stderr[-3000:]
    assert "(log: " not in second.stdout  # no run was started again (run_queue prints it)
    assert (results / "table.md").read_text() == table
