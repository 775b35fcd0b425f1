"""`llds monitor score CORPUS --split S` on a tiny corpus built here, checked against counts made
by hand, and the scoring functions on their own.

The critical alarms are placed by hand: every built-in detector is switched off and one test
detector, `test_critical`, fires at each step whose row has `test/critical`. The report's
attribution reads the rows: reward 0.6 to step 94, then 0.1 (the pre-registered collapse at
step 100, with 40 steps logged after it); an LLD run's share of reinforced responses that fell
goes 0.2 -> 0.8 at step 41, a mismatch run's k3 KL 0.001 -> 0.01 at step 41.

The judge split, by hand (collapse at 100, lead >= 20):
- lld seed 1: cause 40, critical at 70: warned in time, lead 30; LLD named: attributed.
- lld seed 2: cause 40, critical at 85: 15 steps ahead, late; its share stays 0.2: no known
  signature, not attributed.
- lld+llds seed 1: cause 40, no collapse: not among the collapses.
- mismatch seed 1: cause 40, critical at 30 (before the onset, passed over) and 75: lead 25;
  mismatch named: attributed.
- lr seed 1: cause 75, collapse 100, abrupt (25 steps after the onset): out of the timely
  denominator and the leads although its critical alarm at 80 is 20 steps ahead (counted as
  an abrupt collapse warned before it, not attributed: no signature in its rows).
- tool seed 1: cause 50, censored (no collapse_step), critical at 60: not among the collapses.
- none seeds 1, 2 and the corrected twin mismatch+tis seed 1: seed 2 has a critical alarm at
  50: 1 false of 3 usable healthy = 3.3 per 10; none seed 4 is censored, and its critical
  alarm at 50 is not counted (counted, it would make 2 of 4 = 5.0).
Collapses 3 (gradual); in time 2 (lld 1, mismatch 1), leads 30 and 25, median 27.5; attributed
2. A tune row (lld seed 3) and a tune healthy run with a critical alarm stay out of the judge
split; the heldout split (tool seed 2: cause 50, critical at 60, lead 40) has no healthy run.
"""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

import pytest
import yaml

from llds.cli import main
from llds.errors import DataFormatError
from llds.io import write_jsonl
from llds.monitor import DetectorSettings, Firing, register_detector
from llds.monitor.alarms import ALARM_KINDS
from llds.monitor.scoring import (
    COLUMNS,
    OPTIONAL_COLUMNS,
    CorpusRun,
    Outcome,
    logged_steps,
    parse_manifest,
    score,
    scorecard_line,
    table,
)

STEPS = 140


@register_detector(
    "test_critical",
    severity="critical",
    mechanism="unspecific",
    settings=DetectorSettings,
    describe=lambda s, p: "a critical alarm wherever the row has test/critical",
)
class HandPlacedCritical:
    def __init__(self, settings: DetectorSettings) -> None:
        pass

    def update(self, view) -> Firing | None:
        return Firing("placed by hand") if view.row.get("test/critical") else None


def rows(critical: tuple[int, ...] = (), collapse: bool = True, **late: float) -> list[dict]:
    """`late`: metric (`__` for `/`) -> (before, from step 41) as a 2-tuple."""
    out = []
    for s in range(1, STEPS + 1):
        row: dict[str, Any] = {"step": s, "reward/mean": 0.6 if s < 95 or not collapse else 0.1}
        for name, (before, after) in late.items():
            row[name.replace("__", "/")] = before if s <= 40 else after
        if s in critical:
            row["test/critical"] = 1.0
        out.append(row)
    return out


CORPUS = [
    # run, arm, seed, split, cause_step, collapse_step, censored, abrupt, rows
    ("lld/s1", "lld", 1, "judge", 40, 100, "no", "no", rows((70,), lld__share_pos_fell=(0.2, 0.8))),
    ("lld/s2", "lld", 2, "judge", 40, 100, "no", "no", rows((85,), lld__share_pos_fell=(0.2, 0.2))),
    ("lld_llds/s1", "lld+llds", 1, "judge", 40, None, "no", "no", rows(collapse=False)),
    (
        "mismatch/s1",
        "mismatch",
        1,
        "judge",
        40,
        100,
        "no",
        "no",
        rows((30, 75), mismatch__k3_kl=(1e-3, 1e-2)),
    ),
    ("lr/s1", "lr", 1, "judge", 75, 100, "no", "yes", rows((80,))),
    ("tool/s1", "tool", 1, "judge", 50, None, "yes", "no", rows((60,))),
    ("none/s1", "none", 1, "judge", None, None, "no", "no", rows(collapse=False)),
    ("none/s2", "none", 2, "judge", None, None, "no", "no", rows((50,), collapse=False)),
    ("none/s4", "none", 4, "judge", None, None, "yes", "no", rows((50,))),
    ("tis/s1", "mismatch+tis", 1, "judge", None, None, "no", "no", rows(collapse=False)),
    ("lld/s3", "lld", 3, "tune", 40, 100, "no", "no", rows((70,), lld__share_pos_fell=(0.2, 0.8))),
    ("none/s3", "none", 3, "tune", None, None, "no", "no", rows((50,), collapse=False)),
    ("tool/s2", "tool", 2, "heldout", 50, 100, "no", "no", rows((60,))),
]


HEALTHY_ARMS = {"mismatch+tis": "none"}
"""arms whose manifest mechanism is not their name: the corrected twin is a healthy run"""


def make_corpus(root: Path) -> Path:
    with (root / "manifest.csv").open("w", newline="", encoding="utf-8") as f:
        out = csv.writer(f)
        out.writerow([*COLUMNS, *OPTIONAL_COLUMNS])
        for run, arm, seed, split, cause, collapse, censored, abrupt, log in CORPUS:
            mechanism = HEALTHY_ARMS.get(arm, arm)
            write_jsonl(root / run / "metrics.jsonl", log)
            row = [run, mechanism, seed, split, cause or "", collapse or ""]
            out.writerow([*row, arm, censored, abrupt])
    settings = {name: {"enabled": False} for name in ALARM_KINDS}
    config = {"monitor": {"alarms": settings, "extra_alarms": {"test_critical": {}}}}
    (root / "hand.yaml").write_text(yaml.safe_dump(config), encoding="utf-8")
    return root


def run_score(root: Path, split: str, capsys) -> tuple[int, list[str], str]:
    rc = main(
        ["monitor", "score", str(root), "--split", split, "--config", str(root / "hand.yaml")]
    )
    out = capsys.readouterr()
    return rc, out.out.splitlines(), out.err


def test_the_judge_scorecard_is_the_hand_count(tmp_path, capsys) -> None:
    rc, lines, err = run_score(make_corpus(tmp_path), "judge", capsys)
    assert rc == 0, err
    assert lines[-1] == "scorecard: timely=2/3 false_critical_per_10_healthy=3.3 attributed=2/3"
    by = {line.split()[0]: line.split() for line in lines[2:-1]}
    # mechanism runs collapses warned_in_time median_lead attributed with_critical abrupt censored
    assert by["lld"][:9] == ["lld", "2", "2", "1", "30", "1", "2", "0", "0"]
    assert by["mismatch"][:9] == ["mismatch", "1", "1", "1", "25", "1", "1", "0", "0"]
    assert by["lr"][:9] == ["lr", "1", "0", "0", "n/a", "0", "1", "1", "0"]
    assert by["lld+llds"][:4] == ["lld+llds", "1", "0", "0"]
    assert by["tool"][:9] == ["tool", "1", "0", "0", "n/a", "0", "0", "0", "1"]
    # healthy: 4 runs, 1 censored, 1 false critical of the 3 usable; then by arm
    assert by["none"][:9] == ["none", "4", "0", "-", "-", "-", "1", "-", "1"]
    assert "(false critical of 3; a cause named on 0)" in " ".join(by["none"])
    arms = {line.split()[1]: line.split()[1:] for line in lines if line.startswith("  arm ")}
    assert arms["none"][:9] == ["none", "3", "0", "-", "-", "-", "1", "-", "1"]
    assert arms["mismatch+tis"][:9] == ["mismatch+tis", "1", "0", "-", "-", "-", "0", "-", "0"]
    assert lines.index(next(x for x in lines if x.startswith("none"))) < lines.index(
        next(x for x in lines if x.startswith("  arm "))
    )
    assert "median lead over the split: 27.5 (leads [30, 25])" in lines
    abrupt = next(line for line in lines if line.startswith("abrupt collapses"))
    assert "lr 1 (a critical alarm after the onset and before the collapse on 1, attributed 0)" in (
        abrupt
    )


def test_the_tune_split_is_scored_apart(tmp_path, capsys) -> None:
    rc, lines, _ = run_score(make_corpus(tmp_path), "tune", capsys)
    assert rc == 0
    assert lines[-1] == "scorecard: timely=1/1 false_critical_per_10_healthy=10.0 attributed=1/1"
    assert not any(line.startswith("abrupt") for line in lines)


def test_the_heldout_split_has_no_healthy_runs_and_says_so(tmp_path, capsys) -> None:
    rc, lines, _ = run_score(make_corpus(tmp_path), "heldout", capsys)
    assert rc == 0
    assert lines[-1] == "scorecard: timely=1/1 false_critical_per_10_healthy=n/a attributed=0/1"
    assert any(line.startswith("no usable healthy run in split heldout") for line in lines)
    assert "median lead over the split: 40 (leads [40])" in lines


def test_a_bad_manifest_is_one_line(tmp_path, capsys) -> None:
    root = make_corpus(tmp_path)
    text = (root / "manifest.csv").read_text(encoding="utf-8")
    (root / "manifest.csv").write_text(text.replace("judge", "jugde", 1), encoding="utf-8")
    rc, lines, err = run_score(root, "judge", capsys)
    assert rc == 2 and lines == []
    assert "manifest.csv: row 2: split: expected one of tune, judge, heldout, got 'jugde'" in err
    assert len(err.strip().splitlines()) == 1
    rc = main(["monitor", "score", str(root), "--split", "later"])
    assert rc == 2 and "split" in capsys.readouterr().err


def outcome(mechanism, cause, collapse, critical, named=()) -> Outcome:
    return Outcome(CorpusRun("r", mechanism, 0, "judge", cause, collapse), critical, named)


def test_lead_counts_from_the_first_critical_alarm_after_the_onset() -> None:
    assert outcome("lr", 50, 100, (40, 80)).lead() == 20  # 40 is before the onset
    assert outcome("lr", 50, 100, (40, 81)).lead() is None  # 19 ahead
    assert outcome("lr", 50, 100, (40, 81)).lead(lead=10) == 19
    assert outcome("lr", 50, None, (60,)).lead() is None  # no collapse
    assert outcome("lld+llds", 50, 100, (), ("lld",)).attributed  # the arm's mechanism is lld
    assert not outcome("lld", 50, 100, (), ("lld", "entropy")).attributed  # exactly one


def test_no_healthy_run_gives_no_false_alarm_rate() -> None:
    card = score([outcome("lr", 10, 60, (30,), ("lr",))], "judge")
    assert scorecard_line(card) == (
        "scorecard: timely=1/1 false_critical_per_10_healthy=n/a attributed=1/1"
    )


def test_parse_manifest_names_the_row_and_column() -> None:
    good = {"run": "a", "mechanism": "lr", "seed": "1", "split": "tune"}
    runs = parse_manifest([{**good, "cause_step": "40", "collapse_step": ""}], "m.csv")
    assert runs == [CorpusRun("a", "lr", 1, "tune", 40, None)]
    with pytest.raises(DataFormatError, match=r"m\.csv: row 2: cause_step: required"):
        parse_manifest([{**good, "cause_step": "", "collapse_step": ""}], "m.csv")
    with pytest.raises(DataFormatError, match="row 3: collapse_step: expected a step number"):
        rows = [{**good, "cause_step": "4", "collapse_step": x} for x in ("", "soon")]
        parse_manifest(rows, "m.csv")
    with pytest.raises(DataFormatError, match="missing column"):
        parse_manifest([good], "m.csv")
    with pytest.raises(DataFormatError, match="row 2: abrupt: expected yes or no, got 'maybe'"):
        parse_manifest([{**good, "cause_step": "4", "collapse_step": "9", "abrupt": "maybe"}], "m")
    with pytest.raises(DataFormatError, match="row 2: collapse_step: must be empty for a censored"):
        parse_manifest([{**good, "cause_step": "4", "collapse_step": "99", "censored": "yes"}], "m")


def test_abrupt_comes_from_the_column_else_from_the_30_step_rule() -> None:
    base = {"run": "a", "mechanism": "lr", "seed": "1", "split": "tune", "cause_step": "61"}
    # no column: 89 - 61 = 28 < 30 abrupt; 91 - 61 = 30 not; no collapse: not abrupt
    derived = parse_manifest([{**base, "collapse_step": c} for c in ("89", "91", "")], "m")
    assert [r.abrupt for r in derived] == [True, False, False]
    assert [r.gradual for r in derived] == [False, True, False]
    # the column wins over the rule (the corpus's own code wrote it)
    given = parse_manifest([{**base, "collapse_step": "89", "abrupt": "no", "arm": "lr"}], "m")
    assert given[0].gradual and given[0].arm == "lr"


def test_abrupt_and_censored_runs_leave_the_rates() -> None:
    """By hand: two gradual lr collapses (one warned 30 ahead, one not warned), one abrupt lr
    collapse warned 25 ahead (not counted, or timely would be 2/3); healthy: one clean, one
    with a critical alarm, one censored with a critical alarm (not counted, or F would be
    6.7): timely 1/2, F = 10 * 1/2 = 5.0."""
    lr = [
        Outcome(CorpusRun("a", "lr", 0, "tune", 61, 120), (90,)),
        Outcome(CorpusRun("b", "lr", 1, "tune", 61, 120), ()),
        Outcome(CorpusRun("c", "lr", 2, "tune", 61, 85, abrupt=True), (60, 61)),
    ]
    healthy = [
        Outcome(CorpusRun("d", "none", 0, "tune", None, None), ()),
        Outcome(CorpusRun("e", "none", 1, "tune", None, None, "mismatch+tis"), (100, 150)),
        Outcome(CorpusRun("f", "none", 2, "tune", None, None, censored=True), (70,)),
    ]
    card = score(lr + healthy, "tune")
    assert scorecard_line(card) == (
        "scorecard: timely=1/2 false_critical_per_10_healthy=5.0 attributed=0/2"
    )
    (row,) = card.causes
    assert (row.abrupt, row.abrupt_warned, row.leads, row.critical_alarms) == (1, 1, (30,), 3)
    assert card.healthy is not None
    assert (card.healthy.usable, card.healthy.critical_alarms, card.healthy.censored) == (2, 2, 1)
    assert [(a.arm, a.runs, a.with_critical) for a in card.healthy_arms] == [
        ("mismatch+tis", 1, 1),
        ("none", 2, 0),
    ]


def test_healthy_runs_warnings_have_their_own_rate() -> None:
    """Warnings are counted over the usable healthy runs with their steps: 3 warnings on one
    of two 200-step runs is 0.75 per 100 steps; the censored run's are left out."""
    healthy = [
        Outcome(CorpusRun("a", "none", 0, "judge", None, None), (), (), (30, 80, 150), 200),
        Outcome(CorpusRun("b", "none", 1, "judge", None, None), (), (), (), 200),
        Outcome(CorpusRun("c", "none", 2, "judge", None, None, censored=True), (), (), (9,), 50),
    ]
    card = score(healthy, "judge")
    assert card.healthy is not None
    assert (card.healthy.with_warning, card.healthy.warning_alarms) == (1, 3)
    assert card.healthy.warnings_per_100_steps == pytest.approx(0.75)
    assert "warnings on healthy runs: 1 of 2 runs, 3 alarms, 0.75 per 100 steps" in table(card)
    assert card.false_critical_per_10_healthy == 0.0  # warnings are never false alarms


def test_logged_steps_counts_each_step_once() -> None:
    rows = [{"step": 1}, {"step": 2}, {"step": 2}, {"loss": 0.1}]
    assert logged_steps(rows) == 3
