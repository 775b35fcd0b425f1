"""`llds report`: HTML report comparing training runs (phases, alarms, LLD curves)."""

from __future__ import annotations

import argparse
from pathlib import Path

HELP = "HTML report comparing runs: reward, likelihoods, displacement, phases and alarms"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_dirs", nargs="+", metavar="RUN_DIR", help="run directories to compare")
    p.add_argument(
        "--out",
        default=None,
        help="output directory (default: RUN_DIR/report for one run, ./llds_report otherwise)",
    )
    p.add_argument("--labels", default=None, help="comma-separated run labels, e.g. grpo,llds")


def run(args: argparse.Namespace) -> int:
    from llds.errors import UserInputError
    from llds.report.html import write_report

    labels = None
    if args.labels is not None:
        labels = [s.strip() for s in args.labels.split(",")]
        if any(not s for s in labels):
            raise UserInputError(f"--labels {args.labels!r}: empty label")
    out = args.out
    if out is None:
        out = Path(args.run_dirs[0]) / "report" if len(args.run_dirs) == 1 else Path("llds_report")
    path = write_report(args.run_dirs, out, labels=labels)
    print(f"report written to {path}")
    return 0
