"""The monitor's tuning (`experiments/monitor_tuning/`) on a tiny corpus built here, its choice
checked by hand.

Two test detectors with one threshold each: `tuning_test_x` fires when the row's `test/x` is at
least `level`, `tuning_test_y` the same for `test/y` (an alarm at the first step of each
episode). The grid: x at level 1 (its default, X0) and 3 (X1); y at level 1 (Y0) and 4 (Y1).
Cause runs have their onset at 61; `series(x=(v, s))` sets `test/x` to v from step s on.

By hand, with the alarms of one cell counted as critical (lead >= 20):
- c1 lr, collapse 120: x=2 from 80 (X0: lead 40), y=5 from 90 (Y0, Y1: lead 30).
- c2 mismatch, collapse 130: x=4 from 100 (X0, X1: lead 30).
- c3 lr, collapse 85, abrupt: x=5 from 62 (23 ahead, but abrupt: never counted).
- c4 entropy, no collapse: y=5 from 70 (neither a hit nor a false alarm).
- 10 usable healthy runs: h1 x=2 from 50 (X0), h2 y=2 from 100 (Y0), h3 y=5 from 100 (Y0,
  Y1), the rest clean (h4 a mismatch+tis twin); h11 censored with x=9 (never counted).
Alone: X0 timely 2, healthy false 1; X1 1, 0; Y0 1, 2 (over 1 in 10: not eligible); Y1 1, 1.
Combinations of {none, X0, X1} x {none, Y1}: the most timely within 1 in 10 are X0 (2; false
h1) and X1+Y1 (2; false h3): tied on false runs (1) and on alarms on healthy runs (1); X0 has
4 critical alarms over the usable runs (c1, c2, c3, h1), X1+Y1 has 5 (c1, c2, c3, c4, h3): X0
is chosen, X1+Y1 the runner-up; X0+Y1 alarms h1 and h3 (2 in 10): out.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

import pytest
from pydantic import Field

from llds.config.schema import section
from llds.errors import UserInputError
from llds.io import write_jsonl
from llds.monitor import DetectorSettings, Firing, register_detector
from llds.monitor.alarms import scan_alarms
from llds.monitor.registry import detector_spec
from llds.monitor.replay import load_monitor_config, monitor_config_from
from llds.monitor.scoring import COLUMNS, OPTIONAL_COLUMNS, CorpusRun
from llds.monitor.settings import BUILT_IN_ALARMS
from llds.report.sources import find_source, read_source
from monitor_tuning import tune
from monitor_tuning.choice import MAX_FALSE_PER_10
from monitor_tuning.grid import cells_of, monitor_section, replay_cells


@section(key="monitor.extra_alarms.tuning_test_x")
class LevelSettings(DetectorSettings):
    """A level a test series must reach."""

    level: float = Field(default=1.0, gt=0)
    """fires at or above it"""


def _level_detector(name: str, key: str) -> None:
    @register_detector(
        name,
        severity="warning",
        mechanism="unspecific",
        settings=LevelSettings,
        describe=lambda s, p: f"`{key}` at least {s.level:g}",
    )
    class Level:
        def __init__(self, settings: LevelSettings) -> None:
            self.level = settings.level

        def update(self, view) -> Firing | None:
            value = view.row.get(key)
            return Firing(f"{key} {value}") if value is not None and value >= self.level else None


_level_detector("tuning_test_x", "test/x")
_level_detector("tuning_test_y", "test/y")

GRID = {"tuning_test_x": ({}, {"level": 3.0}), "tuning_test_y": ({}, {"level": 4.0})}
STEPS = 150


def series(**late: tuple[float, int]) -> list[dict[str, Any]]:
    out = []
    for s in range(1, STEPS + 1):
        row: dict[str, Any] = {"step": s, "reward/mean": 0.5}
        for name, (value, start) in late.items():
            row[f"test/{name}"] = value if s >= start else 0.0
        out.append(row)
    return out


# run, mechanism, arm, split, cause, collapse, censored, abrupt, rows
TUNE = [
    ("c1", "lr", "lr", "tune", 61, 120, "no", "no", series(x=(2, 80), y=(5, 90))),
    ("c2", "mismatch", "mismatch", "tune", 61, 130, "no", "no", series(x=(4, 100))),
    ("c3", "lr", "lr", "tune", 61, 85, "no", "yes", series(x=(5, 62))),
    ("c4", "entropy", "entropy", "tune", 61, None, "no", "no", series(y=(5, 70))),
    ("h1", "none", "none", "tune", None, None, "no", "no", series(x=(2, 50))),
    ("h2", "none", "none", "tune", None, None, "no", "no", series(y=(2, 100))),
    ("h3", "none", "none", "tune", None, None, "no", "no", series(y=(5, 100))),
    ("h4", "none", "mismatch+tis", "tune", None, None, "no", "no", series()),
    *[(f"h{i}", "none", "none", "tune", None, None, "no", "no", series()) for i in range(5, 11)],
    ("h11", "none", "none", "tune", None, None, "yes", "no", series(x=(9, 50))),
]
OTHER = [("j1", "lr", "lr", "judge", 61, 120), ("t1", "tool", "tool", "heldout", 61, 110)]
"""Runs of the other splits, in the manifest with no folder: reading one would fail."""
COMPLETE = {"lr": 2, "mismatch": 1, "entropy": 1, "none": 9, "mismatch+tis": 1}


def make_corpus(root: Path, censor: tuple[str, ...] = ()) -> Path:
    with (root / "manifest.csv").open("w", newline="", encoding="utf-8") as f:
        out = csv.writer(f)
        out.writerow([*COLUMNS, *OPTIONAL_COLUMNS])
        for run, mech, arm, split, cause, collapse, censored, abrupt, rows in TUNE:
            write_jsonl(root / run / "metrics.jsonl", rows)
            censored = "yes" if run in censor else censored
            out.writerow([run, mech, 0, split, cause or "", collapse or "", arm, censored, abrupt])
        for run, mech, arm, split, cause, collapse in OTHER:
            out.writerow([run, mech, 4, split, cause, collapse, arm, "no", "no"])
    return root


def labels(cells) -> list[str]:
    return [c.label for c in cells]


def test_the_choice_is_the_hand_count(tmp_path) -> None:
    corpus = make_corpus(tmp_path)
    choice = tune.run(corpus, tmp_path / "out", grid=GRID, expected=COMPLETE)
    alone = {
        c.label: (f.timely, f.healthy_false, f.healthy_usable) for c, f in choice.alone.items()
    }
    assert alone == {
        "tuning_test_x[defaults]": (2, 1, 10),
        "tuning_test_x[level=3]": (1, 0, 10),
        "tuning_test_y[defaults]": (1, 2, 10),
        "tuning_test_y[level=4]": (1, 1, 10),
    }
    assert labels(choice.eligible) == [
        "tuning_test_x[defaults]",
        "tuning_test_x[level=3]",
        "tuning_test_y[level=4]",
    ]
    assert choice.searched == 6
    assert labels(choice.chosen.cells) == ["tuning_test_x[defaults]"]
    assert choice.chosen.all_alarms == 4 and choice.chosen.card.leads == (40, 30)
    assert choice.runner_up is not None
    assert labels(choice.runner_up.cells) == ["tuning_test_x[level=3]", "tuning_test_y[level=4]"]
    assert choice.runner_up.all_alarms == 5
    saved = json.loads((tmp_path / "out" / "choice.json").read_text(encoding="utf-8"))
    assert saved["chosen"]["scorecard"] == (
        "scorecard: timely=2/2 false_critical_per_10_healthy=1.0 attributed=0/2"
    )
    assert saved["chosen"]["median_lead"] == 35
    assert saved["status"].startswith("in-sample, complete tune split (n = 15 tune runs")
    assert saved["n"]["abrupt_collapses"] == 1 and saved["n"]["censored"] == 1
    with (tmp_path / "out" / "grid.csv").open(encoding="utf-8") as f:
        grid = list(csv.DictReader(f))
    assert [(r["cell"], r["timely"], r["healthy_false"], r["eligible"]) for r in grid] == [
        ("tuning_test_x[defaults]", "2", "1", "yes"),
        ("tuning_test_x[level=3]", "1", "0", "yes"),
        ("tuning_test_y[defaults]", "1", "2", "no"),
        ("tuning_test_y[level=4]", "1", "1", "yes"),
    ]
    # the chosen settings replayed as frozen score as the grid did; y, an extra alarm the
    # frozen section does not name, is off there, so the healthy runs have no warning
    page = (tmp_path / "out" / "results.md").read_text(encoding="utf-8")
    frozen = page.split("## The chosen settings as frozen, replayed on the tune runs")[1]
    assert saved["chosen"]["scorecard"] in frozen
    assert "warnings on healthy runs: 0 of 10 runs, 0 alarms, 0.00 per 100 steps" in frozen
    assert "| c1 | lr | gradual | 61 | 120 | `tuning_test_x` at 80 (+40) |" in frozen


def test_nine_healthy_runs_allow_no_false_alarm(tmp_path) -> None:
    """With h10 censored, 9 usable healthy runs: one false run is 1.1 in 10, over the bound;
    only X1 (timely 1, no false run) is eligible, and it is chosen."""
    assert MAX_FALSE_PER_10 == 1  # the protocol's bound: 1 healthy run in 10
    choice = tune.run(make_corpus(tmp_path, censor=("h10",)), tmp_path / "out", grid=GRID)
    assert labels(choice.eligible) == ["tuning_test_x[level=3]"]
    assert labels(choice.chosen.cells) == ["tuning_test_x[level=3]"]
    assert choice.chosen.timely == 1 and choice.chosen.healthy_false == 0


def test_other_splits_are_never_read(tmp_path, monkeypatch) -> None:
    corpus = make_corpus(tmp_path)
    with pytest.raises(UserInputError, match="does not exist"):  # a judge run is unreadable ...
        read_source(find_source(corpus / "j1"))
    read: list[str] = []

    def recording(source):
        read.append(Path(source.path).relative_to(corpus).parts[0])
        return read_source(source)

    monkeypatch.setattr(tune, "read_source", recording)
    tune.run(corpus, tmp_path / "out", grid=GRID)  # ... and the tuning never opens one
    assert read == [t[0] for t in TUNE]
    judge = CorpusRun("j1", "lr", 4, "judge", 61, 120)
    with pytest.raises(tune.SplitRefused, match="j1: split judge: the tuning reads tune runs"):
        tune.read_tune_log(corpus, judge)
    with pytest.raises(tune.SplitRefused, match="split heldout"):
        tune.read_tune_log(corpus, CorpusRun("t1", "tool", 4, "heldout", 61, 110))


def test_an_incomplete_split_is_preliminary_and_not_frozen(tmp_path) -> None:
    corpus = make_corpus(tmp_path)
    with pytest.raises(SystemExit, match="--freeze: the tune split is incomplete"):
        tune.run(corpus, tmp_path / "out", freeze=True, grid=GRID)  # the protocol's counts
    assert not (tmp_path / "out").exists()
    tune.run(corpus, tmp_path / "out", grid=GRID)
    saved = json.loads((tmp_path / "out" / "choice.json").read_text(encoding="utf-8"))
    assert saved["status"].startswith("PRELIMINARY: in-sample, incomplete tune split (n = 15")
    assert saved["tune_runs_have_expected"]["lld"] == [0, 4]
    assert (tmp_path / "out" / "results.md").read_text(encoding="utf-8").count("PRELIMINARY") == 1


def test_the_frozen_file_loads_as_monitor_settings(tmp_path) -> None:
    corpus = make_corpus(tmp_path, censor=("h10",))
    complete = {**COMPLETE, "none": 8}
    tune.run(corpus, tmp_path / "out", freeze=True, grid=GRID, expected=complete)
    frozen = tmp_path / "out" / "frozen.yaml"
    assert "# Critical: tuning_test_x;" in frozen.read_text(encoding="utf-8")
    cfg = load_monitor_config(frozen)
    assert cfg.extra_alarms == {"tuning_test_x": {"level": 3.0, "severity": "critical"}}
    # the detectors registered as critical that the tune split did not choose: warnings
    for name in BUILT_IN_ALARMS:
        registered = detector_spec(name).severity
        want = "warning" if registered == "critical" else None
        assert getattr(cfg.alarms, name).severity == want, name
    # not chosen: at the protocol's defaults, not at the library's (frozen since)
    assert cfg.alarms.entropy_drift.high == 2.0 and cfg.alarms.lr_divergence.grad_growth == 2.0


def test_one_replay_per_grid_position_equals_each_detector_alone() -> None:
    """Built-in detectors too: the reward rises 0.2 -> 0.8 and falls back from step 60, the
    entropy doubles from step 50."""
    rows = series(x=(4, 30), y=(5, 40))
    for r in rows:
        s = r["step"]
        r["reward/mean"] = 0.2 + 0.6 * min(s, 40) / 40 - (0.5 if s >= 60 else 0.0)
        r["policy/entropy"] = 1.0 if s < 50 else 2.5
    grid = {
        **GRID,
        "reward_fall": ({}, {"fall": 0.3}),
        "entropy_drift": ({}, {"high": 3.0}),
    }
    together = replay_cells(rows, grid)
    fired = 0
    for cell in cells_of(grid):
        config = monitor_config_from(monitor_section([cell]), cell.label)
        alone = tuple(a.step for a in scan_alarms(rows, config) if a.kind == cell.detector)
        assert together[cell] == alone, cell.label
        fired += bool(alone)
    assert fired == 7  # all but entropy_drift at high=3 (2.5x only)


def test_stage_one_freezes_on_the_organism_runs_without_reading_lld(tmp_path) -> None:
    """Amendment 1: with the organism arms complete and the lld runs missing, the whole split
    is refused and stage 1 freezes on the organism runs alone, never opening an lld run (this
    one has no folder: reading it would fail)."""
    corpus = make_corpus(tmp_path, censor=("h10",))
    with (corpus / "manifest.csv").open("a", newline="", encoding="utf-8") as f:
        csv.writer(f).writerow(["l1", "lld", 0, "tune", 1, 150, "lld", "no", "no"])
    expected = {**COMPLETE, "none": 8, "lld": 4}
    with pytest.raises(SystemExit, match=r"incomplete \(have, expected\): \{'lld': \[1, 4\]\}"):
        tune.run(corpus, tmp_path / "all", freeze=True, grid=GRID, expected=expected)
    choice = tune.run(
        corpus, tmp_path / "one", freeze=True, grid=GRID, expected=expected, stage="organism"
    )
    assert labels(choice.chosen.cells) == ["tuning_test_x[level=3]"]
    saved = json.loads((tmp_path / "one" / "choice.json").read_text(encoding="utf-8"))
    assert saved["status"].startswith("in-sample, stage 1: the complete organism part")
    assert "lld" not in saved["tune_runs_have_expected"]
    assert "stage 1" in (tmp_path / "one" / "frozen.yaml").read_text(encoding="utf-8")
