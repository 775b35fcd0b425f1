"""The report's verdict box: the collapse step the attribution names, the signatures present
before it with the stabilizer docs/stabilizers.md names for each, and "did not learn" only when
neither the reward nor held-out EM rose."""

from __future__ import annotations

from pathlib import Path

from llds.monitor.phases import detect_phases
from llds.report import html as report_mod
from llds.report.attribution import COLLAPSE, MECHANISMS, STABILIZERS, run_events
from llds.report.run_info import EvalPoint, HeldOut
from llds.report.text import verdict
from synthetic_logs import synthetic_rows


def _summary(rows, held_out=None):
    run = report_mod.RunData("r", Path("r"), rows, detect_phases(rows), [], None, None, held_out)
    return report_mod.summarize(run)


def test_every_mechanism_has_a_stabilizer_named_in_the_docs():
    page = (Path(__file__).resolve().parents[1] / "docs" / "stabilizers.md").read_text()
    assert set(STABILIZERS) == set(MECHANISMS)
    for _, switch in STABILIZERS.values():
        assert f"`{switch.split('=')[0]}" in page, switch


def test_a_collapsed_run_names_the_attribution_step_and_its_stabilizers():
    rows = synthetic_rows("collapse", seed=1, steps=160)
    events = run_events(rows, [])
    collapse = next(e for e in events if e.kind == COLLAPSE)
    text = verdict(_summary(rows), events)
    assert f"collapsed at step {collapse.step}" in text
    present = collapse.with_status("present")
    assert present  # the synthetic collapse shows a signature
    for f in present:
        name, switch = STABILIZERS[f.mechanism]
        assert f"{f.mechanism}: {name}" in text and switch in text


def test_did_not_learn_only_when_neither_reward_nor_heldout_em_rose():
    flat = [{"step": i + 1, "reward/mean": 0.05} for i in range(40)]
    assert "did not learn" in verdict(_summary(flat), run_events(flat, []))
    start = EvalPoint(0, 0.267, 60, Path("warm.json"))
    rose = HeldOut((EvalPoint(40, 0.558, 60, Path("e.json")),), start)
    s = _summary(flat, rose)
    assert s["learned"] and s["heldout_em_rose"] and not s["reward_rose"]
    text = verdict(s, run_events(flat, []))
    assert "did not collapse" in text and "did not learn" not in text
    fell = HeldOut((EvalPoint(40, 0.2, 60, Path("e.json")),), start)
    assert "did not learn" in verdict(_summary(flat, fell), run_events(flat, []))
