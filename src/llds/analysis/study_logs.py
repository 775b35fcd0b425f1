"""Run logs as a study keeps them: live under a run directory, or committed gzipped.

A study's finished runs are committed as `ARM/seedN/metrics.jsonl.gz` (a tenth of the size),
and the tables that read them must give the same numbers as on the live `metrics.jsonl`.
The folder layout is `[WORLD/]ARM/seedN`, with `+` in arm names written `_` (`GRPO_LLDS`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from llds.runs.tracking import METRICS_FILE, read_log, read_metrics, rows_of

COMMITTED_LOG = METRICS_FILE + ".gz"


def read_committed_metrics(path: str | Path) -> list[dict[str, Any]]:
    """The intact rows of a committed run log (`metrics.jsonl.gz`): a copy cut short or a
    damaged line is named in one warning, as for a live log (`llds.runs.tracking`)."""
    return rows_of(read_log(path))


def run_rows(run_dir: str | Path) -> list[dict[str, Any]]:
    """A run's metrics rows: its live log or, once committed, the gzipped copy."""
    run_dir = Path(run_dir)
    if (run_dir / METRICS_FILE).is_file():
        return read_metrics(run_dir)
    if (run_dir / COMMITTED_LOG).is_file():
        return read_committed_metrics(run_dir / COMMITTED_LOG)
    raise FileNotFoundError(f"{run_dir}: neither {METRICS_FILE} nor {COMMITTED_LOG}")


def last_step(run_dir: str | Path) -> int:
    """The last step in the run's live metrics log (0 when there is none)."""
    rows = read_metrics(run_dir)  # [] when the run has not started
    return int(rows[-1]["step"]) if rows else 0


def run_logs(results: str | Path) -> list[Path]:
    """Every committed run log under `results`, in path order."""
    return sorted(Path(results).rglob(COMMITTED_LOG))


def arm_dir_name(arm: str) -> str:
    """The folder of an arm: `GRPO+LLDS` -> `GRPO_LLDS`."""
    return arm.replace("+", "_")


def world_and_arm(results: str | Path, run: str | Path) -> tuple[str, str, str]:
    """`(world, arm, seed)` from `[<world>/]<arm>/seed<N>`; the organism has no world folder."""
    parts = Path(run).relative_to(results).parts
    world = "/".join(parts[:-2]) or "organism"
    return world, parts[-2].replace("_", "+", 1), parts[-1].removeprefix("seed")
