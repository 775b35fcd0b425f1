"""`llds report`: HTML report comparing training runs (phases, alarms, LLD curves).

Positional tokens are run directories, except those whose text before the first `=` is a
dotted key (`out=runs/report`): those are overrides. A directory whose name contains `=` is
written with a `./` in front, or listed under `runs:` in a config file.
"""

from __future__ import annotations

import argparse
from typing import Any

HELP = "HTML report comparing runs: reward, likelihoods, displacement, phases and alarms"
ALIASES = {"--out": "out", "--labels": "labels"}
OUTPUT_DIRS = ("out",)
"""directories this command writes: refused up front when they exist as files"""
OUTPUT_OWNS = ("report.html",)
"""what an earlier output of this command holds: such a folder may be written again"""


CONFIG = "llds.report.config:ReportConfig"
REST = ("runs", ", and run directories")
"""the key that takes the positional tokens that are not overrides, and their help"""


def run(cfg: Any, args: argparse.Namespace) -> int:
    from llds.report.html import write_report

    cfg.runs = [run_folder(run) for run in cfg.runs]
    verdicts: list[str] = []
    path = write_report(cfg.runs, cfg.out_dir(), labels=cfg.labels, verdicts=verdicts)
    for line in verdicts:
        print(line)
    print(f"report written to {path}")
    return 0


def run_folder(run: str) -> str:
    """A native run's log given for its run (`RUN/metrics.jsonl`, `.gz`) -> `RUN`."""
    from pathlib import Path

    from llds.runs.tracking import METRICS_FILE

    path = Path(run)
    if path.is_file() and path.name in (METRICS_FILE, f"{METRICS_FILE}.gz"):
        return str(path.parent)
    return run
