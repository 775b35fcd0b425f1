"""The held-out drift measurement splits each chain's log-likelihood into its actions and reads
the change of the correct chains; checked against sums and medians worked out by hand."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from lld_study import chain_drift as hd


def test_chain_parts_sums_each_action_by_hand() -> None:
    # row 0: search (2 tokens) | obs | search (1) | obs | answer (2): three actions
    # row 1: one action only (an answer without a search): all of it is the first action
    mask = torch.tensor([[1, 1, 0, 1, 0, 1, 1], [1, 1, 1, 0, 0, 0, 0]])
    logp = torch.tensor(
        [[-1.0, -2.0, -9.0, -0.5, -9.0, -0.25, -0.25], [-1.0, -1.0, -1.0, -9.0, 0.0, 0.0, 0.0]]
    )
    parts = hd.chain_parts(logp, mask)
    assert parts["total"].tolist() == [-4.0, -3.0]
    assert parts["first"].tolist() == [-3.0, -3.0]
    assert parts["later_searches"].tolist() == [-0.5, 0.0]
    assert parts["answer"].tolist() == [-0.5, 0.0]


def test_two_actions_are_a_first_action_and_an_answer() -> None:
    mask = torch.tensor([[1, 0, 1, 1]])
    logp = torch.tensor([[-2.0, -7.0, -1.0, -1.0]])
    parts = hd.chain_parts(logp, mask)
    assert parts["first"].item() == -2.0
    assert parts["later_searches"].item() == 0.0
    assert parts["answer"].item() == -2.0


def test_drift_summary_median_and_share_that_fell() -> None:
    s = hd.drift_summary([-5.0, -5.0, -5.0, -5.0], [-6.0, -5.0, -4.0, -7.0])
    assert s == {"median": -0.5, "fell": 0.75, "n": 4}  # changes -1, 0, +1, -2
    assert hd.drift_summary([], [])["median"] is None


@pytest.mark.parametrize(
    ("median", "fell", "expected"),
    [
        (-0.3, 0.8, "displaced"),
        (0.0, 0.5, "overtaken"),
        (0.2, 0.1, "overtaken"),
        (-0.1, 0.5, "mixed"),
    ],
)
def test_reading_follows_the_protocol(median: float, fell: float, expected: str) -> None:
    assert hd.reading({"median": median, "fell": fell, "n": 10}) == expected


def test_compare_with_study_finds_the_largest_difference(tmp_path: Path) -> None:
    def write(run: Path, rows: list[dict]) -> None:
        run.mkdir()
        (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))

    write(
        tmp_path / "a",
        [{"step": 1, "reward/mean": 0.5, "time/step": 3.0}, {"step": 2, "reward/mean": 0.25}],
    )
    write(
        tmp_path / "b",
        [{"step": 1, "reward/mean": 0.5, "time/step": 9.0}, {"step": 2, "reward/mean": 0.5}],
    )
    vs = hd.compare_with_study(tmp_path / "a", tmp_path / "b", steps=2)
    assert vs == {"rows": 2, "max_abs_diff": 0.25, "where": "reward/mean @ 2"}


def test_reference_alarm_needs_two_readings_in_a_row() -> None:
    def row(step: int, median: float, fell: float) -> dict:
        return {"step": step, "correct/total": {"median": median, "fell": fell, "n": 9}}

    dip = [row(10, 0.4, 0.2), row(20, -0.9, 0.6), row(30, 0.4, 0.3), row(40, -0.1, 0.5)]
    assert hd.reference_alarm(dip) is None  # one falling reading; a half that fell is no majority
    fall = [row(10, -0.3, 0.8), row(20, 0.1, 0.4), row(30, -0.2, 0.7), row(40, -2.0, 0.9)]
    assert hd.reference_alarm(fall) == 40
    assert hd.reference_alarm([row(10, -1.0, 1.0)]) is None


def test_rows_of_splits_the_chains_by_the_warm_starts_correctness() -> None:
    start = {"parts": {p: [-5.0, -4.0, -3.0] for p in hd.PARTS}}
    step_10 = {"parts": {p: [-6.0, -4.0, -1.0] for p in hd.PARTS}, "em": 0.5, "valid_searches": 1.5}
    step_2 = {"parts": {p: [-5.0, -3.0, -3.0] for p in hd.PARTS}, "em": 0.75, "valid_searches": 2}
    rows = hd.rows_of(start, {"checkpoints": {"10": step_10, "2": step_2}}, [True, True, False])
    assert [r["step"] for r in rows] == [2, 10]  # in step order, not key order
    assert rows[1]["em"] == 0.5 and rows[1]["searches"] == 1.5
    assert rows[1]["correct/total"] == {"median": -0.5, "fell": 1.0, "n": 2}  # -1 and 0
    assert rows[1]["wrong/answer"] == {"median": 2.0, "fell": 0.0, "n": 1}
    assert rows[0]["correct/first"] == {"median": 0.5, "fell": 0.5, "n": 2}  # 0 and +1
