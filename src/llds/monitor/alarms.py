"""Collapse alarms raised online from the per-step metrics, and what the trainer should do.

Reward lags collapse by tens of steps; the paper's early warning is the correct-response
likelihood falling while reward still rises. `AlarmMonitor` turns the phase detector's signals
into de-duplicated alarms (one per kind per episode of trouble, re-armed after the condition has
been quiet for a few steps) with messages that cite steps and numbers, and `should_act` maps
alarms plus the `diagnostics.on_alarm` policy to one action.

Which kinds can stop or roll back a run (`ACTIONABLE_KINDS`):
    displacement_decay, likelihood_decay, collapse, reward_collapse
`displacement_decay` (critical) is the paper's early warning measured directly: the responses
GRPO pushes up lose likelihood over the step's updates. `likelihood_decay` (warning) is the
weaker reading of logs without the displacement (the rollout-time likelihood falling).
Warning-only kinds (logged, never acted on alone, because they also occur in healthy runs):
    stagnation, entropy_spike, grad_norm_spike, ratio_spike, nonfinite, search_decline
`search_decline` (`llds.monitor.searches`): the agent makes a quarter fewer valid searches per
rollout than over its first 20 steps; on the recorded runs it came long before most collapses,
and also in runs that never collapsed.
Spikes that come together, or with a likelihood decay or a reward drop, are escalated by the
phase detector into the `collapse` phase, which raises the actionable `collapse` alarm.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from llds import metrics as keys
from llds.monitor.phases import PhaseConfig, PhaseLabel, PhaseTracker, Sample
from llds.monitor.robust import as_float, median
from llds.monitor.searches import EARLY, SEARCHES_KEY, SearchDecline, SearchDeclineTracker

AlarmKind = Literal[
    "displacement_decay",
    "likelihood_decay",
    "collapse",
    "reward_collapse",
    "stagnation",
    "entropy_spike",
    "grad_norm_spike",
    "ratio_spike",
    "nonfinite",
    "search_decline",
]
Severity = Literal["info", "warning", "critical"]
Policy = Literal["warn", "stop", "rollback"]
ActionKind = Literal["none", "warn", "stop", "rollback"]

SEVERITY: dict[str, Severity] = {
    "displacement_decay": "critical",
    "likelihood_decay": "warning",
    "collapse": "critical",
    "reward_collapse": "critical",
    "stagnation": "info",
    "entropy_spike": "warning",
    "grad_norm_spike": "warning",
    "ratio_spike": "warning",
    "nonfinite": "warning",
    "search_decline": "warning",
}
ALARM_KINDS: tuple[str, ...] = tuple(SEVERITY)
ACTIONABLE_KINDS: frozenset[str] = frozenset(
    {"displacement_decay", "likelihood_decay", "collapse", "reward_collapse"}
)
POLICIES: tuple[str, ...] = ("warn", "stop", "rollback")

SKIPPED_KEY = keys.SKIPPED_TOTAL
_SPIKE_KINDS = {
    "entropy": ("entropy_spike", "policy entropy"),
    "grad_norm": ("grad_norm_spike", "gradient norm"),
    "ratio_max": ("ratio_spike", "max likelihood ratio"),
}


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
        return self.kind in ACTIONABLE_KINDS

    @property
    def since_step(self) -> int:
        since = self.evidence.get("since_step")
        return int(since) if since is not None else self.step

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class AlarmConfig:
    """Alarm settings on top of the phase detector's thresholds."""

    phase: PhaseConfig = field(default_factory=PhaseConfig)
    rearm_steps: int = 5
    """quiet steps after which an alarm kind can fire again"""
    stagnation_steps: int = 10
    """consecutive stagnation labels before the (info) stagnation alarm"""


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


def _fmt(x: float | None, digits: int = 2) -> str:
    return "n/a" if x is None else f"{x:.{digits}f}"


def _moved(a: float | None, b: float | None, eps: float = 0.01) -> str:
    if a is None or b is None:
        return "was not measured"
    verb = "rose" if b > a + eps else "fell" if b < a - eps else "held"
    return f"{verb} {_fmt(a)} -> {_fmt(b)}"


class AlarmMonitor:
    """Online alarms: `update(row)` once per step returns the alarms newly raised at that step."""

    def __init__(self, config: AlarmConfig | None = None) -> None:
        self.config = config or AlarmConfig()
        self.tracker = PhaseTracker(self.config.phase)
        self._active: dict[str, bool] = {}
        self._quiet: dict[str, int] = {}
        self._skipped: float | None = None
        self._stagnant = 0
        self._searches = SearchDeclineTracker()
        self.alarms: list[Alarm] = []
        self.label: PhaseLabel | None = None

    @property
    def phase(self) -> str | None:
        return self.label.phase if self.label else None

    def update(self, row: Mapping[str, Any]) -> list[Alarm]:
        label = self.tracker.update(row)
        self.label = label
        ev = label.evidence
        step = label.step
        self._stagnant = self._stagnant + 1 if label.phase == "stagnation" else 0
        decaying = ev["falling_streak"] >= self.config.phase.decay_steps
        from_displacement = ev.get("disp_pos") is not None
        firing: dict[str, Any] = {
            "displacement_decay": decaying and from_displacement,
            "likelihood_decay": decaying and not from_displacement,
            "collapse": label.phase == "collapse",
            "reward_collapse": bool(ev["reward_collapsed"]),
            "stagnation": self._stagnant >= self.config.stagnation_steps,
            "nonfinite": self._nonfinite(row),
            "search_decline": self._searches.update(step, as_float(row.get(SEARCHES_KEY))),
        }
        for name, (kind, _) in _SPIKE_KINDS.items():
            firing[kind] = name in ev["signals"]
        raised = []
        for kind in ALARM_KINDS:
            if firing[kind]:
                self._quiet[kind] = 0
                if not self._active.get(kind):
                    self._active[kind] = True
                    raised.append(self._make(kind, step, ev, firing[kind]))
            else:
                self._quiet[kind] = self._quiet.get(kind, 0) + 1
                if self._quiet[kind] >= self.config.rearm_steps:
                    self._active[kind] = False
        self.alarms.extend(raised)
        return raised

    def _nonfinite(self, row: Mapping[str, Any]) -> float | bool:
        total = as_float(row.get(SKIPPED_KEY))
        if total is None:
            return False
        prev, self._skipped = self._skipped, total
        return total - prev if prev is not None and total > prev else False

    def _history(self) -> list[Sample]:
        return list(self.tracker.history)

    def _make(self, kind: str, step: int, ev: Mapping[str, Any], extra: Any) -> Alarm:
        evidence: dict[str, Any] = {"phase": self.label.phase if self.label else None}
        if kind in ("likelihood_decay", "displacement_decay"):
            message = self._decay_message(step, evidence)
        elif kind == "collapse":
            evidence.update(signals=list(ev["signals"]), since_step=step)
            message = (
                f"collapse phase entered at step {step}: "
                f"{', '.join(ev['signals']) or 'likelihood decay with reward drop'}; "
                f"correct-response log-likelihood {_fmt(ev['logp_correct'])}, "
                f"reward {_fmt(ev['reward_level'])} (peak {_fmt(ev['reward_peak'])})"
            )
        elif kind == "reward_collapse":
            peak_step = ev["reward_peak_step"]
            evidence.update(peak=ev["reward_peak"], level=ev["reward_level"], since_step=peak_step)
            message = (
                f"reward collapsed: smoothed reward fell from its peak {_fmt(ev['reward_peak'])}"
                f" at step {peak_step} to {_fmt(ev['reward_level'])} at step {step}"
            )
        elif kind == "stagnation":
            n = self.config.stagnation_steps
            evidence.update(
                logp_slope=ev["logp_long_slope"],
                reward_slope=ev["reward_long_slope"],
                since_step=step - n + 1,
            )
            message = (
                f"correct-response log-likelihood flat over steps {step - n + 1}-{step} "
                f"(slope {_fmt(ev['logp_long_slope'], 4)}/step) while reward rose "
                f"{_fmt(ev['reward_long_slope'], 4)}/step"
            )
        elif kind == "nonfinite":
            total = int(self._skipped or 0)
            evidence.update(new_skips=extra, skipped_total=total, since_step=step)
            message = (
                f"{int(extra)} optimizer update(s) skipped at step {step} for non-finite "
                f"loss or gradients ({total} so far)"
            )
        elif kind == "search_decline":
            assert isinstance(extra, SearchDecline)
            evidence.update(
                valid_searches=extra.window_median,
                valid_searches_early=extra.early_median,
                since_step=extra.window_start,
            )
            message = (
                f"the agent searches less: median {extra.window_median:.2f} valid searches per "
                f"rollout over steps {extra.window_start}-{step}, against "
                f"{extra.early_median:.2f} over its first {EARLY} steps"
            )
        else:
            name = next(n for n, (k, _) in _SPIKE_KINDS.items() if k == kind)
            label = _SPIKE_KINDS[name][1]
            value = getattr(self._history()[-1], name)
            z, ratio = ev[f"{name}_z"], ev[f"{name}_ratio"]
            baseline = value / ratio if value is not None and ratio else None
            evidence.update(value=value, baseline=baseline, z=z, ratio=ratio, since_step=step)
            n = self.config.phase.baseline_window
            message = (
                f"{label} spiked to {_fmt(value, 3)} at step {step}: {_fmt(ratio, 1)}x its median "
                f"{_fmt(baseline, 3)} over the previous {n} steps (robust z {_fmt(z, 1)})"
            )
        evidence.update({k: ev[k] for k in ("logp_correct", "reward_level", "signals")})
        return Alarm(step, kind, SEVERITY[kind], message, evidence)

    def _decay_message(self, step: int, evidence: dict[str, Any]) -> str:
        """Cite where the decline began: from the displacement, where its rolling medians first
        said so; from the rollout-time likelihood, the smoothed maximum inside the span that
        made the trend (trend window + the K falling steps)."""
        cfg = self.config.phase
        hist = self._history()
        label = self.label
        if label is not None and label.evidence.get("disp_pos") is not None:
            ev = label.evidence
            s0 = step - ev["falling_streak"] + 1
            r0 = next((s.reward for s in hist if s.step == s0 - cfg.disp_window), None)
            r1 = ev["reward_level"]
            evidence.update(
                since_step=s0, disp_pos=ev["disp_pos"], frac_pos_fell=ev["frac_pos_fell"]
            )
            return (
                f"lazy likelihood displacement: the responses GRPO pushes up (advantage > 0) "
                f"lost likelihood over steps {s0}-{step} (median change {_fmt(ev['disp_pos'])} "
                f"nats per response per step, {_fmt(100 * ev['frac_pos_fell'], 0)}% of them fell"
                f", over the last {cfg.disp_window} steps) while reward {_moved(r0, r1)}"
            )
        span = hist[-(cfg.window + cfg.decay_steps - 1) :]

        def level(i: int, attr: str, width: int) -> float | None:
            vals = [getattr(s, attr) for s in span[max(0, i - width + 1) : i + 1]]
            vals = [v for v in vals if v is not None]
            return median(vals) if vals else None

        levels = [level(i, "logp", 3) for i in range(len(span))]
        known = [i for i, v in enumerate(levels) if v is not None]
        # the last step still at the maximum: where the flat (or rising) part ended
        start = max(known, key=lambda i: (levels[i], i)) if known else 0
        a, b = levels[start], levels[-1]
        r0, r1 = level(start, "reward", cfg.smooth), level(len(span) - 1, "reward", cfg.smooth)
        s0 = span[start].step
        evidence.update(since_step=s0, logp_from=a, logp_to=b, reward_from=r0, reward_to=r1)
        return (
            f"correct-response log-likelihood fell from {_fmt(a)} to {_fmt(b)} over steps "
            f"{s0}-{step} while reward {_moved(r0, r1)}"
        )


def scan_alarms(
    rows: Iterable[Mapping[str, Any]], config: AlarmConfig | None = None
) -> list[Alarm]:
    """All alarms a monitor would have raised over a finished metrics log."""
    monitor = AlarmMonitor(config)
    for row in rows:
        monitor.update(row)
    return monitor.alarms
