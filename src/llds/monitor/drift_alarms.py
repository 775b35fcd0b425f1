"""Live alarms for the mechanisms the report attributes and the phase detector does not watch:
sampler mismatch, void turns, entropy drift, learning-rate divergence, and a fall of the
reward from what the run had gained.

Each compares a recent window with the run's own early steps (`llds.monitor.baseline`), since
an absolute level separates worlds rather than states of one run: a mismatch's KL, a void-turn
share or an entropy differs by an order of magnitude between a tiny organism and a real model.
They read only logged metrics. Their thresholds are round values chosen before any collapse
corpus existed (the attribution rules' where one exists), but for the two that the collapse
corpus's tune split chose (`experiments/monitor_tuning/frozen.yaml`): `entropy_drift.high` and
`lr_divergence.grad_growth`. Those two detectors are critical, chosen there (with
`search_decline`) as the alarms that predicted collapses; the other three stay warnings.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field

from llds import metrics as keys
from llds.config.schema import section
from llds.monitor.baseline import Comparison, EarlyWindow
from llds.monitor.registry import DetectorSettings, Firing, StepView, register_detector
from llds.monitor.robust import as_float

LR_KEY = "lr"
"""The learning rate the optimizer used at the step (the native trainer logs it as `lr`)."""


def _g(x: float) -> str:
    return f"{x:.3g}"


def _against(c: Comparison, step: int) -> str:
    return (
        f"median {_g(c.now)} over steps {c.window_start}-{step} against {_g(c.early)} over "
        f"{c.baseline_text()}"
    )


def _evidence(c: Comparison, **more: float) -> dict[str, Any]:
    return {
        "window_median": c.now,
        "early_median": c.early,
        "early_first": c.early_first,
        "early_last": c.early_last,
        "since_step": c.window_start,
        **more,
    }


@section
class DriftSettings(DetectorSettings):
    """A comparison of a recent window with the run's first steps."""

    early: int = Field(default=20, ge=3)
    """the run's first steps with the metric: its own healthy baseline"""
    window: int = Field(default=10, ge=3)
    """recent steps whose median is compared with the baseline: a median of ten does not move
    on one odd batch, and still follows a change within about five steps"""


def _rose(c: Comparison, factor: float, floor: float) -> bool:
    return c.now >= factor * c.early and c.now >= floor


# ------------------------------------------------------------------ sampler mismatch


@section(key="monitor.alarms.sampler_mismatch")
class SamplerMismatchSettings(DriftSettings):
    """The sampling policy drifting away from the trained one: its KL (`mismatch/k3_kl`, or
    where a framework logs only that, the mean |log-prob difference|) rising over its early
    level. Logged only when another policy samples (a sampling copy, vLLM, an async trainer)."""

    rise: float = Field(default=2.0, gt=1)
    """fires at a window median at least this multiple of the early median (the attribution's
    mismatch rule: a doubling)"""
    k3_floor: float = Field(default=1e-3, ge=0)
    """and at least this k3 KL (nats per token): below it a doubling of a rounding-level
    mismatch is still harmless"""
    logp_diff_floor: float = Field(default=0.05, ge=0)
    """or, from the mean |log-prob difference| (nats per token), at least this"""


@register_detector(
    "sampler_mismatch",
    severity="warning",
    mechanism="mismatch",
    settings=SamplerMismatchSettings,
    describe=lambda s, p: (
        f"the {s.window}-step median of `{keys.MISMATCH_K3_KL}` at least {s.rise:g}x its median "
        f"over the run's first {s.early} steps and at least {s.k3_floor:g} (or of "
        f"`{keys.MISMATCH_ABS_LOGP_DIFF_MEAN}`, at least {s.logp_diff_floor:g}, where only that "
        "is logged): the sampler drifts from the trained policy."
    ),
)
class SamplerMismatch:
    """The mismatch between sampler and trained policy growing."""

    def __init__(self, settings: SamplerMismatchSettings) -> None:
        self.settings = settings
        self._k3 = EarlyWindow(settings.early, settings.window)
        self._diff = EarlyWindow(settings.early, settings.window)

    def update(self, view: StepView) -> Firing | None:
        s = self.settings
        k3 = self._k3.update(view.step, as_float(view.row.get(keys.MISMATCH_K3_KL)))
        diff = self._diff.update(
            view.step, as_float(view.row.get(keys.MISMATCH_ABS_LOGP_DIFF_MEAN))
        )
        if k3 is not None:
            key, c, floor = keys.MISMATCH_K3_KL, k3, s.k3_floor
        elif diff is not None and view.row.get(keys.MISMATCH_K3_KL) is None:
            key, c, floor = keys.MISMATCH_ABS_LOGP_DIFF_MEAN, diff, s.logp_diff_floor
        else:
            return None
        if not _rose(c, s.rise, floor):
            return None
        return Firing(
            f"the sampler drifts from the trained policy: {key} " + _against(c, view.step),
            _evidence(c),
        )


# ------------------------------------------------------------------ void turns


@section(key="monitor.alarms.void_turns")
class VoidTurnsSettings(DriftSettings):
    """More rollouts with a void turn (one that is neither a valid search nor an answer,
    `turns/void_share`) than early in the run: the path by which tool-use RL blows up its
    gradients (SimpleTIR)."""

    rise: float = Field(default=2.0, gt=1)
    """fires at a window median at least this multiple of the early median (the attribution's
    void-turn rule) ..."""
    min_rise: float = Field(default=0.1, ge=0)
    """... and at least this much above it (a share of rollouts): from an early share of 0.01
    a doubling is nothing"""


@register_detector(
    "void_turns",
    severity="warning",
    mechanism="tool",
    settings=VoidTurnsSettings,
    describe=lambda s, p: (
        f"the {s.window}-step median of `{keys.TURNS_VOID_SHARE}` at least {s.rise:g}x and "
        f"{s.min_rise:g} above its median over the run's first {s.early} steps."
    ),
)
class VoidTurns:
    """The share of rollouts with a void turn rising."""

    def __init__(self, settings: VoidTurnsSettings) -> None:
        self.settings = settings
        self._share = EarlyWindow(settings.early, settings.window)

    def update(self, view: StepView) -> Firing | None:
        s = self.settings
        c = self._share.update(view.step, as_float(view.row.get(keys.TURNS_VOID_SHARE)))
        if c is None or c.now < s.rise * c.early or c.now - c.early < s.min_rise:
            return None
        return Firing(
            f"more rollouts with a void turn: {keys.TURNS_VOID_SHARE} " + _against(c, view.step),
            _evidence(c),
        )


# ------------------------------------------------------------------ entropy


@section(key="monitor.alarms.entropy_drift")
class EntropyDriftSettings(DriftSettings):
    """The policy's entropy drifting far from its early level, down (collapse: the policy stops
    exploring) or up (blow-up: it samples noise); the slow form of what `entropy_spike`
    catches in one step."""

    low: float = Field(default=0.25, gt=0, lt=1)
    """fires at a window median at most this share of the early median: healthy runs sharpen
    their policy, so only a fall to a quarter counts"""
    high: float = Field(default=3.0, gt=1)
    """or at least this multiple of it. Chosen on the collapse corpus's tune split
    (experiments/monitor_tuning/): the setting that warned a collapse in time with no healthy
    run alarmed (2, the attribution's blow-up factor, before: one healthy run alarmed)"""


@register_detector(
    "entropy_drift",
    severity="critical",
    mechanism="entropy",
    settings=EntropyDriftSettings,
    describe=lambda s, p: (
        f"the {s.window}-step median of `{keys.ENTROPY}` at most {s.low:g}x or at least "
        f"{s.high:g}x its median over the run's first {s.early} steps."
    ),
)
class EntropyDrift:
    """Entropy far below or above where the run started."""

    def __init__(self, settings: EntropyDriftSettings) -> None:
        self.settings = settings
        self._entropy = EarlyWindow(settings.early, settings.window)

    def update(self, view: StepView) -> Firing | None:
        s = self.settings
        c = self._entropy.update(view.step, as_float(view.row.get(keys.ENTROPY)))
        if c is None or c.early <= 0:
            return None
        if c.now <= s.low * c.early:
            what = "collapsed"
        elif c.now >= s.high * c.early:
            what = "blew up"
        else:
            return None
        return Firing(
            f"entropy {what}: {keys.ENTROPY} " + _against(c, view.step),
            _evidence(c),
        )


# ------------------------------------------------------------------ learning rate


@section(key="monitor.alarms.lr_divergence")
class LRDivergenceSettings(DriftSettings):
    """Steps growing too large as the learning rate rises (a warm-up that overshoots, a peak
    set too high): the gradient norm, or the update size per unit of learning rate, grown over
    the early window while the logged learning rate (`lr`) rose. Without `lr` in the log it
    cannot tell this from the gradient growth of a death spiral, and does not fire."""

    lr_rise: float = Field(default=1.5, gt=1)
    """the learning rate's window median at least this multiple of its early median"""
    grad_growth: float = Field(default=1.5, gt=1)
    """fires when the gradient norm's window median is at least this multiple of its early
    median (chosen on the collapse corpus's tune split, experiments/monitor_tuning/: 2, a
    doubling, before, warned no collapse in time there) ..."""
    update_excess: float = Field(default=1.5, gt=1)
    """... or the update size (`optim/update_ratio`) grew this much more than the learning
    rate did (an Adam step scales with the learning rate; growing faster, the optimizer's
    state no longer tames the gradients)"""


@register_detector(
    "lr_divergence",
    severity="critical",
    mechanism="lr",
    settings=LRDivergenceSettings,
    describe=lambda s, p: (
        f"with the {s.window}-step median of `{LR_KEY}` at least {s.lr_rise:g}x its early "
        f"median, `{keys.GRAD_NORM}` at least {s.grad_growth:g}x its median over the run's "
        f"first {s.early} steps, or `{keys.UPDATE_RATIO}` grown {s.update_excess:g}x more "
        "than the learning rate."
    ),
)
class LRDivergence:
    """Gradient norm or update size outgrowing a rising learning rate."""

    def __init__(self, settings: LRDivergenceSettings) -> None:
        self.settings = settings
        self._lr = EarlyWindow(settings.early, settings.window)
        self._grad = EarlyWindow(settings.early, settings.window)
        self._update = EarlyWindow(settings.early, settings.window)

    def update(self, view: StepView) -> Firing | None:
        s, step, row = self.settings, view.step, view.row
        lr = self._lr.update(step, as_float(row.get(LR_KEY)))
        grad = self._grad.update(step, as_float(row.get(keys.GRAD_NORM)))
        upd = self._update.update(step, as_float(row.get(keys.UPDATE_RATIO)))
        lr_x = lr.ratio if lr is not None else None
        if lr_x is None or lr_x < s.lr_rise:
            return None
        grad_x = grad.ratio if grad is not None else None
        upd_x = upd.ratio if upd is not None else None
        lr_said = f"{LR_KEY} x{_g(lr_x)} over {lr.baseline_text()}" if lr else ""
        if grad_x is not None and grad_x >= s.grad_growth:
            assert grad is not None
            said = f"{keys.GRAD_NORM} x{_g(grad_x)} (" + _against(grad, step) + ")"
            return Firing(
                f"steps outgrow the rising learning rate: {said}, while {lr_said}",
                _evidence(grad, lr_ratio=lr_x),
            )
        if upd_x is not None and upd_x >= s.update_excess * lr_x:
            assert upd is not None
            said = f"{keys.UPDATE_RATIO} x{_g(upd_x)} (" + _against(upd, step) + ")"
            return Firing(
                f"steps outgrow the rising learning rate: {said}, while {lr_said}",
                _evidence(upd, lr_ratio=lr_x),
            )
        return None


# ------------------------------------------------------------------ reward


@section(key="monitor.alarms.reward_fall")
class RewardFallSettings(DriftSettings):
    """The smoothed reward giving back much of what the run gained over its early level: the
    symptom every mechanism ends in, earlier and weaker than `reward_collapse` (which waits for
    half the peak, held for `monitor.phase.reward_drop_steps`)."""

    fall: float = Field(default=0.5, gt=0, le=1)
    """fires when the window median has lost at least this share of the gain from the early
    median to the highest window median since"""
    min_gain: float = Field(default=0.1, ge=0)
    """a run whose window median never rose this far above its early median has gained
    nothing it could give back"""


@register_detector(
    "reward_fall",
    severity="warning",
    mechanism="unspecific",
    settings=RewardFallSettings,
    describe=lambda s, p: (
        f"the {s.window}-step median of `{keys.REWARD_MEAN}` lost at least {s.fall:g} of its "
        f"gain (at least {s.min_gain:g}) from its median over the run's first {s.early} steps "
        "to its highest since."
    ),
)
class RewardFall:
    """The reward giving back its gains."""

    def __init__(self, settings: RewardFallSettings) -> None:
        self.settings = settings
        self._reward = EarlyWindow(settings.early, settings.window)
        self.peak: float | None = None
        self.peak_step = 0

    def update(self, view: StepView) -> Firing | None:
        s = self.settings
        c = self._reward.update(view.step, as_float(view.row.get(keys.REWARD_MEAN)))
        if c is None:
            return None
        if self.peak is None or c.now > self.peak:
            self.peak, self.peak_step = c.now, view.step
        gain = self.peak - c.early
        if gain < s.min_gain or c.now > self.peak - s.fall * gain:
            return None
        lost = (self.peak - c.now) / gain
        return Firing(
            f"the reward gives back {100 * lost:.0f}% of its gain: {keys.REWARD_MEAN} "
            + _against(c, view.step)
            + f", after a peak median of {_g(self.peak)} at step {self.peak_step}",
            _evidence(c, peak=self.peak, peak_step=self.peak_step),
        )
