"""Label each training step with its phase of the LLD trajectory (pure functions, no I/O).

The paper describes three phases of the correct-response likelihood under vanilla GRPO:
early *stagnation* (flat while reward rises), *steady decay* (falling while reward still rises
and gradients look normal), and *accelerated collapse* (sharp likelihood drop, entropy / ratio /
gradient-norm spikes, reward falls to zero). Reward lags, so the likelihood is the primary signal.

"Falling" is read from the paper's own quantity when the log has it: the displacement of the
responses GRPO pushes up (`lld/disp_pos`, the change of their log-likelihood over the step's
updates, and `lld/frac_pos_fell`, the share of them that lost likelihood). The rollout-time
likelihood of correct responses (`lld/logp_correct`) is selection-biased (it is measured on
whatever the policy sampled) and is used only for logs without the displacement.

Everything here is causal: the label of step t depends only on rows 1..t, so the same code runs
online inside the trainer (`PhaseTracker`) and offline on a finished log (`detect_phases`).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import Field

from llds import metrics as keys
from llds.config.schema import Invalid, section
from llds.monitor.robust import (
    Spike,
    Trend,
    as_float,
    diff_noise,
    mad_sigma,
    median,
    spike_score,
    theil_sen,
    trend,
)

Phase = Literal["warmup", "healthy", "stagnation", "steady_decay", "collapse"]
PHASES: tuple[Phase, ...] = ("warmup", "healthy", "stagnation", "steady_decay", "collapse")

LOGP_KEY = keys.LOGP_CORRECT
REWARD_KEY = keys.REWARD_MEAN
ENTROPY_KEY = keys.ENTROPY
GRAD_NORM_KEY = keys.GRAD_NORM
RATIO_MAX_KEY = keys.RATIO_MAX
FELL_KEY = keys.FRAC_CORRECT_FELL
DISP_POS_KEY = keys.DISP_POS
POS_FELL_KEY = keys.FRAC_POS_FELL


@section(key="monitor.phase")
class PhaseConfig:
    """The phase detector, shared by the alarms that read phases (decay, collapse, spikes,
    stagnation). Defaults suit per-token log-likelihoods (nats/token) and rewards in [0, 1],
    logged once per training step.

    Trends are Theil-Sen slopes over the last `window` steps that must be both large
    (> min_slope per step) and significant (> z standard errors, noise from the MAD of residuals).
    Spikes are robust z-scores (median / MAD of the previous `baseline_window` steps) on log
    values that also exceed `spike_min_ratio` times the baseline.
    """

    window: int = Field(default=20, ge=4)
    """steps in the trend window; also the number of warmup steps: fewer points make a
    Theil-Sen slope of a noisy series meaningless"""
    min_points: int = Field(default=8, ge=3)
    """finite values needed inside the window before a trend is judged (at most `window`), so
    that a log with gaps is not judged on three points"""
    decay_steps: int = Field(default=5, ge=1)
    """K: consecutive steps of falling correct-response likelihood that make a steady decay; one
    falling step is noise, K in a row is a trend that persists"""
    logp_min_slope: float = Field(default=0.002, ge=0)
    """smallest likelihood slope (nats/token per step) that counts as a trend: a significant but
    tiny slope is not worth a warning"""
    logp_noise_floor: float = Field(default=0.005, ge=0)
    """floor of the likelihood noise estimate (nats/token), so that a smooth series does not
    turn every wiggle into a significant trend"""
    slope_z: float = Field(default=3.0, gt=0)
    """significance of a likelihood trend, in standard errors"""
    reward_min_slope: float = Field(default=0.001, ge=0)
    """smallest reward slope (per step) that counts as rising or falling"""
    reward_noise_floor: float = Field(default=0.01, ge=0)
    """floor of the reward noise estimate: with a few prompts per step a run of equal rewards
    would otherwise make the noise zero"""
    reward_z: float = Field(default=1.0, gt=0)
    """reward is noisy and only needs to be *plausibly* rising: a looser test than likelihood"""
    stagnation_window: int = Field(default=32, ge=3)
    """longer window for the stagnation test, so flat-vs-rising does not flicker with noise"""
    flat_slope: float = Field(default=0.0015, ge=0)
    """stagnation: |likelihood slope| over `stagnation_window` at most this (nats/token/step)"""
    baseline_window: int = Field(default=20, ge=3)
    """steps before the current one that form a spike baseline: the recent past, so a level
    that drifted slowly is not a spike"""
    min_baseline: int = Field(default=8, ge=3)
    """finite baseline values needed before spikes are scored (at most `baseline_window`)"""
    spike_z: float = Field(default=6.0, gt=0)
    """robust z-score above the baseline that counts as a spike; also how far below its recent
    trend line the likelihood must fall, two steps running, to count as a sharp drop"""
    spike_min_ratio: float = Field(default=1.5, ge=1)
    """a spike must also be at least this many times its baseline (entropy, grad norm, ratio):
    a calm series has a tiny spread, and a z-score alone would call a 10% rise a spike"""
    spike_min_scale: float = Field(default=0.05, ge=0)
    """floor of the baseline spread in log units (~5%): smooth series do not spike on wiggles"""
    logp_drop_min_scale: float = Field(default=0.02, ge=0)
    """floor of the spread around the likelihood trend line (nats/token) for sharp drops"""
    smooth: int = Field(default=5, ge=1)
    """rolling-median width of the current reward level"""
    peak_smooth: int = Field(default=20, ge=1)
    """rolling-median width of the reward whose running maximum is the peak (over what exists
    once `smooth` steps do): wider than `smooth`, so that a short run of easy batches does not
    set a peak the run never really had"""
    reward_drop_frac: float = Field(default=0.5, gt=0, lt=1)
    """reward collapsed: smoothed reward at most (1 - this) times its running peak"""
    reward_min_peak: float = Field(default=0.1, ge=0)
    """a run whose reward never exceeded this cannot 'collapse' in reward"""
    reward_drop_z: float = Field(default=3.0, ge=0)
    """... and the fall from the peak must exceed this many per-step reward noise sigmas"""
    reward_drop_steps: int = Field(default=12, ge=1)
    """... and hold that many consecutive steps: with a few prompts per step, runs of easy or
    hard batches move the smoothed reward far from its (upward-biased) running peak in healthy
    runs, and a dip of d steps keeps the `smooth`-step median down for up to d + smooth - 1
    steps; a collapsed reward stays down"""
    fell_frac: float = Field(default=0.6, ge=0, le=1)
    """if the median share of correct responses whose likelihood fell (lld/frac_correct_fell)
    over the window reaches this, any clearly negative slope counts as falling"""
    recovery_steps: int = Field(default=10, ge=1)
    """calm steps needed to leave the collapse phase once entered, so that one quiet step inside
    a collapse does not end it"""
    disp_window: int = Field(default=20, ge=3)
    """steps in the rolling medians of the displacement (`lld/disp_pos`, `lld/frac_pos_fell`;
    at least `min_points`): one step's displacement is measured on a few groups and is noisy"""
    disp_fall: float = Field(default=0.0, ge=0)
    """falling: the rolling median of `lld/disp_pos` (nats per response per step) below minus
    this ..."""
    pos_fell_frac: float = Field(default=0.5, ge=0, le=1)
    """... and the rolling median of `lld/frac_pos_fell` at least this"""
    disp_flat: float = Field(default=0.05, ge=0)
    """stagnation: |rolling median of `lld/disp_pos`| at most this while reward rises"""

    def __post_init__(self) -> None:
        """The checks that involve two fields (single-field ranges are on the fields)."""
        pairs = (
            ("min_points", self.min_points <= self.window, "at most window"),
            ("stagnation_window", self.stagnation_window >= self.min_points, "at least min_points"),
            ("min_baseline", self.min_baseline <= self.baseline_window, "at most baseline_window"),
            ("smooth", self.smooth <= self.peak_smooth, "at most peak_smooth"),
            ("disp_window", self.disp_window >= self.min_points, "at least min_points"),
        )
        for name, ok, why in pairs:
            if not ok:
                raise Invalid(name, f"{getattr(self, name)!r} must be {why}")


@dataclass(frozen=True)
class Sample:
    """The inputs of the detector at one step (None = missing)."""

    step: int
    logp: float | None
    reward: float | None
    entropy: float | None
    grad_norm: float | None
    ratio_max: float | None
    frac_fell: float | None
    disp_pos: float | None = None
    frac_pos_fell: float | None = None

    @classmethod
    def from_row(cls, row: Mapping[str, Any], default_step: int) -> Sample:
        step = as_float(row.get("step"))
        return cls(
            step=int(step) if step is not None else default_step,
            logp=as_float(row.get(LOGP_KEY)),
            reward=as_float(row.get(REWARD_KEY)),
            entropy=as_float(row.get(ENTROPY_KEY)),
            grad_norm=as_float(row.get(GRAD_NORM_KEY)),
            ratio_max=as_float(row.get(RATIO_MAX_KEY)),
            frac_fell=as_float(row.get(FELL_KEY)),
            disp_pos=as_float(row.get(DISP_POS_KEY)),
            frac_pos_fell=as_float(row.get(POS_FELL_KEY)),
        )


@dataclass(frozen=True)
class Signals:
    """Everything the detector measured at one step, before the phase decision."""

    logp_trend: Trend | None
    reward_trend: Trend | None
    long_logp_trend: Trend | None
    long_reward_trend: Trend | None
    entropy: Spike | None
    grad_norm: Spike | None
    ratio_max: Spike | None
    sharp_drop: bool
    logp_drop_z: float | None
    reward_level: float | None
    reward_peak_level: float | None
    reward_noise: float | None
    frac_fell: float | None
    disp_pos: float | None = None
    """rolling median of `lld/disp_pos` over `disp_window` (None: not logged / too few)"""
    frac_pos_fell: float | None = None
    """rolling median of `lld/frac_pos_fell` over `disp_window`"""

    def spiking(self, config: PhaseConfig) -> list[str]:
        """Names of the series spiking at this step."""
        out = []
        for name in ("entropy", "grad_norm", "ratio_max"):
            s: Spike | None = getattr(self, name)
            if s is not None and s.z >= config.spike_z and s.ratio >= config.spike_min_ratio:
                out.append(name)
        return out


@dataclass(frozen=True)
class PhaseLabel:
    """The phase of one step and the numbers behind it (JSON-friendly)."""

    step: int
    phase: Phase
    evidence: dict[str, Any] = field(default_factory=dict)


def _finite(xs: Sequence[float | None]) -> list[float]:
    return [x for x in xs if x is not None]


def _series_trend(
    samples: Sequence[Sample],
    attr: str,
    *,
    min_points: int,
    min_slope: float,
    z: float,
    noise_floor: float,
    noise: float | None,
) -> Trend | None:
    pts = [(s.step, getattr(s, attr)) for s in samples if getattr(s, attr) is not None]
    if len(pts) < min_points or len({x for x, _ in pts}) < 2:
        return None
    xs, ys = zip(*pts, strict=True)
    return trend(xs, ys, min_slope=min_slope, z=z, noise_floor=noise_floor, noise=noise)


def _spike(history: Sequence[Sample], attr: str, config: PhaseConfig) -> Spike | None:
    current = getattr(history[-1], attr)
    base = _finite([getattr(s, attr) for s in history[-1 - config.baseline_window : -1]])
    if current is None or len(base) < config.min_baseline:
        return None
    return spike_score(base, current, log_scale=True, min_scale=config.spike_min_scale)


def _sharp_drop(history: Sequence[Sample], config: PhaseConfig) -> tuple[bool, float | None]:
    """Likelihood falling much faster than its own recent trend, two steps in a row.

    The baseline is a Theil-Sen line through the `baseline_window` steps before the last two;
    the newest two values must both sit `spike_z` robust sigmas below its extrapolation. A
    steady decline stays on its line (that is steady decay); an accelerating one leaves it.
    Returns (is_sharp_drop, z of the newest value).
    """
    if len(history) < 3 or history[-1].logp is None:
        return False, None
    base = [
        (s.step, s.logp) for s in history[-2 - config.baseline_window : -2] if s.logp is not None
    ]
    if len(base) < config.min_baseline or len({x for x, _ in base}) < 2:
        return False, None
    xs, ys = zip(*base, strict=True)
    slope, intercept = theil_sen(xs, ys)
    resid = [y - (slope * x + intercept) for x, y in base]
    scale = max(mad_sigma(resid), config.logp_drop_min_scale)

    def z(sample: Sample) -> float | None:
        if sample.logp is None:
            return None
        return (sample.logp - (slope * sample.step + intercept)) / scale

    z_now, z_prev = z(history[-1]), z(history[-2])
    assert z_now is not None
    sharp = z_now <= -config.spike_z and z_prev is not None and z_prev <= -config.spike_z
    return sharp, z_now


def compute_signals(history: Sequence[Sample], config: PhaseConfig) -> Signals:
    """Trends, spikes and levels at the newest sample of `history` (oldest first)."""

    span = history[-config.stagnation_window :]
    logp_noise = diff_noise([s.logp for s in span])
    reward_noise = diff_noise([s.reward for s in span])

    def trends(samples: Sequence[Sample]) -> tuple[Trend | None, Trend | None]:
        logp = _series_trend(
            samples,
            "logp",
            min_points=config.min_points,
            min_slope=config.logp_min_slope,
            z=config.slope_z,
            noise_floor=config.logp_noise_floor,
            noise=logp_noise,
        )
        reward = _series_trend(
            samples,
            "reward",
            min_points=config.min_points,
            min_slope=config.reward_min_slope,
            z=config.reward_z,
            noise_floor=config.reward_noise_floor,
            noise=reward_noise,
        )
        return logp, reward

    win = history[-config.window :]
    logp_trend, reward_trend = trends(win)
    long_logp, long_reward = trends(history[-config.stagnation_window :])
    sharp, drop_z = _sharp_drop(history, config)
    rewards = _finite([s.reward for s in history[-config.smooth :]])
    long_rewards = _finite([s.reward for s in history[-config.peak_smooth :]])
    fell = _finite([s.frac_fell for s in win])
    disp_win = history[-config.disp_window :]
    disp = _finite([s.disp_pos for s in disp_win])
    pos_fell = _finite([s.frac_pos_fell for s in disp_win])
    return Signals(
        logp_trend=logp_trend,
        reward_trend=reward_trend,
        long_logp_trend=long_logp,
        long_reward_trend=long_reward,
        entropy=_spike(history, "entropy", config),
        grad_norm=_spike(history, "grad_norm", config),
        ratio_max=_spike(history, "ratio_max", config),
        sharp_drop=sharp,
        logp_drop_z=drop_z,
        reward_level=median(rewards) if len(rewards) == config.smooth else None,
        reward_peak_level=median(long_rewards) if len(long_rewards) >= config.smooth else None,
        reward_noise=reward_noise,
        frac_fell=median(fell) if fell else None,
        disp_pos=median(disp) if len(disp) >= config.min_points else None,
        frac_pos_fell=median(pos_fell) if len(pos_fell) >= config.min_points else None,
    )


def _direction(t: Trend | None) -> int | None:
    return None if t is None else t.direction


class PhaseTracker:
    """Online phase detector: feed one metrics row per step, get that step's label.

    Keeps only a bounded window of history plus a few counters, so it is cheap to run inside
    the training loop. `detect_phases` on a prefix of rows gives exactly the same labels.
    """

    def __init__(self, config: PhaseConfig | None = None) -> None:
        self.config = config or PhaseConfig()
        cfg = self.config
        keep = max(
            cfg.window,
            cfg.stagnation_window,
            cfg.baseline_window + 2,
            cfg.peak_smooth,
            cfg.disp_window,
        )
        self.history: deque[Sample] = deque(maxlen=keep)
        self.count = 0
        self.falling_streak = 0
        self.drop_streak = 0
        self.reward_peak: float | None = None
        self.reward_peak_step: int | None = None
        self.collapsed = False
        self.calm_steps = 0
        self.last: PhaseLabel | None = None
        self.last_signals: Signals | None = None

    def update(self, row: Mapping[str, Any]) -> PhaseLabel:
        cfg = self.config
        sample = Sample.from_row(row, default_step=self.count + 1)
        self.history.append(sample)
        self.count += 1
        sig = compute_signals(list(self.history), cfg)
        self.last_signals = sig

        lt, rt = _direction(sig.logp_trend), _direction(sig.reward_trend)
        slope = sig.logp_trend.slope if sig.logp_trend else None
        if sig.disp_pos is not None:  # the paper's quantity: the displacement of A > 0
            falling = (
                sig.disp_pos < -cfg.disp_fall
                and sig.frac_pos_fell is not None
                and sig.frac_pos_fell >= cfg.pos_fell_frac
            )
        else:  # older logs: the rollout-time likelihood of correct responses
            lld_majority = sig.frac_fell is not None and sig.frac_fell >= cfg.fell_frac
            falling = lt == -1 or (
                lld_majority and slope is not None and slope < -cfg.logp_min_slope
            )
        warm = self.count > cfg.window
        self.falling_streak = self.falling_streak + 1 if falling and warm else 0

        level, peak_level = sig.reward_level, sig.reward_peak_level
        if peak_level is not None and (self.reward_peak is None or peak_level > self.reward_peak):
            self.reward_peak, self.reward_peak_step = peak_level, sample.step
        peak = self.reward_peak
        noise = max(sig.reward_noise or 0.0, cfg.reward_noise_floor)
        reward_halved = (
            warm
            and peak is not None
            and level is not None
            and peak >= cfg.reward_min_peak
            and level <= (1 - cfg.reward_drop_frac) * peak
        )
        reward_dropped = reward_halved and peak - level > cfg.reward_drop_z * noise
        self.drop_streak = self.drop_streak + 1 if reward_dropped else 0
        reward_collapsed = self.drop_streak >= cfg.reward_drop_steps
        spikes = sig.spiking(cfg)
        signals = [*spikes, "sharp_drop"] if sig.sharp_drop else spikes
        decaying = self.falling_streak >= cfg.decay_steps
        # One spike is common in healthy runs (the max ratio over a small batch is heavy-tailed);
        # it counts only together with another spike, a likelihood decay or a smoothed reward
        # at most half its peak. A loosely falling reward trend is noise at a few prompts per step.
        collapse_now = (
            len(signals) >= 2
            or (signals and (reward_halved or decaying))
            or (decaying and reward_dropped)
            or reward_collapsed
        )
        if collapse_now:
            self.collapsed, self.calm_steps = True, 0
        elif self.collapsed:
            calm = not signals and not reward_dropped and (lt is None or lt >= 0)
            self.calm_steps = self.calm_steps + 1 if calm else 0
            if self.calm_steps >= cfg.recovery_steps:
                self.collapsed = False

        phase: Phase
        if not warm:
            phase = "warmup"
        elif self.collapsed:
            phase = "collapse"
        elif decaying:
            phase = "steady_decay"
        elif self._stagnating(sig):
            phase = "stagnation"
        else:
            phase = "healthy"

        evidence = {
            "logp_correct": sample.logp,
            "logp_slope": slope,
            "logp_trend": lt,
            "reward": sample.reward,
            "reward_level": sig.reward_level,
            "reward_slope": sig.reward_trend.slope if sig.reward_trend else None,
            "reward_trend": rt,
            "reward_peak": peak,
            "reward_peak_step": self.reward_peak_step,
            "reward_dropped": reward_dropped,
            "reward_collapsed": reward_collapsed,
            "reward_drop_streak": self.drop_streak,
            "falling_streak": self.falling_streak,
            "frac_correct_fell": sig.frac_fell,
            "disp_pos": sig.disp_pos,
            "frac_pos_fell": sig.frac_pos_fell,
            "logp_drop_z": sig.logp_drop_z,
            "signals": signals,
            "logp_long_slope": sig.long_logp_trend.slope if sig.long_logp_trend else None,
            "reward_long_slope": sig.long_reward_trend.slope if sig.long_reward_trend else None,
        }
        for name in ("entropy", "grad_norm", "ratio_max"):
            s: Spike | None = getattr(sig, name)
            evidence[f"{name}_z"] = s.z if s else None
            evidence[f"{name}_ratio"] = s.ratio if s else None
        self.last = PhaseLabel(sample.step, phase, evidence)
        return self.last

    def _stagnating(self, sig: Signals) -> bool:
        """Likelihood flat (small slope, not just insignificant; or, from the displacement,
        the responses GRPO pushes up barely moving) while reward rises."""
        lt, rt = sig.long_logp_trend, sig.long_reward_trend
        if rt is None or rt.direction != 1:
            return False
        if sig.disp_pos is not None:
            return abs(sig.disp_pos) <= self.config.disp_flat
        return lt is not None and abs(lt.slope) <= self.config.flat_slope


def detect_phases(
    rows: Sequence[Mapping[str, Any]], config: PhaseConfig | None = None
) -> list[PhaseLabel]:
    """The phase of every row of a metrics log (rows in step order)."""
    tracker = PhaseTracker(config)
    return [tracker.update(row) for row in rows]


def phase_spans(labels: Sequence[PhaseLabel]) -> list[tuple[int, int, Phase]]:
    """Runs of equal phase as (first_step, last_step, phase), for plotting and summaries."""
    spans: list[tuple[int, int, Phase]] = []
    for lab in labels:
        if spans and spans[-1][2] == lab.phase:
            spans[-1] = (spans[-1][0], lab.step, lab.phase)
        else:
            spans.append((lab.step, lab.step, lab.phase))
    return spans
