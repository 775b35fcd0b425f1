"""Comparing two probes of the same questions: the exact sign test against values worked by
hand, and the per-question pairing (questions only one probe has are left out)."""

from __future__ import annotations

import pytest

from llds.analysis.probe_compare import compare_probes, paired, plot_pairs
from llds.probe.one_step import ProbeResult


def _result(qid: str, disp: float, fell: float) -> ProbeResult:
    return ProbeResult(qid, "q?", 2, 2, disp, disp / 10, -1.0, fell, 1.0, -1.0, -0.2)


def test_compare_probes_pairs_questions_by_id() -> None:
    a = [_result("q1", -0.4, 0.5), _result("q2", 0.3, 0.0), _result("q3", -0.1, 1.0)]
    a.append(_result("only-a", -9.0, 1.0))
    b = [_result("q3", 0.2, 0.5), _result("q1", -0.2, 0.0), _result("q2", 0.1, 0.5)]
    assert [(x.example_id, y.example_id) for x, y in paired(a, b)] == [
        ("q1", "q1"), ("q2", "q2"), ("q3", "q3"),
    ]  # fmt: skip
    c = compare_probes(a, b)
    # q1: 0.5 -> 0.0 fewer; q2: 0.0 -> 0.5 more; q3: 1.0 -> 0.5 fewer
    assert (c.questions, c.fewer_fell, c.more_fell, c.same) == (3, 2, 1, 0)
    assert c.p_value == pytest.approx(1.0)  # 2 * (1 + 3) / 8 capped
    assert c.lld_share_a == pytest.approx(2 / 3) and c.lld_share_b == pytest.approx(1 / 3)
    assert c.mean_disp_correct_a == pytest.approx((-0.4 + 0.3 - 0.1) / 3)
    assert c.mean_disp_correct_b == pytest.approx((-0.2 + 0.1 + 0.2) / 3)
    with pytest.raises(ValueError, match="no question in common"):
        compare_probes(a, [_result("other", 0.0, 0.0)])


def test_plot_pairs_writes_a_figure(tmp_path) -> None:
    a = [_result("q1", -0.4, 0.5), _result("q2", 0.3, 0.0)]
    plot_pairs(a, a[::-1], tmp_path / "pairs.png", labels=("without", "with"))
    assert (tmp_path / "pairs.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
