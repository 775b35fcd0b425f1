"""The markdown tables of a study, from its run summaries (`study_summary.summarize_run`).

A study is `{arm: {seed: summary}}`. Every table prints one row per run, so each number of a
results page can be traced to one run; `continued_table` reads runs continued past their last
step straight from their logs (live or committed).
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from lld_study.study_summary import (
    DIP_KEYS,
    SEARCH_TAIL,
    SEARCH_WINDOW,
    median_of,
    search_summary,
)
from llds import metrics as keys
from llds.analysis.study_logs import run_rows
from llds.monitor.alarms import scan_alarms
from llds.report.collapse import LLD_WINDOW, collapse_step, first_fall_and_recovery

Study = dict[str, dict[Any, dict[str, Any]]]
"""arm -> seed -> run summary."""


def fmt(v: Any, digits: int = 3) -> str:
    """A cell: `-` for None, floats to `digits` places, anything else as it prints."""
    return "-" if v is None else f"{v:.{digits}f}" if isinstance(v, float) else str(v)


def _line(cells: Sequence[str]) -> str:
    return "| " + " | ".join(cells) + " |"


def _head(head: Sequence[str]) -> list[str]:
    return [_line(head), "|" + "---|" * len(head)]


def probe_cells(summary: dict[str, Any] | None) -> str:
    """`LLD / 1st-order LLD / drag:pull (n=N)` of a one-step probe's summary, or `-`."""
    if not summary or not summary.get("probed"):
        return "-"
    return (
        f"{summary['lld_share']:.2f} / {summary['first_order_lld_share']:.2f} / "
        f"{summary['median_drag_to_pull']:.2f} (n={summary['probed']})"
    )


def _series_median(r: dict[str, Any], key: str) -> float | None:
    vals = [v for v in r["series"][key] if v is not None]
    return statistics.median(vals) if vals else None


def _alarm_cell(r: dict[str, Any]) -> str:
    """`401 (collapse)`: the run's first critical alarm and its kind, or `none`."""
    if not r["first_critical_alarm"]:
        return "none"
    return f"{r['first_critical_alarm']} ({r['first_critical_kind']})"


def _displacement_cell(r: dict[str, Any]) -> str:
    """`108 / -16.28`: steps with `disp_pos` < 0 and the worst `disp_pos` of the run."""
    return f"{fmt(r['lld_steps'])} / {fmt(r['worst_disp_pos'], 2)}"


def table(study: Study, start: float | None) -> str:
    """The main table: EM at every evaluation, collapse, first critical alarm and lead, LLD
    before the collapse, the first 10 steps' KL and clip fraction, displacement and the probe."""
    checkpoints = sorted(
        {s for runs in study.values() for r in runs.values() for s in r["eval_em"]}
    )
    head = ["arm", "seed", "start EM", *[f"EM @ {c}" for c in checkpoints]]
    head += ["collapse step", "first critical alarm", "lead", "disp_pos before", "KL / clip, 1-10"]
    head += ["median disp_pos / frac_pos_fell", "steps with disp_pos < 0 / worst disp_pos"]
    head += ["end probe: LLD / 1st-order LLD / drag:pull"]
    lines = _head(head)
    for arm, runs in study.items():
        for seed, r in sorted(runs.items()):
            b = r.get("before_collapse", {})
            cells = [arm, str(seed), fmt(start)]
            cells += [fmt(r["eval_em"].get(c)) for c in checkpoints]
            cells += [
                fmt(r["collapse_step"]) if r["collapse_step"] else "none",
                _alarm_cell(r),
                fmt(r["lead"]),
                fmt(b.get("disp_pos_median")),
                f"{fmt(r['first10']['approx_kl'], 4)} / {fmt(r['first10']['clip_frac'])}",
                f"{fmt(_series_median(r, keys.DISP_POS))} / "
                f"{fmt(_series_median(r, keys.FRAC_POS_FELL))}",
                _displacement_cell(r),
                probe_cells(r.get("probe_final")),
            ]
            lines.append(_line(cells))
    return "\n".join(lines)


def largest_share(shares: dict[Any, float | None]) -> str:
    """`0.05 (step 250)`: the largest of a run's per-evaluation shares and where it was
    (`0.00` when every evaluation had none; ties go to the earliest evaluation)."""
    known = {int(step): v for step, v in shares.items() if v is not None}
    if not known:
        return "-"
    step = max(known, key=lambda s: (known[s], -s))
    return f"{known[step]:.2f} (step {step})" if known[step] > 0 else "0.00"


def variant_table(study: Study) -> str:
    """The stage-3 table (one row per run): held-out EM at each evaluation, collapse, first
    critical alarm, steps with `disp_pos` < 0, lowest EM, valid searches (last steps / lowest
    window) and the largest share of held-out responses with punctuation runs."""
    head = ["arm", "seed", "EM @ evaluations", "collapse (pre-registered)"]
    head += ["first critical alarm", "steps with disp_pos < 0 / worst", "lowest EM"]
    head += [f"valid searches: last {SEARCH_TAIL} steps / lowest {SEARCH_WINDOW}-step mean"]
    head += ["held-out punctuation runs, largest share"]
    lines = _head(head)
    for arm, runs in study.items():
        for seed, r in sorted(runs.items()):
            ems = [em for _, em in sorted((int(s), em) for s, em in r["eval_em"].items())]
            searches = r.get("searches") or {}
            cells = [
                arm,
                str(seed),
                " / ".join(fmt(em) for em in ems),
                fmt(r["collapse_step"]) if r["collapse_step"] else "none",
                _alarm_cell(r),
                _displacement_cell(r),
                fmt(min((em for em in ems if em is not None), default=None)),
                f"{fmt(searches.get('last'), 2)} / {fmt(searches.get('lowest_window'), 2)}",
                largest_share(r.get("punctuation_runs") or {}),
            ]
            lines.append(_line(cells))
    return "\n".join(lines)


def dip_table(study: Study) -> str:
    """Each run's deepest reward fall with the medians of DIP_KEYS (first 50 steps -> fall)."""
    head = ["arm", "seed", "10-step median reward: peak (step) -> trough (step)"]
    head += [f"{k}: first 50 -> fall" for k in DIP_KEYS]
    lines = _head(head)
    for arm, runs in study.items():
        for seed, r in sorted(runs.items()):
            d = r["dip"]
            cells = [
                arm,
                str(seed),
                f"{d['peak']:.2f} ({d['peak_step']}) -> {d['trough']:.2f} ({d['trough_step']})",
            ]
            cells += [f"{fmt(d['start'][k], 3)} -> {fmt(d['fall'][k], 3)}" for k in DIP_KEYS]
            lines.append(_line(cells))
    return "\n".join(lines)


def share_table(study: Study, name: str, start: float | None) -> str:
    """Per run, one of the `EVAL_SHARES` at each held-out evaluation (`start`: the warm
    start's value)."""
    evals = sorted({s for runs in study.values() for r in runs.values() for s in r[name]})
    lines = _head(["arm", "seed", "start", *[f"@ {s}" for s in evals]])
    for arm, runs in study.items():
        for seed, r in sorted(runs.items()):
            cells = [arm, str(seed), fmt(start, 2), *[fmt(r[name].get(s), 2) for s in evals]]
            lines.append(_line(cells))
    return "\n".join(lines)


def continued_table(out: Path, runs: Sequence[str], since: int) -> str:
    """Runs continued past step `since` (each `out/RUN`, live or committed log): whether each
    was collapsed at `since`, its collapse over the whole run, the first fall and whether it
    recovered, held-out EM at `since` and every 50 steps after (to `since` + 300), valid
    searches, the first critical alarm after `since` (replayed with this checkout's detector)
    and the study's reading of LLD before the collapse."""
    at = range(since, since + 301, 50)
    head = f"| run | last step | collapsed at {since} | collapse step | steps collapsed "
    head += "| first fall | recovered after it "
    head += f"| held-out EM at steps {', '.join(map(str, at))} | valid searches, last 50 steps "
    head += f"| first critical alarm after {since} "
    head += "| median disp_pos / frac_pos_fell, 50 steps before the collapse |"
    lines = [head, "|" + "---|" * 11]
    for run in runs:
        rows = run_rows(out / run)
        steps, reward = [r["step"] for r in rows], [r[keys.REWARD_MEAN] for r in rows]
        collapse = collapse_step(steps, reward)
        k = sum(1 for t in steps if t <= since)
        before = collapse_step(steps[:k], reward[:k]) if k else None
        fall, recovered = first_fall_and_recovery(reward)
        em = {r["step"]: r["eval/em"] for r in rows if "eval/em" in r}
        ems = " / ".join(f"{em[s]:.3f}" if s in em else "-" for s in at)
        searches = search_summary([r.get(keys.VALID_SEARCHES) for r in rows])["last"]
        late = [a.step for a in scan_alarms(rows) if a.severity == "critical" and a.step > since]
        lld = "-"
        if collapse is not None:  # the study's reading of LLD before a collapse
            i = steps.index(collapse)
            window = rows[max(0, i - LLD_WINDOW) : i]
            lld = " / ".join(
                fmt(median_of(window, key), 2) for key in (keys.DISP_POS, keys.FRAC_POS_FELL)
            )
        lines.append(
            f"| {run} | {steps[-1]} | {before or 'no'} | {collapse or 'none'} "
            f"| {0 if collapse is None else steps[-1] - collapse + 1} "
            f"| {'none' if fall is None else steps[fall]} | {'yes' if recovered else 'no'} "
            f"| {ems} | {fmt(searches, 2)} | {late[0] if late else 'none'} | {lld} |"
        )
    return "\n".join(lines)
