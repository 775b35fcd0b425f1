"""The LLDS-strength study's confirmation (CONFIRMATION.md): GRPO against the lambda the
dose-response picked (rule 5), 300 steps, seeds in pairs, resumable in the background; the logs
go to `results/confirm_b/runs/` and the tables to `results/confirm_b/summary.{md,json}`.

    python experiments/llds_strength/confirm.py --parallel 2      # seeds 1-6 of part B
    python experiments/llds_strength/confirm.py --seeds 7 8       # more seeds, same way
    python experiments/llds_strength/confirm.py --dry-run         # each run's config
    python experiments/llds_strength/confirm.py --collect         # copy the logs, tables
    python experiments/llds_strength/confirm.py --park            # also archive unfinished runs
    python experiments/llds_strength/confirm.py --part a ...      # part A (results/confirm/)

Two parts (CONFIRMATION.md, amendment 1), each from its own warm start and never pooled: part A
from the theorem study's (`runs/theorem_world`, known by its held-out EM 0.750, which only the
CPUs it was trained on rebuild), part B from the committed
`../theorem_world/results/warm_start_3/model.tar.gz` (`runs/theorem_world_b`, known by the
SHA-256 its report records), which every machine unpacks.

A run takes longer than one machine may last: `--park` archives each unfinished run's newest
checkpoint into `RESULTS/parked/` to commit, and a later call whose work folder is gone
resumes from it (run.py: `park`, `unpark`); `RESULTS/runs/ARM/seedN/machines.jsonl` says which
machine each call queued it on.

The lambda is read from `results/study.json` (`answers.confirmation_lambda`): nothing starts
until the dose-response is complete and its rule has named one.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # experiments/: the studies' modules
from llds.io import write_json
from llds_strength.strength_confirmation import (
    BASE_ARM,
    SEEDS,
    STEPS,
    arm_for,
    confirmation_summary,
    load_logs,
)
from llds_strength.strength_study import WARM_EM
from run import HERE, WARM_EVAL, WARM_START_ARCHIVE, driver_arguments, execute, ordered_runs, plan

SPEED = ("optim.micro_batch_tokens=4096", "optim.logprob_micro_batch_tokens=16384")
"""CONFIRMATION.md: micro-batch budgets that change float rounding only, 1.13x faster here."""


WARM_START_B = HERE.parent / "theorem_world" / "results" / "warm_start_3"
PARTS = {
    "a": {
        "theorem": "runs/theorem_world",
        "work": "runs/llds_strength/confirm",
        "results": HERE / "results" / "confirm",
        "warm_archive": WARM_START_ARCHIVE,
        "warm_report": None,
        "label": "part A (the theorem study's warm start)",
    },
    "b": {
        "theorem": "runs/theorem_world_b",
        "work": "runs/llds_strength/confirm_b",
        "results": HERE / "results" / "confirm_b",
        "warm_archive": WARM_START_B / "model.tar.gz",
        "warm_report": WARM_START_B / "report.json",
        "label": "part B (warm start B, ../theorem_world/results/warm_start_3)",
    },
}
"""Each part's defaults (CONFIRMATION.md, amendment 1): its warm start and where its runs go."""


def chosen_arm(study: Path) -> str:
    """The arm rule 5 picked, from the dose-response's tables (`tables.py` writes them)."""
    try:
        lam = json.loads(study.read_text(encoding="utf-8"))["answers"]["confirmation_lambda"]
    except (OSError, ValueError, KeyError) as e:
        raise SystemExit(f"{study}: no answers.confirmation_lambda ({e}); run tables.py") from e
    if lam is None:
        raise SystemExit(
            f"{study}: answers.confirmation_lambda is null: the dose-response is not complete "
            "(PROTOCOL.md rule 5); the confirmation waits for it"
        )
    return arm_for(float(lam))


def write_tables(results: Path, arm: str, part: str) -> None:
    """The part's tables from its logs, with its warm start's step-0 held-out EM: the theorem
    study's for part A, the one the driver measured for part B (`RESULTS/warm_start.json`)."""
    warm_em: float | None = WARM_EM
    if PARTS[part]["warm_report"] is not None:
        measured = results / WARM_EVAL
        warm_em = None
        if measured.is_file():
            warm_em = json.loads(measured.read_text(encoding="utf-8"))["held_out_em"]
    runs = load_logs(results / "runs", arm)
    summary = confirmation_summary(runs, arm, warm_em, PARTS[part]["label"])
    write_json(results / "summary.json", summary["json"])
    (results / "summary.md").write_text(summary["markdown"], encoding="utf-8")


def main() -> None:
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--part", choices=sorted(PARTS), default="b")
    part = PARTS[pre.parse_known_args()[0].part]
    p = driver_arguments(__doc__, part["work"], part["results"], SEEDS)
    p.add_argument(
        "--part",
        choices=sorted(PARTS),
        default="b",
        help="which warm start and folders: a (the theorem study's) or b (warm start B, the "
        "default)",
    )
    p.add_argument("--study", default=str(HERE / "results" / "study.json"), help="rule 5's lambda")
    p.set_defaults(
        theorem=part["theorem"],
        warm_archive=str(part["warm_archive"]),
        warm_report=str(part["warm_report"]) if part["warm_report"] else None,
    )
    args = p.parse_args()
    theorem, work, results = Path(args.theorem), Path(args.work), Path(args.results)
    arm = chosen_arm(Path(args.study))
    runs = plan(
        theorem,
        work,
        results,
        ordered_runs([BASE_ARM, arm], args.seeds),
        [f"steps={STEPS}", *SPEED],
    )
    execute(runs, theorem, work, results, args)
    if not args.dry_run:
        write_tables(results, arm, args.part)


if __name__ == "__main__":
    main()
