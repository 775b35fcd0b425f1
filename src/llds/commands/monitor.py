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
    saved `monitor` section (the run named by `run_key`), then `--config FILE`'s `monitor`
    section (a training config or any YAML with one), then the command-line overrides."""
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
        run = given.get(run_key)
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


SUBCOMMANDS = {"replay": replay}
