"""Runs whose evaluation file mixes question sources (say `held-out` and `transfer`), one table
row per run: EM, F1 and valid searches per source at every evaluation, the reward at the start
and the end, and the displacement.

A run that has just started has an empty metrics log while its first step runs; it has no row
yet, so a table printed during a study lists the runs that have logged a step, and only those.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from llds import metrics as keys
from llds.runs.eval_result import EvalResult, eval_files
from llds.runs.tracking import read_metrics

HEAD = (
    "| arm | seed | steps | held-out EM @ each eval | held-out F1 | transfer EM @ each eval "
    "| valid searches / question (held-out) | reward first / last 10 steps "
    "| median disp_pos / frac_pos_fell | steps with disp_pos < 0 | min / run |"
)


def _evals(run: Path, start: Path) -> dict[int, EvalResult]:
    """The run's evaluations by step, with the warm start's as step 0."""
    found = {0: EvalResult.read(start)} if start.is_file() else {}
    found.update({step: EvalResult.read(f) for step, f in eval_files(run)})
    return found


def _source(res: EvalResult, source: str, field: str) -> float:
    scores = res.by_source.get(source)
    return getattr(scores, field) if scores is not None and scores.n else float("nan")


def _mean(rows: Sequence[dict[str, Any]], key: str) -> float | None:
    vals = [r[key] for r in rows if isinstance(r.get(key), (int, float))]
    return statistics.fmean(vals) if vals else None


def _fmt(v: float | None, digits: int = 3) -> str:
    return "-" if v is None or v != v else f"{v:.{digits}f}"


def _values(rows: Sequence[dict[str, Any]], key: str) -> list[float]:
    return [r[key] for r in rows if isinstance(r.get(key), float) and r[key] == r[key]]


def _series(evals: dict[int, EvalResult], source: str, field: str) -> str:
    return " / ".join(_fmt(_source(evals[s], source, field)) for s in sorted(evals))


def run_row(arm: str, seed: int, run: Path, rows: Sequence[dict[str, Any]], start: Path) -> str:
    """One run's line of the table (`rows`: its metrics log; `start`: the warm start's
    evaluation, step 0 of every series)."""
    evals = _evals(run, start)
    disp, fell = _values(rows, keys.DISP_POS), _values(rows, keys.FRAC_POS_FELL)
    reward = f"{_fmt(_mean(rows[:10], 'reward/mean'))} / {_fmt(_mean(rows[-10:], 'reward/mean'))}"
    return (
        f"| {arm} | {seed} | {rows[-1]['step']} | {_series(evals, 'held-out', 'em')} "
        f"(steps {', '.join(map(str, sorted(evals)))}) | {_series(evals, 'held-out', 'f1')} "
        f"| {_series(evals, 'transfer', 'em')} | {_series(evals, 'held-out', 'valid_searches')} "
        f"| {reward} | {_fmt(statistics.median(disp) if disp else None, 2)} / "
        f"{_fmt(statistics.median(fell) if fell else None, 2)} "
        f"| {sum(d < 0 for d in disp)} of {len(disp)} "
        f"| {sum(r.get('time/step', 0.0) for r in rows) / 60:.0f} |"
    )


def source_table(runs: Mapping[tuple[str, int], Path], start: Path) -> str:
    """The table of `runs` ((arm, seed) -> run directory, in row order) that have logged a
    step."""
    lines = [HEAD, "|" + "---|" * 11]
    for (arm, seed), run in runs.items():
        rows = read_metrics(run)
        if rows:  # started runs only (a run's first step may not be logged yet)
            lines.append(run_row(arm, seed, run, rows, start))
    return "\n".join(lines)
