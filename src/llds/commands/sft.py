"""`llds sft`: supervised warm start on expert search trajectories (before GRPO).

A thin adapter: the keys are `llds.sft.SFTConfig`'s fields (names, types, defaults and help come
from there), `--config` a YAML file of the same keys, and the work is `llds.sft.run`, under the
lock `llds train` takes on its run directory: one writer per output folder.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from llds.train.lock import RunLock

HELP = "supervised warm start: teach a model the search protocol on expert trajectories"
ALIASES = {"--model": "model", "--data": "data", "--retriever": "corpus", "--out": "out"}
OUTPUT_DIRS = ("out",)
"""directories this command writes: refused up front when they exist as files"""
OUTPUT_OWNS = ("sft_report.json", "sft_metrics.jsonl", "config.json")
"""what an earlier output of this command holds (a finished or a running one): such a folder may
be written again; while another process writes it, its lock refuses"""


CONFIG = "llds.sft.config:SFTConfig"
LOAD = "llds.sft.config:load_sft_config"


def run(cfg: Any, args: argparse.Namespace) -> int:
    from llds import sft
    from llds.logs import setup_logging

    setup_logging()  # the warm start reports through the llds.sft logger
    lock = output_lock(cfg.out)
    try:
        sft.run(cfg)
    finally:
        lock.release()
    return 0


def output_lock(out: str) -> RunLock:
    """The run-directory lock of `llds train`, taken on `out`: while another `llds sft` (or
    `llds train`) writes there, one line naming `out` and the holder's PID."""
    from llds.train.lock import RunDirectoryLocked, RunLock, lock_path

    try:
        return RunLock(out).acquire()
    except RunDirectoryLocked:
        path = lock_path(out)
        try:
            holder = path.read_text(encoding="utf-8", errors="replace").strip()
        except OSError:
            holder = ""
        raise RunDirectoryLocked(
            f"out {out} is in use by another process ({holder or 'PID unknown'}; lock {path}); "
            "wait for it to finish or give another out"
        ) from None
