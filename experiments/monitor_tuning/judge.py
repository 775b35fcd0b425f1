"""Score the frozen monitor settings on the collapse corpus's `judge` and `heldout` splits,
once (PROTOCOL.md, "Freezing, then judging"), and write `scores.md`.

    python experiments/monitor_tuning/judge.py    # after frozen.yaml is committed

The scorecard is `llds monitor score`'s (the same library calls); beside it, for every cause
run that collapsed, the first critical alarm at or after the cause's onset and how many steps
before the collapse it came (negative: after), and the cause the report names, so that a
reader sees what the scorecard's counts summarise. Out of sample: nothing here is tuned on.
"""

from __future__ import annotations

import argparse
import csv
import sys
from collections.abc import Sequence
from pathlib import Path

from llds.io import atomic_write
from llds.monitor.alarms import scan_alarms
from llds.monitor.replay import load_monitor_config
from llds.monitor.scoring import (
    HEALTHY,
    CorpusRun,
    Outcome,
    parse_manifest,
    score,
    scorecard_line,
    table,
)
from llds.monitor.settings import MonitorConfig
from llds.report.attribution import verdict_of
from llds.report.sources import find_source, read_source

HERE = Path(__file__).resolve().parent
CORPUS = HERE.parent / "collapse_corpus"
SPLITS = ("judge", "heldout")


def judge_split(corpus: Path, split: str, monitor: MonitorConfig) -> tuple[list[str], list[str]]:
    """`llds monitor score`'s lines for `split`, and one table row per collapsed cause run."""
    manifest = corpus / "manifest.csv"
    with manifest.open(newline="", encoding="utf-8") as f:
        runs = [r for r in parse_manifest(csv.DictReader(f), str(manifest)) if r.split == split]
    return score_runs(corpus, runs, monitor, split)


def score_runs(
    corpus: Path, runs: Sequence[CorpusRun], monitor: MonitorConfig, split: str
) -> tuple[list[str], list[str]]:
    """The scorecard's lines for `runs` replayed with `monitor` (warnings on healthy runs
    included), and one table row per collapsed cause run (`ROWS_HEAD` is its header)."""
    outcomes, rows_out = [], []
    for r in runs:
        rows = read_source(find_source(corpus / r.run))
        alarms = scan_alarms(rows, monitor)
        verdict = verdict_of(rows, alarms)
        outcomes.append(Outcome.replayed(r, rows, alarms, verdict.codes))
        if r.mechanism == HEALTHY or r.collapse_step is None:
            continue
        after = [a for a in alarms if a.severity == "critical" and a.step >= (r.cause_step or 0)]
        first = (
            f"`{after[0].kind}` at {after[0].step} ({r.collapse_step - after[0].step:+d})"
            if after
            else "none"
        )
        kind = "censored" if r.censored else "abrupt" if r.abrupt else "gradual"
        named = ", ".join(verdict.named) or "no known signature"
        below = ", ".join(verdict.downstream) or "-"
        rows_out.append(
            f"| {r.run} | {r.mechanism} | {kind} | {r.cause_step} | {r.collapse_step} | "
            f"{first} | {named} | {below} |"
        )
    card = score(outcomes, split)
    return [*table(card), scorecard_line(card)], rows_out


ROWS_HEAD = (
    "Every collapsed cause run: the first critical alarm at or after the cause's onset "
    "(steps before the collapse; negative: after it) and the report's named cause.",
    "",
    "| run | mechanism | collapse | cause step | collapse step | first critical alarm "
    "| cause named | also present, downstream |",
    "|---|---|---|---|---|---|---|---|",
)


def scores_md(config: Path, results: dict[str, tuple[list[str], list[str]]]) -> str:
    lines = [
        "# The frozen monitor settings on `judge` and `heldout` (out of sample)",
        "",
        f"Written by `python experiments/monitor_tuning/judge.py` with `{config.name}` "
        "(committed before this was run); do not edit. Out of sample: the settings and the "
        "report's attribution were chosen on `tune` only.",
    ]
    for split, (score_lines, rows) in results.items():
        lines += ["", f"## `{split}`", "", "```", *score_lines, "```", ""]
        lines += [*ROWS_HEAD, *rows]
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--corpus", type=Path, default=CORPUS, help="folder with manifest.csv")
    ap.add_argument("--config", type=Path, default=HERE / "frozen.yaml", help="frozen settings")
    ap.add_argument("--out", type=Path, default=HERE / "scores.md")
    args = ap.parse_args(argv)
    monitor = load_monitor_config(args.config)
    results = {s: judge_split(args.corpus, s, monitor) for s in SPLITS}
    with atomic_write(args.out, "w", encoding="utf-8") as f:
        f.write(scores_md(args.config, results))
    for split, (score_lines, _) in results.items():
        print(f"{split}: {score_lines[-1]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
