"""Every arm of one LLD-study factor side by side: held-out EM at the last evaluation, the change
against GRPO on the same seed, collapses, and steps with `disp_pos` < 0, per seed and median.

The study's curves (`run.py`) show how each run moved; this answers the arm question of the
study's stage 3 at a glance ("does a variant protect held-out EM, and does it change the
displacement?") from the per-run summaries the study already wrote, so it trains nothing:

    python experiments/lld_study/compare_arms.py \\
        experiments/lld_study/results/similar-names/lld_study_judge.json \\
        --figure docs/results/lld-arms-similar-names.png --start-em 0.708

Prints one markdown table; `--figure` also draws it (one dot per seed, a bar at the median).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # experiments/: the studies' modules
from lld_study.arm_table import arm_rows, figure, markdown


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("summary", type=Path, help="a factor's lld_study_judge.json")
    ap.add_argument("--figure", type=Path, help="write the figure here (PNG)")
    ap.add_argument("--start-em", type=float, help="the warm start's held-out EM, drawn as a line")
    args = ap.parse_args()
    study = json.loads(args.summary.read_text())
    rows = arm_rows(study)
    print(markdown(rows))
    if args.figure:
        figure(rows, args.figure, args.start_em)
        print(f"\nfigure: {args.figure}")


if __name__ == "__main__":
    main()
