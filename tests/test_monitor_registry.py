"""The alarm registry: every built-in declared once and configurable under `monitor.alarms`,
extra detectors by name, and the drift detectors firing at hand-counted steps.

The drift detectors compare a 10-step window median with the median of the run's first 20
steps. A series at `a` for steps 1-40 and at `b` from step 41 on: the first window is steps
21-30 (judged at step 30); at step 45 it holds five `b`s (median (a + b) / 2), at step 46 six
(median b).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from llds.config.schema import section
from llds.errors import ConfigError
from llds.monitor import MECHANISMS, DetectorSettings, Firing, register_detector
from llds.monitor.alarms import ACTIONABLE_KINDS, ALARM_KINDS, SEVERITY, AlarmMonitor, scan_alarms
from llds.monitor.baseline import Comparison, EarlyWindow
from llds.monitor.registry import detector_spec, registered_detectors, severity_of
from llds.monitor.replay import load_monitor_config, monitor_config_from
from llds.monitor.settings import AlarmsConfig, MonitorConfig, configured_detectors
from llds.train.config import TrainConfig

FROZEN = Path(__file__).resolve().parents[1] / "experiments" / "monitor_tuning" / "frozen.yaml"


def step_rows(n: int, **series: Any) -> list[dict[str, Any]]:
    """`n` rows; each keyword is a metric: a number, or a function of the step."""
    return [
        {"step": s, **{k.replace("__", "/"): v(s) if callable(v) else v for k, v in series.items()}}
        for s in range(1, n + 1)
    ]


def switch(a: float, b: float, at: int = 41):
    return lambda s: a if s < at else b


def only(kind: str, rows: list[dict[str, Any]], **settings: Any) -> list:
    cfg = MonitorConfig()
    for name in ALARM_KINDS:
        getattr(cfg.alarms, name).enabled = name == kind
    for key, value in settings.items():
        setattr(getattr(cfg.alarms, kind), key, value)
    return scan_alarms(rows, cfg)


# ------------------------------------------------------------------ the registry


def test_every_built_in_is_declared_once_and_has_its_section() -> None:
    names = [f.name for f in dataclasses.fields(AlarmsConfig)]
    assert names == list(ALARM_KINDS)
    for f in dataclasses.fields(AlarmsConfig):
        spec = detector_spec(f.name)
        assert spec is not None and isinstance(getattr(AlarmsConfig(), f.name), spec.settings)
        assert spec.mechanism in MECHANISMS and SEVERITY[f.name] == spec.severity
        assert f.name in {s.name for s in registered_detectors()}
    actionable = {"displacement_decay", "likelihood_decay", "collapse", "reward_collapse"}
    assert actionable == ACTIONABLE_KINDS
    # critical: the three the collapse corpus's tune split chose (frozen.yaml); stagnation info
    critical = {"search_decline", "entropy_drift", "lr_divergence"}
    assert {k for k, s in SEVERITY.items() if s == "critical"} == critical
    assert {k for k, s in SEVERITY.items() if s == "info"} == {"stagnation"}


def resolved(config: MonitorConfig) -> dict[str, Any]:
    """Every setting of `config`, each detector's severity the one in force."""
    out = dataclasses.asdict(config)
    for spec, settings in configured_detectors(config):
        section = out["alarms"] if spec.name in ALARM_KINDS else out["extra_alarms"]
        section[spec.name] = {
            **dataclasses.asdict(settings),
            "severity": severity_of(spec, settings),
        }
    return out


def test_the_defaults_are_the_settings_frozen_on_the_tune_split() -> None:
    """A run that sets nothing runs with frozen.yaml's settings (PROTOCOL.md: the library's
    defaults become the frozen settings after the freeze commit): every detector's switch,
    thresholds and severity, the phase detector's and re-arming's."""
    frozen = load_monitor_config(FROZEN)
    assert frozen.alarms.entropy_drift.high == 3.0  # the file is read, not the defaults
    assert frozen.alarms.collapse.severity == "warning"
    defaults = resolved(MonitorConfig())
    assert resolved(frozen) == defaults
    assert defaults["alarms"]["lr_divergence"]["grad_growth"] == 1.5
    assert defaults["alarms"]["displacement_decay"]["severity"] == "warning"
    assert defaults["alarms"]["search_decline"]["severity"] == "critical"


def test_the_run_config_holds_every_detector_setting() -> None:
    cfg = TrainConfig()
    assert cfg.monitor.alarms.search_decline.decline == 0.75
    assert cfg.monitor.alarms.reward_fall.fall == 0.5
    with pytest.raises(ConfigError, match=r"monitor\.alarms\.void_turns\.rise"):
        MonitorConfig(alarms=AlarmsConfig(void_turns={"rise": 0.5}))


def test_a_taken_name_or_an_unknown_mechanism_is_refused() -> None:
    with pytest.raises(ValueError, match="already registered"):
        register_detector(
            "collapse",
            severity="warning",
            mechanism="lld",
            settings=DetectorSettings,
            describe=lambda s, p: "",
        )(lambda s: None)
    with pytest.raises(ValueError, match="mechanism"):
        register_detector(
            "x",
            severity="warning",
            mechanism="gremlins",
            settings=DetectorSettings,
            describe=lambda s, p: "",
        )


@section(key="monitor.extra_alarms.every_tenth")
class EveryTenthSettings(DetectorSettings):
    """Test detector."""

    period: int = 10
    """fires on multiples of this"""


@register_detector(
    "every_tenth",
    severity="critical",
    mechanism="lr",
    settings=EveryTenthSettings,
    describe=lambda s, p: f"every {s.period}th step",
)
class EveryTenth:
    def __init__(self, settings: EveryTenthSettings) -> None:
        self.period = settings.period

    def update(self, view) -> Firing | None:
        return Firing(f"step {view.step}") if view.step % self.period == 0 else None


def test_an_extra_detector_runs_by_name_with_its_settings_and_rearms() -> None:
    rows = step_rows(30, reward__mean=0.5)
    cfg = MonitorConfig(extra_alarms={"every_tenth": {"period": 7}})
    alarms = [a for a in scan_alarms(rows, cfg) if a.kind == "every_tenth"]
    # quiet for 6 steps between firings: more than rearm_steps (5), so each fires
    assert [a.step for a in alarms] == [7, 14, 21, 28]
    assert alarms[0].severity == "critical" and alarms[0].mechanism == "lr"
    assert alarms[0].to_line() == {
        "step": 7,
        "kind": "every_tenth",
        "severity": "critical",
        "mechanism": "lr",
        "message": "step 7",
    }
    cfg = MonitorConfig(rearm_steps=7, extra_alarms={"every_tenth": {"period": 7}})
    assert [a.step for a in scan_alarms(rows, cfg) if a.kind == "every_tenth"] == [7]
    with pytest.raises(ConfigError, match=r"monitor\.extra_alarms\.nope: not a registered"):
        AlarmMonitor(MonitorConfig(extra_alarms={"nope": {}}))
    with pytest.raises(ConfigError, match=r"monitor\.extra_alarms\.every_tenth"):
        AlarmMonitor(MonitorConfig(extra_alarms={"every_tenth": {"no_such": 1}}))


def test_switching_a_detector_off_leaves_the_others_alone() -> None:
    rows = step_rows(
        80,
        reward__mean=switch(0.5, 0.5),
        policy__entropy=switch(1.0, 0.1),
        turns__void_share=switch(0.0, 0.5),
    )
    both = scan_alarms(rows)
    cfg = MonitorConfig()
    cfg.alarms.entropy_drift.enabled = False
    without = scan_alarms(rows, cfg)
    assert "entropy_drift" in {a.kind for a in both}
    assert [a for a in both if a.kind != "entropy_drift"] == without


def test_a_detectors_severity_is_set_from_the_config_and_changes_nothing_else() -> None:
    """`monitor.alarms.<name>.severity`: the tuned settings choose which alarms are critical;
    the alarms themselves (steps, messages) stay the same."""
    rows = step_rows(
        80,
        reward__mean=switch(0.5, 0.5),
        policy__entropy=switch(1.0, 0.1),
    )
    registered = scan_alarms(rows)
    drift = [a for a in registered if a.kind == "entropy_drift"]
    assert drift and {a.severity for a in drift} == {SEVERITY["entropy_drift"]} == {"critical"}
    cfg = monitor_config_from({"alarms": {"entropy_drift": {"severity": "warning"}}}, "t.yaml")
    raised = scan_alarms(rows, cfg)
    assert [(a.step, a.kind, a.message) for a in raised] == [
        (a.step, a.kind, a.message) for a in registered
    ]
    assert [a.severity for a in raised] == [
        "warning" if a.kind == "entropy_drift" else a.severity for a in registered
    ]
    with pytest.raises(ConfigError, match=r"monitor\.alarms\.entropy_drift\.severity"):
        monitor_config_from({"alarms": {"entropy_drift": {"severity": "loud"}}}, "t.yaml")


def test_early_window_compares_the_first_values_with_the_last() -> None:
    w = EarlyWindow(early=3, window=2)
    # baseline: the first three known values (step 2 is not logged): 1, 3, 2 -> median 2
    got = [w.update(s, v) for s, v in [(1, 1.0), (2, None), (3, 3.0), (4, 2.0), (5, 9.0)]]
    assert got == [None] * 5  # the window holds one value of two
    assert w.update(6, 7.0) == Comparison(2.0, 8.0, 1, 4, 5, (9.0, 7.0))
    assert w.update(7, 1.0) == Comparison(2.0, 4.0, 1, 4, 6, (7.0, 1.0))


# ------------------------------------------------------------------ the drift detectors


def test_sampler_mismatch_fires_when_the_k3_kl_doubles_above_its_floor() -> None:
    rows = step_rows(80, mismatch__k3_kl=switch(0.001, 0.004))
    (a,) = only("sampler_mismatch", rows)
    assert a.step == 45 and a.mechanism == "mismatch" and a.severity == "warning"
    assert a.evidence["window_median"] == pytest.approx(0.0025)
    assert a.evidence["since_step"] == 36 and a.evidence["early_last"] == 20
    assert "over steps 36-45 against 0.001 over steps 1-20" in a.message
    # a doubling of a rounding-level mismatch stays below the floor
    assert only("sampler_mismatch", step_rows(80, mismatch__k3_kl=switch(1e-5, 4e-5))) == []
    # TRL logs only the mean |log-prob difference|
    diff = step_rows(80, mismatch__abs_logp_diff_mean=switch(0.03, 0.12))
    assert [a.step for a in only("sampler_mismatch", diff)] == [45]


def test_void_turns_needs_a_doubling_and_a_tenth_more() -> None:
    assert [
        a.step for a in only("void_turns", step_rows(80, turns__void_share=switch(0.05, 0.3)))
    ] == [45]
    # 0.3 -> 0.65: median 0.475 at 45 is not 2 x 0.3; 0.65 at 46 is
    assert [
        a.step for a in only("void_turns", step_rows(80, turns__void_share=switch(0.3, 0.65)))
    ] == [46]
    # 0.01 -> 0.05 is five-fold but not 0.1 more
    assert only("void_turns", step_rows(80, turns__void_share=switch(0.01, 0.05))) == []


def test_entropy_drift_fires_on_a_collapse_and_on_a_blow_up() -> None:
    (down,) = only("entropy_drift", step_rows(80, policy__entropy=switch(1.0, 0.2)))
    assert down.step == 46 and down.message.startswith("entropy collapsed")  # 0.6 at 45
    (up,) = only("entropy_drift", step_rows(80, policy__entropy=switch(1.0, 3.5)))
    assert up.step == 46 and up.message.startswith("entropy blew up")  # 2.25 at 45
    # 2.5x is below the default `high` (3, chosen on the tune split), above the old one (2)
    assert only("entropy_drift", step_rows(80, policy__entropy=switch(1.0, 2.5))) == []
    (old,) = only("entropy_drift", step_rows(80, policy__entropy=switch(1.0, 2.5)), high=2.0)
    assert old.step == 46  # 1.75 at 45
    assert only("entropy_drift", step_rows(80, policy__entropy=switch(1.0, 0.2)), low=0.1) == []


def test_lr_divergence_needs_the_learning_rate_to_rise() -> None:
    lr, grad = switch(1e-6, 3e-6), switch(1.0, 3.0)
    # at 45: lr median 2e-6 (x2 >= 1.5), grad median 2.0 (x2 >= 1.5); at 44 both still x1
    (a,) = only("lr_divergence", step_rows(80, lr=lr, policy__grad_norm=grad))
    assert a.step == 45 and a.mechanism == "lr" and a.evidence["lr_ratio"] == pytest.approx(2.0)
    # a gradient norm grown 1.8x: over the default `grad_growth` (1.5, chosen on the tune
    # split) from step 46 (median 1.4 at 45), under the old one (2)
    slow = step_rows(80, lr=lr, policy__grad_norm=switch(1.0, 1.8))
    assert [a.step for a in only("lr_divergence", slow)] == [46]
    assert only("lr_divergence", slow, grad_growth=2.0) == []
    # the same gradient growth at a constant learning rate (a death spiral's) is not this
    assert only("lr_divergence", step_rows(80, lr=1e-6, policy__grad_norm=grad)) == []
    # without a logged learning rate it cannot tell, and does not fire
    assert only("lr_divergence", step_rows(80, policy__grad_norm=grad)) == []
    # an update size that follows the learning rate (x3 with x3) is an Adam step; x6 is not:
    # at 45 the update median is 3.5e-4 (x3.5) against 1.5 x lr's x2 = 3
    follows = step_rows(80, lr=lr, optim__update_ratio=switch(1e-4, 3e-4))
    assert only("lr_divergence", follows) == []
    outgrows = step_rows(80, lr=lr, optim__update_ratio=switch(1e-4, 6e-4))
    assert [a.step for a in only("lr_divergence", outgrows)] == [45]


def test_reward_fall_fires_when_half_the_gain_is_given_back() -> None:
    # early median 0.2; window medians 0.6 from step 30 (peak 0.6 at 30): gain 0.4; the
    # threshold 0.6 - 0.5 x 0.4 = 0.4; from step 61 at 0.3: median 0.45 at 65, 0.3 at 66
    reward = lambda s: 0.2 if s <= 20 else 0.6 if s <= 60 else 0.3  # noqa: E731
    (a,) = only("reward_fall", step_rows(100, reward__mean=reward))
    assert a.step == 66 and a.evidence["peak_step"] == 30
    assert "gives back 75% of its gain" in a.message
    assert only("reward_fall", step_rows(100, reward__mean=reward), fall=0.8) == []
    # a run that never gained cannot give back
    assert only("reward_fall", step_rows(100, reward__mean=lambda s: 0.5 if s < 60 else 0.3)) == []
