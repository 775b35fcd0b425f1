"""Alarm detectors, registered by name (as loss terms are, `llds.algo.register_loss_term`).

A detector watches the metric rows of one run as they come: `update(view)` once per step, with
the step's row, the phase detector's label and its bounded history (`StepView`), returns a
`Firing` (a message citing steps and numbers, and its evidence) while its condition holds, None
otherwise. It keeps whatever state it needs (a baseline, a counter) and reads nothing but the
logged metrics. The monitor (`llds.monitor.alarms.AlarmMonitor`) turns firings into alarms: one
per episode of trouble, re-armed after `monitor.rearm_steps` quiet steps.

Everything about a detector is declared once, where it is registered: its name (the alarm's
kind and its key under `monitor.alarms`), its severity, the mechanism it points at
(`MECHANISMS`), whether it may stop or roll back a run, its settings (a config `section`) and a
sentence saying what it watches with the thresholds in force (the report's and the docs' list).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from llds.config.schema import section
from llds.monitor.phases import PhaseConfig, PhaseLabel, Sample

Severity = Literal["info", "warning", "critical"]

MECHANISMS: dict[str, str] = {
    "lld": "lazy likelihood displacement: the responses GRPO reinforces lose likelihood",
    "entropy": "the policy's entropy collapsing or blowing up",
    "lr": "learning-rate divergence: steps too large for the landscape",
    "mismatch": "the sampling policy drifting from the trained one",
    "tool": "the tool stops helping: void turns, fewer searches",
    "unspecific": "a symptom several mechanisms share (a reward fall, a spike, a skipped update)",
}
"""The mechanism an alarm points at, by code. The codes are the collapse corpus's mechanism
names (`lld`, `lr`, `mismatch`, `tool`, `entropy`); `unspecific` marks the symptoms."""


@section
class DetectorSettings:
    """The settings every detector has; a detector's own section adds its thresholds."""

    enabled: bool = True
    """raise this alarm; off, the detector does not run at all"""
    severity: Severity | None = None
    """this alarm's severity; unset, the one it was registered with. Critical is what the
    monitor's scorecard counts as a warning of collapse: which detectors are critical is
    chosen on the collapse corpus's tune split (docs/diagnostics.md)"""


@dataclass(frozen=True)
class StepView:
    """What a detector may read at one step: the logged row, the phase detector's label and
    its recent samples (oldest first), and the phase detector's settings."""

    step: int
    row: Mapping[str, Any]
    label: PhaseLabel
    history: Sequence[Sample]
    phase: PhaseConfig


@dataclass(frozen=True)
class Firing:
    """A detector's condition holds: what to say and the numbers behind it (`since_step` in
    `evidence` is where the trouble started, for rollbacks)."""

    message: str
    evidence: dict[str, Any] = field(default_factory=dict)


class Detector(Protocol):
    """One run's detector: called once per step, in step order."""

    def update(self, view: StepView) -> Firing | None: ...


@dataclass(frozen=True)
class DetectorSpec:
    """A registered detector and everything declared about it."""

    name: str
    severity: Severity
    mechanism: str
    actionable: bool
    """may stop or roll back a run (`diagnostics.on_alarm: stop | rollback`)"""
    settings: type
    """its settings: a config `section` with at least `enabled`"""
    build: Callable[[Any], Detector]
    """`build(settings)` -> a fresh detector for one run"""
    describe: Callable[[Any, PhaseConfig], str]
    """`describe(settings, phase)`: what it watches, with the thresholds in force (plain text,
    metric names in backticks)"""


_REGISTRY: dict[str, DetectorSpec] = {}


def register_detector(
    name: str,
    *,
    severity: Severity,
    mechanism: str,
    settings: type,
    describe: Callable[[Any, PhaseConfig], str],
    actionable: bool = False,
) -> Callable[[Callable[[Any], Detector]], Callable[[Any], Detector]]:
    """Register `build(settings) -> Detector` (usually the detector's class) as the alarm
    `name`. Registering a taken name is an error (no silent replacement); so is a mechanism
    that is not one of `MECHANISMS`."""
    if mechanism not in MECHANISMS:
        raise ValueError(f"detector {name!r}: mechanism {mechanism!r} not in {list(MECHANISMS)}")

    def add(build: Callable[[Any], Detector]) -> Callable[[Any], Detector]:
        if name in _REGISTRY and _REGISTRY[name].build is not build:
            raise ValueError(f"an alarm detector named {name!r} is already registered")
        _REGISTRY[name] = DetectorSpec(
            name, severity, mechanism, actionable, settings, build, describe
        )
        return build

    return add


def severity_of(spec: DetectorSpec, settings: Any) -> Severity:
    """The severity in force for a detector: its settings' `severity` where set (a detector
    registered outside llds may have settings without one), else the registered one."""
    return getattr(settings, "severity", None) or spec.severity


def registered_detectors() -> tuple[DetectorSpec, ...]:
    """Every registered detector, in registration order (the built-ins first)."""
    return tuple(_REGISTRY.values())


def detector_spec(name: str) -> DetectorSpec | None:
    """The registered detector `name`, or None."""
    return _REGISTRY.get(name)


def mechanism_of(kind: str) -> str:
    """The mechanism an alarm kind points at (`unspecific` for a kind no detector declares,
    e.g. one read from an old log)."""
    spec = _REGISTRY.get(kind)
    return spec.mechanism if spec is not None else "unspecific"
