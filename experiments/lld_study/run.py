"""The LLD study: does GRPO on the organism enter the death spiral at a sane learning rate, does
LLDS stop it, and does the detector see it coming? (Protocol: experiments/lld_study/PROTOCOL.md,
written before the runs; results: docs/results/lld-study.md.)

Each arm is an override file of one recipe (`experiments/lld_study/*.yaml`, `base.yaml` on the
`organism` preset); every run starts from the demo's warm start. Seed sets: `tune` (10 11 12:
the detector's thresholds are set on these) and `judge` (0 1 2: judged with frozen thresholds).

    llds demo --out runs/demo --skip-train                     # world + warm start (once)
    python experiments/lld_study/run.py --demo runs/demo --out runs/lld-study --set tune
    python experiments/lld_study/run.py --demo runs/demo --out runs/lld-study --set judge
    python experiments/lld_study/run.py ... --summarize-only   # tables from what is on disk
    python experiments/lld_study/run.py --factor similar-names --out runs/lld-study --set judge
    python experiments/lld_study/run.py ... --dry-run          # each run's config; runs nothing

`--factor` runs the same recipe on one of the theorem's factors (`FACTORS`): its own world and
warm start, built once under `OUT/FACTOR/warm` (world, SFT, start EM), runs under `OUT/FACTOR`.

Resumable: a finished run is skipped, an interrupted one resumes from its last checkpoint.
Runs go `--parallel` at a time (one thread each), through `llds.train.background.start_run`.
Writes `lld_study_SET.json` and `lld_study_SET.png` in --out and prints the markdown tables.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from _common import config_data, print_dry_run
from lld_study.study_summary import summarize_run
from lld_study.study_tables import dip_table, probe_cells, share_table, table, variant_table
from llds import metrics as keys
from llds.analysis.eval_shares import EVAL_SHARES
from llds.analysis.machine import machine
from llds.report.collapse import SMOOTH, median_window
from llds.runs.eval_result import EvalResult, eval_file
from study import (
    ARMS,
    COLORS,
    FACTORS,
    MAIN_ARMS,
    SEED_SETS,
    arm_config,
    build_warm_start,
    probe_all,
    run_all,
    run_dir,
    select_seeds,
)

Study = dict[str, dict[int, dict[str, Any]]]


def plot(study: Study, path: Path, start: float | None = None) -> None:
    """Reward, displacement, share fell and held-out EM per run (the warm start's EM, when
    known, is step 0 of every EM curve)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [
        (keys.REWARD_MEAN, "training reward (10-step median)"),
        (keys.DISP_POS, "displacement of A>0 responses (10-step median)"),
        (keys.FRAC_POS_FELL, "share of A>0 responses that lost likelihood"),
    ]
    fig, axes = plt.subplots(1, 4, figsize=(19, 4.2))
    for arm, runs in study.items():
        for r in runs.values():
            color = COLORS.get(arm, "black")
            for ax, (key, title) in zip(axes, panels, strict=False):
                ys = r["series"][key]
                smooth = [median_window(ys, i, SMOOTH) for i in range(len(ys))]
                ax.plot(range(1, len(ys) + 1), smooth, color=color, lw=1, alpha=0.8)
                ax.set_title(title, fontsize=10)
            em = sorted({**({0: start} if start is not None else {}), **r["eval_em"]}.items())
            axes[3].plot([s for s, _ in em], [v for _, v in em], color=color, marker="o", lw=1)
            if r["collapse_step"]:
                axes[0].axvline(r["collapse_step"], color=color, ls=":", lw=0.8)
            if r["first_critical_alarm"]:
                axes[0].plot(r["first_critical_alarm"], 0, marker="^", color=color)
    axes[1].axhline(0, color="black", lw=0.6)
    axes[3].set_title("held-out EM (120 questions, greedy)", fontsize=10)
    for ax in axes:
        ax.set_xlabel("step")
    handles = [plt.Line2D([], [], color=c, label=a) for a, c in COLORS.items() if a in study]
    axes[3].legend(handles=handles, fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def dry_run(demo: Path, out: Path, arms: list[str], seeds: tuple[int, ...]) -> None:
    """Print every selected run's arm, seed, colour and full config; build and run nothing."""
    print_dry_run(
        [
            {
                "arm": arm,
                "seed": s,
                "color": COLORS[arm],
                "config": config_data(arm_config(demo, out, arm, s)),
            }
            for s in seeds
            for arm in arms
        ]
    )


def print_tables(
    study: Study, demo: Path, out: Path, factor: str, set_name: str, seeds: tuple[int, ...]
) -> None:
    """Every table of the study, from the run summaries (and the warm start's evaluation);
    writes the summaries and the figure to `out`."""
    start_file = eval_file(demo / "sft", 0)
    start_eval = EvalResult.read(start_file) if start_file.is_file() else None
    start = start_eval.overall.em if start_eval else None
    print(f"machine: {machine()}")
    print(f"factor: {factor}; seed set: {set_name} {seeds}")
    warm = out / "warm_start_probe" / "probe.json"
    if warm.is_file():
        cells = probe_cells(json.loads(warm.read_text()))
        print(f"warm start probe (LLD / 1st-order LLD / drag:pull): {cells}")
    print()
    print(table(study, start))
    print()
    print("Per run, as in stage 3's tables:")
    print(variant_table(study))
    print()
    print("The deepest fall of each run's reward (descriptive, not pre-registered):")
    print(dip_table(study))
    titles = {
        "copied": "Held-out answers copied from a retrieved passage",
        "punctuation_runs": "Held-out responses with a run of 5+ of one punctuation character",
    }
    for name, share in EVAL_SHARES.items():
        print()
        print(f"{titles[name]} (descriptive, not pre-registered):")
        print(share_table(study, name, share(start_eval) if start_eval else None))
    slim = {
        a: {s: {k: v for k, v in r.items() if k != "series"} for s, r in runs.items()}
        for a, runs in study.items()
    }
    (out / f"lld_study_{set_name}.json").write_text(json.dumps(slim, indent=1))
    plot(study, out / f"lld_study_{set_name}.png", start)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--demo", type=Path, default=Path("runs/demo"))
    ap.add_argument("--out", type=Path, default=Path("runs/lld-study"))
    ap.add_argument("--set", choices=sorted(SEED_SETS), default="tune")
    ap.add_argument("--arms", nargs="+", choices=list(ARMS), default=MAIN_ARMS)
    ap.add_argument(
        "--seeds",
        nargs="+",
        type=int,
        help="run (and tabulate) only these seeds of the set, e.g. to finish one before the next",
    )
    ap.add_argument("--parallel", type=int, default=2)
    ap.add_argument(
        "--factor",
        choices=["organism", *FACTORS],
        default="organism",
        help="organism: the demo's warm start (--demo); else the factor's own world and warm "
        "start, built under OUT/FACTOR/warm",
    )
    ap.add_argument("--sft-steps", type=int, help="a factor's warm start: SFT steps (default 1200)")
    ap.add_argument("--summarize-only", action="store_true")
    ap.add_argument(
        "--probe-final",
        action="store_true",
        help="run the one-step probe on every finished run's last checkpoint and the warm start",
    )
    ap.add_argument(
        "--dry-run",
        action="store_true",
        help="print each selected run's config as JSON lines; build, train and write nothing",
    )
    args = ap.parse_args()
    try:
        seeds = select_seeds(args.set, args.seeds)
    except ValueError as e:
        ap.error(str(e))
    if args.factor != "organism":
        args.out = args.out / args.factor
        # tables and dry runs only read what is on disk: no world or warm start is built
        if args.summarize_only or args.dry_run:
            args.demo = args.out / "warm"
        else:
            args.demo = build_warm_start(args.factor, args.out, args.sft_steps)
    if args.dry_run:
        dry_run(args.demo, args.out, args.arms, seeds)
        return
    if not args.summarize_only:
        if not (args.demo / "sft" / "model").is_dir():
            raise SystemExit(f"{args.demo}: no warm start; run `llds demo --out {args.demo}`")
        run_all(args.demo, args.out, args.arms, seeds, args.parallel)
    if args.probe_final:
        probe_all(args.demo, args.out, args.arms, seeds)
    study = {
        arm: {
            s: summarize_run(run_dir(args.out, arm, s))
            for s in seeds
            if (run_dir(args.out, arm, s) / "metrics.jsonl").is_file()
        }
        for arm in args.arms
    }
    args.out.mkdir(parents=True, exist_ok=True)
    print_tables(study, args.demo, args.out, args.factor, args.set, seeds)


if __name__ == "__main__":
    main()
