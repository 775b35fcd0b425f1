"""Continue finished LLD-study runs to a later step: the same recipe with `steps` raised.

A collapse is defined as lasting to the end of a run, so a fall in a run's last steps cannot be
told from a dip; continuing the run can. Each named run (`ARM_DIR/seedN` under `--out`, as
`run.py` lays them out) is resumed from its newest checkpoint with the arm's config file, the
warm start under `--out/warm`, its seed and `steps=--steps`; nothing else changes (a resume may
raise `steps` without permission, and the study's learning rate is constant, so the continued
steps are those a longer run would have taken). A run already at `--steps` is skipped, an
interrupted one resumes. Runs go `--parallel` at a time, one thread each.

    python experiments/lld_study/continue_runs.py --out runs/lld-study/larger-model --steps 900 \\
        --runs GRPO/seed1 GRPO_LLDS/seed1 GRPO_LLDS/seed2 GRPO/seed2 GRPO_LLDS/seed0

`--report` starts nothing: it prints, per named run, what the continued stage's protocol
measures (experiments/lld_study/PROTOCOL.md, "`larger-model`, stage 3"), from what is on disk.
`--dry-run` starts nothing either: it prints the config each named run would continue with.
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from _common import config_data, print_dry_run
from lld_study.study_tables import continued_table
from llds.analysis.study_logs import last_step

HERE = Path(__file__).resolve().parent
ARM_FILES = {"GRPO": "grpo.yaml", "GRPO_LLDS": "grpo-llds.yaml"}
"""run folder name -> the arm's override file (the two arms the continued stage names)"""


def run_overrides(out: Path, run: str, steps: int) -> tuple[Path, list[str]]:
    """The config file and overrides that continue `run` (`ARM_DIR/seedN`) to `steps`: the ones
    `run.py` started it with, plus the new total. Written out rather than taken from
    `study.arm_config`, so that continuing imports nothing of the study's other drivers and also
    runs on the older checkout that ran the stages; a test pins the two configs equal but for
    `steps`."""
    match = re.fullmatch(r"([A-Za-z_]+)/seed(\d+)", run)
    if match is None or match.group(1) not in ARM_FILES:
        raise ValueError(f"--runs {run!r}: expected one of {sorted(ARM_FILES)} then /seedN")
    arm, seed = match.group(1), int(match.group(2))
    warm = out / "warm"
    return HERE / ARM_FILES[arm], [
        f"run_dir={out / arm / f'seed{seed}'}",
        f"seed={seed}",
        f"model.path={warm / 'sft' / 'model'}",
        f"data.train={warm / 'world' / 'train.jsonl'}",
        f"data.eval={warm / 'world' / 'test.jsonl'}",
        f"retriever.source={warm / 'world' / 'corpus.jsonl'}",
        f"steps={steps}",
    ]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True, help="the factor's study folder")
    ap.add_argument("--runs", nargs="+", required=True, help="ARM_DIR/seedN, in start order")
    ap.add_argument("--steps", type=int, help="the new total (required unless --report)")
    ap.add_argument("--parallel", type=int, default=2)
    ap.add_argument("--report", action="store_true", help="print the stage's table; run nothing")
    ap.add_argument("--since", type=int, default=600, help="--report: the step runs resumed from")
    ap.add_argument(
        "--dry-run", action="store_true", help="print each run's continued config; run nothing"
    )
    args = ap.parse_args()
    if args.report:
        print(continued_table(args.out, args.runs, args.since))
        return
    if args.steps is None:
        ap.error("--steps: the new total is required to continue runs")
    from llds.train.background import run_queue
    from llds.train.config import load_config

    stamp = int(time.time())
    jobs, planned = [], []
    for run in args.runs:
        try:
            path, overrides = run_overrides(args.out, run, args.steps)
        except ValueError as exc:
            ap.error(str(exc))
        cfg = load_config(path, overrides)
        if args.dry_run:
            planned.append({"run": run, "config": config_data(cfg)})
            continue
        run_dir = args.out / run
        if not (run_dir / "checkpoints").is_dir():
            ap.error(f"--runs {run}: no checkpoints in {run_dir} to continue from")
        if last_step(run_dir) >= args.steps:
            print(f"{run}: already at step {args.steps}", flush=True)
            continue
        jobs.append((cfg, run_dir / f"train-{stamp}.log"))
    if args.dry_run:
        print_dry_run(planned)
        return
    run_queue(jobs, args.parallel, poll_s=5.0)


if __name__ == "__main__":
    main()
