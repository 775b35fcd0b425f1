"""The per-arm summary of a study (`lld_study.arm_table`): last evaluation, same-seed
differences against GRPO, medians, and unfinished runs, on a study built by hand."""

from __future__ import annotations

import pytest

from lld_study import arm_table


def _run(em: dict[str, float], lld: int | None = 10, collapse: int | None = None) -> dict:
    return {"eval_em": em, "lld_steps": lld, "collapse_step": collapse}


STUDY = {
    "GRPO": {
        "0": _run({"50": 0.9, "600": 0.6, "100": 0.1}, lld=200),  # keys unordered, as in JSON
        "1": _run({"600": 0.5}, lld=100),
        "2": _run({"600": 0.4}, lld=150),
    },
    "GRPO+LLDS": {
        "0": _run({"600": 0.7}, lld=40),
        "1": _run({"600": 0.2}, lld=60, collapse=420),
        "2": _run({}, lld=None),  # not evaluated yet: left out
    },
    "GRPO+LLDS-x": {"3": _run({"600": 0.8})},  # a seed GRPO does not have
}


def test_last_em_is_the_latest_step_not_the_last_key() -> None:
    assert arm_table.last_em(STUDY["GRPO"]["0"]) == 0.6
    assert arm_table.last_em(_run({})) is None


def test_differences_medians_and_counts_by_hand() -> None:
    rows = {r["arm"]: r for r in arm_table.arm_rows(STUDY)}
    grpo, llds, other = rows["GRPO"], rows["GRPO+LLDS"], rows["GRPO+LLDS-x"]
    assert grpo["median_em"] == 0.5 and grpo["diff"] == {} and grpo["median_lld_steps"] == 150
    assert llds["seeds"] == ["0", "1"]
    assert llds["diff"] == pytest.approx({"0": 0.1, "1": -0.3})
    assert llds["median_diff"] == pytest.approx(-0.1)  # median of +0.1 and -0.3
    assert llds["above_reference"] == 1
    assert llds["median_em"] == pytest.approx(0.45) and llds["median_lld_steps"] == 50
    assert llds["collapse"] == {"0": None, "1": 420}
    assert other["diff"] == {} and other["median_diff"] is None


def test_markdown_rows_carry_every_seed() -> None:
    table = arm_table.markdown(arm_table.arm_rows(STUDY)).splitlines()
    assert len(table) == 2 + 3
    llds = next(line for line in table if line.startswith("| GRPO+LLDS |"))
    cells = [c.strip() for c in llds.strip("|").split("|")]
    assert cells[1:] == [
        "0, 1",
        "0.700 / 0.200",
        "0.450",
        "+0.100 / -0.300",
        "-0.100",
        "1 of 2",
        "- / 420",
        "40 / 60",
        "50",
    ]


def test_the_figure_is_written(tmp_path) -> None:
    path = tmp_path / "arms.png"
    arm_table.figure(arm_table.arm_rows(STUDY), path, start_em=0.7)
    assert path.stat().st_size > 1000
