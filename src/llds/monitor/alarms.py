"""Collapse alarms raised online from the per-step metrics, and what the trainer should do.

`AlarmMonitor` runs every enabled detector of the registry (`llds.monitor.registry`; the
built-ins in `phase_alarms`, `searches` and `drift_alarms`) once per step over the same phase
label, and turns their firings into de-duplicated alarms: one per kind per episode of trouble,
re-armed after the condition has been quiet for `monitor.rearm_steps` steps. `should_act` maps
one step's alarms plus the `diagnostics.on_alarm` policy to one action. Each alarm's severity,
the mechanism it points at and whether it may stop or roll back a run are declared where its
detector is registered; `ACTIONABLE_KINDS` and `SEVERITY` are read from there.

Spikes that come together, or with a likelihood decay or a reward drop, are escalated by the
phase detector into the `collapse` phase, which raises the actionable `collapse` alarm.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from llds.monitor import drift_alarms, phase_alarms, searches  # noqa: F401  (they register)
from llds.monitor.phases import PhaseLabel, PhaseTracker
from llds.monitor.registry import Severity, StepView, detector_spec, mechanism_of, severity_of
from llds.monitor.settings import BUILT_IN_ALARMS, AlarmConfig, MonitorConfig, active_detectors

__all__ = ["AlarmConfig", "MonitorConfig"]

Policy = Literal["warn", "stop", "rollback"]
ActionKind = Literal["none", "warn", "stop", "rollback"]

_SPECS = [detector_spec(name) for name in BUILT_IN_ALARMS]
SEVERITY: dict[str, Severity] = {s.name: s.severity for s in _SPECS if s is not None}
"""Severity of every built-in alarm kind, in the order they run."""
ALARM_KINDS: tuple[str, ...] = tuple(SEVERITY)
ACTIONABLE_KINDS: frozenset[str] = frozenset(s.name for s in _SPECS if s and s.actionable)
POLICIES: tuple[str, ...] = ("warn", "stop", "rollback")

COMMON_EVIDENCE = ("logp_correct", "reward_level", "signals")
"""The phase detector's numbers every alarm carries, whichever detector raised it."""


@dataclass(frozen=True)
class Alarm:
    """One alarm: `since_step` in evidence is where the trouble started (for rollbacks)."""

    step: int
    kind: str
    severity: Severity
    message: str
    evidence: dict[str, Any] = field(default_factory=dict)

    @property
    def actionable(self) -> bool:
        """Whether its detector may stop or roll back a run."""
        spec = detector_spec(self.kind)
        return spec.actionable if spec is not None else self.kind in ACTIONABLE_KINDS

    @property
    def mechanism(self) -> str:
        """The mechanism its detector points at (`llds.monitor.registry.MECHANISMS`)."""
        return mechanism_of(self.kind)

    @property
    def since_step(self) -> int:
        since = self.evidence.get("since_step")
        return int(since) if since is not None else self.step

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def to_line(self) -> dict[str, Any]:
        """The alarm as `llds monitor replay --json` prints it: step, kind, severity, the
        mechanism it points at, message."""
        return {
            "step": self.step,
            "kind": self.kind,
            "severity": self.severity,
            "mechanism": self.mechanism,
            "message": self.message,
        }


@dataclass(frozen=True)
class Action:
    """What the trainer should do after a step's alarms.

    kind: none (no alarm), warn (log only), stop (save and stop), rollback (reload the newest
    checkpoint at or before `rollback_before_step`, e.g. with LLDS switched on).
    """

    kind: ActionKind
    alarms: tuple[Alarm, ...] = ()
    reason: str = ""
    rollback_before_step: int | None = None


def should_act(alarms: Sequence[Alarm], policy: str) -> Action:
    """Map one step's alarms and the on_alarm policy to a single action.

    warn: always just warn. stop / rollback: act only if an actionable alarm is present
    (`ACTIONABLE_KINDS`); warning-only kinds just warn.
    """
    if policy not in POLICIES:
        from llds.errors import ConfigError

        raise ConfigError(f"diagnostics.on_alarm={policy!r}: expected one of {', '.join(POLICIES)}")
    if not alarms:
        return Action("none")
    alarms = tuple(alarms)
    actionable = [a for a in alarms if a.actionable]
    if policy == "warn" or not actionable:
        return Action("warn", alarms, "; ".join(a.message for a in alarms))
    reason = "; ".join(f"{a.kind}: {a.message}" for a in actionable)
    if policy == "stop":
        return Action("stop", alarms, reason)
    before = min(a.since_step for a in actionable)
    return Action("rollback", alarms, reason, rollback_before_step=before)


class AlarmMonitor:
    """Online alarms: `update(row)` once per step returns the alarms newly raised at that step."""

    def __init__(self, config: MonitorConfig | None = None) -> None:
        self.config = config or MonitorConfig()
        self.tracker = PhaseTracker(self.config.phase)
        self.detectors = [
            (spec, severity_of(spec, s), spec.build(s)) for spec, s in active_detectors(self.config)
        ]
        self._active: dict[str, bool] = {}
        self._quiet: dict[str, int] = {}
        self.alarms: list[Alarm] = []
        self.label: PhaseLabel | None = None

    @property
    def phase(self) -> str | None:
        return self.label.phase if self.label else None

    def update(self, row: Mapping[str, Any]) -> list[Alarm]:
        label = self.tracker.update(row)
        self.label = label
        view = StepView(label.step, row, label, self.tracker.history, self.config.phase)
        raised = []
        for spec, severity, detector in self.detectors:
            kind = spec.name
            firing = detector.update(view)
            if firing is None:
                self._quiet[kind] = self._quiet.get(kind, 0) + 1
                if self._quiet[kind] >= self.config.rearm_steps:
                    self._active[kind] = False
                continue
            self._quiet[kind] = 0
            if self._active.get(kind):
                continue
            self._active[kind] = True
            evidence: dict[str, Any] = {"phase": label.phase, **firing.evidence}
            evidence.update({k: label.evidence[k] for k in COMMON_EVIDENCE})
            raised.append(Alarm(label.step, kind, severity, firing.message, evidence))
        self.alarms.extend(raised)
        return raised


def scan_alarms(
    rows: Iterable[Mapping[str, Any]], config: MonitorConfig | None = None
) -> list[Alarm]:
    """All alarms a monitor would have raised over a finished metrics log."""
    monitor = AlarmMonitor(config)
    for row in rows:
        monitor.update(row)
    return monitor.alarms
