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
"""

from __future__ import annotations

import argparse
from collections import defaultdict
from pathlib import Path

from llds.report.pooled import ShareSummary, median_over_seeds, summarize
from llds.report.study_logs import read_committed_metrics, run_logs, world_and_arm

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


def main() -> None:
    argparse.ArgumentParser(description=__doc__.split("\n")[0]).parse_args()
    for title, (results, steps, world0) in STUDIES.items():
        print(f"## {title}\n\n{study_table(results, steps, world0)}\n")


if __name__ == "__main__":
    main()
