"""The LLDS-strength study's tables and pre-registered answers (PROTOCOL.md) from the committed
per-step logs alone: `results/runs/ARM/seedN/metrics.jsonl.gz` -> `results/study.{md,json}`.

    python experiments/llds_strength/tables.py
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # experiments/: the studies' modules
from llds.io import write_json
from llds_strength.strength_study import load_logs, study_summary

HERE = Path(__file__).resolve().parent


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--results", default=str(HERE / "results"), help="logs under RESULTS/runs/")
    args = p.parse_args()
    results = Path(args.results)
    summary = study_summary(load_logs(results / "runs"))
    write_json(results / "study.json", summary["json"])
    (results / "study.md").write_text(summary["markdown"], encoding="utf-8")
    print(summary["markdown"])


if __name__ == "__main__":
    main()
