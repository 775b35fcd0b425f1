"""Continue finished LLD-study runs to a later step: the same recipe with `steps` raised.

A collapse is defined as lasting to the end of a run, so a fall in a run's last steps cannot be
told from a dip; continuing the run can. Each named run (`ARM_DIR/seedN` under `--out`, as
`lld_study.py` lays them out) is resumed from its newest checkpoint with the arm's config file,
the warm start under `--out/warm`, its seed and `steps=--steps`; nothing else changes (a
resume may raise `steps` without permission, and the study's learning rate is constant, so the
continued steps are those a longer run would have taken). A run already at `--steps` is
skipped, an interrupted one resumes. Runs go `--parallel` at a time, one thread each.

    python benchmarks/lld_study_continue.py --out runs/lld-study/larger-model --steps 900 \\
        --runs GRPO/seed1 GRPO_LLDS/seed1 GRPO_LLDS/seed2 GRPO/seed2 GRPO_LLDS/seed0
"""

from __future__ import annotations

import argparse
import re
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent / "lld_study"
ARM_FILES = {"GRPO": "grpo.yaml", "GRPO_LLDS": "grpo-llds.yaml"}
"""run folder name -> the arm's override file (the two arms the continued stage names)"""


def run_overrides(out: Path, run: str, steps: int) -> tuple[Path, list[str]]:
    """The config file and overrides that continue `run` (`ARM_DIR/seedN`) to `steps`: the ones
    `lld_study.py` started it with, plus the new total."""
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


def last_step(run_dir: Path) -> int:
    """The last step in the run's metrics log (0 when there is none)."""
    from llds.train.tracking import read_metrics

    if not (run_dir / "metrics.jsonl").is_file():
        return 0
    rows = read_metrics(run_dir)
    return int(rows[-1]["step"]) if rows else 0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True, help="the factor's study folder")
    ap.add_argument("--runs", nargs="+", required=True, help="ARM_DIR/seedN, in start order")
    ap.add_argument("--steps", type=int, required=True)
    ap.add_argument("--parallel", type=int, default=2)
    args = ap.parse_args()
    from llds.train.background import run_queue
    from llds.train.config import load_config

    stamp = int(time.time())
    jobs = []
    for run in args.runs:
        try:
            path, overrides = run_overrides(args.out, run, args.steps)
        except ValueError as exc:
            ap.error(str(exc))
        run_dir = args.out / run
        if not (run_dir / "checkpoints").is_dir():
            ap.error(f"--runs {run}: no checkpoints in {run_dir} to continue from")
        if last_step(run_dir) >= args.steps:
            print(f"{run}: already at step {args.steps}", flush=True)
            continue
        jobs.append((load_config(path, overrides), run_dir / f"train-{stamp}.log"))
    run_queue(jobs, args.parallel, poll_s=5.0)


if __name__ == "__main__":
    main()
