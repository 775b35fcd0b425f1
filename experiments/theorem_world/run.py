"""The theorem-world study (PROTOCOL.md): the learning-rate calibration, the runs of both arms,
and their tables with the pre-registered answers.

    python experiments/theorem_world/warm_start.py --work runs/theorem_world   # once, first
    python experiments/theorem_world/run.py calibrate --work runs/theorem_world
    python experiments/theorem_world/run.py study --work runs/theorem_world
    python experiments/theorem_world/run.py tables --work runs/theorem_world
    python experiments/theorem_world/run.py study ... --dry-run   # each run's config; runs nothing

`calibrate` runs arm `grpo` on the calibration seeds at each rate of the grid, extends the grid
by factors of 3 until a rate's median approx-KL lies within [3e-4, 3e-3], and writes the table
and the chosen rate to `results/calibration.{md,json}`. `study` runs every (arm, seed) at that
rate (the step-0 held-out EM of the warm start first, once). Resumable: a finished run is
skipped, an interrupted one resumes from its last checkpoint; `--parallel` runs at a time, one
thread each. `tables` writes `results/study.{md,json}` from whatever is on disk, partial runs
marked, and the answers only from complete runs.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from _common import config_data, print_dry_run, run_unfinished
from llds.io import write_json
from llds.runs.tracking import read_metrics
from llds.train.config import load_config
from theorem_world.theorem_study import STEPS, calibration_summary, study_summary

HERE = Path(__file__).resolve().parent
ARMS = {"grpo": "base.yaml", "grpo-llds": "grpo-llds.yaml", "grpo-llds-ma": "grpo-llds-ma.yaml"}
STUDY_SEEDS = (1, 2, 3)
CALIBRATION_SEEDS = (101, 102)
CALIBRATION_RATES = (1e-4, 3e-4, 1e-3, 3e-3)
CALIBRATION_STEPS = 10
MAX_GRID_EXTENSIONS = 4


def run_config(
    work: Path, arm: str, seed: int, lr: float, run_dir: Path, extra: Sequence[str] = ()
):
    """The run of `arm` for `seed` at `lr`: the arm's file plus the paths under `work`."""
    return load_config(
        HERE / ARMS[arm],
        [
            f"run_dir={run_dir}",
            f"seed={seed}",
            f"optim.lr={lr}",
            f"model.path={work / 'model'}",
            f"data.train={work / 'world' / 'train.jsonl'}",
            f"data.eval={work / 'world' / 'test.jsonl'}",
            f"retriever.source={work / 'world' / 'corpus.jsonl'}",
            *extra,
        ],
    )


def calibration_dir(work: Path, lr: float, seed: int) -> Path:
    return work / "calibration" / f"lr{lr:.0e}" / f"seed{seed}"


def study_dir(work: Path, arm: str, seed: int) -> Path:
    return work / "study" / arm / f"seed{seed}"


def calibration_configs(work: Path, rates: Sequence[float]) -> list[Any]:
    """Arm `grpo` for CALIBRATION_STEPS steps per (rate, seed); no evaluation or probe (they
    do not change the weights, and the calibration reads only `policy/approx_kl`)."""
    extra = [
        f"steps={CALIBRATION_STEPS}",
        f"save_every={CALIBRATION_STEPS}",
        "eval_every=0",
        "diagnostics.probe_every=0",
    ]
    return [
        run_config(work, "grpo", seed, lr, calibration_dir(work, lr, seed), extra)
        for lr in rates
        for seed in CALIBRATION_SEEDS
    ]


def _calibration_rows(work: Path, rates: Sequence[float]) -> dict[float, list[list[dict]]]:
    return {
        lr: [read_metrics(calibration_dir(work, lr, s)) for s in CALIBRATION_SEEDS] for lr in rates
    }


def calibrate(work: Path, results: Path, parallel: int, dry_run: bool) -> float | None:
    """Run the grid, extend it while no rate lands in the band, write the table; the chosen rate."""
    rates = list(CALIBRATION_RATES)
    for _ in range(MAX_GRID_EXTENSIONS + 1):
        configs = calibration_configs(work, rates)
        if dry_run:
            print_dry_run([config_data(c) for c in configs])
            return None
        run_unfinished(configs, parallel)
        summary = calibration_summary(_calibration_rows(work, rates))
        write_json(results / "calibration.json", summary["json"])
        (results / "calibration.md").write_text(summary["markdown"], encoding="utf-8")
        print(summary["markdown"], flush=True)
        if summary["json"]["chosen"] is not None:
            return summary["json"]["chosen"]
        rates.append(summary["json"]["extend_to"])
    raise SystemExit(f"calibration: no rate in the band after {MAX_GRID_EXTENSIONS} extensions")


def chosen_rate(results: Path, given: float | None) -> float:
    """The study's learning rate: `--lr`, else the committed calibration's choice."""
    if given is not None:
        return given
    path = results / "calibration.json"
    if not path.is_file():
        raise SystemExit(f"{path}: no calibration yet (run `calibrate` first, or give --lr)")
    chosen = json.loads(path.read_text(encoding="utf-8"))["chosen"]
    if chosen is None:
        raise SystemExit(f"{path}: the calibration chose no rate")
    return float(chosen)


def warm_start_eval(work: Path, lr: float) -> None:
    """Held-out EM of the warm start (step 0 of every run), as the runs' periodic evaluation
    measures it (greedy, the world's test questions, the runs' limits); kept in
    `work/warm_eval/eval/step_000000.json`."""
    from llds.data.loaders import load_examples
    from llds.evaluation.evaluate import evaluate
    from llds.evaluation.periodic import eval_rollout_config
    from llds.models.hf import load_policy
    from llds.retrieval.factory import open_retriever
    from llds.runs.eval_result import eval_file

    out = eval_file(work / "warm_eval", 0)
    if out.is_file():
        return
    cfg = run_config(work, "grpo", STUDY_SEEDS[0], lr, work / "warm_eval")
    model, tok = load_policy(cfg.model.path)
    examples = load_examples(cfg.data.eval, limit=cfg.data.eval_limit)
    retriever = open_retriever(cfg.retriever.source)
    rollout = eval_rollout_config(cfg.rollout, cfg.eval_max_turns)
    res = evaluate(model, tok, retriever, examples, rollout, template=None)
    res.write(out)
    print(f"warm start: held-out EM {res.overall.em:.3f} on {res.overall.n} questions", flush=True)


def study_configs(work: Path, lr: float, arms: Sequence[str], seeds: Sequence[int]) -> list[Any]:
    return [run_config(work, a, s, lr, study_dir(work, a, s)) for s in seeds for a in arms]


def tables(work: Path, results: Path, arms: Sequence[str], seeds: Sequence[int]) -> None:
    """`results/study.{md,json}` from the runs' logs as they are (a run is complete once it
    has logged step 300)."""
    runs = {arm: {s: read_metrics(study_dir(work, arm, s)) for s in seeds} for arm in arms}
    complete = {
        arm: {s: bool(rows) and rows[-1]["step"] >= STEPS for s, rows in by_seed.items()}
        for arm, by_seed in runs.items()
    }
    summary = study_summary(runs, complete, eval_root=work)
    write_json(results / "study.json", summary["json"])
    (results / "study.md").write_text(summary["markdown"], encoding="utf-8")
    print(summary["markdown"])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("what", choices=("calibrate", "study", "tables"))
    p.add_argument("--work", default="runs/theorem_world", help="world, warm start and runs")
    p.add_argument("--results", default=str(HERE / "results"), help="tables go here")
    p.add_argument("--arms", nargs="+", default=list(ARMS), choices=list(ARMS))
    p.add_argument("--seeds", nargs="+", type=int, default=list(STUDY_SEEDS))
    p.add_argument("--lr", type=float, default=None, help="default: the calibration's choice")
    p.add_argument("--parallel", type=int, default=2)
    p.add_argument("--dry-run", action="store_true")
    args = p.parse_args()
    work, results = Path(args.work), Path(args.results)
    if not set(args.seeds) <= set(STUDY_SEEDS):
        raise SystemExit(f"--seeds {args.seeds}: the study's seeds are {list(STUDY_SEEDS)}")
    results.mkdir(parents=True, exist_ok=True)
    if args.what == "calibrate":
        calibrate(work, results, args.parallel, args.dry_run)
    elif args.what == "study":
        lr = chosen_rate(results, args.lr)
        configs = study_configs(work, lr, args.arms, args.seeds)
        if args.dry_run:
            print_dry_run([config_data(c) for c in configs])
            return
        warm_start_eval(work, lr)
        run_unfinished(configs, args.parallel)
        tables(work, results, args.arms, args.seeds)
    else:
        tables(work, results, args.arms, args.seeds)


if __name__ == "__main__":
    main()
