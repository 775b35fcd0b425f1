"""The alarms that read the phase detector (`llds.monitor.phases`): likelihood decay, the
collapse phase, the reward collapse, stagnation, spikes; and skipped updates.

Their thresholds are the phase detector's (`monitor.phase.*`), because the collapse phase
combines the same decay, spikes and reward drop: one setting moves the phase and its alarm
together. Their own sections hold the switch and, for stagnation, how long it must last.
Reward lags collapse by tens of steps; the paper's early warning is the correct-response
likelihood falling while reward still rises, measured directly by the displacement of the
responses GRPO pushes up (`displacement_decay`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from pydantic import Field

from llds import metrics as keys
from llds.config.schema import section
from llds.monitor.phases import PhaseConfig
from llds.monitor.registry import DetectorSettings, Firing, StepView, register_detector
from llds.monitor.robust import as_float, median


def fmt(x: float | None, digits: int = 2) -> str:
    """A number in a message; `n/a` when it was not measured."""
    return "n/a" if x is None else f"{x:.{digits}f}"


def _moved(a: float | None, b: float | None, eps: float = 0.01) -> str:
    if a is None or b is None:
        return "was not measured"
    verb = "rose" if b > a + eps else "fell" if b < a - eps else "held"
    return f"{verb} {fmt(a)} -> {fmt(b)}"


def _decaying(view: StepView) -> bool:
    return view.label.evidence["falling_streak"] >= view.phase.decay_steps


def _falling_text(p: PhaseConfig) -> str:
    below = "negative" if p.disp_fall == 0 else f"below {-p.disp_fall:g}"
    return (
        f"for at least {p.decay_steps} steps in a row, the {p.disp_window}-step rolling median "
        f"of `{keys.DISP_POS}` is {below} and the median of `{keys.FRAC_POS_FELL}` is at least "
        f"{p.pos_fell_frac:g}"
    )


# ------------------------------------------------------------------ decay


@section(key="monitor.alarms.displacement_decay")
class DisplacementDecaySettings(DetectorSettings):
    """Steady decay measured from the displacement of the responses GRPO pushes up (the
    paper's early warning); its thresholds are `monitor.phase.decay_steps`, `disp_window`,
    `disp_fall` and `pos_fell_frac`."""


@register_detector(
    "displacement_decay",
    severity="warning",
    mechanism="lld",
    actionable=True,
    settings=DisplacementDecaySettings,
    describe=lambda s, p: f"steady decay measured from `{keys.DISP_POS}`: {_falling_text(p)}.",
)
class DisplacementDecay:
    """The responses GRPO pushes up (advantage > 0) keep losing likelihood over the updates."""

    def __init__(self, settings: DisplacementDecaySettings) -> None:
        self.settings = settings

    def update(self, view: StepView) -> Firing | None:
        ev = view.label.evidence
        if not (_decaying(view) and ev.get("disp_pos") is not None):
            return None
        p, step = view.phase, view.step
        s0 = step - ev["falling_streak"] + 1
        r0 = next((s.reward for s in view.history if s.step == s0 - p.disp_window), None)
        r1 = ev["reward_level"]
        evidence = {
            "since_step": s0,
            "disp_pos": ev["disp_pos"],
            "frac_pos_fell": ev["frac_pos_fell"],
        }
        return Firing(
            f"lazy likelihood displacement: the responses GRPO pushes up (advantage > 0) "
            f"lost likelihood over steps {s0}-{step} (median change {fmt(ev['disp_pos'])} "
            f"nats per response per step, {fmt(100 * ev['frac_pos_fell'], 0)}% of them fell"
            f", over the last {p.disp_window} steps) while reward {_moved(r0, r1)}",
            evidence,
        )


@section(key="monitor.alarms.likelihood_decay")
class LikelihoodDecaySettings(DetectorSettings):
    """Steady decay read from the rollout-time likelihood of correct responses, for logs
    without the displacement; thresholds: `monitor.phase.window`, `decay_steps`,
    `logp_min_slope`, `slope_z`, `fell_frac`."""


@register_detector(
    "likelihood_decay",
    severity="warning",
    mechanism="lld",
    actionable=True,
    settings=LikelihoodDecaySettings,
    describe=lambda s, p: (
        f"steady decay read from the rollout-time likelihood `{keys.LOGP_CORRECT}` (its "
        f"{p.window}-step trend falling for {p.decay_steps} steps in a row), for logs without "
        "the displacement."
    ),
)
class LikelihoodDecay:
    """The correct responses' rollout-time likelihood trending down (selection-biased: it is
    measured on whatever the policy sampled, hence a warning only)."""

    def __init__(self, settings: LikelihoodDecaySettings) -> None:
        self.settings = settings

    def update(self, view: StepView) -> Firing | None:
        if not _decaying(view) or view.label.evidence.get("disp_pos") is not None:
            return None
        p = view.phase
        span = list(view.history)[-(p.window + p.decay_steps - 1) :]

        def level(i: int, attr: str, width: int) -> float | None:
            vals = [getattr(s, attr) for s in span[max(0, i - width + 1) : i + 1]]
            vals = [v for v in vals if v is not None]
            return median(vals) if vals else None

        # cite where the decline began: the last step still at the smoothed maximum inside the
        # span that made the trend (trend window + the K falling steps)
        levels = [level(i, "logp", 3) for i in range(len(span))]
        known = [i for i, v in enumerate(levels) if v is not None]
        start = max(known, key=lambda i: (levels[i], i)) if known else 0
        a, b = levels[start], levels[-1]
        r0, r1 = level(start, "reward", p.smooth), level(len(span) - 1, "reward", p.smooth)
        s0 = span[start].step
        evidence = {"since_step": s0, "logp_from": a, "logp_to": b, "reward_from": r0}
        evidence["reward_to"] = r1
        return Firing(
            f"correct-response log-likelihood fell from {fmt(a)} to {fmt(b)} over steps "
            f"{s0}-{view.step} while reward {_moved(r0, r1)}",
            evidence,
        )


# ------------------------------------------------------------------ collapse


@section(key="monitor.alarms.collapse")
class CollapseSettings(DetectorSettings):
    """The run entered the phase detector's collapse phase (spikes together, or with a decay
    or a halved reward); thresholds: `monitor.phase.spike_*`, `reward_drop_*`,
    `recovery_steps`."""


@register_detector(
    "collapse",
    severity="warning",
    mechanism="unspecific",
    actionable=True,
    settings=CollapseSettings,
    describe=lambda s, p: (
        "the run entered the collapse phase: two signals at once among entropy, gradient-norm "
        "and likelihood-ratio spikes and a sharp likelihood drop; or one of them with steady "
        f"decay or the smoothed reward at most {1 - p.reward_drop_frac:g}x its peak; or the "
        f"reward staying that low for {p.reward_drop_steps} steps."
    ),
)
class Collapse:
    """The collapse phase entered."""

    def __init__(self, settings: CollapseSettings) -> None:
        self.settings = settings

    def update(self, view: StepView) -> Firing | None:
        if view.label.phase != "collapse":
            return None
        ev, step = view.label.evidence, view.step
        return Firing(
            f"collapse phase entered at step {step}: "
            f"{', '.join(ev['signals']) or 'likelihood decay with reward drop'}; "
            f"correct-response log-likelihood {fmt(ev['logp_correct'])}, "
            f"reward {fmt(ev['reward_level'])} (peak {fmt(ev['reward_peak'])})",
            {"signals": list(ev["signals"]), "since_step": step},
        )


@section(key="monitor.alarms.reward_collapse")
class RewardCollapseSettings(DetectorSettings):
    """The smoothed reward stayed far below its running peak; thresholds:
    `monitor.phase.reward_drop_frac`, `reward_drop_z`, `reward_drop_steps`, `reward_min_peak`,
    `smooth`, `peak_smooth`."""


@register_detector(
    "reward_collapse",
    severity="warning",
    mechanism="unspecific",
    actionable=True,
    settings=RewardCollapseSettings,
    describe=lambda s, p: (
        f"the {p.smooth}-step median reward stayed at most {1 - p.reward_drop_frac:g}x its "
        f"peak for {p.reward_drop_steps} steps."
    ),
)
class RewardCollapse:
    """The reward itself collapsed (it lags the other signals)."""

    def __init__(self, settings: RewardCollapseSettings) -> None:
        self.settings = settings

    def update(self, view: StepView) -> Firing | None:
        ev = view.label.evidence
        if not ev["reward_collapsed"]:
            return None
        peak_step = ev["reward_peak_step"]
        return Firing(
            f"reward collapsed: smoothed reward fell from its peak {fmt(ev['reward_peak'])}"
            f" at step {peak_step} to {fmt(ev['reward_level'])} at step {view.step}",
            {"peak": ev["reward_peak"], "level": ev["reward_level"], "since_step": peak_step},
        )


# ------------------------------------------------------------------ stagnation


@section(key="monitor.alarms.stagnation")
class StagnationSettings(DetectorSettings):
    """The likelihood flat while the reward rises, for a while (info only: common early in
    healthy runs)."""

    steps: int = Field(default=10, ge=1)
    """consecutive stagnation labels before the alarm: a few flat steps are normal while the
    reward starts to rise"""


@register_detector(
    "stagnation",
    severity="info",
    mechanism="lld",
    settings=StagnationSettings,
    describe=lambda s, p: f"{s.steps} stagnation steps in a row.",
)
class Stagnation:
    """`steps` stagnation labels in a row."""

    def __init__(self, settings: StagnationSettings) -> None:
        self.settings = settings
        self.streak = 0

    def update(self, view: StepView) -> Firing | None:
        self.streak = self.streak + 1 if view.label.phase == "stagnation" else 0
        n = self.settings.steps
        if self.streak < n:
            return None
        ev, step = view.label.evidence, view.step
        evidence = {
            "logp_slope": ev["logp_long_slope"],
            "reward_slope": ev["reward_long_slope"],
            "since_step": step - n + 1,
        }
        return Firing(
            f"correct-response log-likelihood flat over steps {step - n + 1}-{step} "
            f"(slope {fmt(ev['logp_long_slope'], 4)}/step) while reward rose "
            f"{fmt(ev['reward_long_slope'], 4)}/step",
            evidence,
        )


# ------------------------------------------------------------------ spikes


@section
class SpikeSettings(DetectorSettings):
    """A one-step jump of a series above its recent baseline; thresholds:
    `monitor.phase.spike_z`, `spike_min_ratio`, `baseline_window`, `spike_min_scale`."""


class Spike:
    """One series jumping far above its recent baseline (the phase detector's spike test)."""

    def __init__(self, settings: SpikeSettings, *, series: str, label: str) -> None:
        self.settings = settings
        self.series = series
        """the phase detector's name of the series (`entropy`, `grad_norm`, `ratio_max`)"""
        self.label = label
        """how the message names it"""

    def update(self, view: StepView) -> Firing | None:
        ev, name = view.label.evidence, self.series
        if name not in ev["signals"]:
            return None
        value = getattr(view.history[-1], name)
        z, ratio = ev[f"{name}_z"], ev[f"{name}_ratio"]
        baseline = value / ratio if value is not None and ratio else None
        n = view.phase.baseline_window
        return Firing(
            f"{self.label} spiked to {fmt(value, 3)} at step {view.step}: {fmt(ratio, 1)}x its "
            f"median {fmt(baseline, 3)} over the previous {n} steps (robust z {fmt(z, 1)})",
            {"value": value, "baseline": baseline, "z": z, "ratio": ratio, "since_step": view.step},
        )


def _spike_describe(key: str) -> Callable[[Any, PhaseConfig], str]:
    def describe(s: Any, p: PhaseConfig) -> str:
        return (
            f"`{key}` spiked: a value at least {p.spike_min_ratio:g}x its median over the "
            f"previous {p.baseline_window} steps and {p.spike_z:g} robust standard deviations "
            "above it."
        )

    return describe


SPIKES = (
    ("entropy_spike", "entropy", "policy entropy", keys.ENTROPY, "entropy"),
    ("grad_norm_spike", "grad_norm", "gradient norm", keys.GRAD_NORM, "unspecific"),
    ("ratio_spike", "ratio_max", "max likelihood ratio", keys.RATIO_MAX, "unspecific"),
)
"""(alarm, phase-detector series, its name in messages, its metric, mechanism)"""
for _kind, _series, _label, _key, _mechanism in SPIKES:
    register_detector(
        _kind,
        severity="warning",
        mechanism=_mechanism,
        settings=SpikeSettings,
        describe=_spike_describe(_key),
    )(functools.partial(Spike, series=_series, label=_label))


# ------------------------------------------------------------------ skipped updates


@section(key="monitor.alarms.nonfinite")
class NonfiniteSettings(DetectorSettings):
    """Optimizer updates skipped for a non-finite loss or gradient (`optim/skipped_total`)."""


@register_detector(
    "nonfinite",
    severity="warning",
    mechanism="unspecific",
    settings=NonfiniteSettings,
    describe=lambda s, p: (
        f"optimizer updates were skipped for a non-finite loss or gradient "
        f"(`{keys.SKIPPED_TOTAL}` rose)."
    ),
)
class Nonfinite:
    """The count of skipped updates rose since the last step."""

    def __init__(self, settings: NonfiniteSettings) -> None:
        self.settings = settings
        self.total: float | None = None

    def update(self, view: StepView) -> Firing | None:
        total = as_float(view.row.get(keys.SKIPPED_TOTAL))
        if total is None:
            return None
        prev, self.total = self.total, total
        if prev is None or total <= prev:
            return None
        new = total - prev
        return Firing(
            f"{int(new)} optimizer update(s) skipped at step {view.step} for non-finite "
            f"loss or gradients ({int(total)} so far)",
            {"new_skips": new, "skipped_total": int(total), "since_step": view.step},
        )
