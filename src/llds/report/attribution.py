"""Which known collapse mechanisms left their signature in the steps before a collapse or alarm.

Five mechanisms are known to precede GRPO collapses: lazy likelihood displacement (LLD), a
mismatch between the sampling and the trained policy, void turns, entropy collapse or blow-up,
and a learning rate that diverges. A sixth is particular to search agents: the policy searches
less and answers before it has read what it needs. Each has a rule over the logged signals in
the `WINDOW` steps up to an event; a rule reports `present`, `absent` or `not logged` with the
numbers it read. The rules are written out in docs/diagnostics.md ("Attributing a collapse"). A
present signature is a co-occurrence in the log, not a cause: the report words it so.

The thresholds are round values chosen before looking at any study's runs; none was tuned,
except `SEARCH_DECLINE` (`llds.monitor.searches`), which was set after seeing the one run that
showed the signature (see its docstring).
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from llds import metrics as keys
from llds.monitor.alarms import Alarm
from llds.monitor.robust import as_float
from llds.monitor.searches import SEARCHES_KEY, declined
from llds.report.collapse import SMOOTH, collapse_step, median_window

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
than half of the responses GRPO reinforces became less likely)."""
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
"""Mismatch: an importance-sampling effective sample size (as a fraction) at or below this."""
VOID_RISE_MIN = 0.1
"""Void turns: the share must also rise by at least this much over the early median."""
ENTROPY_COLLAPSE = 0.1
"""Entropy: a window median at or below this share of the early median is a collapse."""
ENTROPY_BLOWUP = 2.0
"""Entropy: a window maximum at or above this multiple of the early median is a blow-up."""
KL_LARGE = 0.05
"""Learning rate: an early median approx-KL (nats per token per update) at or above this."""
CLIP_LARGE = 0.2
"""Learning rate: an early median clipped share (low + high) at or above this."""
GRAD_GROWTH = 10.0
"""Learning rate: a window median gradient norm at or above this multiple of the early one."""

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


def _early(series: Series, key: str, window_start: int) -> float | None:
    """Median of `key` over the run's first `EARLY` steps that come before the window."""
    first = min((s for s, _ in series.get(key, ())), default=0)
    return _median(_values(series, key, first, min(first + EARLY - 1, window_start - 1)))


def _fmt(x: float) -> str:
    return f"{x:.3g}"


def lld_rule(series: Series, step: int) -> Finding:
    """Positive-advantage responses losing likelihood (median share fell >= `SHARE_FELL_MIN`,
    or median `lld/disp_pos` < 0) while the reward still held when the window began."""
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
    if share is not None:
        nums[share_key] = share
        said.append(f"median {share_key} {_fmt(share)}")
    if disp is not None:
        nums[keys.DISP_POS] = disp
        said.append(f"median {keys.DISP_POS} {_fmt(disp)}")
    displaced = (share is not None and share >= SHARE_FELL_MIN) or (disp is not None and disp < 0)
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
    early = _early(series, key, lo)
    if early is None:
        return False, f"median {key} {_fmt(now)} (no early steps to compare)", now
    rose = now >= RISE_FACTOR * early and now >= floor
    return rose, f"median {key} {_fmt(now)} against {_fmt(early)} early", now


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
    ess = _values(series, "mismatch/is_ess", step - WINDOW + 1, step)
    if len(ess) >= MIN_POINTS:
        nums["mismatch/is_ess"] = min(ess)
        parts.append(f"lowest mismatch/is_ess {_fmt(min(ess))}")
        present |= min(ess) <= ESS_MIN
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
    early = _early(series, keys.ENTROPY, lo)
    now, top = statistics.median(window), max(window)
    nums = {"entropy_median": now, "entropy_max": top}
    if early is None:
        return Finding("entropy", "absent", f"median {_fmt(now)} (no early steps to compare)", nums)
    nums["entropy_early"] = early
    if now <= ENTROPY_COLLAPSE * early:
        return Finding(
            "entropy", "present", f"collapse: median {_fmt(now)}, early {_fmt(early)}", nums
        )
    if top >= ENTROPY_BLOWUP * early:
        return Finding("entropy", "present", f"blow-up: max {_fmt(top)}, early {_fmt(early)}", nums)
    return Finding(
        "entropy", "absent", f"median {_fmt(now)}, max {_fmt(top)}, early {_fmt(early)}", nums
    )


def _clip_series(series: Series) -> list[tuple[int, float]]:
    """Low + high clipped shares per step (either alone where only one is logged)."""
    total: dict[int, float] = {}
    for key in ("policy/clip_frac_low", "policy/clip_frac_high"):
        for s, v in series.get(key, ()):
            total[s] = total.get(s, 0.0) + v
    return sorted(total.items())


def lr_divergence_rule(series: Series, step: int) -> Finding:
    """Updates too large from the first steps: early median approx-KL >= `KL_LARGE`, with an
    early median clipped share >= `CLIP_LARGE` or the gradient norm grown `GRAD_GROWTH`-fold."""
    name = "learning-rate divergence"
    kl_pts = series.get("policy/approx_kl", ())
    if not kl_pts:
        return Finding(name, "not logged")
    first = kl_pts[0][0]
    last_early = first + EARLY - 1
    kl = _median([v for s, v in kl_pts if s <= last_early])
    if kl is None:
        return Finding(name, "absent", "too few early approx-KL values")
    nums, parts = {"approx_kl_early": kl}, [f"early median policy/approx_kl {_fmt(kl)}"]
    clip = _median([v for s, v in _clip_series(series) if s <= last_early])
    if clip is not None:
        nums["clip_frac_early"] = clip
        parts.append(f"early clipped share {_fmt(clip)}")
    lo = step - WINDOW + 1
    grad_now = _median(_values(series, keys.GRAD_NORM, lo, step))
    grad_early = _early(series, keys.GRAD_NORM, lo)
    grew = False
    if grad_now is not None and grad_early is not None and grad_early > 0:
        nums["grad_norm_growth"] = grad_now / grad_early
        parts.append(f"grad norm x{_fmt(grad_now / grad_early)} over its early median")
        grew = grad_now >= GRAD_GROWTH * grad_early
    large = kl >= KL_LARGE and ((clip is not None and clip >= CLIP_LARGE) or grew)
    return Finding(name, "present" if large else "absent", "; ".join(parts), nums)


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
    if verdict is None:
        return Finding(name, "absent", f"median {key} {_fmt(now)} (no early steps to compare)")
    present, early, _ = verdict
    nums = {key: now, "valid_searches_early": early}
    said = f"median {key} {_fmt(now)} against {_fmt(early)} early"
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
