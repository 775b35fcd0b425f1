"""A study's run logs read alike live (`metrics.jsonl`) and committed (`metrics.jsonl.gz`), and
the folder layout `[WORLD/]ARM/seedN` names world, arm and seed (`llds.analysis.study_logs`)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from llds.analysis import study_logs


def _text(rows: list[dict]) -> str:
    return "".join(json.dumps(r) + "\n" for r in rows)


def test_last_step_reads_the_metrics_log(tmp_path: Path) -> None:
    assert study_logs.last_step(tmp_path) == 0
    (tmp_path / "metrics.jsonl").write_text('{"step": 1}\n{"step": 2}\n')
    assert study_logs.last_step(tmp_path) == 2


def test_run_rows_reads_the_live_log_first_then_the_committed_copy(tmp_path: Path) -> None:
    committed = [{"step": 1, "reward/mean": 0.5}, {"step": 2, "reward/mean": 0.25}]
    (tmp_path / "metrics.jsonl.gz").write_bytes(gzip.compress(_text(committed).encode()))
    assert study_logs.run_rows(tmp_path) == committed
    assert study_logs.read_committed_metrics(tmp_path / "metrics.jsonl.gz") == committed
    (tmp_path / "metrics.jsonl").write_text(_text(committed[:1]))
    assert study_logs.run_rows(tmp_path) == committed[:1]  # the live log wins
    with pytest.raises(FileNotFoundError, match=r"neither metrics\.jsonl nor metrics\.jsonl\.gz"):
        study_logs.run_rows(tmp_path / "missing")


def test_world_arm_and_seed_from_the_run_path(tmp_path: Path) -> None:
    organism = tmp_path / "GRPO_LLDS" / "seed11"
    factor = tmp_path / "larger-model" / "GRPO_LLDS-MA" / "seed2"
    assert study_logs.world_and_arm(tmp_path, organism) == ("organism", "GRPO+LLDS", "11")
    assert study_logs.world_and_arm(tmp_path, factor) == ("larger-model", "GRPO+LLDS-MA", "2")
    assert study_logs.arm_dir_name("GRPO+LLDS-MA") == "GRPO_LLDS-MA"


def test_run_logs_finds_every_committed_log_in_path_order(tmp_path: Path) -> None:
    for run in ("similar-names/GRPO/seed0", "GRPO_LLDS/seed1", "GRPO/seed0"):
        (tmp_path / run).mkdir(parents=True)
        (tmp_path / run / "metrics.jsonl.gz").write_bytes(gzip.compress(b'{"step": 1}\n'))
    (tmp_path / "GRPO" / "seed0" / "metrics.jsonl").write_text('{"step": 1}\n')  # not committed
    found = [p.parent.relative_to(tmp_path).as_posix() for p in study_logs.run_logs(tmp_path)]
    assert found == ["GRPO/seed0", "GRPO_LLDS/seed1", "similar-names/GRPO/seed0"]


def test_a_committed_log_cut_short_keeps_its_intact_rows(tmp_path):
    import gzip
    import json

    from llds.analysis.study_logs import read_committed_metrics

    rows = [{"step": i, "reward/mean": i / 10} for i in range(1, 200)]
    data = gzip.compress("".join(json.dumps(r) + "\n" for r in rows).encode(), mtime=0)
    path = tmp_path / "metrics.jsonl.gz"
    path.write_bytes(data[: len(data) * 2 // 3])  # a copy cut short: no traceback
    got = read_committed_metrics(path)
    assert 0 < len(got) < len(rows) and got == rows[: len(got)]
    path.write_text("not gzip at all\n")
    import pytest

    from llds.errors import DataFormatError

    with pytest.raises(DataFormatError, match="not a gzip file"):
        read_committed_metrics(path)
