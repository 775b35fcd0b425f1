"""Can a threshold on one logged signal warn of a collapse in time, even when tuned on the runs
it is judged on? The in-sample ceiling of single-signal alarms over the LLD study's runs.

For every signal the trainer logs that the paper or common sense links to collapse (the
displacement of pushed-up responses, the share that fell, entropy, KL, clip fraction, the
reward's fall from its peak, ...), a causal rolling median over the last `window` steps, and an
alarm that fires the first time it crosses a threshold. Every threshold is tried on all runs at
once, so the best row per signal is what that signal could do at most on these runs: if no
threshold meets the goal here, no alarm on that signal can meet it out of sample either
(`lld_study.ceiling`).

The goal is the LLD study's: a median lead of at least 20 steps over the runs with an event, and
no alarm in a run without one. A run's event is the earlier of its collapse (the study's
pre-registered reward definition) and the first 50-step evaluation from which held-out EM stays
at most half the warm start's to the end ("fell for good"); a run with an event that the alarm
misses, or only sees at or after the event, counts against the median.

Reads the committed study logs: `python experiments/lld_study/alarm_ceiling.py` (seconds; no
training).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # experiments/: the studies' modules
from lld_study.ceiling import (
    GOAL_LEAD,
    SIGNALS,
    Run,
    best_rows,
    event_step,
    lead_text,
    rule,
    sweep,
)
from llds.analysis.study_logs import arm_dir_name, read_committed_metrics

RESULTS = Path(__file__).resolve().parent / "results"
ORGANISM_START_EM = 0.558
"""The demo warm start's held-out EM on the machine that ran the organism study (its evaluation
file is not part of the committed results; no organism run came near half of it: lowest 0.483)."""


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
                    path = root / arm_dir_name(arm) / f"seed{seed}" / "metrics.jsonl.gz"
                    rows = read_committed_metrics(path)
                    runs.append(Run(f"{world} {arm} {seed}", rows, event_step(summary, start)))
    return runs


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
                else f"{rule(signal, clean.threshold)} / {clean.in_time} / "
                f"{lead_text(clean.median_lead)}"
            )
            cell_b = "unreachable" if timely is None else f"{timely.false_alarms}"
            print(f"| {signal.name} | {window} | {cell_a} | {cell_b} |")


if __name__ == "__main__":
    main()
