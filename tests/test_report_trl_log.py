"""`llds report` on a real TRL run's `trainer_state.json` (tests/fixtures/trl_log/, made by
examples/trl_search_r1.py): the first optimizer step of each generation batch (pi == pi_old)
has no displacement (not measured, not a tie read as a fall), generation steps log the valid
searches the search-decline rule reads, and the report draws from it."""

from __future__ import annotations

import shutil
from pathlib import Path

from llds.report.html import write_report
from llds.report.sources import find_source, read_source

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "trl_log"


def test_a_real_trl_log_reads_as_measured(tmp_path):
    run = tmp_path / "trl-run"
    run.mkdir()
    shutil.copy(FIXTURE / "trainer_state.json", run)
    source = find_source(run)
    assert source.kind == "trl"
    rows = read_source(source)
    assert [r["step"] for r in rows] == [1, 2, 3, 4, 5, 6]
    generation = [r for r in rows if "reward/mean" in r]  # steps 1, 3, 5: a new batch
    assert [r["step"] for r in generation] == [1, 3, 5]
    for r in generation:
        assert "lld/frac_pos_fell" not in r and "lld/disp_pos" not in r
        assert r["rollout/valid_searches"] >= 0
    measured = [r for r in rows if r.get("lld/frac_pos_fell") is not None]
    assert measured and all(r["step"] % 2 == 0 for r in measured)
    assert all(0 <= r["lld/frac_pos_fell"] <= 1 for r in measured)
    page = write_report([run], tmp_path / "report").read_text(encoding="utf-8")
    assert "<h2>Verdict</h2>" in page and "trl-run" in page
