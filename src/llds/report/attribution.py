"""Which known collapse mechanisms left their signature in the steps before a collapse or alarm.

Five mechanisms are known to precede GRPO collapses: lazy likelihood displacement (LLD), a
mismatch between the sampling and the trained policy, void turns, entropy collapse or blow-up,
and a learning rate that diverges. A sixth is particular to search agents: the policy searches
less and answers before it has read what it needs. Each has a rule over the logged signals in
the `WINDOW` steps up to an event; a rule reports `present`, `absent` or `not logged` with the
numbers it read. Every rule compares the window with the run's own healthy baseline, its first
`EARLY` steps (before the window): a level that a healthy run of that world also has is not a
signature, since an absolute threshold separates worlds rather than states of one run. The rules
are written out in docs/diagnostics.md ("Attributing a collapse"). A present signature is a
co-occurrence in the log, not a cause: the report words it so.

The thresholds are round values chosen before looking at any study's runs; none was tuned,
except `SEARCH_DECLINE` (`llds.monitor.searches`), which was set after seeing the one run that
showed the signature (see its docstring).
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence, Set
from dataclasses import dataclass, field
from typing import Any, Literal

from llds import metrics as keys
from llds.monitor.alarms import Alarm
from llds.monitor.robust import as_float
from llds.monitor.searches import SEARCHES_KEY, declined
from llds.report.collapse import SMOOTH, censored, collapse_step, median_window

WINDOW = 20
"""Steps examined before an event, the event's own step included."""
EARLY = 20
"""The run's first steps: the baseline that "rising", "collapse" and "blow-up" compare with."""
MIN_POINTS = 5
"""A window or baseline with fewer known values is not judged."""

LLD_SHARE_KEYS = ("lld/share_pos_fell", keys.FRAC_POS_FELL, "lld/premb_share_pos_fell")
"""The LLD rule's share, in order of preference."""
SHARE_FELL_MIN = 0.5
"""LLD: the window's median share of positive-advantage responses whose likelihood fell (more
than half of the responses GRPO reinforces became less likely) ..."""
SHARE_RISE = 0.1
"""... and at least this much above its median over the run's early steps: in some worlds more
than half fall from the first step on, in runs that never collapse."""
REWARD_HELD = 0.8
"""LLD: the reward held when the window began if its 10-step median there was at least this
share of its running peak."""
RISE_FACTOR = 2.0
"""Mismatch and void turns: "rising" is a window median at least this multiple of the early
median (and above the floor of its metric)."""
K3_FLOOR = 1e-3
"""Mismatch: k3 KL below this (nats per token) is not a rise, whatever the early value."""
LOGP_DIFF_FLOOR = 1.0
"""Mismatch: a largest |log-prob difference| below 1 nat (a factor e) is not a rise."""
ESS_MIN = 0.5
"""Mismatch: an importance-sampling effective sample size (as a fraction) at or below this,
where its early median was above it."""
VOID_RISE_MIN = 0.1
"""Void turns: the share must also rise by at least this much over the early median."""
ENTROPY_COLLAPSE = 0.1
"""Entropy: a window median at or below this share of the early median is a collapse."""
ENTROPY_BLOWUP = 2.0
"""Entropy: a window maximum at or above this multiple of the early median is a blow-up."""
KL_LARGE = 0.05
"""Learning rate: a window median approx-KL (nats per token per update) at or above this, and
`RISE_FACTOR` x its early median; or ..."""
CLIP_LARGE = 0.2
"""... a window median clipped share (low + high) at or above this, and `RISE_FACTOR` x its
early median; or ..."""
GRAD_GROWTH = 10.0
"""... a window median gradient norm at or above this multiple of the early one."""
LR_RISE = 1.5
"""Learning rate: where `lr` is logged, its window median at least this multiple of its early
median (the live `lr_divergence` alarm's default)."""
LR_KEY = "lr"

Status = Literal["present", "absent", "not logged"]
Series = Mapping[str, Sequence[tuple[int, float]]]
"""Metric name -> its (step, value) pairs, in step order."""

COLLAPSE = "pre-registered collapse"
"""The kind of the event at the collapse of `report.collapse` (apart from the alarm kind
`collapse`, which the phase detector raises)."""

MECHANISMS = (
    "LLD",
    "mismatch",
    "void turns",
    "entropy",
    "learning-rate divergence",
    "search decline",
)
MECHANISM_CODES: dict[str, str] = {
    "LLD": "lld",
    "mismatch": "mismatch",
    "void turns": "tool",
    "entropy": "entropy",
    "learning-rate divergence": "lr",
    "search decline": "tool",
}
"""Each mechanism's code, as the monitor's alarms and the collapse corpus name it
(`llds.monitor.registry.MECHANISMS`)."""
CAUSAL_TIERS: tuple[tuple[str, ...], ...] = (
    ("mismatch", "learning-rate divergence"),
    ("void turns", "search decline"),
    ("LLD",),
    ("entropy",),
)
"""Where several signatures precede a collapse, the cause named is the most upstream one: a
fault of the training set-up (the sampler, the learning rate) changes how the agent uses its
tool and the policy's state, tool use changes what the policy learns, and the death spiral
runs from LLD to an entropy blow-up, never the reverse. The others are listed as downstream.
A learning-rate finding without the rate in the log (`lr_growth` unknown) is only updates
grown large, which the death spiral itself produces: it then sits after LLD, with entropy."""
UNLOGGED_RATE_TIER = 3
"""The tier (index in `CAUSAL_TIERS`) of a learning-rate divergence read without `lr`."""
LEAD = 20
"""A critical alarm is timely when it comes at least this many steps before the collapse."""
STABILIZERS: dict[str, tuple[str, str]] = {
    "LLD": ("LLDS", "algo.llds.enabled=true"),
    "mismatch": ("truncated importance sampling", "algo.rollout_correction.mode=tis"),
    "void turns": ("the void-turn filter", "algo.filter_void_turns=true"),
    "entropy": ("clip-higher", "algo.clip_high=0.28"),
    "learning-rate divergence": ("a lower learning rate", "optim.lr"),
    "search decline": ("LLDS-MA", "algo.llds.mask_answer=true"),
}
"""Each mechanism's stabilizer and its switch, as docs/stabilizers.md names them."""
SIGNALS = (
    keys.REWARD_MEAN,
    *LLD_SHARE_KEYS,  # every share the LLD rule may read: veRL and TRL log only the last
    keys.DISP_POS,
    "mismatch/k3_kl",
    "mismatch/abs_logp_diff_max",
    "mismatch/is_ess",
    "turns/void_share",
    keys.ENTROPY,
    "policy/approx_kl",
    "policy/clip_frac_low",
    "policy/clip_frac_high",
    keys.GRAD_NORM,
    SEARCHES_KEY,
    LR_KEY,
)
"""The metrics the rules read."""


@dataclass(frozen=True)
class Finding:
    """One mechanism's rule applied to one window: its verdict and the numbers behind it."""

    mechanism: str
    status: Status
    reason: str = ""
    numbers: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class Event:
    """A collapse or an alarm, with every mechanism's finding over the window before it."""

    kind: str
    step: int
    findings: tuple[Finding, ...]

    def with_status(self, status: Status) -> list[Finding]:
        """The findings with one verdict, in `MECHANISMS` order."""
        return [f for f in self.findings if f.status == status]


def signal_series(rows: Sequence[Mapping[str, Any]]) -> dict[str, list[tuple[int, float]]]:
    """The rules' metrics from metric rows (missing and non-finite values dropped)."""
    out: dict[str, list[tuple[int, float]]] = {}
    for i, row in enumerate(rows):
        step = as_float(row.get("step"))
        for key in SIGNALS:
            value = as_float(row.get(key))
            if value is not None:
                out.setdefault(key, []).append((int(step) if step is not None else i + 1, value))
    return out


def _values(series: Series, key: str, lo: int, hi: int) -> list[float]:
    """The values of `key` at steps lo..hi, both included."""
    return [v for s, v in series.get(key, ()) if lo <= s <= hi]


def _median(values: Sequence[float]) -> float | None:
    return statistics.median(values) if len(values) >= MIN_POINTS else None


@dataclass(frozen=True)
class Baseline:
    """A metric's median over the run's early steps, and which steps those were."""

    median: float
    first: int
    last: int

    def text(self) -> str:
        return f"{_fmt(self.median)} over its steps {self.first}-{self.last}"


def baseline(series: Series, key: str, window_start: int) -> Baseline | None:
    """`key` over the run's first `EARLY` steps that come before the window; None with fewer
    than `MIN_POINTS` values there."""
    points = series.get(key, ())
    first = min((s for s, _ in points), default=0)
    last = min(first + EARLY - 1, window_start - 1)
    values = [(s, v) for s, v in points if first <= s <= last]
    med = _median([v for _, v in values])
    return None if med is None else Baseline(med, values[0][0], values[-1][0])


def _early(series: Series, key: str, window_start: int) -> float | None:
    """Median of `key` over the run's first `EARLY` steps that come before the window."""
    found = baseline(series, key, window_start)
    return found.median if found is not None else None


NO_BASELINE = "no early steps to compare"


def _fmt(x: float) -> str:
    return f"{x:.3g}"


def lld_rule(series: Series, step: int) -> Finding:
    """Positive-advantage responses losing likelihood against the run's early steps (the median
    share fell at least `SHARE_FELL_MIN` and `SHARE_RISE` above its early median, or the median
    `lld/disp_pos` negative where it was not early) while the reward still held when the window
    began."""
    lo = step - WINDOW + 1
    # the pooled share after the update (native), else the older per-step share, else the share
    # a TRL or veRL loss sees before each mini-batch's own update (see docs/integrations.md)
    share_key = next((k for k in LLD_SHARE_KEYS if series.get(k)), keys.FRAC_POS_FELL)
    share = _median(_values(series, share_key, lo, step))
    disp = _median(_values(series, keys.DISP_POS, lo, step))
    if share is None and disp is None:
        return Finding("LLD", "not logged")
    nums: dict[str, float] = {}
    said = []
    displaced = False
    if share is not None:
        nums[share_key] = share
        early = baseline(series, share_key, lo)
        if early is None:
            said.append(f"median {share_key} {_fmt(share)} ({NO_BASELINE})")
        else:
            nums[f"{share_key}_early"] = early.median
            said.append(f"median {share_key} {_fmt(share)} against {early.text()}")
            displaced = share >= SHARE_FELL_MIN and share >= early.median + SHARE_RISE
    if disp is not None:
        nums[keys.DISP_POS] = disp
        early = baseline(series, keys.DISP_POS, lo)
        if early is None:
            said.append(f"median {keys.DISP_POS} {_fmt(disp)} ({NO_BASELINE})")
        else:
            nums[f"{keys.DISP_POS}_early"] = early.median
            said.append(f"median {keys.DISP_POS} {_fmt(disp)} against {early.text()}")
            displaced |= disp < 0 <= early.median
    rewards = series.get(keys.REWARD_MEAN, ())
    before = [v for s, v in rewards if s <= lo]
    level = median_window(before, len(before) - 1, SMOOTH) if before else None
    peak = max((median_window(before, i, SMOOTH) or 0.0 for i in range(len(before))), default=0.0)
    held = level is not None and level >= REWARD_HELD * peak
    if level is not None:
        nums["reward_at_window_start"], nums["reward_peak"] = level, peak
        said.append(f"reward {_fmt(level)} at step {lo} against a peak of {_fmt(peak)}")
    return Finding("LLD", "present" if displaced and held else "absent", "; ".join(said), nums)


def _rising(series: Series, key: str, step: int, floor: float) -> tuple[bool, str, float | None]:
    """Whether the window median of `key` is at least `RISE_FACTOR` x its early median and
    at least `floor`; with the sentence and the window median."""
    lo = step - WINDOW + 1
    now = _median(_values(series, key, lo, step))
    if now is None:
        return False, "", None
    early = baseline(series, key, lo)
    if early is None:
        return False, f"median {key} {_fmt(now)} ({NO_BASELINE})", now
    rose = now >= RISE_FACTOR * early.median and now >= floor
    return rose, f"median {key} {_fmt(now)} against {early.text()}", now


def mismatch_rule(series: Series, step: int) -> Finding:
    """Sampler and trained policy drifting apart: k3 KL or the largest |log-prob difference|
    rising, or the importance weights' effective sample size at or below `ESS_MIN`."""
    parts, nums, present = [], {}, False
    for key, floor in (
        ("mismatch/k3_kl", K3_FLOOR),
        ("mismatch/abs_logp_diff_max", LOGP_DIFF_FLOOR),
    ):
        rose, said, now = _rising(series, key, step, floor)
        if now is not None:
            nums[key] = now
            parts.append(said)
            present |= rose
    lo = step - WINDOW + 1
    ess = _values(series, "mismatch/is_ess", lo, step)
    if len(ess) >= MIN_POINTS:
        nums["mismatch/is_ess"] = min(ess)
        early = baseline(series, "mismatch/is_ess", lo)
        against = early.text() if early is not None else NO_BASELINE
        parts.append(f"lowest mismatch/is_ess {_fmt(min(ess))} against {against}")
        present |= early is not None and min(ess) <= ESS_MIN < early.median
    if not nums:
        return Finding("mismatch", "not logged")
    return Finding("mismatch", "present" if present else "absent", "; ".join(parts), nums)


def void_turn_rule(series: Series, step: int) -> Finding:
    """The share of rollouts with a void turn rising (`RISE_FACTOR` x its early median and up
    by at least `VOID_RISE_MIN`)."""
    key = "turns/void_share"
    rose, said, now = _rising(series, key, step, 0.0)
    if now is None:
        return Finding("void turns", "not logged")
    early = _early(series, key, step - WINDOW + 1)
    rose = rose and early is not None and now - early >= VOID_RISE_MIN
    return Finding("void turns", "present" if rose else "absent", said, {key: now})


def entropy_rule(series: Series, step: int) -> Finding:
    """Entropy collapsed (window median <= `ENTROPY_COLLAPSE` x early median) or blew up
    (window maximum >= `ENTROPY_BLOWUP` x early median)."""
    lo = step - WINDOW + 1
    window = _values(series, keys.ENTROPY, lo, step)
    if len(window) < MIN_POINTS:
        return Finding("entropy", "not logged")
    base = baseline(series, keys.ENTROPY, lo)
    now, top = statistics.median(window), max(window)
    nums = {"entropy_median": now, "entropy_max": top}
    if base is None:
        return Finding("entropy", "absent", f"median {_fmt(now)} ({NO_BASELINE})", nums)
    early = nums["entropy_early"] = base.median
    if now <= ENTROPY_COLLAPSE * early:
        return Finding("entropy", "present", f"collapse: median {_fmt(now)}, {base.text()}", nums)
    if top >= ENTROPY_BLOWUP * early:
        return Finding("entropy", "present", f"blow-up: max {_fmt(top)}, {base.text()}", nums)
    return Finding("entropy", "absent", f"median {_fmt(now)}, max {_fmt(top)}, {base.text()}", nums)


def _clip_series(series: Series) -> list[tuple[int, float]]:
    """Low + high clipped shares per step (either alone where only one is logged)."""
    total: dict[int, float] = {}
    for key in ("policy/clip_frac_low", "policy/clip_frac_high"):
        for s, v in series.get(key, ()):
            total[s] = total.get(s, 0.0) + v
    return sorted(total.items())


def lr_divergence_rule(series: Series, step: int) -> Finding:
    """Updates grown too large against the run's early steps: the window median approx-KL at
    least `RISE_FACTOR` x its early median and `KL_LARGE`, or the clipped share at least
    `RISE_FACTOR` x its early median and `CLIP_LARGE`, or the gradient norm `GRAD_GROWTH`-fold;
    where the log has the learning rate (`lr`), only while it rose at least `LR_RISE`-fold (a
    death spiral grows the gradients at a constant learning rate), and then the KL and clipped
    share need only their `RISE_FACTOR` rise: the log shows the cause itself, so the absolute
    floors, which keep small relative changes of a healthy run out, are not needed."""
    name = "learning-rate divergence"
    lo = step - WINDOW + 1
    lr_now = _median(_values(series, LR_KEY, lo, step))
    lr_early = baseline(series, LR_KEY, lo)
    lr_growth = (
        lr_now / lr_early.median
        if lr_now is not None and lr_early is not None and lr_early.median > 0
        else None
    )
    lr_logged = lr_growth is not None
    lr_rose = lr_growth is None or lr_growth >= LR_RISE  # without `lr`, the growth alone decides
    floors = (0.0, 0.0) if lr_logged and lr_rose else (KL_LARGE, CLIP_LARGE)
    clip = {"policy/clip_frac": _clip_series(series)}
    merged: dict[str, Sequence[tuple[int, float]]] = {**series, **clip}
    parts, nums, grew = [], {}, False
    for key, floor in zip(("policy/approx_kl", "policy/clip_frac"), floors, strict=True):
        rose, said, now = _rising(merged, key, step, floor)
        if now is not None:
            nums[key] = now
            parts.append(said)
            grew |= rose
    grad_now = _median(_values(series, keys.GRAD_NORM, lo, step))
    grad_early = baseline(series, keys.GRAD_NORM, lo)
    if grad_now is not None and grad_early is not None and grad_early.median > 0:
        growth = nums["grad_norm_growth"] = grad_now / grad_early.median
        parts.append(f"grad norm x{_fmt(growth)} against {grad_early.text()}")
        grew |= growth >= GRAD_GROWTH
    if not nums:
        return Finding(name, "not logged")
    if lr_growth is not None and lr_early is not None:
        nums["lr_growth"] = lr_growth
        parts.append(
            f"learning rate x{_fmt(lr_growth)} against its steps {lr_early.first}-{lr_early.last}"
        )
    present = grew and lr_rose
    return Finding(name, "present" if present else "absent", "; ".join(parts), nums)


def search_decline_rule(series: Series, step: int) -> Finding:
    """The policy searching less: the window median of valid searches per rollout at most
    `SEARCH_DECLINE` x its early median, which is at least `SEARCH_FLOOR`
    (`llds.monitor.searches`, the rule the live alarm uses)."""
    name, key = "search decline", SEARCHES_KEY
    lo = step - WINDOW + 1
    window = _values(series, key, lo, step)
    now = _median(window)
    if now is None:
        return Finding(name, "not logged")
    first = min(s for s, _ in series[key])
    verdict = declined(_values(series, key, first, min(first + EARLY - 1, lo - 1)), window)
    base = baseline(series, key, lo)
    if verdict is None or base is None:
        return Finding(name, "absent", f"median {key} {_fmt(now)} ({NO_BASELINE})")
    present, early, _ = verdict
    nums = {key: now, "valid_searches_early": early}
    said = f"median {key} {_fmt(now)} against {base.text()}"
    return Finding(name, "present" if present else "absent", said, nums)


RULES = (
    lld_rule,
    mismatch_rule,
    void_turn_rule,
    entropy_rule,
    lr_divergence_rule,
    search_decline_rule,
)
"""One rule per mechanism, in `MECHANISMS` order."""


def attribute(series: Series, kind: str, step: int) -> Event:
    """Every mechanism's finding over the `WINDOW` steps up to `step`."""
    return Event(kind, step, tuple(rule(series, step) for rule in RULES))


def reward_collapse(series: Series) -> int | None:
    """The step of the pre-registered collapse (`report.collapse`), read from the reward."""
    points = series.get(keys.REWARD_MEAN, ())
    if not points:
        return None
    return collapse_step([s for s, _ in points], [v for _, v in points])


def run_events(rows: Sequence[Mapping[str, Any]], alarms: Sequence[Alarm]) -> list[Event]:
    """The run's collapse (if any) and its warning and critical alarms, each attributed; info
    alarms (stagnation) are left out, since they also occur in healthy runs."""
    series = signal_series(rows)
    events = []
    collapse = reward_collapse(series)
    if collapse is not None:
        events.append(attribute(series, COLLAPSE, collapse))
    events += [attribute(series, a.kind, a.step) for a in alarms if a.severity != "info"]
    return events


@dataclass(frozen=True)
class Verdict:
    """What the report concludes about one run: whether and when it collapsed (censored when
    the log ends too soon after), the mechanisms whose signatures depart from the run's early
    steps in the window before the collapse (the causes it names), and the first critical
    alarm, and the first one that came at least `LEAD` steps ahead."""

    last_step: int
    collapse_step: int | None = None
    censored: bool = False
    named: tuple[str, ...] = ()
    """the mechanisms named as the collapse's cause (`MECHANISMS` names); empty: none"""
    downstream: tuple[str, ...] = ()
    """the other signatures present before the collapse, downstream of the named ones"""
    first_critical: Alarm | None = None
    first_timely: Alarm | None = None

    @property
    def collapsed(self) -> bool:
        """A collapse that is not censored."""
        return self.collapse_step is not None and not self.censored

    @property
    def codes(self) -> tuple[str, ...]:
        """The named mechanisms as codes (`lld`, `tool`, ...), each once."""
        return tuple(dict.fromkeys(MECHANISM_CODES[m] for m in self.named))

    def line(self, label: str) -> str:
        """The verdict in one plain line, for the terminal."""
        if self.collapse_step is None:
            head = "did not collapse"
        elif self.censored:
            head = (
                f"reward fell at step {self.collapse_step} but the log ends at step "
                f"{self.last_step}: censored, nothing after step {self.last_step} was seen"
            )
        else:
            head = f"collapsed at step {self.collapse_step}"
        parts = [head]
        if self.collapse_step is not None:
            parts.append(
                f"cause named: {', '.join(self.named)}" if self.named else "no known signature"
            )
            if self.downstream:
                parts.append(f"also present, downstream: {', '.join(self.downstream)}")
        if self.first_timely is not None and self.collapse_step is not None:
            a = self.first_timely
            lead = self.collapse_step - a.step
            parts.append(f"first timely alarm: {a.kind} at step {a.step} ({lead} steps ahead)")
        elif self.collapse_step is not None:
            parts.append(f"no critical alarm {LEAD} or more steps ahead")
        elif self.first_critical is not None:
            a = self.first_critical
            parts.append(f"first critical alarm: {a.kind} at step {a.step}")
        else:
            parts.append("no critical alarm")
        return f"{label}: " + "; ".join(parts)


def verdict_of(rows: Sequence[Mapping[str, Any]], alarms: Sequence[Alarm]) -> Verdict:
    """The report's verdict on a run from its rows and the alarms replayed on them."""
    series = signal_series(rows)
    steps = [s for s, _ in series.get(keys.REWARD_MEAN, ())]
    last = int(as_float(rows[-1].get("step")) or len(rows)) if rows else 0
    collapse = reward_collapse(series)
    critical = [a for a in alarms if a.severity == "critical"]
    first = critical[0] if critical else None
    if collapse is None:
        return Verdict(last, first_critical=first)
    event = attribute(series, COLLAPSE, collapse)
    timely = next((a for a in critical if a.step <= collapse - LEAD), None)
    found = event.with_status("present")
    present = [f.mechanism for f in found]
    rate_unknown = {
        f.mechanism
        for f in found
        if f.mechanism == "learning-rate divergence" and "lr_growth" not in f.numbers
    }
    named = most_upstream(present, rate_unknown)
    return Verdict(
        last,
        collapse,
        censored(steps, collapse),
        named,
        tuple(m for m in present if m not in named),
        first,
        timely,
    )


def most_upstream(present: Sequence[str], rate_unknown: Set[str] = frozenset()) -> tuple[str, ...]:
    """The present mechanisms of the first `CAUSAL_TIERS` tier that has any (in `MECHANISMS`
    order); `rate_unknown` (a learning-rate divergence read without `lr`) counts in tier
    `UNLOGGED_RATE_TIER` instead of its own; empty when none is present."""

    def tier_of(m: str) -> int:
        if m in rate_unknown:
            return UNLOGGED_RATE_TIER
        return next(i for i, tier in enumerate(CAUSAL_TIERS) if m in tier)

    if not present:
        return ()
    first = min(tier_of(m) for m in present)
    return tuple(m for m in present if tier_of(m) == first)
