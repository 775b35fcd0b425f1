"""Fault injection, part four (run logs): a damaged line of a run's metrics log costs only
itself. Reading keeps every intact row and names the damaged line with the count of rows read;
a resume never rewrites a log it could not read whole without keeping the original beside it
and saying so; a compressed log cut short keeps the rows before the cut. Through the real
command line (`llds train`, `llds report`) and the reader."""

from __future__ import annotations

import gzip
import json
import logging
from pathlib import Path

import pytest

from llds.errors import DataFormatError
from llds.runs.tracking import METRICS_FILE, read_log, read_metrics
from test_fault_injection_resume import (
    cli,
    inputs,  # noqa: F401 (a fixture)
    reference,  # noqa: F401 (a fixture)
    run,  # noqa: F401 (a fixture)
    steps_of,
    train_args,
)


def damage_line(log: Path, line: int, text: bytes) -> None:
    """Replace line `line` (1-based) of a log by `text`."""
    lines = log.read_bytes().splitlines(keepends=True)
    lines[line - 1] = text + b"\n"
    log.write_bytes(b"".join(lines))


def warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]


def test_a_damaged_middle_row_costs_only_itself(run, caplog):  # noqa: F811
    log = run / METRICS_FILE
    damage_line(log, 2, b'{"step": 2, "reward/mean": 0.')
    caplog.set_level(logging.WARNING)
    assert steps_of(run) == [1, 3, 4]  # the reader once stopped at line 2: [1]
    said = warnings(caplog)
    assert said == [f"{log}: 1 damaged line(s) skipped (line 2: not JSON); 3 intact row(s) read"]
    read_metrics(run)  # the same damage is named once per process
    assert warnings(caplog) == said


def test_a_torn_last_line_is_dropped_quietly(run, caplog):  # noqa: F811
    """The row a crash cut short, at the end without its newline: expected, not named."""
    log = run / METRICS_FILE
    log.write_bytes(log.read_bytes() + b'{"step": 5, "rew')
    caplog.set_level(logging.WARNING)
    assert steps_of(run) == [1, 2, 3, 4]
    assert warnings(caplog) == []


@pytest.mark.parametrize(
    ("text", "why"),
    [
        (b"\x00\x00\x00 garbage", "line 2: not JSON"),
        (b'{"step": 2, "reward/mean": "\xe9"}', "line 2: not UTF-8 text (byte 0xe9 at column 29)"),
    ],
)
def test_resume_over_a_damaged_row_keeps_every_intact_row(inputs, run, capsys, caplog, text, why):  # noqa: F811
    """The issue's case: one damaged row in the middle (not JSON, or a byte that is not
    UTF-8), then the same `llds train` (resumed from step 4, one step more): rows 3-4 stay,
    and the original log is kept beside."""
    log = run / METRICS_FILE
    damage_line(log, 2, text)
    original = log.read_bytes()
    rows_before = {r["step"]: r for r in read_metrics(run)}
    rc, out = cli(train_args(inputs, run, "steps=5"), capsys, caplog)
    assert rc == 0, out
    assert steps_of(run) == [1, 3, 4, 5]
    rows_after = {r["step"]: r for r in read_metrics(run)}
    assert all(rows_after[s] == rows_before[s] for s in (1, 3, 4))  # kept as they were
    copies = sorted(run.glob(f"{METRICS_FILE}.damaged-*"))
    assert len(copies) == 1 and copies[0].read_bytes() == original
    said = [line for line in out.splitlines() if "damaged line" in line]
    assert any(
        why in line
        and "3 intact row(s) read" in line
        and f"the original is kept as {copies[0].name}" in line
        for line in said
    ), out


@pytest.mark.parametrize(
    ("text", "why"),
    [
        (b"this is not json", "line 2: not JSON"),
        (b'{"step": 2, "reward/mean": "\xe9"}', "line 2: not UTF-8 text (byte 0xe9 at column 29)"),
    ],
)
def test_report_reads_past_a_damaged_row_and_says_so(run, tmp_path, capsys, caplog, text, why):  # noqa: F811
    damage_line(run / METRICS_FILE, 2, text)
    rc, out = cli(["report", str(run), "--out", str(tmp_path / "report")], capsys, caplog)
    assert rc == 0, out
    assert "Traceback" not in out
    assert f"{run / METRICS_FILE}: 1 damaged line(s) skipped ({why}); 3 intact row(s) read" in out
    assert (tmp_path / "report" / "report.html").is_file()


def _gz_log(path: Path, steps: int) -> bytes:
    data = gzip.compress(
        "".join(json.dumps({"step": s}) + "\n" for s in range(1, steps + 1)).encode()
    )
    path.write_bytes(data)
    return data


def test_a_compressed_log_cut_short_keeps_the_rows_before_the_cut(tmp_path):
    path = tmp_path / "metrics.jsonl.gz"
    data = _gz_log(path, 3000)
    path.write_bytes(data[: len(data) // 2])
    log = read_log(path)
    steps = [r["step"] for r in log.rows]
    assert steps == list(range(1, len(steps) + 1)) and 100 < len(steps) < 3000
    assert log.problem() == (
        f"{path}: cut short (the compressed data ends early after line {len(steps)}); "
        f"{len(steps)} intact row(s) read"
    )


def test_report_on_a_compressed_log_cut_short(tmp_path, capsys, caplog):
    """`llds report` on a committed `metrics.jsonl.gz` cut short (once an EOFError): the rows
    before the cut are reported, and the cut is named with the count read."""
    folder = tmp_path / "run"
    folder.mkdir()
    data = _gz_log(folder / "metrics.jsonl.gz", 3000)
    (folder / "metrics.jsonl.gz").write_bytes(data[: len(data) // 2])
    kept = len(read_log(folder / "metrics.jsonl.gz").rows)
    rc, out = cli(["report", str(folder), "--out", str(tmp_path / "report")], capsys, caplog)
    assert rc == 0, out
    assert "Traceback" not in out and "EOFError" not in out
    assert (
        f"{folder / 'metrics.jsonl.gz'}: cut short (the compressed data ends early after line "
        f"{kept}); {kept} intact row(s) read"
    ) in out
    assert (tmp_path / "report" / "report.html").is_file()
    assert sorted(p.name for p in folder.iterdir()) == ["metrics.jsonl.gz"]  # nothing written there


def test_report_names_steps_that_go_back(tmp_path, capsys, caplog):
    """Two runs' rows in one log (steps 1-6, then 3-5 again): once read on without a word.
    The later rows replace the earlier ones from step 3 on, as a resume cuts its log back."""
    folder = tmp_path / "run"
    folder.mkdir()
    first = [{"step": s, "reward/mean": 0.1} for s in range(1, 7)]
    second = [{"step": s, "reward/mean": 0.9} for s in range(3, 6)]
    log = folder / METRICS_FILE
    log.write_text("".join(json.dumps(r) + "\n" for r in first + second), encoding="utf-8")
    rc, out = cli(["report", str(folder), "--out", str(tmp_path / "report")], capsys, caplog)
    assert rc == 0, out
    assert (
        f"{log}: steps go back at 1 line(s) (line 7: step 3 after step 6, the 4 earlier "
        "row(s) from step 3 on dropped for the later ones); 5 intact row(s) read"
    ) in out
    read = read_log(log)
    assert not read.whole
    assert [(r["step"], r["reward/mean"]) for r in read.rows] == [
        (1, 0.1),
        (2, 0.1),
        (3, 0.9),
        (4, 0.9),
        (5, 0.9),
    ]


def test_plain_text_named_gz_is_one_error(tmp_path):
    path = tmp_path / "metrics.jsonl.gz"
    path.write_text('{"step": 1}\n', encoding="utf-8")
    with pytest.raises(DataFormatError, match=r"metrics\.jsonl\.gz: not a gzip file"):
        read_log(path)
