"""The monitor's settings: the run-config section `monitor` (phase detector, re-arming, and one
section per alarm detector under `monitor.alarms.<name>`).

The trainer, a resumed or rolled-back run, `llds monitor replay`, `llds report` and the TRL
adapter all build their monitor from this one section (`llds.monitor.alarms.AlarmMonitor`), so
an alarm replayed on a finished log is the alarm the run raised.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any

from pydantic import Field

from llds.config.schema import section
from llds.errors import ConfigError
from llds.monitor.drift_alarms import (
    EntropyDriftSettings,
    LRDivergenceSettings,
    RewardFallSettings,
    SamplerMismatchSettings,
    VoidTurnsSettings,
)
from llds.monitor.phase_alarms import (
    CollapseSettings,
    DisplacementDecaySettings,
    LikelihoodDecaySettings,
    NonfiniteSettings,
    RewardCollapseSettings,
    SpikeSettings,
    StagnationSettings,
)
from llds.monitor.phases import PhaseConfig
from llds.monitor.registry import DetectorSpec, detector_spec, registered_detectors
from llds.monitor.searches import SearchDeclineSettings


def _default(cls: type) -> Any:
    return dataclasses.field(default_factory=cls)


@section(key="monitor.alarms")
class AlarmsConfig:
    """The built-in alarm detectors, each under its name (which is also its alarm's kind); they
    run in this order every step. Their defaults are the settings frozen on the collapse
    corpus's tune split (experiments/monitor_tuning/frozen.yaml): the three that predicted
    collapses there are critical, the others warnings (stagnation an info)."""

    displacement_decay: DisplacementDecaySettings = _default(DisplacementDecaySettings)
    """warning, LLD: the responses GRPO reinforces keep losing likelihood"""
    likelihood_decay: LikelihoodDecaySettings = _default(LikelihoodDecaySettings)
    """warning, LLD: the correct responses' rollout-time likelihood keeps falling"""
    collapse: CollapseSettings = _default(CollapseSettings)
    """warning: the phase detector's collapse phase"""
    reward_collapse: RewardCollapseSettings = _default(RewardCollapseSettings)
    """warning: the smoothed reward held far below its peak"""
    stagnation: StagnationSettings = _default(StagnationSettings)
    """info, LLD: likelihood flat while the reward rises"""
    entropy_spike: SpikeSettings = _default(SpikeSettings)
    """warning, entropy: a one-step jump of the entropy"""
    grad_norm_spike: SpikeSettings = _default(SpikeSettings)
    """warning: a one-step jump of the gradient norm"""
    ratio_spike: SpikeSettings = _default(SpikeSettings)
    """warning: a one-step jump of the largest likelihood ratio"""
    nonfinite: NonfiniteSettings = _default(NonfiniteSettings)
    """warning: optimizer updates skipped for non-finite values"""
    search_decline: SearchDeclineSettings = _default(SearchDeclineSettings)
    """critical, tool: fewer valid searches than early in the run"""
    sampler_mismatch: SamplerMismatchSettings = _default(SamplerMismatchSettings)
    """warning, mismatch: the sampler drifting from the trained policy"""
    void_turns: VoidTurnsSettings = _default(VoidTurnsSettings)
    """warning, tool: more rollouts with a void turn than early in the run"""
    entropy_drift: EntropyDriftSettings = _default(EntropyDriftSettings)
    """critical, entropy: entropy far below or above its early level"""
    lr_divergence: LRDivergenceSettings = _default(LRDivergenceSettings)
    """critical, learning rate: steps outgrowing a rising learning rate"""
    reward_fall: RewardFallSettings = _default(RewardFallSettings)
    """warning: the reward giving back much of its gain"""


@section(key="monitor")
class MonitorConfig:
    """Collapse alarms raised online from the per-step metrics (`diagnostics.alarms` switches
    them on; `diagnostics.on_alarm` says what an alarm does)."""

    rearm_steps: int = Field(default=5, ge=1)
    """quiet steps after which an alarm kind can fire again: one alarm per episode of trouble,
    not one per step"""
    phase: PhaseConfig = _default(PhaseConfig)
    """the phase detector, whose thresholds the decay, collapse, spike and stagnation alarms
    share"""
    alarms: AlarmsConfig = _default(AlarmsConfig)
    """the alarm detectors, each with its switch and thresholds"""
    extra_alarms: dict[str, dict[str, Any]] = dataclasses.field(default_factory=dict)
    """detectors registered outside llds (`llds.monitor.register_detector`, in a module
    imported before the monitor is built), by name, each with its settings' overrides ({} for
    its defaults); they run after the built-ins"""


BUILT_IN_ALARMS: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(AlarmsConfig))
"""The built-in alarm kinds, in the order they run."""

AlarmConfig = MonitorConfig
"""The name the monitor's settings had before they were a run-config section."""


def configured_detectors(config: MonitorConfig) -> Iterator[tuple[DetectorSpec, Any]]:
    """`(spec, settings)` of every detector the config names, switched on or off, in the
    order they run: the built-ins in `AlarmsConfig` order, then `extra_alarms`. An extra name
    that is not registered, or settings its detector refuses, is a `ConfigError` naming the
    key."""
    for name in BUILT_IN_ALARMS:
        spec = detector_spec(name)
        assert spec is not None, f"built-in alarm {name} is not registered"
        yield spec, getattr(config.alarms, name)
    for name, overrides in config.extra_alarms.items():
        spec = detector_spec(name)
        key = f"monitor.extra_alarms.{name}"
        if spec is None or name in BUILT_IN_ALARMS:
            extra = [s.name for s in registered_detectors() if s.name not in BUILT_IN_ALARMS]
            raise ConfigError(
                f"{key}: not a registered extra alarm detector (registered: {extra or 'none'}; "
                "register with llds.monitor.register_detector)"
            )
        try:
            settings = spec.settings(**overrides)
        except (ConfigError, TypeError) as exc:
            raise ConfigError(f"{key}: {exc}") from None
        yield spec, settings


def active_detectors(config: MonitorConfig) -> Iterator[tuple[DetectorSpec, Any]]:
    """The switched-on part of `configured_detectors`."""
    return ((spec, s) for spec, s in configured_detectors(config) if s.enabled)
