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

`--report` starts nothing: it prints, per named run, what the continued stage's protocol
measures (benchmarks/README.md, "`larger-model`, stage 3"), from what is on disk.
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

HERE = Path(__file__).resolve().parent / "lld_study"
ARM_FILES = {"GRPO": "grpo.yaml", "GRPO_LLDS": "grpo-llds.yaml"}
"""run folder name -> the arm's override file (the two arms the continued stage names)"""


def run_overrides(out: Path, run: str, steps: int) -> tuple[Path, list[str]]:
    """The config file and overrides that continue `run` (`ARM_DIR/seedN`) to `steps`: the ones
    `lld_study.py` started it with, plus the new total. Written out rather than taken from
    `lld_study.arm_config`, so that continuing imports nothing of the study script and also runs
    on the older checkout that ran the stages; a test pins the two configs equal but for
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


def last_step(run_dir: Path) -> int:
    """The last step in the run's metrics log (0 when there is none)."""
    from llds.runs.tracking import read_metrics

    if not (run_dir / "metrics.jsonl").is_file():
        return 0
    rows = read_metrics(run_dir)
    return int(rows[-1]["step"]) if rows else 0


def first_fall_and_recovery(reward: Sequence[float]) -> tuple[int | None, bool]:
    """`(index of the first fall, recovered)`: the first index where the 10-step median reward is
    at or below half of its running peak (a peak of at least 0.2), as in the collapse
    definition, and whether the median is ever above half of its running peak after that."""
    from lld_study import DROP, MIN_PEAK, SMOOTH, _median_window

    peak, fall = 0.0, None
    for i in range(len(reward)):
        smooth = _median_window(reward, i, SMOOTH)
        peak = max(peak, smooth)
        low = peak >= MIN_PEAK and smooth <= DROP * peak
        if fall is None and low:
            fall = i
        elif fall is not None and not low:
            return fall, True
    return fall, False


def run_rows(path: Path) -> list[dict]:
    """A run's metrics rows: its live log (`metrics.jsonl`) or, once committed, the gzipped copy
    (`metrics.jsonl.gz`)."""
    from _common import read_committed_metrics
    from llds.runs.tracking import read_metrics

    if (path / "metrics.jsonl").is_file():
        return read_metrics(path)
    if (path / "metrics.jsonl.gz").is_file():
        return read_committed_metrics(path / "metrics.jsonl.gz")
    raise SystemExit(f"{path}: neither metrics.jsonl nor metrics.jsonl.gz")


def report(out: Path, runs: Sequence[str], since: int) -> str:
    """The stage's per-run table (markdown) from the runs' metrics logs under `out`. The alarms
    are replayed from the logged metrics with this checkout's detector, as `lld_study.py`
    does."""
    from lld_study import LLD_WINDOW, _fmt, _median_of, collapse_step, search_summary
    from llds import metrics as keys
    from llds.monitor.alarms import scan_alarms

    head = f"| run | last step | collapsed at {since} | collapse step | steps collapsed "
    head += "| first fall | recovered after it "
    at = range(since, since + 301, 50)
    head += f"| held-out EM at steps {', '.join(map(str, at))} | valid searches, last 50 steps "
    head += f"| first critical alarm after {since} "
    head += "| median disp_pos / frac_pos_fell, 50 steps before the collapse |"
    lines = [head, "|" + "---|" * 11]
    for run in runs:
        rows = run_rows(out / run)
        steps, reward = [r["step"] for r in rows], [r[keys.REWARD_MEAN] for r in rows]
        collapse = collapse_step(steps, reward)
        k = sum(1 for t in steps if t <= since)
        before = collapse_step(steps[:k], reward[:k]) if k else None
        fall, recovered = first_fall_and_recovery(reward)
        em = {r["step"]: r["eval/em"] for r in rows if "eval/em" in r}
        ems = " / ".join(f"{em[s]:.3f}" if s in em else "-" for s in at)
        searches = search_summary([r.get(keys.VALID_SEARCHES) for r in rows])["last"]
        late = [a.step for a in scan_alarms(rows) if a.severity == "critical" and a.step > since]
        lld = "-"
        if collapse is not None:  # the study's reading of LLD before a collapse
            i = steps.index(collapse)
            window = rows[max(0, i - LLD_WINDOW) : i]
            lld = " / ".join(
                _fmt(_median_of(window, key), 2) for key in (keys.DISP_POS, keys.FRAC_POS_FELL)
            )
        lines.append(
            f"| {run} | {steps[-1]} | {before or 'no'} | {collapse or 'none'} "
            f"| {0 if collapse is None else steps[-1] - collapse + 1} "
            f"| {'none' if fall is None else steps[fall]} | {'yes' if recovered else 'no'} "
            f"| {ems} | {_fmt(searches, 2)} | {late[0] if late else 'none'} | {lld} |"
        )
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True, help="the factor's study folder")
    ap.add_argument("--runs", nargs="+", required=True, help="ARM_DIR/seedN, in start order")
    ap.add_argument("--steps", type=int, help="the new total (required unless --report)")
    ap.add_argument("--parallel", type=int, default=2)
    ap.add_argument("--report", action="store_true", help="print the stage's table; run nothing")
    ap.add_argument("--since", type=int, default=600, help="--report: the step runs resumed from")
    args = ap.parse_args()
    if args.report:
        print(report(args.out, args.runs, args.since))
        return
    if args.steps is None:
        ap.error("--steps: the new total is required to continue runs")
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
