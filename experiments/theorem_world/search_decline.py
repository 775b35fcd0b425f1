"""The search-decline signature on every recorded run: where it is present, and when first.

The rule (`llds.report.attribution.search_decline_rule`, threshold `SEARCH_DECLINE`) was added
after one run showed it: the theorem-world study's GRPO+LLDS seed 1, whose reward fell while
it searched less. On that run it is in-sample. Every other run here judges it: does it fire
before collapses of other kinds (it should say "absent" there unless the policy did search
less), and does it fire in runs that never collapsed (a false alarm, as far as a collapse is
the measure)?

For each run: its pre-registered collapse step (`llds.report.collapse`), the rule's verdict at
that step and the other mechanisms whose signatures are present there, the first step at which
the rule would have said "present" had it been asked there (a scan over every step with a full
window and baseline), and the valid searches per rollout early and at the end.

    python experiments/theorem_world/search_decline.py [RUN_DIR ...] [--out FILE.md]

With no RUN_DIR: every committed run log under experiments/ and the theorem-world study's live
runs under runs/theorem_world/study.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # experiments/: the studies' modules
from llds.analysis.study_logs import COMMITTED_LOG
from theorem_world.search_decline_table import judge, table

ROOT = Path(__file__).resolve().parents[2]


def _default_runs() -> list[Path]:
    committed = sorted(p.parent for p in (ROOT / "experiments").rglob(COMMITTED_LOG))
    live = sorted((ROOT / "runs" / "theorem_world" / "study").glob("*/seed*"))
    return committed + [p for p in live if (p / "metrics.jsonl").is_file()]


def _name(run: Path) -> str:
    try:
        return str(run.resolve().relative_to(ROOT))
    except ValueError:
        return str(run)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("runs", nargs="*", type=Path, help="run directories (default: all recorded)")
    p.add_argument("--out", type=Path, default=None, help="also write the table here")
    args = p.parse_args()
    rows = [judge(run, _name(run)) for run in (args.runs or _default_runs())]
    text = table(rows)
    print(text)
    if args.out:
        args.out.write_text(text, encoding="utf-8")


if __name__ == "__main__":
    main()
