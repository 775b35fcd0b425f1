"""Scoring the monitor on a corpus of runs whose collapses have known causes (pure, no I/O).

A corpus manifest names, per run, the mechanism that was set off in it (`none` for a healthy
run; an LLDS arm of one as `lld+llds`), its split (`tune`, `judge`, `heldout`), the step the
cause began (`cause_step`) and the step the run collapsed (`collapse_step`; empty when it did
not, or when the log ends too soon after to say). A collapse is *warned in time* when the
first critical alarm at or after the cause's onset comes at least `LEAD` steps before the
collapse; its lead is the steps between. A healthy run with any critical alarm is a false
critical alarm. The report's *attribution* is right when the mechanisms it names as the
collapse's cause are exactly the manifest's. `llds monitor score` reads the manifest and the
runs and prints `table` and, as its last line, `scorecard_line`.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from pydantic import Field

from llds.config.schema import section
from llds.errors import DataFormatError
from llds.monitor.settings import MonitorConfig

HEALTHY = "none"
SPLITS = ("tune", "judge", "heldout")
COLUMNS = ("run", "mechanism", "seed", "split", "cause_step", "collapse_step")
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

    def warning_step(self) -> int | None:
        """The first critical alarm at or after the cause's onset."""
        onset = self.run.cause_step or 0
        return next((s for s in self.critical if s >= onset), None)

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


def parse_manifest(rows: Iterable[Mapping[str, str]], where: str) -> list[CorpusRun]:
    """The manifest's rows (as a CSV reader gives them) as `CorpusRun`s; a missing column, a
    split not in `SPLITS`, a cause run without `cause_step` or a value that is not a step is a
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
        out.append(
            CorpusRun(
                row["run"].strip(),
                mechanism,
                seed if seed is not None else 0,
                split,
                cause,
                _step(row["collapse_step"], "collapse_step", at),
            )
        )
    return out


@dataclass(frozen=True)
class MechanismScore:
    """One mechanism's line of the table (for `none`, the healthy runs)."""

    mechanism: str
    runs: int
    collapses: int
    timely: int
    leads: tuple[int, ...]
    attributed: int
    with_critical: int
    """runs with any critical alarm (for healthy runs: the false critical alarms)"""
    named_any: int
    """runs whose report names a cause (for healthy runs it should name none)"""

    @property
    def median_lead(self) -> float | None:
        return statistics.median(self.leads) if self.leads else None


@dataclass(frozen=True)
class Scorecard:
    """The per-mechanism scores and the totals of the last line."""

    split: str
    rows: tuple[MechanismScore, ...]

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
    def false_critical_per_10_healthy(self) -> float | None:
        h = self.healthy
        return 10 * h.with_critical / h.runs if h is not None and h.runs else None


def score(outcomes: Sequence[Outcome], split: str, lead: int = LEAD) -> Scorecard:
    """The scorecard of one split's outcomes: one row per mechanism (causes by name, then the
    healthy runs)."""
    by: dict[str, list[Outcome]] = {}
    for o in outcomes:
        by.setdefault(o.run.mechanism, []).append(o)
    order = sorted(m for m in by if m != HEALTHY) + ([HEALTHY] if HEALTHY in by else [])
    rows = []
    for m in order:
        group = by[m]
        collapsed = [o for o in group if o.run.collapse_step is not None]
        leads = tuple(x for x in (o.lead(lead) for o in collapsed) if x is not None)
        rows.append(
            MechanismScore(
                mechanism=m,
                runs=len(group),
                collapses=len(collapsed),
                timely=len(leads),
                leads=leads,
                attributed=sum(o.attributed for o in collapsed),
                with_critical=sum(bool(o.critical) for o in group),
                named_any=sum(bool(o.named) for o in group),
            )
        )
    return Scorecard(split, tuple(rows))


def _num(x: float | None) -> str:
    return "n/a" if x is None else f"{x:g}"


def table(card: Scorecard, lead: int = LEAD) -> list[str]:
    """The per-mechanism lines `llds monitor score` prints before the scorecard."""
    head = (
        f"split {card.split}: warned in time = first critical alarm at or after the cause's "
        f"onset and at least {lead} steps before the collapse"
    )
    cols = "mechanism    runs  collapses  warned_in_time  median_lead  attributed  with_critical"
    lines = [head, cols]
    for r in card.rows:
        if r.mechanism == HEALTHY:
            lines.append(
                f"{'none':<12} {r.runs:>4}  {r.collapses:>9}  {'-':>14}  {'-':>11}  "
                f"{'-':>10}  {r.with_critical:>13}  (false critical; a cause named on "
                f"{r.named_any})"
            )
            continue
        lines.append(
            f"{r.mechanism:<12} {r.runs:>4}  {r.collapses:>9}  {r.timely:>14}  "
            f"{_num(r.median_lead):>11}  {r.attributed:>10}  {r.with_critical:>13}"
        )
    return lines


def scorecard_line(card: Scorecard) -> str:
    """`scorecard: timely=A/B false_critical_per_10_healthy=F attributed=C/B`."""
    f = card.false_critical_per_10_healthy
    rate = "n/a" if f is None else f"{f:.1f}"
    return (
        f"scorecard: timely={card.timely}/{card.collapses} "
        f"false_critical_per_10_healthy={rate} attributed={card.attributed}/{card.collapses}"
    )
