"""Replaying the alarms on a finished log: the settings of `llds monitor replay`, the monitor
settings a YAML file's `monitor:` section gives, and the lines the command prints.

The replay is `scan_alarms` over the run's rows with the settings in force: the run's own
saved `monitor` section, then a file's, then `key=value` overrides, so an alarm can be replayed
as the run raised it or with the settings a user is about to try.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from llds.config.loader import read_yaml, source_name, validate
from llds.config.schema import section
from llds.errors import ConfigError
from llds.monitor.alarms import Alarm
from llds.monitor.settings import MonitorConfig

MONITOR_KEY = "monitor"


@section
class ReplayConfig:
    """`llds monitor replay`: the alarms a run's log raises with the run's own monitor settings
    (its saved config's `monitor` section) or others (`--config FILE`'s `monitor` section, then
    `monitor.*=...` overrides)."""

    run: str = ""
    """the run: a native run directory (`metrics.jsonl`, or a study's `metrics.jsonl.gz`), a
    TRL output directory (`trainer_state.json`), a veRL metrics log (file-logger `.jsonl`) or a
    directory of TensorBoard event files; on the command line, the positional"""
    json: bool = False
    """print one alarm per line as JSON (`step`, `kind`, `severity`, `mechanism`, `message`)
    instead of text, for scripts"""
    monitor: MonitorConfig = dataclasses.field(default_factory=MonitorConfig)
    """the alarms' settings (the run config's `monitor` section)"""

    def missing(self) -> list[tuple[str, str]]:
        """Required keys left empty."""
        return [] if self.run else [("run", "required (a run directory or metrics log)")]


def monitor_section(data: Any, source: str) -> dict[str, Any]:
    """The `monitor` mapping of a config file's data (a training config, a printed config or a
    file written for the monitor; other keys are not read); a file without one is refused."""
    if not isinstance(data, Mapping) or not isinstance(data.get(MONITOR_KEY), Mapping):
        raise ConfigError(
            f"{source}: no `{MONITOR_KEY}:` section (the alarms' settings, as "
            "`llds train --print-config` shows them)"
        )
    return dict(data[MONITOR_KEY])


def monitor_config_from(section_data: Mapping[str, Any] | None, source: str) -> MonitorConfig:
    """The monitor settings of a `monitor` mapping (a saved config's; None: the defaults);
    errors name `source` and the dotted key."""
    if section_data is None:
        return MonitorConfig()
    return validate(ReplayConfig, {MONITOR_KEY: dict(section_data), "run": "-"}, source).monitor


def load_monitor_config(path: str | Path | None) -> MonitorConfig:
    """The monitor settings of a YAML file's `monitor:` section (`base:` chains followed);
    None: the defaults. Errors name the file and the dotted key."""
    if path is None:
        return MonitorConfig()
    name = source_name(Path(path))
    return monitor_config_from(monitor_section(read_yaml(path), name), name)


def text_line(alarm: Alarm) -> str:
    """One alarm as `llds monitor replay` prints it."""
    mechanism = "" if alarm.mechanism == "unspecific" else f" [{alarm.mechanism}]"
    return f"step {alarm.step:>5}  {alarm.severity:<8}  {alarm.kind}{mechanism}: {alarm.message}"


def json_line(alarm: Alarm) -> str:
    """One alarm as `--json` prints it."""
    return json.dumps(alarm.to_line())


def summary_line(alarms: Sequence[Alarm], steps: int) -> str:
    """How many alarms of each severity over how many logged steps."""
    counts = {s: sum(a.severity == s for a in alarms) for s in ("critical", "warning", "info")}
    said = ", ".join(f"{n} {s}" for s, n in counts.items())
    return f"{len(alarms)} alarm(s) over {steps} logged steps: {said}"
