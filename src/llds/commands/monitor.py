"""`llds monitor replay RUN` / `llds monitor score CORPUS --split S`: the collapse alarms
replayed on any run's log, and scored on a corpus of runs whose collapses have known causes.

`replay` prints the alarms a run's log raises with the run's own monitor settings (its saved
config's `monitor` section), `--config FILE`'s `monitor` section, then `monitor.*=...`
overrides; `--json` prints one alarm per line. `score` reads `CORPUS/manifest.csv`, replays
each run of the split and prints, per mechanism, how many collapses were warned in time, with
the scorecard as its last line (docs/diagnostics.md, "Scoring the monitor").
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from pathlib import Path
from types import SimpleNamespace
from typing import Any

HELP = "replay the collapse alarms on a run's log, or score them on a corpus of runs"


def load_with_saved_monitor(cls: type, run_key: str) -> Any:
    """A loader (`path, overrides -> config`) for a config with a `monitor` section: the run's
    saved `monitor` section (the run named by `run_key`; "": none), then `--config FILE`'s
    `monitor` section (a training config or any YAML with one), then the command-line
    overrides."""
    from llds.config.loader import (
        COMMAND_LINE,
        Gathered,
        build,
        nest,
        plain_overrides,
        read_yaml,
        source_name,
    )
    from llds.monitor.replay import MONITOR_KEY, monitor_section
    from llds.report.run_info import saved_monitor

    def load(path: str | Path | None, overrides: Mapping[str, Any]) -> Any:
        given = plain_overrides(nest(overrides), cls)
        got = Gathered()
        run = given.get(run_key) if run_key else None
        if isinstance(run, str) and run:
            section, where = saved_monitor(run)
            if section is not None:
                got.add(str(where), {MONITOR_KEY: section}, cls, ())
        if path:
            name = source_name(Path(path))
            got.top = name
            got.add(name, {MONITOR_KEY: monitor_section(read_yaml(path), name)}, cls, ())
        got.add(COMMAND_LINE, given, cls, ())
        return build(cls, got)

    return load


def settings_note(run: str, config_file: str | None) -> str:
    """Where the settings came from, in one line."""
    from llds.report.run_info import saved_monitor

    section, where = saved_monitor(run)
    if section is not None:
        said = f"the monitor section of {where}"
    elif where is not None:
        said = f"the defaults ({where} has no monitor section)"
    else:
        said = "the defaults (the run saved no config)"
    return f"settings: {said}" + (f", then {config_file}" if config_file else "")


def _replay(cfg: Any, args: argparse.Namespace) -> int:
    import sys

    from llds.monitor.alarms import scan_alarms
    from llds.monitor.replay import json_line, summary_line, text_line
    from llds.report.sources import find_source, read_source

    source = find_source(Path(cfg.run))
    rows = read_source(source)
    alarms = scan_alarms(rows, cfg.monitor)
    note = f"{source.path} ({source.kind} log); {settings_note(cfg.run, args.config)}"
    if cfg.json:
        print(note, file=sys.stderr)
        for alarm in alarms:
            print(json_line(alarm))
        return 0
    print(note)
    for alarm in alarms:
        print(text_line(alarm))
    print(summary_line(alarms, len(rows)))
    return 0


replay = SimpleNamespace(
    HELP="the alarms a run's log raises, with the run's own or other monitor settings",
    CONFIG="llds.monitor.replay:ReplayConfig",
    LOAD="llds.commands.monitor:load_replay",
    ALIASES={"--json": "json"},
    REST=("run", ", and the run directory or metrics log"),
    run=_replay,
)


def load_replay(path: str | Path | None, overrides: Mapping[str, Any]) -> Any:
    """`llds monitor replay`'s loader."""
    from llds.monitor.replay import ReplayConfig

    return load_with_saved_monitor(ReplayConfig, "run")(path, overrides)


def _score(cfg: Any, args: argparse.Namespace) -> int:
    import csv

    from llds.errors import UserInputError
    from llds.monitor.alarms import scan_alarms
    from llds.monitor.scoring import (
        Outcome,
        parse_manifest,
        score,
        scorecard_line,
        table,
    )
    from llds.report.attribution import verdict_of
    from llds.report.sources import find_source, read_source

    corpus = Path(cfg.corpus)
    manifest = corpus / "manifest.csv"
    if not manifest.is_file():
        raise UserInputError(f"{manifest} does not exist (a corpus folder holds manifest.csv)")
    with manifest.open(newline="", encoding="utf-8") as f:
        runs = parse_manifest(csv.DictReader(f), str(manifest))
    chosen = [r for r in runs if r.split == cfg.split]
    if not chosen:
        raise UserInputError(f"{manifest}: no run in split {cfg.split}")
    outcomes = []
    for r in chosen:
        rows = read_source(find_source(corpus / r.run))
        alarms = scan_alarms(rows, cfg.monitor)
        outcomes.append(Outcome.replayed(r, rows, alarms, verdict_of(rows, alarms).codes))
    card = score(outcomes, cfg.split, cfg.lead)
    for line in table(card, cfg.lead):
        print(line)
    print(scorecard_line(card))
    return 0


score_command = SimpleNamespace(
    HELP="score the alarms on a corpus split: collapses warned in time, false critical alarms",
    CONFIG="llds.monitor.scoring:ScoreConfig",
    LOAD="llds.commands.monitor:load_score",
    ALIASES={"--split": "split", "--lead": "lead"},
    REST=("corpus", ", and the corpus folder (with manifest.csv)"),
    run=_score,
)


def load_score(path: str | Path | None, overrides: Mapping[str, Any]) -> Any:
    """`llds monitor score`'s loader: the settings under test are `--config FILE`'s monitor
    section and the overrides (no run's saved ones: `corpus` names no run)."""
    from llds.monitor.scoring import ScoreConfig

    return load_with_saved_monitor(ScoreConfig, "")(path, overrides)


SUBCOMMANDS = {"replay": replay, "score": score_command}
