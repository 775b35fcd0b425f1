"""The organism study: GRPO(+LLDS) from the demo's warm start, several seeds, same budget.

Arms (each run for every seed, from the same warm start, held-out EM every 50 steps):
  organism/GRPO+LLDS   organism   (lr 2e-4)
  organism/GRPO        organism with algo.llds.enabled=false
  collapse/GRPO        collapse with algo.llds.enabled=false   (lr 5e-4)
  collapse/GRPO+LLDS   collapse   (lr 5e-4)
  collapse/GRPO+LLDS-1.0   the same with the LLDS coefficient 1.0 instead of 0.2

    llds demo --out runs/demo --skip-train           # world + warm start (once)
    python experiments/organism/run.py --demo runs/demo --out runs/study [--seeds 0 1 2]
                                       [--parallel 2] [--summarize-only]

Prints a markdown table (held-out EM of the warm start and after 50/100/150/200 steps, median
over seeds with the per-seed values, the last-20-step training reward and answered fraction,
the first collapse alarm) and writes `study.png` (median held-out EM, smoothed training reward
and correct-response log-likelihood per arm, seeds as thin lines) and `study.json` in --out.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from llds.analysis.machine import machine
from llds.monitor.alarms import scan_alarms
from llds.report.plots import moving_average
from llds.runs.eval_result import EvalResult, eval_file
from llds.runs.tracking import read_metrics
from llds.train.background import run_queue
from llds.train.config import TrainConfig, load_config

ARMS: dict[str, tuple[str, list[str]]] = {
    "organism/GRPO+LLDS": ("organism", []),
    "organism/GRPO": ("organism", ["algo.llds.enabled=false"]),
    "collapse/GRPO": ("collapse", ["algo.llds.enabled=false"]),
    "collapse/GRPO+LLDS": ("collapse", []),
    "collapse/GRPO+LLDS-1.0": ("collapse", ["algo.llds.coef=1.0"]),
}
COLORS = {
    "organism/GRPO+LLDS": "tab:green",
    "organism/GRPO": "tab:olive",
    "collapse/GRPO": "tab:red",
    "collapse/GRPO+LLDS-1.0": "tab:purple",
    "collapse/GRPO+LLDS": "tab:blue",
}


def run_dir(out: Path, arm: str, seed: int) -> Path:
    return out / arm.replace("/", "_").replace("+", "_") / f"seed{seed}"


def arm_config(demo: Path, out: Path, arm: str, seed: int) -> TrainConfig:
    """The run of `arm` for `seed`: its preset plus the study's paths and seed."""
    config, extra = ARMS[arm]
    return load_config(
        config,
        [
            f"run_dir={run_dir(out, arm, seed)}",
            f"seed={seed}",
            f"model.path={demo / 'sft' / 'model'}",
            f"data.train={demo / 'world' / 'train.jsonl'}",
            f"data.eval={demo / 'world' / 'test.jsonl'}",
            f"retriever.source={demo / 'world' / 'corpus.jsonl'}",
            "logging.progress=false",
            "optim.minibatch_order=shuffled",  # the order the recorded runs used
            *extra,
        ],
    )


def run_all(
    demo: Path, out: Path, arms: Sequence[str], seeds: Sequence[int], parallel: int
) -> None:
    """Every (arm, seed) as its own training process, `parallel` at a time, 1 thread each."""
    jobs = [
        (arm_config(demo, out, arm, s), run_dir(out, arm, s) / "train.log")
        for s in seeds
        for arm in arms
    ]
    run_queue(jobs, parallel)


def summarize_run(path: Path) -> dict[str, Any]:
    rows = read_metrics(path)
    if not rows:
        raise SystemExit(f"{path}: no metrics.jsonl rows (run the study first)")
    tail = rows[-20:]
    # replayed with the current detector (not read from alarms.jsonl, which holds what the
    # detector of the day raised online), so a re-summary reflects detector changes
    critical = [a.step for a in scan_alarms(rows) if a.severity == "critical"]
    evals = [r for r in rows if "eval/em" in r]
    return {
        "eval_em": {r["step"]: r["eval/em"] for r in evals},
        "last_em_by_hops": {h: evals[-1].get(f"eval/em_{h}hop") for h in (1, 2, 3)}
        if evals
        else {},
        "reward_last20": statistics.fmean(r["reward/mean"] for r in tail),
        "answered_last20": statistics.fmean(r["rollout/answered_frac"] for r in tail),
        "searches_last20": statistics.fmean(r["rollout/valid_searches"] for r in tail),
        "first_critical_alarm": min(critical) if critical else None,
        "steps": rows[-1]["step"],
        "wall_s": sum(r["time/step"] for r in rows),
        "reward": [r["reward/mean"] for r in rows],
        "logp_correct": [r.get("lld/logp_correct") for r in rows],
    }


def start_em(demo: Path) -> float | None:
    path = eval_file(demo / "sft", 0)
    return EvalResult.read(path).overall.em if path.is_file() else None


def _cell(values: Sequence[float]) -> str:
    return f"**{statistics.median(values):.3f}** ({' / '.join(f'{v:.3f}' for v in values)})"


def _by_hops(per_seed: Sequence[dict[Any, Any]]) -> str:
    """Median over seeds of the last evaluation's EM per hop count ("-" where not logged)."""
    cells = []
    for h in (1, 2, 3):
        values = [d.get(h, d.get(str(h))) for d in per_seed]
        values = [v for v in values if v is not None]
        cells.append(f"{statistics.median(values):.2f}" if values else "-")
    return " / ".join(cells)


def table(study: dict[str, dict[int, dict[str, Any]]], start: float | None) -> str:
    checkpoints = sorted(
        {s for runs in study.values() for r in runs.values() for s in r["eval_em"]}
    )
    head = [
        "arm",
        "seeds",
        "start EM",
        *[f"EM @ {s}" for s in checkpoints],
        "last EM by hops 1 / 2 / 3",
        "train reward, last 20",
        "answered, last 20",
        "first critical alarm",
        "min / run",
    ]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for arm, runs in study.items():
        seeds = sorted(runs)
        ems = [_cell([runs[s]["eval_em"].get(c, float("nan")) for s in seeds]) for c in checkpoints]
        alarms = [runs[s]["first_critical_alarm"] for s in seeds]
        cells = [
            arm,
            ", ".join(map(str, seeds)),
            "-" if start is None else f"{start:.3f}",
            *ems,
            _by_hops([runs[s].get("last_em_by_hops", {}) for s in seeds]),
            _cell([runs[s]["reward_last20"] for s in seeds]),
            _cell([runs[s]["answered_last20"] for s in seeds]),
            " / ".join("none" if a is None else f"step {a}" for a in alarms),
            f"{statistics.median(runs[s]['wall_s'] for s in seeds) / 60:.1f}",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot(study: dict[str, dict[int, dict[str, Any]]], start: float | None, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    for arm, runs in study.items():
        color = COLORS.get(arm, "black")
        steps = sorted({c for r in runs.values() for c in r["eval_em"]})
        xs = [0, *steps] if start is not None else steps
        per_seed = []
        for r in runs.values():
            ys = [r["eval_em"].get(c, float("nan")) for c in steps]
            per_seed.append([start, *ys] if start is not None else ys)
            axes[0].plot(xs, per_seed[-1], color=color, alpha=0.25, lw=1)
        axes[0].plot(
            xs,
            [statistics.median(v) for v in zip(*per_seed, strict=True)],
            color=color,
            lw=2.5,
            marker="o",
            label=arm,
        )
        for r in runs.values():
            axes[1].plot(moving_average(r["reward"], 10), color=color, alpha=0.6, lw=1)
            lp = [float("nan") if v is None else v for v in r["logp_correct"]]
            axes[2].plot(lp, color=color, alpha=0.6, lw=1)
    axes[0].set(title="held-out EM (greedy, 120 questions)", xlabel="step", ylabel="EM")
    axes[1].set(title="training reward (moving average 10)", xlabel="step")
    axes[2].set(title="log-likelihood per token of correct responses", xlabel="step")
    axes[0].legend()
    for ax in axes:
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--demo",
        type=Path,
        default=Path("runs/demo"),
        help="folder of `llds demo --skip-train` (world/ and sft/)",
    )
    ap.add_argument("--out", type=Path, default=Path("runs/study"))
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--arms", nargs="+", default=list(ARMS), choices=list(ARMS))
    ap.add_argument("--parallel", type=int, default=2)
    ap.add_argument("--summarize-only", action="store_true")
    args = ap.parse_args()
    if not (args.demo / "sft" / "model").is_dir():
        raise SystemExit(
            f"{args.demo}: no sft/model; run `llds demo --out {args.demo} --skip-train` first"
        )
    if not args.summarize_only:
        run_all(args.demo, args.out, args.arms, args.seeds, args.parallel)
    study = {
        arm: {s: summarize_run(run_dir(args.out, arm, s)) for s in args.seeds} for arm in args.arms
    }
    start = start_em(args.demo)
    args.out.mkdir(parents=True, exist_ok=True)
    plot(study, start, args.out / "study.png")
    (args.out / "study.json").write_text(json.dumps({"start_em": start, "runs": study}))
    print(f"machine: {machine()}")
    print(f"command: `python experiments/organism/run.py {' '.join(sys.argv[1:])}`".strip())
    print()
    print(table(study, start))
    print(f"\nfigure: {args.out / 'study.png'}")


if __name__ == "__main__":
    main()
