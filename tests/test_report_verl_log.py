"""`llds report` on a veRL log made by veRL's own code (`tests/fixtures/verl_log/make_log.py`:
veRL's `compute_data_metrics`, the LLDS loss through veRL's registry, veRL's `reduce_metrics`
and `FileLogger`): it reads only what veRL logs, the LLD rule reads the loss's pre-mini-batch
share, and the verdict names the collapse step the attribution names."""

from __future__ import annotations

import json
import shutil
import statistics
from pathlib import Path

from llds.report.attribution import COLLAPSE, run_events
from llds.report.html import write_report
from llds.report.sources import find_source, read_source

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "verl_log"
NATIVE_ONLY = ("lld/disp_pos", "lld/frac_pos_fell", "rollout/valid_searches", "policy/ratio_max")


def _raw(folder: Path = FIXTURE) -> list[dict]:
    lines = (folder / "metrics.verl.jsonl").read_text(encoding="utf-8").splitlines()
    return [json.loads(line) for line in lines if line.strip()]


def _verl_rows(folder: Path, run: Path) -> list[dict]:
    """The report's rows of the veRL log in `folder`, copied into the run directory `run`."""
    run.mkdir()
    shutil.copy(folder / "metrics.verl.jsonl", run)
    source = find_source(run)
    assert source.kind == "verl-jsonl"
    return read_source(source)


def test_the_log_is_verl_s_own_and_the_lld_rule_reads_its_share(tmp_path):
    raw = _raw()
    assert all(set(r) == {"step", "data"} for r in raw)  # veRL's FileLogger records
    assert not any(k in r["data"] for r in raw for k in NATIVE_ONLY)
    run = tmp_path / "verl-run"
    rows = _verl_rows(FIXTURE, run)
    assert [r["step"] for r in rows] == [r["step"] for r in raw]
    # the share comes from the loss's counts, as the report pools them
    for r, rec in zip(rows, raw, strict=True):
        d = rec["data"]
        if d["actor/lld_premb_n_pos"] > 0:
            want = d["actor/lld_premb_n_pos_fell"] / d["actor/lld_premb_n_pos"]
            assert abs(r["lld/premb_share_pos_fell"] - want) < 1e-12
    # the collapse by the definition, by hand: 10-step median reward at or below half its
    # running peak (>= 0.2) to the end
    reward = [rec["data"]["critic/score/mean"] for rec in raw]
    smooth = [statistics.median(reward[max(0, i - 9) : i + 1]) for i in range(len(reward))]
    peaks = [max(smooth[: i + 1]) for i in range(len(smooth))]
    low = [s <= 0.5 * p and p >= 0.2 for s, p in zip(smooth, peaks, strict=True)]
    collapse = raw[next(i for i in range(len(low)) if all(low[i:]))]["step"]
    event = next(e for e in run_events(rows, []) if e.kind == COLLAPSE)
    assert event.step == collapse
    lld = next(f for f in event.findings if f.mechanism == "LLD")
    assert lld.status == "present", lld
    assert lld.numbers["lld/premb_share_pos_fell"] >= 0.5
    # the page: its verdict and its attribution name that step, and LLDS for the LLD signature;
    # the log ends a few steps after it, so the collapse is censored
    last = raw[-1]["step"]
    assert last - collapse < 30
    page = write_report([run], tmp_path / "report").read_text(encoding="utf-8")
    assert f"reward fell to half its peak at step {collapse}, censored" in page
    assert f"nothing after step {last} was seen" in page
    assert f"Signatures present before the collapse at step {collapse}" in page
    assert "LLD: LLDS (<code>algo.llds.enabled=true</code>)" in page


REAL_RUN = Path(__file__).resolve().parent / "fixtures" / "verl_trainer_log"


def test_a_real_verl_trainer_log_is_read_and_the_drawn_log_holds_only_its_keys(tmp_path):
    """The log of a real veRL trainer run with the LLDS loss (2 steps, CPU, made by
    `tests/verl_worker.py trainer`) is read as veRL's, its LLD share comes from the loss's
    counts, the report renders it; and every key of the drawn collapse log above is one this
    real run logged, so that log holds nothing veRL would not write."""
    real = _raw(REAL_RUN)
    assert [r["step"] for r in real] == [1, 2]
    run = tmp_path / "verl-trainer"
    rows = _verl_rows(REAL_RUN, run)
    for row, rec in zip(rows, real, strict=True):
        d = rec["data"]
        want = d["actor/lld_premb_n_pos_fell"] / d["actor/lld_premb_n_pos"]
        assert abs(row["lld/premb_share_pos_fell"] - want) < 1e-12
    page = write_report([run], tmp_path / "report").read_text(encoding="utf-8")
    assert "verl-trainer" in page
    drawn = {k for rec in _raw() for k in rec["data"]}
    logged = {k for rec in real for k in rec["data"]}
    assert drawn <= logged, sorted(drawn - logged)
