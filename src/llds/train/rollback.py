"""Alarms -> actions: what the trainer does when the monitor raises an alarm (log it, stop, or
roll back to a sound checkpoint and turn LLDS on), and where a rollback goes.

A rollback takes the newest checkpoint at or before the alarm's onset that passes the checks
resume makes (`checkpoint.find_resumable`): a damaged one is passed over, and named.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Sequence
from pathlib import Path

from llds.config.algo import LLDSConfig
from llds.monitor.alarms import Action, Alarm, AlarmMonitor, should_act
from llds.runs.tracking import read_metrics
from llds.train.checkpoint import find_resumable
from llds.train.config import TrainConfig

log = logging.getLogger("llds.train")

ALARMS_FILE = "alarms.jsonl"


class CollapseAlarmStop(RuntimeError):
    """`diagnostics.on_alarm=stop` and an actionable collapse alarm fired."""


def new_monitor(cfg: TrainConfig, run_dir: Path, step: int) -> AlarmMonitor | None:
    """A fresh monitor fed with the run's logged history up to `step` (so that a resume or a
    rollback does not reset it); None when alarms are off."""
    if not (cfg.diagnostics.enabled and cfg.diagnostics.alarms):
        return None
    monitor = AlarmMonitor(cfg.monitor)
    for row in read_metrics(run_dir):
        if row.get("step", 0) <= step:
            monitor.update(row)
    return monitor


def decide(alarms: Sequence[Alarm], on_alarm: str, run_dir: Path, *, write: bool) -> Action:
    """What to do about `alarms` (`diagnostics.on_alarm`); each is logged and, by the main
    process (`write`), appended to `alarms.jsonl` with the action taken."""
    action = should_act(list(alarms), on_alarm)
    for a in alarms:
        log.warning("step %d: %s alarm (%s): %s", a.step, a.kind, a.severity, a.message)
    if write:
        with (run_dir / ALARMS_FILE).open("a", encoding="utf-8") as f:
            for a in alarms:
                f.write(json.dumps({**a.to_dict(), "action": action.kind}) + "\n")
    return action


def rollback_target(ckpt_root: Path, before_step: int) -> Path:
    """The newest sound checkpoint at or before `before_step`; stops the run when none is
    kept."""
    target, damaged = find_resumable(ckpt_root, at_or_before=before_step)
    for path, why in damaged:
        log.warning("rollback passes over checkpoint %s: %s", path.name, why)
    if target is None:
        raise CollapseAlarmStop(
            f"rollback requested to a step <= {before_step} but no sound checkpoint is kept "
            "(lower save_every or raise keep_checkpoints); stopping instead"
        )
    return target


def rollback_llds(cfg: TrainConfig) -> LLDSConfig:
    """The LLDS settings in force after a rollback: the config's with LLDS on, at a coefficient
    of at least `diagnostics.rollback_llds_coef` (the config itself is left as the user wrote
    it; the step's `LLDSInForce` is built from these)."""
    coef = max(cfg.algo.llds.coef, cfg.diagnostics.rollback_llds_coef)
    return dataclasses.replace(cfg.algo.llds, enabled=coef > 0, coef=coef)
