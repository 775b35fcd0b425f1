"""Set the displacement detector's thresholds on the LLD study's `tune` runs (never on `judge`).

Replays every tune run's metrics through the alarm monitor for each point of a small grid of
`PhaseConfig` settings and scores it: false critical alarms (a critical alarm in a run that did
not collapse, or more than 100 steps before its collapse), then the median lead over collapsed
runs (collapse step minus first critical alarm). The rule, fixed before the runs: among the
settings with the fewest false alarms, the largest median lead; ties go to the a-priori defaults
(the paper's definition: median displacement below 0 and a majority of the pushed-up responses
falling, over 20 steps, for 5 steps). Prints the table and the chosen setting; the chosen
values are then written into `PhaseConfig`'s defaults by hand and committed before `--set
judge` runs.

    python experiments/lld_study/tune_detector.py --out runs/lld-study
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import statistics
from pathlib import Path
from typing import Any

from llds import metrics as keys
from llds.monitor.alarms import AlarmConfig, scan_alarms
from llds.monitor.phases import PhaseConfig
from llds.report.collapse import collapse_step
from llds.runs.tracking import read_metrics
from study import ARMS, SEED_SETS, run_dir

GRID: dict[str, tuple[Any, ...]] = {
    "disp_window": (10, 20, 30),
    "disp_fall": (0.0, 0.05, 0.1),
    "pos_fell_frac": (0.5, 0.6),
    "decay_steps": (3, 5, 10),
}
EARLY = 100  # an alarm more than this many steps before the collapse counts as false


def score(runs: list[tuple[list[dict[str, Any]], int | None]], phase: PhaseConfig) -> dict:
    """False critical alarms and leads of the detector with `phase` over `(rows, collapse)`."""
    false, leads = 0, []
    for rows, collapse in runs:
        critical = [
            a.step for a in scan_alarms(rows, AlarmConfig(phase=phase)) if a.severity == "critical"
        ]
        first = critical[0] if critical else None
        if collapse is None:
            false += first is not None
        elif first is not None and collapse - first > EARLY:
            false += 1
        else:
            leads.append(collapse - first if first is not None else 0)
    return {
        "false": false,
        "median_lead": statistics.median(leads) if leads else None,
        "leads": leads,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=Path("runs/lld-study"))
    args = ap.parse_args()
    runs = []
    for arm in ARMS:
        for seed in SEED_SETS["tune"]:
            path = run_dir(args.out, arm, seed)
            rows = read_metrics(path) if (path / "metrics.jsonl").is_file() else []
            if not rows:
                continue
            steps = [r["step"] for r in rows]
            collapse = collapse_step(steps, [r[keys.REWARD_MEAN] for r in rows])
            runs.append((rows, collapse))
            print(f"{arm} seed {seed}: {steps[-1]} steps, collapse {collapse}")
    if not runs:
        raise SystemExit(f"no tune runs under {args.out}")
    default = PhaseConfig()
    results = []
    for values in itertools.product(*GRID.values()):
        phase = dataclasses.replace(default, **dict(zip(GRID, values, strict=True)))
        results.append((dict(zip(GRID, values, strict=True)), score(runs, phase)))
    a_priori = {k: getattr(default, k) for k in GRID}

    def key(item: tuple[dict, dict]) -> tuple:
        setting, s = item
        lead = s["median_lead"] if s["median_lead"] is not None else float("-inf")
        return (s["false"], -lead, setting != a_priori)

    results.sort(key=key)
    print("\n| " + " | ".join(GRID) + " | false critical | median lead | leads |")
    print("|" + "---|" * (len(GRID) + 3))
    for setting, s in results[:15]:
        cells = [str(v) for v in setting.values()]
        print(f"| {' | '.join(cells)} | {s['false']} | {s['median_lead']} | {s['leads']} |")
    print(f"\nchosen: {results[0][0]}  (a priori: {a_priori})")


if __name__ == "__main__":
    main()
