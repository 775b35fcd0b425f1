"""The metric logs `llds report` reads, in the report's own metric names.

A native run writes `metrics.jsonl` (a study commits it gzipped, `metrics.jsonl.gz`: read
too). A TRL run keeps its logged metrics in `trainer_state.json` (`log_history`, one dict per
logging step) at the top of its output directory or in its newest
`checkpoint-N/`. A veRL run logs through its trackers: the file logger writes one JSON object a
line, `{"step": N, "data": {metric: value}}`; the TensorBoard logger writes event files. Each
reader returns rows shaped like the native log (`step` plus metrics) with the frameworks' names
mapped onto the native ones, so the same phases, alarms, panels and attribution apply.
The name tables and `map_row` are the monitor's (`llds.monitor.framework_logs`), so the live
alarms inside TRL and the report read a framework's log alike.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from llds.analysis.study_logs import COMMITTED_LOG, run_rows
from llds.errors import DataFormatError, UserInputError
from llds.monitor.framework_logs import TRL_NAMES, VERL_NAMES, map_row
from llds.runs.tracking import METRICS_FILE

SourceKind = Literal["native", "trl", "verl-jsonl", "tensorboard"]

TRL_STATE = "trainer_state.json"
EVENTS_GLOB = "events.out.tfevents.*"


@dataclass(frozen=True)
class MetricSource:
    """Where a run's metrics were read from, and which format that was."""

    kind: SourceKind
    path: Path


def _merge_by_step(rows: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """Rows with the same step merged (a framework may log one step in several calls), in
    step order."""
    merged: dict[int, dict[str, Any]] = {}
    for row in rows:
        merged.setdefault(row["step"], {}).update(row)
    return [merged[s] for s in sorted(merged)]


def _has_metrics(row: Mapping[str, Any]) -> bool:
    return any(k != "step" for k in row)


def _checkpoint_number(path: Path) -> int:
    match = re.fullmatch(r"checkpoint-(\d+)", path.parent.name)
    return int(match.group(1)) if match else -1


def trl_state_file(run_dir: Path) -> Path | None:
    """The output directory's `trainer_state.json`, else its newest checkpoint's."""
    if (run_dir / TRL_STATE).is_file():
        return run_dir / TRL_STATE
    states = sorted(run_dir.glob(f"checkpoint-*/{TRL_STATE}"), key=_checkpoint_number)
    return states[-1] if states else None


def read_trl(state_file: Path) -> list[dict[str, Any]]:
    """Rows of a TRL `trainer_state.json`'s `log_history`; entries without metrics (the final
    runtime summary) are dropped."""
    try:
        state = json.loads(state_file.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise DataFormatError(f"{state_file}: not valid JSON ({exc})") from exc
    history = state.get("log_history") if isinstance(state, dict) else None
    if not isinstance(history, list):
        raise DataFormatError(f"{state_file}: no `log_history` list (is it a TRL trainer state?)")
    rows = []
    for i, entry in enumerate(history):
        if not isinstance(entry, dict) or not isinstance(entry.get("step"), int):
            raise DataFormatError(f"{state_file}: log_history[{i}] has no integer `step`")
        row = map_row(entry["step"], entry, TRL_NAMES)
        if _has_metrics(row):
            rows.append(row)
    return _merge_by_step(rows)


def is_verl_jsonl(path: Path) -> bool:
    """Whether the file's first line is a veRL file-logger record (`step` and a `data` dict)."""
    try:
        with path.open(encoding="utf-8") as f:
            first = json.loads(f.readline())
    except (OSError, json.JSONDecodeError, UnicodeDecodeError):
        return False
    return isinstance(first, dict) and "step" in first and isinstance(first.get("data"), dict)


def read_verl_jsonl(path: Path) -> list[dict[str, Any]]:
    """Rows of a veRL file-logger log; a torn last line (a crash mid-write) is skipped."""
    rows = []
    with path.open(encoding="utf-8") as f:
        lines = [line for line in f if line.strip()]
    for i, line in enumerate(lines, 1):
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            if i == len(lines):
                break
            raise DataFormatError(f"{path}: line {i} is not JSON ({exc})") from exc
        if not isinstance(record, dict) or not isinstance(record.get("data"), dict):
            raise DataFormatError(f"{path}: line {i} is not a {{step, data}} record")
        rows.append(map_row(int(record["step"]), record["data"], VERL_NAMES))
    return _merge_by_step(r for r in rows if _has_metrics(r))


def read_tensorboard(run_dir: Path) -> list[dict[str, Any]]:
    """Rows of the scalar summaries in the event files under `run_dir` (veRL's TensorBoard
    logger writes one scalar per metric and step)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    rows = []
    for folder in sorted({p.parent for p in run_dir.rglob(EVENTS_GLOB)}):
        acc = EventAccumulator(str(folder), size_guidance={"scalars": 0})
        acc.Reload()
        for tag in acc.Tags().get("scalars", []):
            for event in acc.Scalars(tag):
                rows.append(map_row(event.step, {tag: event.value}, VERL_NAMES))
    return _merge_by_step(r for r in rows if _has_metrics(r))


def find_source(path: Path) -> MetricSource:
    """Which log a run path holds: the native `metrics.jsonl` first, then a TRL trainer state,
    a veRL file-logger JSONL (the path itself, or the one `.jsonl` in a directory), then
    TensorBoard event files."""
    if path.is_file():
        if is_verl_jsonl(path):
            return MetricSource("verl-jsonl", path)
        if path.name == TRL_STATE:
            return MetricSource("trl", path)
        raise UserInputError(f"{path} is neither a veRL metrics JSONL nor a TRL {TRL_STATE}")
    if not path.is_dir():
        raise UserInputError(f"run directory {path} does not exist")
    if (path / METRICS_FILE).is_file() or (path / COMMITTED_LOG).is_file():
        return MetricSource("native", path)
    state = trl_state_file(path)
    if state is not None:
        return MetricSource("trl", state)
    logs = [p for p in sorted(path.glob("*.jsonl")) if is_verl_jsonl(p)]
    if len(logs) == 1:
        return MetricSource("verl-jsonl", logs[0])
    if next(path.rglob(EVENTS_GLOB), None) is not None:
        return MetricSource("tensorboard", path)
    raise UserInputError(
        f"run directory {path} has no {METRICS_FILE} (or {COMMITTED_LOG}): is it a training run? "
        f"(also read: a TRL "
        f"output directory with {TRL_STATE}, a veRL file-logger .jsonl, TensorBoard event files)"
    )


def read_source(source: MetricSource) -> list[dict[str, Any]]:
    """The rows of one source, in the report's metric names."""
    if source.kind == "native":
        return run_rows(source.path)  # the live log, else a study's committed gzipped copy
    if source.kind == "trl":
        return read_trl(source.path)
    if source.kind == "verl-jsonl":
        return read_verl_jsonl(source.path)
    return read_tensorboard(source.path)
