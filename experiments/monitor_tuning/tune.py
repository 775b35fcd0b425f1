"""Tune the monitor's alarms on the collapse corpus's `tune` split (PROTOCOL.md here).

    python experiments/monitor_tuning/tune.py            # grid.csv, choice.json, results.md
    python experiments/monitor_tuning/tune.py --freeze   # and frozen.yaml (complete split only)
    python experiments/monitor_tuning/tune.py --freeze --stage organism   # amendment 1, stage 1

Reads `../collapse_corpus/manifest.csv` and the committed logs of its `tune` runs only (the log
reader refuses a run of another split), replays every cell of `grid.GRID` through the library
(`llds.monitor.alarms.scan_alarms`), scores with `llds.monitor.scoring` and applies the
protocol's choice rule (`choice.choose`). Every figure is in-sample; while the `tune` split is
incomplete the outputs say PRELIMINARY and `--freeze` is refused.
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import io
import json
import sys
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # experiments/: the studies' modules

from llds.io import atomic_write, write_json
from llds.monitor.registry import registered_detectors
from llds.monitor.replay import monitor_config_from
from llds.monitor.scoring import HEALTHY, CorpusRun, parse_manifest, scorecard_line, table
from llds.monitor.settings import BUILT_IN_ALARMS
from llds.report.attribution import verdict_of
from llds.report.sources import find_source, read_source
from monitor_tuning.choice import SPLIT, Choice, Figures, ReplayedRun, choose
from monitor_tuning.grid import (
    GRID,
    PROTOCOL_DEFAULTS,
    Grid,
    cells_of,
    monitor_section,
    replay_cells,
)
from monitor_tuning.judge import ROWS_HEAD, score_runs

HERE = Path(__file__).resolve().parent
CORPUS = HERE.parent / "collapse_corpus"
EXPECTED_TUNE: dict[str, int] = {
    "none": 12,
    "mismatch+tis": 4,
    "lr": 4,
    "mismatch": 4,
    "entropy": 4,
    "lld": 4,
    "lld+llds": 8,
}
"""The complete `tune` split (PROTOCOL.md, "Freezing"): healthy runs by arm (controls seeds 0-3
and extra healthy seeds 8-15; corrected twins 0-3), cause runs by mechanism (seeds 0-3; the
LLDS arms at two strengths)."""
IN_SAMPLE = "in-sample: the tune split"
STAGES: dict[str, frozenset[str]] = {
    "all": frozenset(),
    "organism": frozenset({"lld", "lld+llds"}),
}
"""The mechanisms each freezing stage leaves out (PROTOCOL.md, amendment 1): stage 1 freezes
on the organism's part of the tune split while the theorem world's `lld` runs are being made;
stage 2 (`all`) on the whole split."""


class SplitRefused(ValueError):
    """A run of another split than `tune` was about to be read."""


def tune_runs(corpus: Path) -> list[CorpusRun]:
    """The manifest's `tune` rows (every row is parsed, so a damaged manifest is refused)."""
    manifest = corpus / "manifest.csv"
    with manifest.open(newline="", encoding="utf-8") as f:
        runs = parse_manifest(csv.DictReader(f), str(manifest))
    return [r for r in runs if r.split == SPLIT]


def read_tune_log(corpus: Path, run: CorpusRun) -> list[dict[str, Any]]:
    """A `tune` run's committed rows; any other split is refused before its folder is opened."""
    if run.split != SPLIT:
        raise SplitRefused(f"{run.run}: split {run.split}: the tuning reads tune runs only")
    return read_source(find_source(corpus / run.run))


def replay(corpus: Path, runs: Sequence[CorpusRun], grid: Grid) -> list[ReplayedRun]:
    """Every tune run's alarm steps per cell and the causes its report names."""
    out = []
    for r in runs:
        rows = read_tune_log(corpus, r)
        out.append(ReplayedRun(r, verdict_of(rows, []).codes, replay_cells(rows, grid)))
    return out


def arm_key(run: CorpusRun) -> str:
    """How `EXPECTED_TUNE` counts a run: a healthy run by its arm, a cause run by mechanism."""
    return (run.arm or HEALTHY) if run.mechanism == HEALTHY else run.mechanism


def completeness(runs: Sequence[CorpusRun], expected: Mapping[str, int]) -> dict[str, list[int]]:
    """`{key: [have, expected]}` over every expected key and any other present."""
    have = Counter(arm_key(r) for r in runs)
    return {k: [have.get(k, 0), expected.get(k, 0)] for k in sorted({*expected, *have})}


def is_complete(counts: Mapping[str, Sequence[int]]) -> bool:
    return all(have >= want for have, want in counts.values())


def sample_sizes(runs: Sequence[CorpusRun]) -> dict[str, int]:
    causes = [r for r in runs if r.mechanism != HEALTHY and not r.censored]
    return {
        "runs": len(runs),
        "gradual_collapses": sum(r.gradual for r in causes),
        "abrupt_collapses": sum(r.collapse_step is not None and r.abrupt for r in causes),
        "cause_runs_not_collapsed": sum(r.collapse_step is None for r in causes),
        "censored": sum(r.censored for r in runs),
        "healthy_usable": sum(r.healthy for r in runs),
    }


def status_line(complete: bool, n: Mapping[str, int], stage: str = "all") -> str:
    said = (
        f"n = {n['runs']} tune runs: {n['gradual_collapses']} gradual collapse(s), "
        f"{n['abrupt_collapses']} abrupt, {n['healthy_usable']} healthy"
    )
    if complete and stage != "all":
        left = ", ".join(sorted(STAGES[stage]))
        return (
            f"in-sample, stage 1: the complete {stage} part of the tune split, without {left} "
            f"({said})"
        )
    if complete:
        return f"in-sample, complete tune split ({said})"
    return (
        f"PRELIMINARY: in-sample, incomplete tune split ({said}); not frozen, the library's "
        "defaults unchanged"
    )


# ------------------------------------------------------------------ outputs

GRID_COLUMNS = (
    "status",
    "cell",
    "detector",
    "index",
    "settings",
    "collapses",
    "timely",
    "median_lead",
    "leads",
    "healthy_usable",
    "healthy_false",
    "healthy_alarms",
    "all_alarms",
    "abrupt_warned",
    "eligible",
)


def grid_rows(choice: Choice, status: str) -> list[dict[str, Any]]:
    """One row per cell: its figures alone (in-sample)."""
    out = []
    for c, f in choice.alone.items():
        out.append(
            {
                "status": status,
                "cell": c.label,
                "detector": c.detector,
                "index": c.index,
                "settings": json.dumps(dict(c.overrides), sort_keys=True),
                "collapses": f.card.collapses,
                "timely": f.timely,
                "median_lead": "" if f.card.median_lead is None else f.card.median_lead,
                "leads": " ".join(str(x) for x in f.card.leads),
                "healthy_usable": f.healthy_usable,
                "healthy_false": f.healthy_false,
                "healthy_alarms": f.healthy_alarms,
                "all_alarms": f.all_alarms,
                "abrupt_warned": sum(r.abrupt_warned for r in f.card.causes),
                "eligible": "yes" if c in choice.eligible else "no",
            }
        )
    return out


def figures_json(f: Figures) -> dict[str, Any]:
    card = f.card
    rate = card.false_critical_per_10_healthy
    return {
        "critical": [c.label for c in f.cells],
        "timely": f"{card.timely}/{card.collapses}",
        "median_lead": card.median_lead,
        "leads": list(card.leads),
        "healthy_with_critical": f"{f.healthy_false}/{f.healthy_usable}",
        "false_critical_per_10_healthy": None if rate is None else round(rate, 3),
        "healthy_critical_alarms": f.healthy_alarms,
        "all_critical_alarms": f.all_alarms,
        "attributed": f"{card.attributed}/{card.collapses}",
        "scorecard": scorecard_line(card),
    }


def choice_json(
    choice: Choice, status: str, n: Mapping[str, int], counts: Mapping[str, Any], manifest: Path
) -> dict[str, Any]:
    chosen = choice.chosen
    return {
        "status": status,
        "sample": IN_SAMPLE,
        "protocol": "experiments/monitor_tuning/PROTOCOL.md",
        "command": "python experiments/monitor_tuning/tune.py",
        "manifest_sha256": hashlib.sha256(manifest.read_bytes()).hexdigest(),
        "n": dict(n),
        "tune_runs_have_expected": dict(counts),
        "eligible": [c.label for c in choice.eligible],
        "combinations_searched": choice.searched,
        "critical_settings": {c.detector: dict(c.overrides) for c in chosen.cells},
        "chosen": figures_json(chosen),
        "runner_up": None if choice.runner_up is None else figures_json(choice.runner_up),
        "note": (
            "the critical set takes effect through monitor.alarms.<name>.severity, which "
            "frozen.yaml sets (tune.py --freeze)"
        ),
    }


def results_md(
    choice: Choice, status: str, n: Mapping[str, int], frozen: tuple[list[str], list[str]]
) -> str:
    """A page with the grid, the choice and the chosen settings replayed as frozen (`frozen`:
    `judge.score_runs`'s lines and rows on the tune runs), every figure in-sample."""
    lines = [
        "# Monitor tuning on the collapse corpus's tune split",
        "",
        f"**{status}.** Written by `python experiments/monitor_tuning/tune.py` from the",
        "committed tune logs; do not edit. Every figure here is in-sample (the split the",
        "settings are chosen on); out-of-sample figures come only from `judge` and `heldout`,",
        "scored once with the frozen settings (PROTOCOL.md).",
        "",
        f"Sample: {json.dumps(dict(n))}.",
        "",
        "## Each cell alone (its alarms counted as critical)",
        "",
        "| cell | timely | leads | healthy with an alarm | alarms on healthy | eligible |",
        "|---|---|---|---|---|---|",
    ]
    for c, f in choice.alone.items():
        leads = ", ".join(str(x) for x in f.card.leads) or "-"
        lines.append(
            f"| `{c.label}` | {f.timely}/{f.card.collapses} | {leads} | "
            f"{f.healthy_false}/{f.healthy_usable} | {f.healthy_alarms} | "
            f"{'yes' if c in choice.eligible else 'no'} |"
        )
    chosen = choice.chosen
    named = ", ".join(f"`{c.label}`" for c in chosen.cells) or "none (no eligible cell)"
    lines += [
        "",
        "## The choice",
        "",
        f"Critical set: {named}; {choice.searched} combination(s) of eligible cells compared.",
        "",
        "```",
        *table(chosen.card),
        scorecard_line(chosen.card),
        "```",
    ]
    if choice.runner_up is not None:
        up = choice.runner_up
        lines += [
            "",
            "Runner-up: "
            + (", ".join(f"`{c.label}`" for c in up.cells) or "none")
            + f" ({scorecard_line(up.card)}; {up.healthy_alarms} alarms on healthy runs, "
            f"{up.all_alarms} on all).",
        ]
    score_lines, rows = frozen
    lines += [
        "",
        "## The chosen settings as frozen, replayed on the tune runs",
        "",
        "The monitor section `--freeze` writes (every other detector a warning), replayed the "
        "way `judge.py` replays `judge` and `heldout`: the warnings on healthy runs and the "
        "report's named cause, on the runs the choice was made on (in-sample).",
        "",
        "```",
        *score_lines,
        "```",
        "",
        *ROWS_HEAD,
        *rows,
    ]
    return "\n".join(lines) + "\n"


def with_severities(section: dict[str, Any], choice: Choice) -> dict[str, Any]:
    """`section` with each detector's `severity` (`monitor.alarms.<name>.severity`): critical
    for the chosen cells' detectors, warning for every other detector registered as critical
    (the protocol: critical only where the tune split chose it); the rest keep theirs."""
    chosen = {c.detector for c in choice.chosen.cells}
    alarms = section.setdefault("alarms", {})
    extra = section.get("extra_alarms", {})
    for spec in registered_detectors():
        demoted = spec.severity == "critical" and spec.name not in chosen
        if spec.name not in chosen and not demoted:
            continue
        where = alarms if spec.name in BUILT_IN_ALARMS else extra
        if spec.name in where or spec.name in BUILT_IN_ALARMS:
            where.setdefault(spec.name, {})["severity"] = "warning" if demoted else "critical"
    return section


def frozen_yaml(choice: Choice, status: str) -> str:
    """The chosen settings as a `monitor:` section the config system loads, and the critical
    set in its header; a detector not chosen keeps the protocol's defaults (`PROTOCOL_DEFAULTS`
    where the library's have moved since)."""

    section = monitor_section(choice.chosen.cells, disable_others=False)
    chosen = {c.detector for c in choice.chosen.cells}
    for name, setting in PROTOCOL_DEFAULTS.items():  # the rest keep the protocol's defaults
        if name not in chosen:
            section["alarms"].setdefault(name, {}).update(setting)
    section = with_severities(section, choice)
    body = yaml.safe_dump({"monitor": section}, sort_keys=True)
    critical = ", ".join(c.detector for c in choice.chosen.cells) or "none"
    head = [
        "# Monitor settings frozen from the collapse corpus's tune split",
        "# (experiments/monitor_tuning/PROTOCOL.md; tune.py --freeze; " + status + ").",
        f"# Critical: {critical}; every other detector registered as critical is a warning.",
    ]
    return "\n".join(head) + "\n" + body


def _write_text(path: Path, text: str) -> None:
    with atomic_write(path, "w", encoding="utf-8") as f:
        f.write(text)


def _csv_text(rows: Sequence[Mapping[str, Any]]) -> str:
    buf = io.StringIO()
    out = csv.DictWriter(buf, fieldnames=GRID_COLUMNS, lineterminator="\n")
    out.writeheader()
    out.writerows(rows)
    return buf.getvalue()


def run(
    corpus: Path,
    out: Path,
    *,
    freeze: bool = False,
    grid: Grid = GRID,
    expected: Mapping[str, int] = EXPECTED_TUNE,
    stage: str = "all",
) -> Choice:
    """Replay, choose, write `grid.csv`, `choice.json`, `results.md` (and `frozen.yaml`), on
    the tune runs of the `stage` (`STAGES`: which mechanisms it leaves out)."""
    left_out = STAGES[stage]
    runs = [r for r in tune_runs(corpus) if arm_key(r) not in left_out]
    counts = completeness(runs, {k: v for k, v in expected.items() if k not in left_out})
    complete = is_complete(counts)
    if freeze and not complete:
        short = {k: v for k, v in counts.items() if v[0] < v[1]}
        raise SystemExit(f"--freeze: the tune split is incomplete (have, expected): {short}")
    n = sample_sizes(runs)
    status = status_line(complete, n, stage)
    choice = choose(replay(corpus, runs, grid), cells_of(grid))
    _write_text(out / "grid.csv", _csv_text(grid_rows(choice, status)))
    write_json(out / "choice.json", choice_json(choice, status, n, counts, corpus / "manifest.csv"))
    frozen = yaml.safe_load(frozen_yaml(choice, status))["monitor"]
    monitor = monitor_config_from(frozen, "the chosen settings")
    replayed = score_runs(corpus, runs, monitor, SPLIT)
    _write_text(out / "results.md", results_md(choice, status, n, replayed))
    if freeze:
        _write_text(out / "frozen.yaml", frozen_yaml(choice, status))
    return choice


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--corpus", type=Path, default=CORPUS, help="folder with manifest.csv")
    ap.add_argument("--out", type=Path, default=HERE, help="where the outputs go")
    ap.add_argument("--freeze", action="store_true", help="also write frozen.yaml")
    ap.add_argument(
        "--stage",
        choices=sorted(STAGES),
        default="all",
        help="organism: stage 1, the tune split without the lld runs (amendment 1)",
    )
    args = ap.parse_args(argv)
    choice = run(args.corpus, args.out, freeze=args.freeze, stage=args.stage)
    for line in table(choice.chosen.card):
        print(line)
    print(scorecard_line(choice.chosen.card) + f"  ({IN_SAMPLE})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
