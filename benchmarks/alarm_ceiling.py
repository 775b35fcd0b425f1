"""Can a threshold on one logged signal warn of a collapse in time, even when tuned on the runs
it is judged on? The in-sample ceiling of single-signal alarms over the LLD study's runs.

For every signal the trainer logs that the paper or common sense links to collapse (the
displacement of pushed-up responses, the share that fell, entropy, KL, clip fraction, the
reward's fall from its peak, ...), a causal rolling median over the last `window` steps, and an
alarm that fires the first time it crosses a threshold. Every threshold is tried on all runs at
once, so the best row per signal is what that signal could do at most on these runs: if no
threshold meets the goal here, no alarm on that signal can meet it out of sample either.

The goal is the LLD study's: a median lead of at least 20 steps over the runs with an event, and
no alarm in a run without one. A run's event is the earlier of its collapse (the study's
pre-registered reward definition) and the first 50-step evaluation from which held-out EM stays
at most half the warm start's to the end ("fell for good"); a run with an event that the alarm
misses, or only sees at or after the event, counts against the median.

Reads the committed study logs: `python benchmarks/alarm_ceiling.py` (seconds; no training).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from _common import read_committed_metrics

RESULTS = Path(__file__).parent / "lld_study" / "results"
ORGANISM_START_EM = 0.558
"""The demo warm start's held-out EM on the machine that ran the organism study (its evaluation
file is not part of the committed results; no organism run came near half of it: lowest 0.483)."""

GOAL_LEAD = 20


@dataclass(frozen=True)
class Signal:
    name: str
    read: Callable[[dict], float | None]
    high_is_bad: bool


def _key(k: str) -> Callable[[dict], float | None]:
    return lambda row: row.get(k)


def _clip(row: dict) -> float | None:
    lo, hi = row.get("policy/clip_frac_low"), row.get("policy/clip_frac_high")
    return None if lo is None or hi is None else lo + hi


SIGNALS = (
    Signal("lld/disp_pos", _key("lld/disp_pos"), high_is_bad=False),
    Signal("lld/frac_pos_fell", _key("lld/frac_pos_fell"), high_is_bad=True),
    Signal("lld/disp_correct", _key("lld/disp_correct"), high_is_bad=False),
    Signal("lld/logp_correct", _key("lld/logp_correct"), high_is_bad=False),
    Signal("policy/entropy", _key("policy/entropy"), high_is_bad=True),
    Signal("policy/approx_kl", _key("policy/approx_kl"), high_is_bad=True),
    Signal("policy/kl (to the start)", _key("policy/kl"), high_is_bad=True),
    Signal("policy/clip_frac (low + high)", _clip, high_is_bad=True),
    Signal("policy/ratio_max", _key("policy/ratio_max"), high_is_bad=True),
    Signal("policy/grad_norm", _key("policy/grad_norm"), high_is_bad=True),
    Signal("rollout/valid_searches", _key("rollout/valid_searches"), high_is_bad=False),
    Signal("reward/mean", _key("reward/mean"), high_is_bad=False),
)


@dataclass(frozen=True)
class Run:
    label: str
    rows: list[dict]
    event: int | None  # the first step of the collapse or of the fall for good


def fell_for_good(eval_em: dict[str, float], start: float) -> int | None:
    """The first evaluation step from which held-out EM stays at most half the start's."""
    steps = sorted(int(s) for s in eval_em)
    first = None
    for s in steps:
        low = eval_em[str(s)] <= start / 2
        first = None if not low else (s if first is None else first)
    return first


def event_step(summary: dict, start: float) -> int | None:
    marks = [summary.get("collapse_step"), fell_for_good(summary["eval_em"], start)]
    marks = [m for m in marks if m is not None]
    return min(marks) if marks else None


def finer_readings(results: Path, world: str) -> dict[str, dict[str, float]]:
    """Held-out EM every 10 steps where the held-out-drift reruns recorded it (the first 100
    steps of the `long-chains` runs), per `ARM/SEED`; empty for the other worlds."""
    path = results / "heldout-drift" / world / "heldout_drift.json"
    if not path.is_file():
        return {}
    runs = json.loads(path.read_text())["runs"]
    return {key: {str(r["step"]): r["em"] for r in run["rows"]} for key, run in runs.items()}


def load_runs(results: Path = RESULTS, *, fine: bool = False) -> list[Run]:
    """The 27 runs of the organism (tune and judge seeds), `similar-names` and `long-chains`.
    `fine`: the fall for good is read from the 10-step readings as well, where they exist."""
    worlds = [
        ("organism", results, ("lld_study_tune.json", "lld_study_judge.json"), ORGANISM_START_EM),
        ("similar-names", results / "similar-names", ("lld_study_judge.json",), None),
        ("long-chains", results / "long-chains", ("lld_study_judge.json",), None),
    ]
    runs = []
    for world, root, files, start in worlds:
        if start is None:
            start = json.loads((root / "warm" / "step_000000.json").read_text())["overall"]["em"]
        finer = finer_readings(results, world) if fine else {}
        for file in files:
            for arm, seeds in json.loads((root / file).read_text()).items():
                for seed, summary in seeds.items():
                    extra = finer.get(f"{arm}/{seed}", {})
                    summary = {**summary, "eval_em": {**summary["eval_em"], **extra}}
                    path = root / arm.replace("+", "_") / f"seed{seed}" / "metrics.jsonl.gz"
                    rows = read_committed_metrics(path)
                    runs.append(Run(f"{world} {arm} {seed}", rows, event_step(summary, start)))
    return runs


def rolling_median(values: Sequence[float | None], window: int) -> np.ndarray:
    """Causal: entry t is the median of the finite values among steps t-window+1..t (NaN until
    `window` steps exist or when none is finite)."""
    x = np.array([np.nan if v is None else float(v) for v in values])
    out = np.full(len(x), np.nan)
    for t in range(window - 1, len(x)):
        part = x[t - window + 1 : t + 1]
        part = part[np.isfinite(part)]
        if len(part):
            out[t] = np.median(part)
    return out


def badness(run: Run, signal: Signal, window: int) -> tuple[np.ndarray, np.ndarray]:
    """(steps, running worst of the rolling median so far, oriented so that higher is worse)."""
    steps = np.array([int(r["step"]) for r in run.rows])
    med = rolling_median([signal.read(r) for r in run.rows], window)
    if signal.name == "reward/mean":  # the fall from the running peak of the rolling median
        peak = np.fmax.accumulate(np.where(np.isfinite(med), med, -np.inf))
        med = np.where(np.isfinite(med) & (peak > 0), peak - med, np.nan)
    elif not signal.high_is_bad:
        med = -med
    worst = np.fmax.accumulate(np.where(np.isfinite(med), med, -np.inf))
    return steps, worst


def first_fire(steps: np.ndarray, worst: np.ndarray, threshold: float) -> int | None:
    i = int(np.searchsorted(worst, threshold, side="left"))  # worst is non-decreasing
    return int(steps[i]) if i < len(steps) else None


@dataclass(frozen=True)
class Outcome:
    threshold: float
    false_alarms: int
    leads: list[float]  # per event run: event - fire; -inf when missed

    @property
    def median_lead(self) -> float:
        return statistics.median(self.leads) if self.leads else math.nan

    @property
    def in_time(self) -> int:
        return sum(lead >= GOAL_LEAD for lead in self.leads)


def sweep(runs: Sequence[Run], signal: Signal, window: int) -> list[Outcome]:
    curves = [badness(r, signal, window) for r in runs]
    finite = np.concatenate([w[np.isfinite(w)] for _, w in curves])
    out = []
    for threshold in np.unique(finite):
        fires = [first_fire(s, w, threshold) for s, w in curves]
        pairs = list(zip(runs, fires, strict=True))
        false_alarms = sum(f is not None for r, f in pairs if r.event is None)
        leads = [
            -math.inf if f is None else float(r.event - f) for r, f in pairs if r.event is not None
        ]
        out.append(Outcome(float(threshold), false_alarms, leads))
    return out


def best_rows(outcomes: Sequence[Outcome]) -> tuple[Outcome | None, Outcome | None]:
    """(the best threshold without a false alarm, the one with the fewest false alarms among
    those whose median lead meets the goal)."""
    clean = [o for o in outcomes if o.false_alarms == 0]
    best_clean = max(clean, key=lambda o: (o.in_time, o.median_lead), default=None)
    timely = [o for o in outcomes if o.median_lead >= GOAL_LEAD]
    fewest = min(timely, key=lambda o: (o.false_alarms, -o.median_lead), default=None)
    return best_clean, fewest


def _rule(signal: Signal, threshold: float) -> str:
    """The alarm's condition in the signal's own units."""
    if signal.name == "reward/mean":
        return f"peak - now >= {threshold:.3g}"
    return f">= {threshold:.3g}" if signal.high_is_bad else f"<= {-threshold:.3g}"


def _lead(x: float) -> str:
    return "missed" if x == -math.inf else f"{x:+.0f}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--windows", type=int, nargs="+", default=[5, 20])
    ap.add_argument(
        "--fine",
        action="store_true",
        help="date the fall for good with the 10-step held-out readings where they exist "
        "(long-chains, steps 10-100) instead of the 50-step evaluations alone",
    )
    args = ap.parse_args()
    runs = load_runs(fine=args.fine)
    events = [r for r in runs if r.event is not None]
    print(f"{len(runs)} runs, {len(events)} with an event:")
    for r in events:
        print(f"  {r.label}: event at step {r.event}")
    print()
    print(
        "| signal | window | no false alarm: threshold / runs warned >= 20 steps ahead / "
        f"median lead (of {len(events)}) | median lead >= {GOAL_LEAD}: fewest false alarms "
        f"(of {len(runs) - len(events)}) |"
    )
    print("|---|---|---|---|")
    for signal in SIGNALS:
        for window in args.windows:
            clean, timely = best_rows(sweep(runs, signal, window))
            cell_a = (
                "never fires cleanly"
                if clean is None
                else f"{_rule(signal, clean.threshold)} / {clean.in_time} / "
                f"{_lead(clean.median_lead)}"
            )
            cell_b = "unreachable" if timely is None else f"{timely.false_alarms}"
            print(f"| {signal.name} | {window} | {cell_a} | {cell_b} |")


if __name__ == "__main__":
    main()
