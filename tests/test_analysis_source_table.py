"""The per-source run table (`llds.analysis.source_table`, the SmolLM2 study's table) lists the
runs that have logged a step, and only those (a run that has just started has an empty metrics
log while its first step runs)."""

from __future__ import annotations

import json
from pathlib import Path

from llds.analysis.source_table import source_table


def _log(run: Path, rows: list[dict]) -> None:
    run.mkdir(parents=True)
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_table_skips_a_run_with_an_empty_log(tmp_path: Path) -> None:
    rows = [
        {"step": s, "reward/mean": 0.25 * s, "lld/disp_pos": d, "lld/frac_pos_fell": f}
        for s, d, f in ((1, 0.5, 0.0), (2, -0.25, 0.75))
    ]
    rows = [{**r, "time/step": 60.0} for r in rows]
    runs = {("GRPO", 0): tmp_path / "GRPO" / "seed0", ("GRPO+LLDS", 0): tmp_path / "LLDS"}
    _log(runs["GRPO", 0], rows)
    _log(runs["GRPO+LLDS", 0], [])
    lines = source_table(runs, tmp_path / "sft" / "eval" / "step_000000.json").splitlines()
    assert len(lines) == 3  # header, rule, the one run with rows
    cells = [c.strip() for c in lines[2].strip("|").split("|")]
    assert cells[:3] == ["GRPO", "0", "2"]
    assert cells[7] == "0.375 / 0.375"  # reward, mean of the first / last (up to) 10 steps
    assert cells[8] == "0.12 / 0.38"  # medians of disp_pos (0.5, -0.25), frac_pos_fell
    assert cells[9] == "1 of 2" and cells[10] == "2"  # steps with disp_pos < 0; minutes


def _record(source: str, em: float, searches: int = 1):
    from llds.runs.eval_result import EvalRecord

    return EvalRecord(
        id="q",
        source=source,
        question="?",
        golds=["x"],
        prediction="x",
        em=em,
        f1=em,
        sub_em=em,
        valid_searches=searches,
        answered=True,
    )


def test_each_source_gets_its_series_from_the_warm_start_on(tmp_path: Path) -> None:
    from llds.runs.eval_result import EvalResult, eval_file

    run, warm = tmp_path / "GRPO" / "seed1", tmp_path / "sft"
    _log(run, [{"step": 20, "reward/mean": 0.5, "time/step": 30.0}])
    EvalResult.of([_record("held-out", 1.0), _record("held-out", 0.0, searches=2)]).write(
        eval_file(warm, 0)
    )
    EvalResult.of([_record("held-out", 1.0), _record("transfer", 1.0)]).write(eval_file(run, 20))
    line = source_table({("GRPO", 1): run}, eval_file(warm, 0)).splitlines()[2]
    cells = [c.strip() for c in line.strip("|").split("|")]
    assert cells[3] == "0.500 / 1.000 (steps 0, 20)"  # held-out EM at the start, then step 20
    assert cells[5] == "- / 1.000"  # no transfer question at the start
    assert cells[6] == "1.500 / 1.000"  # valid searches per held-out question
    assert cells[8] == "- / -" and cells[9] == "0 of 0"  # no displacement logged
