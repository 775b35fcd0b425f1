"""The `lld` mechanism's tables (PROTOCOL.md, "The `lld` mechanism" and amendment 3), from the
committed logs only: the pilot's setting, the runs' rows of the corpus manifest, the death
spiral before each GRPO collapse and the Fisher tests of the collapses per arm.

    python experiments/collapse_corpus/lld.py --tables   # lld/pilot.md|json, lld/summary.md|json

Each run's log is `lld/<folder>/runs/<arm>/seed<N>/metrics.jsonl.gz` (the LLDS-strength
driver's layout). A run counts once its log reaches `lld.STEPS` or amendment 5's stop rule holds
on it (`dead_step`); an unfinished one is listed as running and enters no figure.
"""

from __future__ import annotations

import itertools
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from llds.analysis.pooled import pooled_share
from llds.analysis.significance import fisher_p
from llds.analysis.study_logs import run_rows
from llds.report.collapse import MIN_PEAK, SMOOTH, censored, collapse_step, median_window

CAUSE_STEP = 1
"""No cause is injected: the mechanism is emergent, its onset the first step."""
ABRUPT_BEFORE = 30
"""A collapse fewer than this many steps after the onset is abrupt (the organism's rule)."""
TUNE_SEEDS = range(4)
"""Seeds 0-3 are `tune`, 4-7 `judge` (the split fixed in PROTOCOL.md)."""
WINDOWS = {"50 before": 50, "20 before": 20}
"""The death spiral's windows: the 50 and the 20 steps before the collapse step."""
MEANS = ("lld/logp_correct", "policy/grad_norm", "policy/entropy")
"""Signals averaged over a window (the pooled LLD share is pooled over responses instead)."""
GRPO = "lam0"
DEAD_STEPS = 50
"""Amendment 5: a run stops after this many consecutive steps of reward at or below..."""
DEAD_SHARE = 0.25
"""...this share of its running peak (the collapse rule's: the highest 10-step median so far)."""


@dataclass(frozen=True)
class LLDRun:
    """One finished or running `lld` run, read with the pre-registered collapse rule."""

    folder: str
    """the run's folder, relative to the collapse corpus (the manifest's `run`)"""
    arm: str
    seed: int
    last_step: int
    finished: bool
    collapse: int | None
    censored: bool
    abrupt: bool
    peak: float
    final: float
    stopped: int | None = None
    """the step at which amendment 5's stop rule held on a run it stopped (None: it did not
    hold, or the run had reached its last step before the rule was made)"""

    @property
    def collapsed(self) -> bool:
        return self.finished and self.collapse is not None and not self.censored


def dead_step(steps: Sequence[int], reward: Sequence[float]) -> int | None:
    """Amendment 5's stop rule, read step by step as a run logs: the first step at which the
    reward has been at or below `DEAD_SHARE` of its running peak (the highest 10-step median so
    far, at least the collapse rule's 0.2) in each of the last `DEAD_STEPS` steps; None if it
    never holds. It looks at no step after the one it returns."""
    peak, low = 0.0, 0
    for i, value in enumerate(reward):
        smooth = median_window(reward, i, SMOOTH)
        assert smooth is not None, "a reward series has no missing values"
        peak = max(peak, smooth)
        low = low + 1 if peak >= MIN_PEAK and value <= DEAD_SHARE * peak else 0
        if low >= DEAD_STEPS:
            return steps[i]
    return None


def read_run(corpus: Path, run_dir: Path, arm: str, seed: int, steps: int) -> LLDRun:
    """`run_dir`'s committed log under the collapse rule (censored: fewer than 30 logged steps
    after the collapse; abrupt: within `ABRUPT_BEFORE` steps of the onset)."""
    rows = run_rows(run_dir)
    at = [int(r["step"]) for r in rows]
    reward = [float(r["reward/mean"]) for r in rows]
    start = collapse_step(at, reward)
    smooth = [v for i in range(len(reward)) if (v := median_window(reward, i, 10)) is not None]
    stopped = dead_step(at, reward) if at and at[-1] < steps else None  # ran to the end: None
    return LLDRun(
        folder=run_dir.relative_to(corpus).as_posix(),
        arm=arm,
        seed=seed,
        last_step=at[-1] if at else 0,
        finished=bool(at) and (at[-1] >= steps or stopped is not None),
        collapse=start,
        censored=censored(at, start),
        abrupt=start is not None and start - CAUSE_STEP < ABRUPT_BEFORE,
        peak=max(smooth, default=0.0),
        final=smooth[-1] if smooth else 0.0,
        stopped=stopped,
    )


def read_runs(corpus: Path, results: Path, steps: int) -> list[LLDRun]:
    """Every run under `results/runs/<arm>/seed<N>/`, in arm then seed order."""
    out = []
    root = results / "runs"
    for arm_dir in sorted(p for p in root.iterdir() if p.is_dir()) if root.is_dir() else []:
        for run_dir in sorted(arm_dir.glob("seed*"), key=lambda p: int(p.name[4:])):
            out.append(read_run(corpus, run_dir, arm_dir.name, int(run_dir.name[4:]), steps))
    return out


# ------------------------------------------------------------------ the pilot's choice
def _rule(outcomes: Sequence[tuple[bool, bool]], order: Sequence[str]) -> tuple[str, str]:
    """The protocol's rule on each setting's `(collapsed in every seed, in one)`, in `order`."""
    for rule, said in ((0, "every pilot seed"), (1, "one pilot seed")):
        for name, hit in zip(order, outcomes, strict=True):
            if hit[rule]:
                return name, f"GRPO collapsed in {said} at ({name})"
    return order[-1], "no setting of the pilot makes GRPO collapse"


def _possible(runs: Sequence[LLDRun]) -> set[tuple[bool, bool]]:
    """Every `(collapsed in every seed, in one)` a setting's runs can still end with: one for
    finished runs, each way an unfinished run can end otherwise, all three with no run yet."""
    if not runs:
        return {(False, False), (False, True), (True, True)}
    known = [r.collapsed for r in runs if r.finished]
    open_ = sum(not r.finished for r in runs)
    ends = {tuple(known) + (True,) * k + (False,) * (open_ - k) for k in range(open_ + 1)}
    return {(all(h), any(h)) for h in ends}


def setting_choice(pilot: Mapping[str, Sequence[LLDRun]], order: Sequence[str]) -> dict[str, Any]:
    """The protocol's rule over the pilot's settings in `order`: the first whose GRPO collapses
    in every pilot seed, else the first where it collapses in one; with none, setting `order[-1]`
    and "no setting of the pilot makes GRPO collapse". While runs are unfinished it is decided
    only if every way they can end gives the same setting (then it says so), else undecided."""
    options = [sorted(_possible(pilot.get(name, []))) for name in order]
    choices = {_rule(combo, order) for combo in itertools.product(*options)}
    if len(choices) == 1:
        name, why = choices.pop()
        return {"setting": name, "why": why}
    open_ = [n for n, o in zip(order, options, strict=True) if len(o) > 1]
    settings = {name for name, _ in choices}
    if len(settings) > 1:
        return {"setting": None, "why": f"setting ({open_[0]}) not finished"}
    name = settings.pop()
    return {
        "setting": name,
        "why": (
            f"every way the unfinished runs of {', '.join(f'({n})' for n in open_)} can end "
            f"gives ({name}); the pilot's table reports how they do end"
        ),
    }


# ------------------------------------------------------------------ the manifest
def manifest_rows(runs: Sequence[LLDRun], mechanism: Mapping[str, str]) -> list[dict[str, str]]:
    """The finished runs' manifest rows (`corpus_collect.MANIFEST_COLUMNS`)."""
    rows = []
    for r in runs:
        if not r.finished:
            continue
        rows.append(
            {
                "run": r.folder,
                "mechanism": mechanism[r.arm],
                "seed": str(r.seed),
                "split": "tune" if r.seed in TUNE_SEEDS else "judge",
                "cause_step": str(CAUSE_STEP),
                "collapse_step": str(r.collapse) if r.collapsed else "",
                "arm": r.arm,
                "censored": "yes" if r.censored else "no",
                "abrupt": "yes" if r.abrupt else "no",
                "last_step": str(r.last_step),
            }
        )
    return rows


# ------------------------------------------------------------------ the death spiral
def window_signals(rows: Sequence[Mapping[str, Any]], lo: int, hi: int) -> dict[str, Any]:
    """Steps lo..hi of one or several runs' rows: the LLD share pooled over responses, and each
    of `MEANS` averaged over the steps that log it."""
    inside = [r for r in rows if lo <= int(r["step"]) <= hi]
    out: dict[str, Any] = {"lld_share_pooled": pooled_share(inside)}
    for key in MEANS:
        vals = [float(r[key]) for r in inside if isinstance(r.get(key), int | float)]
        out[key] = statistics.fmean(vals) if vals else None
    return out


def death_spiral(corpus: Path, runs: Sequence[LLDRun]) -> list[dict[str, Any]]:
    """For each GRPO collapse, each window's signals in the run, in its seed's LLDS arms and in
    the finished runs that did not collapse (pooled together), over the same steps."""
    finished = [r for r in runs if r.finished]
    calm = [row for r in finished if not r.collapsed for row in run_rows(corpus / r.folder)]
    out = []
    for r in finished:
        if r.arm != GRPO or not r.collapsed or r.collapse is None:
            continue
        own = run_rows(corpus / r.folder)
        twins = [
            row
            for t in finished
            if t.seed == r.seed and t.arm != GRPO
            for row in run_rows(corpus / t.folder)
        ]
        entry: dict[str, Any] = {"run": r.folder, "seed": r.seed, "collapse": r.collapse}
        for name, span in WINDOWS.items():
            lo, hi = r.collapse - span, r.collapse - 1
            entry[name] = {
                "grpo": window_signals(own, lo, hi),
                "llds_arms_same_seed": window_signals(twins, lo, hi) if twins else None,
                "runs_not_collapsed": window_signals(calm, lo, hi) if calm else None,
            }
        out.append(entry)
    return out


def collapses_per_arm(runs: Sequence[LLDRun], arms: Sequence[str]) -> dict[str, dict[str, Any]]:
    """Per arm, finished runs and collapses; each LLDS arm against GRPO by Fisher's exact test
    (two-sided), and whether "LLDS prevents the collapse" holds (GRPO collapsed in at least half
    of its runs, the LLDS arm in fewer, p < 0.05)."""
    table: dict[str, dict[str, Any]] = {}
    for arm in arms:
        done = [r for r in runs if r.arm == arm and r.finished]
        table[arm] = {"runs": len(done), "collapsed": sum(r.collapsed for r in done)}
    g = table.get(GRPO, {"runs": 0, "collapsed": 0})
    for arm in arms:
        if arm == GRPO:
            continue
        a = table[arm]
        p = fisher_p(g["collapsed"], g["runs"], a["collapsed"], a["runs"])
        a["fisher_p_vs_grpo"] = p
        a["prevents"] = bool(
            g["runs"]
            and 2 * g["collapsed"] >= g["runs"]
            and a["collapsed"] < g["collapsed"]
            and p is not None
            and p < 0.05
        )
    return table


# ------------------------------------------------------------------ the pages
def _num(x: float | None) -> str:
    return "-" if x is None else f"{x:.3g}"


def runs_markdown(title: str, runs: Sequence[LLDRun]) -> list[str]:
    lines = [
        f"## {title}",
        "",
        "| run | arm | seed | last step | collapse step | censored | abrupt | peak | final |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in runs:
        state = str(r.collapse) if r.collapse is not None else "-"
        if not r.finished:
            state += f" (running: logged to step {r.last_step})"
        elif r.stopped is not None:
            state += f" (stopped by amendment 5 at step {r.stopped})"
        lines.append(
            f"| {r.folder} | {r.arm} | {r.seed} | {r.last_step} | {state} | "
            f"{'yes' if r.censored else 'no'} | {'yes' if r.abrupt else 'no'} | "
            f"{r.peak:.3f} | {r.final:.3f} |"
        )
    return lines


def pilot_markdown(pilot: Mapping[str, Sequence[LLDRun]], choice: Mapping[str, Any]) -> str:
    lines = [
        "# The `lld` pilot",
        "",
        "Written by `lld.py --tables` from the committed logs; do not edit.",
        "",
        f"Setting chosen: **{choice['setting'] or 'not yet'}** ({choice['why']}).",
    ]
    for name, runs in pilot.items():
        lines += ["", *runs_markdown(f"Setting ({name})", runs)]
    return "\n".join(lines) + "\n"


def summary_markdown(
    runs: Sequence[LLDRun], table: Mapping[str, Mapping[str, Any]], spiral: Sequence[Mapping]
) -> str:
    lines = [
        "# The `lld` arms",
        "",
        "Written by `lld.py --tables` from the committed logs; do not edit.",
        "",
        "| arm | finished runs | collapsed | Fisher p vs GRPO | LLDS prevents the collapse |",
        "|---|---|---|---|---|",
    ]
    for arm, a in table.items():
        p = a.get("fisher_p_vs_grpo")
        prevents = "-" if arm == GRPO else ("yes" if a["prevents"] else "no")
        lines.append(f"| {arm} | {a['runs']} | {a['collapsed']} | {_num(p)} | {prevents} |")
    keys = ("lld_share_pooled", *MEANS)
    lines += [
        "",
        "The death spiral: each GRPO collapse's signals in the windows before it; in brackets "
        "its seed's LLDS arms, then the runs that did not collapse, over the same steps.",
        "",
        "| run | collapse | window | " + " | ".join(keys) + " |",
        "|---|---|---|" + "---|" * len(keys),
    ]
    for e in spiral:
        for name in WINDOWS:
            w = e[name]
            cells = []
            for k in keys:
                twin = w["llds_arms_same_seed"] or {}
                calm = w["runs_not_collapsed"] or {}
                cells.append(f"{_num(w['grpo'][k])} ({_num(twin.get(k))}; {_num(calm.get(k))})")
            lines.append(f"| {e['run']} | {e['collapse']} | {name} | " + " | ".join(cells) + " |")
    if not spiral:
        lines.append("| no GRPO collapse among the finished runs | | | " + "| " * len(keys))
    lines += ["", *runs_markdown("Every run", runs)]
    return "\n".join(lines) + "\n"


def as_json(runs: Sequence[LLDRun]) -> list[dict[str, Any]]:
    return [{**asdict(r), "collapsed": r.collapsed} for r in runs]
