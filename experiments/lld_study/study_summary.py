"""One run of a study, summarized from its run directory: what the study tables print.

A summary is plain JSON-able data (a study writes them all to `lld_study_SET.json` and commits
it), so tables can be rebuilt later without the run directories: held-out EM per evaluation, the
pre-registered collapse, the first critical alarm replayed with this checkout's detector, the
displacement episodes, the deepest reward fall, valid searches and the `EVAL_SHARES`.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from llds import metrics as keys
from llds.analysis.eval_shares import EVAL_SHARES
from llds.errors import DataFormatError
from llds.monitor.alarms import scan_alarms
from llds.report.collapse import LLD_WINDOW, SMOOTH, collapse_step, deepest_dip, median_window
from llds.runs.eval_result import EvalResult
from llds.runs.tracking import read_metrics

SEARCH_TAIL = 50
"""Steps at the end of a run over which valid searches are averaged."""
SEARCH_WINDOW = 25
"""Width of the sliding window whose lowest mean shows the one-search state."""
DIP_KEYS = (
    keys.DISP_POS,
    keys.FRAC_POS_FELL,
    "lld/logp_correct",
    keys.ENTROPY,
    "policy/approx_kl",
    "policy/clip_frac_low",
)
"""What the deepest-dip table compares between the first 50 steps and the fall."""
SERIES_KEYS = (keys.REWARD_MEAN, keys.DISP_POS, keys.FRAC_POS_FELL, keys.ENTROPY)
"""The per-step series a summary keeps for the study's figure."""


def mean_of(rows: Sequence[dict[str, Any]], key: str) -> float | None:
    """Mean of `key` over the rows that have it (None if none does)."""
    vals = [r[key] for r in rows if r.get(key) is not None]
    return statistics.fmean(vals) if vals else None


def median_of(rows: Sequence[dict[str, Any]], key: str) -> float | None:
    """Median of `key` over the rows that have it (None if none does)."""
    vals = [r[key] for r in rows if r.get(key) is not None]
    return statistics.median(vals) if vals else None


def search_summary(per_step: Sequence[float | None]) -> dict[str, float | None]:
    """Valid searches per rollout: the mean over the last SEARCH_TAIL steps and the lowest mean
    of any SEARCH_WINDOW consecutive steps (the LLD study's measure of the one-search collapse,
    which LLDS-MA is meant to prevent)."""
    vals = [v for v in per_step if v is not None]
    if not vals:
        return {"last": None, "lowest_window": None}
    windows = [
        statistics.fmean(vals[i : i + SEARCH_WINDOW])
        for i in range(max(1, len(vals) - SEARCH_WINDOW + 1))
    ]
    return {"last": statistics.fmean(vals[-SEARCH_TAIL:]), "lowest_window": min(windows)}


def dip_summary(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The deepest fall of the 10-step median reward (descriptive, found after the runs) and
    the medians of DIP_KEYS over it and over the first 50 steps: LLD shows as pushed-up
    responses losing likelihood during the fall; a diverging step size as KL and clip fractions
    far above their start."""
    reward = [r[keys.REWARD_MEAN] for r in rows]
    smooth = [median_window(reward, i, SMOOTH) or 0.0 for i in range(len(reward))]
    peak, trough = deepest_dip(smooth)
    fall = rows[peak : trough + 1]
    return {
        "peak_step": rows[peak]["step"],
        "trough_step": rows[trough]["step"],
        "peak": smooth[peak],
        "trough": smooth[trough],
        "fall": {k: median_of(fall, k) for k in DIP_KEYS},
        "start": {k: median_of(rows[:LLD_WINDOW], k) for k in DIP_KEYS},
    }


def _eval_results(path: Path) -> dict[int, EvalResult]:
    """The run's held-out evaluations by step, each read once."""
    return {
        int(f.stem.split("_")[1]): EvalResult.read(f)
        for f in sorted((path / "eval").glob("step_*.json"))
    }


def _before_collapse(rows: Sequence[dict[str, Any]], collapse: int) -> dict[str, Any]:
    """The LLD_WINDOW steps before a collapse: the study's test for LLD before it."""
    steps = [r["step"] for r in rows]
    reward = [r[keys.REWARD_MEAN] for r in rows]
    i = steps.index(collapse)
    before = rows[max(0, i - LLD_WINDOW) : i]
    return {
        "disp_pos_median": median_of(before, keys.DISP_POS),
        "frac_pos_fell_median": median_of(before, keys.FRAC_POS_FELL),
        "reward_start": median_window(reward, max(0, i - LLD_WINDOW), SMOOTH),
        "reward_peak_step": steps[max(range(i + 1), key=lambda j: reward[j])],
        "approx_kl": mean_of(before, "policy/approx_kl"),
    }


def summarize_run(path: Path) -> dict[str, Any]:
    """The summary of the run in `path` (its `metrics.jsonl`, `eval/` and `probe_final/`)."""
    rows = read_metrics(path)
    if not rows:
        raise DataFormatError(f"{path}: no metrics.jsonl rows (run the study first)")
    steps = [r["step"] for r in rows]
    collapse = collapse_step(steps, [r[keys.REWARD_MEAN] for r in rows])
    evals = _eval_results(path)
    # replayed with the detector of this checkout, not read from what fired online
    critical = [a for a in scan_alarms(rows) if a.severity == "critical"]
    first = critical[0].step if critical else None
    probe = path / "probe_final" / "probe.json"
    out: dict[str, Any] = {
        "steps": steps[-1],
        "collapse_step": collapse,
        "first_critical_alarm": first,
        "first_critical_kind": critical[0].kind if critical else None,
        "lead": None if collapse is None or first is None else collapse - first,
        "false_alarm": collapse is None and first is not None,
        "eval_em": {r["step"]: r["eval/em"] for r in rows if "eval/em" in r},
        **{
            name: {step: share(result) for step, result in evals.items()}
            for name, share in EVAL_SHARES.items()
        },
        "first10": {
            "approx_kl": mean_of(rows[:10], "policy/approx_kl"),
            "clip_frac": sum(
                mean_of(rows[:10], f"policy/clip_frac_{side}") or 0.0 for side in ("low", "high")
            ),
        },
        "wall_s": sum(r["time/step"] for r in rows),
        # per-step LLD episodes: steps whose pushed-up responses lost likelihood on average
        "lld_steps": sum(1 for r in rows if (r.get(keys.DISP_POS) or 0.0) < 0),
        "worst_disp_pos": min(
            (r[keys.DISP_POS] for r in rows if r.get(keys.DISP_POS) is not None), default=None
        ),
        "dip": dip_summary(rows),
        "searches": search_summary([r.get(keys.VALID_SEARCHES) for r in rows]),
        "probe_final": json.loads(probe.read_text()) if probe.is_file() else None,
        "series": {k: [r.get(k) for r in rows] for k in SERIES_KEYS},
    }
    if collapse is not None:
        out["before_collapse"] = _before_collapse(rows, collapse)
    return out
