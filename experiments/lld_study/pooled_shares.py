"""How many of the responses GRPO pushed up lost likelihood: LLD pooled over responses, per run.

Reads the committed metrics logs of the LLD study (`results/`, steps 1-600), of its continued
runs (`continued/`, steps 601-900 only) and of the SmolLM2 study
(`experiments/smollm2/results/rl/`, steps 1-60), and prints one markdown table per study: for
every run, the positive-advantage responses re-scored (`lld/pos_responses`, summed), how many
fell (`lld/frac_pos_fell` x `lld/pos_responses`; a change `<= 0` counts as fell), the pooled
share, and the per-step shares' distribution (steps where none fell, quartiles; the median is
what the results pages used to report); then one row per world and arm with the median over
seeds and every seed's pooled share.

    python experiments/lld_study/pooled_shares.py

With `--runs`, the same counts over windows of steps of the named run folders instead (each
holding a `metrics.jsonl.gz`), with the median of the per-step shares over the same window
beside them: `--steps A-B` (both counted), `--every N` (consecutive N-step windows from step
1), `--deepest-fall` (steps 1-50 and the deepest fall of the 10-step median reward, peak to
trough, the windows of the study's dip table) and `--before-collapse` (the 50 steps before the
pre-registered collapse, where the study looked for LLD):

    python experiments/lld_study/pooled_shares.py --runs RUN [RUN ...] --before-collapse
"""

from __future__ import annotations

import argparse
from collections import defaultdict
from pathlib import Path

from llds import metrics as keys
from llds.analysis.pooled import ShareSummary, summarize
from llds.analysis.seeds import median_over_seeds
from llds.analysis.study_logs import COMMITTED_LOG, read_committed_metrics, run_logs, world_and_arm
from llds.report.collapse import LLD_WINDOW, SMOOTH, collapse_step, deepest_dip, median_window

HERE = Path(__file__).resolve().parent
STUDIES = {
    "LLD study, steps 1-600": (HERE / "results", range(1, 601), "organism"),
    "continued runs, steps 601-900": (HERE / "continued", range(601, 901), "organism"),
    "SmolLM2-135M, steps 1-60": (
        HERE.parent / "smollm2" / "results" / "rl",
        range(1, 61),
        "trivia",
    ),
}
"""title: (results folder, steps counted, the world of a run without a world folder)"""


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{100 * v:.1f}%"


def run_line(world: str, arm: str, seed: str, s: ShareSummary) -> str:
    """One run's row."""
    q = s.quartiles
    qs = "-" if q is None else " / ".join(f"{v:.2f}" for v in q)
    none = f"{s.steps_none_fell} of {s.steps}"
    cells = [world, arm, seed, str(s.responses), str(s.fell), _pct(s.pooled), none, qs]
    return "| " + " | ".join(cells) + " |"


def study_table(results: Path, steps: range, world0: str) -> str:
    """The per-run table and the per-arm summary of one study's committed logs."""
    head = "| world | arm | seed | positive responses | fell | pooled share "
    head += "| steps with none fell | per-step share: quartiles (median in the middle) |"
    lines = [head, "|" + " --- |" * 8]
    arms: dict[tuple[str, str], list[tuple[str, float | None]]] = defaultdict(list)
    runs = [(*world_and_arm(results, log.parent), log) for log in run_logs(results)]
    for world, arm, seed, log in sorted(runs, key=lambda r: (r[0], r[1], int(r[2]))):
        world = world0 if world == "organism" else world
        s = summarize(read_committed_metrics(log), steps=steps)
        lines.append(run_line(world, arm, seed, s))
        arms[(world, arm)].append((seed, s.pooled))
    lines += ["", "| world | arm | seeds | pooled share: median over seeds | every seed |"]
    lines.append("|" + " --- |" * 5)
    for (world, arm), seeds in arms.items():
        every = ", ".join(
            f"{seed}: {_pct(v)}" for seed, v in sorted(seeds, key=lambda x: int(x[0]))
        )
        med = _pct(median_over_seeds(v for _, v in seeds))
        lines.append(f"| {world} | {arm} | {len(seeds)} | {med} | {every} |")
    return "\n".join(lines)


def _window(text: str) -> range:
    """`A-B` -> the steps A to B, both counted."""
    a, _, b = text.partition("-")
    return range(int(a), int(b or a) + 1)


def run_windows(rows: list[dict], args: argparse.Namespace) -> list[tuple[str, range]]:
    """The windows `(label, steps)` the options ask for, on one run's rows."""
    steps = [int(r["step"]) for r in rows]
    out = [(f"{w.start}-{w.stop - 1}", w) for w in map(_window, args.steps or [])]
    if args.every:
        out += [
            (f"{a}-{min(a + args.every - 1, steps[-1])}", range(a, a + args.every))
            for a in range(1, steps[-1] + 1, args.every)
        ]
    if args.deepest_fall:  # as `study_summary.dip_summary` cuts them
        reward = [r[keys.REWARD_MEAN] for r in rows]
        smooth = [median_window(reward, i, SMOOTH) or 0.0 for i in range(len(reward))]
        peak, trough = deepest_dip(smooth)
        out.append(
            (
                f"first {LLD_WINDOW} steps",
                range(steps[0], steps[min(LLD_WINDOW, len(steps)) - 1] + 1),
            )
        )
        out.append(
            (
                f"deepest fall: {smooth[peak]:.2f} (step {steps[peak]}) -> {smooth[trough]:.2f} "
                f"(step {steps[trough]})",
                range(steps[peak], steps[trough] + 1),
            )
        )
    if args.before_collapse:  # as `study_summary._before_collapse` cuts it
        collapse = collapse_step(steps, [r[keys.REWARD_MEAN] for r in rows])
        if collapse is None:
            out.append(("no collapse", range(0)))
        else:
            i = steps.index(collapse)
            first = steps[max(0, i - LLD_WINDOW)]
            out.append(
                (
                    f"{first}-{collapse - 1}, before the collapse at {collapse}",
                    range(first, collapse),
                )
            )
    return out


def window_table(runs: list[str], args: argparse.Namespace) -> str:
    """One row per run and window: the pooled counts and the median of the per-step shares."""
    head = "| run | steps | positive responses | fell | pooled share | steps with none fell "
    head += "| per-step share: median |"
    lines = [head, "|" + " --- |" * 7]
    for run in runs:
        rows = read_committed_metrics(Path(run) / COMMITTED_LOG)
        for label, steps in run_windows(rows, args):
            s = summarize(rows, steps=steps)
            q = s.quartiles
            cells = [run, label, str(s.responses), str(s.fell), _pct(s.pooled)]
            cells += [f"{s.steps_none_fell} of {s.steps}", "-" if q is None else f"{q[1]:.2f}"]
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", nargs="+", metavar="RUN", help="run folders: count windows")
    parser.add_argument("--steps", nargs="+", metavar="A-B", help="windows of steps")
    parser.add_argument("--every", type=int, metavar="N", help="consecutive N-step windows")
    parser.add_argument("--deepest-fall", action="store_true", help="steps 1-50 and the fall")
    parser.add_argument("--before-collapse", action="store_true", help="the 50 steps before it")
    args = parser.parse_args()
    asked = args.steps or args.every or args.deepest_fall or args.before_collapse
    if bool(args.runs) != bool(asked):
        parser.error("--runs and the windows (--steps, --every, ...) go together")
    if args.runs:
        print(window_table(args.runs, args))
        return
    for title, (results, steps, world0) in STUDIES.items():
        print(f"## {title}\n\n{study_table(results, steps, world0)}\n")


if __name__ == "__main__":
    main()
