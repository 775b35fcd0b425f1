"""Scoring the monitor on a corpus of runs whose collapses have known causes (pure, no I/O).

A corpus manifest names, per run, the mechanism that was set off in it (`none` for a healthy
run; an LLDS arm of one as `lld+llds`), its split (`tune`, `judge`, `heldout`), the step the
cause began (`cause_step`) and the step the run collapsed (`collapse_step`; empty when it did
not, or when the log ends too soon after to say), and optionally its `arm`, whether it is
`censored` and whether its collapse is `abrupt`. A collapse is *warned in time* when the
first critical alarm at or after the cause's onset comes at least `LEAD` steps before the
collapse; its lead is the steps between. An *abrupt* collapse (fewer than `ABRUPT` steps after
the onset) leaves no time to warn of, so it is counted apart: out of the timely denominator and
the leads. A *censored* run (its log ends too soon after its collapse to say whether the reward
came back) is neither collapsed nor healthy: out of every rate, counted apart. A healthy run
with any critical alarm is a false critical alarm. The report's *attribution* is right when the
mechanisms it names as the collapse's cause are exactly the manifest's. `llds monitor score`
reads the manifest and the runs and prints `table` and, as its last line, `scorecard_line`.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from pydantic import Field

from llds.config.schema import section
from llds.errors import DataFormatError
from llds.monitor.settings import MonitorConfig

if TYPE_CHECKING:
    from llds.monitor.alarms import Alarm

HEALTHY = "none"
SPLITS = ("tune", "judge", "heldout")
COLUMNS = ("run", "mechanism", "seed", "split", "cause_step", "collapse_step")
OPTIONAL_COLUMNS = ("arm", "censored", "abrupt")
"""Read when the manifest has them: `arm` (the run's arm, e.g. a healthy control `none` or a
corrected twin `mismatch+tis`; default its mechanism), `censored` and `abrupt` (`yes`/`no`;
without the column, not censored, and abrupt by the `ABRUPT` rule on the two steps)."""
ABRUPT = 30
"""A collapse fewer than this many steps after its cause's onset is abrupt (the collapse
corpus's protocol): the cause killed the run before a monitor could have warned in time."""
LEAD = 20
"""The least steps between a critical alarm and the collapse for the alarm to count as in
time: a user needs a few checkpoints' worth of steps to stop or roll back."""


@section
class ScoreConfig:
    """`llds monitor score`: the alarms scored on a corpus's split (CORPUS/manifest.csv), with
    the monitor settings given here (not each run's own: the settings are what is judged)."""

    corpus: str = ""
    """the corpus folder holding `manifest.csv` (its `run` paths are relative to it); on the
    command line, the positional"""
    split: Literal["tune", "judge", "heldout"] | None = None
    """which split to score: `tune` (where settings may be chosen: in-sample), `judge` or
    `heldout` (out of sample); required"""
    lead: int = Field(default=LEAD, ge=1)
    """steps a critical alarm must come before the collapse to count as in time"""
    monitor: MonitorConfig = dataclasses.field(default_factory=MonitorConfig)
    """the alarms' settings under test (the run config's `monitor` section)"""

    def missing(self) -> list[tuple[str, str]]:
        """Required keys left empty."""
        out = []
        if not self.corpus:
            out.append(("corpus", "required (a folder with manifest.csv)"))
        if self.split is None:
            out.append(("split", f"required: one of {', '.join(SPLITS)}"))
        return out


@dataclass(frozen=True)
class CorpusRun:
    """One row of a corpus manifest."""

    run: str
    mechanism: str
    seed: int
    split: str
    cause_step: int | None
    collapse_step: int | None
    arm: str = ""
    """the manifest's arm (empty: the same as the mechanism)"""
    censored: bool = False
    """the log ended too soon after a collapse to call it: neither collapsed nor healthy"""
    abrupt: bool = False
    """the collapse came fewer than `ABRUPT` steps after the cause's onset"""

    @property
    def gradual(self) -> bool:
        """A collapse a monitor could have warned of in time: collapsed, not abrupt."""
        return self.collapse_step is not None and not self.abrupt

    @property
    def healthy(self) -> bool:
        """A healthy run whose log can say so (not censored)."""
        return self.mechanism == HEALTHY and not self.censored

    @property
    def expected(self) -> str:
        """The mechanism the report should name: the manifest's, without an arm's `+llds`."""
        return self.mechanism.split("+", 1)[0]


@dataclass(frozen=True)
class Outcome:
    """One run replayed: its critical alarms' steps and the mechanisms (codes) the report
    names as its collapse's cause."""

    run: CorpusRun
    critical: tuple[int, ...]
    named: tuple[str, ...] = ()
    warnings: tuple[int, ...] = ()
    """the steps of its warning alarms (reported with their own rate, never as false alarms)"""
    steps: int = 0
    """the steps its log holds: the denominator of the warnings' rate"""

    @classmethod
    def replayed(
        cls,
        run: CorpusRun,
        rows: Sequence[Mapping[str, object]],
        alarms: Iterable[Alarm],
        named: tuple[str, ...],
    ) -> Outcome:
        """The outcome of `run` from its rows, the alarms replayed on them and the causes its
        report names: critical and warning alarms apart, the steps logged."""
        alarms = list(alarms)
        critical = tuple(a.step for a in alarms if a.severity == "critical")
        warnings = tuple(a.step for a in alarms if a.severity == "warning")
        return cls(run, critical, named, warnings, logged_steps(rows))

    def warning_step(self) -> int | None:
        """The first critical alarm at or after the cause's onset."""
        onset = self.run.cause_step or 0
        return next((s for s in self.critical if s >= onset), None)

    def warned_before_collapse(self) -> bool:
        """A critical alarm at or after the onset and before the collapse step (any lead)."""
        warned, collapse = self.warning_step(), self.run.collapse_step
        return warned is not None and collapse is not None and warned < collapse

    def lead(self, lead: int = LEAD) -> int | None:
        """Steps between that alarm and the collapse, when it came at least `lead` ahead."""
        collapse, warned = self.run.collapse_step, self.warning_step()
        if collapse is None or warned is None or collapse - warned < lead:
            return None
        return collapse - warned

    @property
    def attributed(self) -> bool:
        return self.named == (self.run.expected,)


def _step(value: str, column: str, where: str) -> int | None:
    text = value.strip()
    if not text:
        return None
    try:
        step = int(text)
    except ValueError:
        why = f"expected a step number or empty, got {value!r}"
        raise DataFormatError(f"{where}: {column}: {why}") from None
    if step < 0:
        raise DataFormatError(f"{where}: {column}: expected a step number, got {value!r}")
    return step


def _yes_no(row: Mapping[str, str], column: str, where: str) -> bool | None:
    value = row.get(column)
    if value is None:
        return None
    text = value.strip().lower()
    if text not in ("yes", "no"):
        raise DataFormatError(f"{where}: {column}: expected yes or no, got {value!r}")
    return text == "yes"


def _is_abrupt(cause: int | None, collapse: int | None, given: bool | None) -> bool:
    if given is not None:
        return given
    return cause is not None and collapse is not None and collapse - cause < ABRUPT


def parse_manifest(rows: Iterable[Mapping[str, str]], where: str) -> list[CorpusRun]:
    """The manifest's rows (as a CSV reader gives them) as `CorpusRun`s; a missing column, a
    split not in `SPLITS`, a cause run without `cause_step`, a value that is not a step (or,
    in `censored`/`abrupt`, not yes/no) or a censored run with a `collapse_step` is a
    `DataFormatError` naming the file, the row and the column."""
    out = []
    for i, row in enumerate(rows, 2):  # row 1 is the header
        at = f"{where}: row {i}"
        absent = [c for c in COLUMNS if row.get(c) is None]
        if absent:
            raise DataFormatError(f"{at}: missing column(s) {', '.join(absent)}")
        mechanism, split = row["mechanism"].strip(), row["split"].strip()
        if split not in SPLITS:
            raise DataFormatError(
                f"{at}: split: expected one of {', '.join(SPLITS)}, got {split!r}"
            )
        if not row["run"].strip() or not mechanism:
            raise DataFormatError(f"{at}: run and mechanism must not be empty")
        cause = _step(row["cause_step"], "cause_step", at)
        if mechanism != HEALTHY and cause is None:
            raise DataFormatError(f"{at}: cause_step: required for mechanism {mechanism!r}")
        seed = _step(row["seed"], "seed", at)
        collapse = _step(row["collapse_step"], "collapse_step", at)
        censored = bool(_yes_no(row, "censored", at))
        if censored and collapse is not None:
            raise DataFormatError(
                f"{at}: collapse_step: must be empty for a censored run, got {collapse}"
            )
        out.append(
            CorpusRun(
                row["run"].strip(),
                mechanism,
                seed if seed is not None else 0,
                split,
                cause,
                collapse,
                (row.get("arm") or "").strip(),
                censored,
                _is_abrupt(cause, collapse, _yes_no(row, "abrupt", at)),
            )
        )
    return out


@dataclass(frozen=True)
class MechanismScore:
    """One mechanism's line of the table (for `none`, the healthy runs; `arm` set for one arm
    of them)."""

    mechanism: str
    runs: int
    collapses: int
    """gradual collapses (not abrupt, not censored): the timely denominator"""
    timely: int
    leads: tuple[int, ...]
    attributed: int
    """gradual collapses whose named cause is exactly the mechanism"""
    with_critical: int
    """usable (not censored) runs with any critical alarm (for healthy runs: the false critical
    alarms)"""
    named_any: int
    """usable runs whose report names a cause (for healthy runs it should name none)"""
    abrupt: int = 0
    """abrupt collapses, counted apart: no alarm could have come in time"""
    abrupt_warned: int = 0
    """abrupt collapses with a critical alarm at or after the onset and before the collapse"""
    abrupt_attributed: int = 0
    censored: int = 0
    """runs out of every rate: the log ends too soon after a collapse to call it"""
    critical_alarms: int = 0
    """critical alarms over the usable runs"""
    with_warning: int = 0
    """usable runs with any warning alarm"""
    warning_alarms: int = 0
    """warning alarms over the usable runs"""
    steps: int = 0
    """logged steps over the usable runs"""
    arm: str = ""

    @property
    def warnings_per_100_steps(self) -> float | None:
        return 100 * self.warning_alarms / self.steps if self.steps else None

    @property
    def usable(self) -> int:
        return self.runs - self.censored

    @property
    def median_lead(self) -> float | None:
        return statistics.median(self.leads) if self.leads else None


@dataclass(frozen=True)
class Scorecard:
    """The per-mechanism scores and the totals of the last line."""

    split: str
    rows: tuple[MechanismScore, ...]
    healthy_arms: tuple[MechanismScore, ...] = ()
    """the healthy runs split by arm (controls, corrected twins, ...), when the manifest names
    arms"""

    @property
    def causes(self) -> list[MechanismScore]:
        return [r for r in self.rows if r.mechanism != HEALTHY]

    @property
    def healthy(self) -> MechanismScore | None:
        return next((r for r in self.rows if r.mechanism == HEALTHY), None)

    @property
    def timely(self) -> int:
        return sum(r.timely for r in self.causes)

    @property
    def collapses(self) -> int:
        return sum(r.collapses for r in self.causes)

    @property
    def attributed(self) -> int:
        return sum(r.attributed for r in self.causes)

    @property
    def abrupt(self) -> int:
        return sum(r.abrupt for r in self.causes)

    @property
    def leads(self) -> tuple[int, ...]:
        return tuple(x for r in self.causes for x in r.leads)

    @property
    def median_lead(self) -> float | None:
        return statistics.median(self.leads) if self.leads else None

    @property
    def false_critical_per_10_healthy(self) -> float | None:
        h = self.healthy
        return 10 * h.with_critical / h.usable if h is not None and h.usable else None


def _group_score(
    mechanism: str, group: Sequence[Outcome], lead: int, arm: str = ""
) -> MechanismScore:
    usable = [o for o in group if not o.run.censored]
    gradual = [o for o in usable if o.run.gradual]
    abrupt = [o for o in usable if o.run.collapse_step is not None and o.run.abrupt]
    leads = tuple(x for x in (o.lead(lead) for o in gradual) if x is not None)
    return MechanismScore(
        mechanism=mechanism,
        runs=len(group),
        collapses=len(gradual),
        timely=len(leads),
        leads=leads,
        attributed=sum(o.attributed for o in gradual),
        with_critical=sum(bool(o.critical) for o in usable),
        named_any=sum(bool(o.named) for o in usable),
        abrupt=len(abrupt),
        abrupt_warned=sum(o.warned_before_collapse() for o in abrupt),
        abrupt_attributed=sum(o.attributed for o in abrupt),
        censored=len(group) - len(usable),
        critical_alarms=sum(len(o.critical) for o in usable),
        with_warning=sum(bool(o.warnings) for o in usable),
        warning_alarms=sum(len(o.warnings) for o in usable),
        steps=sum(o.steps for o in usable),
        arm=arm,
    )


def score(outcomes: Sequence[Outcome], split: str, lead: int = LEAD) -> Scorecard:
    """The scorecard of one split's outcomes: one row per mechanism (causes by name, then the
    healthy runs), and the healthy runs by arm."""
    by: dict[str, list[Outcome]] = {}
    for o in outcomes:
        by.setdefault(o.run.mechanism, []).append(o)
    order = sorted(m for m in by if m != HEALTHY) + ([HEALTHY] if HEALTHY in by else [])
    rows = tuple(_group_score(m, by[m], lead) for m in order)
    arms: dict[str, list[Outcome]] = {}
    for o in by.get(HEALTHY, []):
        arms.setdefault(o.run.arm or HEALTHY, []).append(o)
    healthy_arms = tuple(_group_score(HEALTHY, arms[a], lead, a) for a in sorted(arms))
    return Scorecard(split, rows, healthy_arms if len(arms) > 1 else ())


def _num(x: float | None) -> str:
    return "n/a" if x is None else f"{x:g}"


COLUMNS_LINE = (
    "mechanism          runs  collapses  warned_in_time  median_lead  attributed  with_critical"
    "  abrupt  censored"
)


def _healthy_line(r: MechanismScore) -> str:
    name = f"  arm {r.arm}" if r.arm else HEALTHY
    return (
        f"{name:<18} {r.runs:>4}  {r.collapses:>9}  {'-':>14}  {'-':>11}  "
        f"{'-':>10}  {r.with_critical:>13}  {'-':>6}  {r.censored:>8}  (false critical "
        f"of {r.usable}; a cause named on {r.named_any})"
    )


def _warnings_line(r: MechanismScore) -> str:
    """The healthy runs' warnings, with their own rate: a warning asks for a look, so it is not
    a false alarm, but a user should know how often one comes on a run that is fine."""
    rate = r.warnings_per_100_steps
    per = "n/a" if rate is None else f"{rate:.2f}"
    return (
        f"warnings on healthy runs: {r.with_warning} of {r.usable} runs, {r.warning_alarms} "
        f"alarms, {per} per 100 steps"
    )


def table(card: Scorecard, lead: int = LEAD) -> list[str]:
    """The per-mechanism lines `llds monitor score` prints before the scorecard: the causes,
    the healthy runs (and their arms), the abrupt collapses apart, and what the split lacks."""
    head = (
        f"split {card.split}: warned in time = first critical alarm at or after the cause's "
        f"onset and at least {lead} steps before the collapse; collapses = gradual ones (abrupt "
        f"ones, within {ABRUPT} steps of the onset, and censored runs are counted apart)"
    )
    lines = [head, COLUMNS_LINE]
    for r in card.rows:
        if r.mechanism == HEALTHY:
            lines.append(_healthy_line(r))
            lines.extend(_healthy_line(a) for a in card.healthy_arms)
            if r.steps:  # warnings measured (outcomes built with their steps)
                lines.append(_warnings_line(r))
            continue
        lines.append(
            f"{r.mechanism:<18} {r.runs:>4}  {r.collapses:>9}  {r.timely:>14}  "
            f"{_num(r.median_lead):>11}  {r.attributed:>10}  {r.with_critical:>13}  "
            f"{r.abrupt:>6}  {r.censored:>8}"
        )
    lines.append(f"median lead over the split: {_num(card.median_lead)} (leads {list(card.leads)})")
    abrupt = [r for r in card.causes if r.abrupt]
    if abrupt:
        said = ", ".join(
            f"{r.mechanism} {r.abrupt} (a critical alarm after the onset and before the "
            f"collapse on {r.abrupt_warned}, attributed {r.abrupt_attributed})"
            for r in abrupt
        )
        lines.append(f"abrupt collapses, out of timely and lead: {said}")
    if card.healthy is None or not card.healthy.usable:
        lines.append(
            f"no usable healthy run in split {card.split}: its false critical rate is n/a "
            "(healthy runs are measured in the split their seed belongs to)"
        )
    return lines


def scorecard_line(card: Scorecard) -> str:
    """`scorecard: timely=A/B false_critical_per_10_healthy=F attributed=C/B` (B: the gradual
    collapses)."""
    f = card.false_critical_per_10_healthy
    rate = "n/a" if f is None else f"{f:.1f}"
    return (
        f"scorecard: timely={card.timely}/{card.collapses} "
        f"false_critical_per_10_healthy={rate} attributed={card.attributed}/{card.collapses}"
    )


def logged_steps(rows: Sequence[Mapping[str, object]]) -> int:
    """How many distinct steps a run's rows log (rows without a step count as one each)."""
    steps = {row.get("step") for row in rows if row.get("step") is not None}
    return len(steps) + sum(1 for row in rows if row.get("step") is None)
