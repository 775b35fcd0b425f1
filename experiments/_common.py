"""Helpers shared by the study drivers: which runs are done, starting the others, printing
a config without training (`--dry-run`), and the clock and progress lines of a driver that runs
under a time budget (the GPU routes)."""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any


def finished(cfg: Any) -> bool:
    """Whether the training run of `cfg` (a `TrainConfig`) has logged its last step."""
    from llds.runs.tracking import read_metrics

    rows = read_metrics(cfg.run_dir)  # [] when the run has not started
    return bool(rows) and rows[-1]["step"] >= cfg.steps


def run_unfinished(configs: Sequence[Any], parallel: int, poll_s: float = 5.0) -> None:
    """Every run of `configs` that has not finished, each in its own process (resuming from its
    last checkpoint), `parallel` at a time; logs go to RUN/train-TIMESTAMP.log."""
    from llds.train.background import run_queue

    stamp = int(time.time())
    jobs = [(c, Path(c.run_dir) / f"train-{stamp}.log") for c in configs if not finished(c)]
    run_queue(jobs, parallel, poll_s=poll_s)


def config_data(cfg: Any) -> dict[str, Any]:
    """A config as plain JSON data, whatever kind of config object it is."""
    if hasattr(cfg, "model_dump"):
        return cfg.model_dump(mode="json")
    return json.loads(json.dumps(dataclasses.asdict(cfg), default=str))


def print_dry_run(runs: Sequence[dict[str, Any]]) -> None:
    """What a driver would run, one JSON object per line, for a reader or a test."""
    for run in runs:
        print(json.dumps(run, sort_keys=True))


PROGRESS = "progress.jsonl"


class Clock:
    """Seconds since the command started, and when its budget, less a reserve, ends."""

    def __init__(self, budget_s: float) -> None:
        self.start, self.budget_s = time.monotonic(), budget_s

    def elapsed(self) -> float:
        return time.monotonic() - self.start

    def deadline(self, reserve_s: float) -> float:
        return self.start + self.budget_s - reserve_s


def say(clock: Clock, folder: Path, event: str, **info: Any) -> None:
    """One line of progress, printed (flushed) and appended to `folder/progress.jsonl`, so a
    command killed at its limit leaves what it had done."""
    row = {"t_s": round(clock.elapsed(), 1), "event": event, **info}
    print(json.dumps(row), flush=True)
    with open(folder / PROGRESS, "a", encoding="utf-8") as f:
        f.write(json.dumps(row) + "\n")
