"""The LLDS-strength study's confirmation (CONFIRMATION.md): GRPO against the lambda the
dose-response picked (rule 5), 300 steps, seeds in pairs, resumable in the background; the logs
go to `results/confirm/runs/` and the tables to `results/confirm/summary.{md,json}`.

    python experiments/llds_strength/confirm.py --parallel 2      # seeds 1-6
    python experiments/llds_strength/confirm.py --seeds 7 8       # more seeds, same way
    python experiments/llds_strength/confirm.py --dry-run         # each run's config
    python experiments/llds_strength/confirm.py --collect         # copy the logs, tables
    python experiments/llds_strength/confirm.py --park            # also archive unfinished runs

A run takes longer than one machine may last: `--park` archives each unfinished run's newest
checkpoint into `results/confirm/parked/` to commit, and a later call whose work folder is gone
resumes from it (run.py: `park`, `unpark`).

The lambda is read from `results/study.json` (`answers.confirmation_lambda`): nothing starts
until the dose-response is complete and its rule has named one.
"""

from __future__ import annotations

import json
from pathlib import Path

from llds.io import write_json
from llds.studies.strength_confirmation import (
    BASE_ARM,
    SEEDS,
    STEPS,
    arm_for,
    confirmation_summary,
    load_logs,
)
from run import HERE, driver_arguments, execute, ordered_runs, plan

SPEED = ("optim.micro_batch_tokens=4096", "optim.logprob_micro_batch_tokens=16384")
"""CONFIRMATION.md: micro-batch budgets that change float rounding only, 1.13x faster here."""


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


def write_tables(results: Path, arm: str) -> None:
    summary = confirmation_summary(load_logs(results / "runs", arm), arm)
    write_json(results / "summary.json", summary["json"])
    (results / "summary.md").write_text(summary["markdown"], encoding="utf-8")


def main() -> None:
    p = driver_arguments(__doc__, "runs/llds_strength/confirm", HERE / "results" / "confirm", SEEDS)
    p.add_argument("--study", default=str(HERE / "results" / "study.json"), help="rule 5's lambda")
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
        write_tables(results, arm)


if __name__ == "__main__":
    main()
