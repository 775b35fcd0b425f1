"""How long did each recorded collapse last? The LLD study's collapses by duration (post hoc).

The study's pre-registered collapse (`llds.report.collapse.collapse_step`) is the first step from
which the 10-step median training reward stays at or below half of its running peak to the end of
the run. A run whose reward drops in its last few steps meets it as fully as one that sat at zero
for hundreds of steps. This script reads every committed run of the study and prints, per run,
the collapse step and how many steps the run spent collapsed, then counts the collapses per
world and arm under the pre-registered definition and under minimum durations of 20 and 50
steps. Descriptive and post hoc: it changes no verdict of the study, whose rules were fixed
before its runs; a collapse inside a run's last steps may have recovered in a longer run.

    python experiments/lld_study/collapse_duration.py [--results experiments/lld_study/results]
"""

from __future__ import annotations

import argparse
import sys
from collections import defaultdict
from pathlib import Path

from llds import metrics as keys
from llds.analysis.study_logs import read_committed_metrics, run_logs, world_and_arm
from llds.report.collapse import SMOOTH, collapsed_steps, median_window

DURATIONS = (20, 50)
RESULTS = Path(__file__).resolve().parent / "results"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--results", type=Path, default=RESULTS)
    args = ap.parse_args()

    command = f"python experiments/lld_study/collapse_duration.py {' '.join(sys.argv[1:])}"
    print(f"command: `{command.strip()}`")
    print()
    head = ["world", "arm", "seed", "steps", "collapse step", "steps collapsed"]
    head += ["end reward (10-step median)"]
    print("| " + " | ".join(head) + " |")
    print("|---|---|---|---|---|---|---|")
    counts: dict[tuple[str, str], list[int]] = defaultdict(lambda: [0, 0, *(0 for _ in DURATIONS)])
    for log in run_logs(args.results):
        run, rows = log.parent, read_committed_metrics(log)
        steps = [r["step"] for r in rows]
        reward = [r[keys.REWARD_MEAN] for r in rows]
        start, length = collapsed_steps(steps, reward)
        end = median_window(reward, len(reward) - 1, SMOOTH)
        world, arm, seed = world_and_arm(args.results, run)
        print(
            f"| {world} | {arm} | {seed} | {steps[-1]} | {start if start else 'none'} "
            f"| {length} | {end:.3f} |"
        )
        c = counts[(world, arm)]
        c[0] += 1
        c[1] += start is not None
        for k, d in enumerate(DURATIONS):
            c[2 + k] += length >= d
    print()
    head = ["world", "arm", "runs", "collapses (pre-registered)"]
    head += [f"lasting >= {d} steps" for d in DURATIONS]
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for (world, arm), c in sorted(counts.items()):
        print(f"| {world} | {arm} | " + " | ".join(str(x) for x in c) + " |")


if __name__ == "__main__":
    main()
