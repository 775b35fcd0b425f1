"""`llds report` over TRL and veRL logs: fixture files in each framework's format, read into the
report's metric names, and the same panels as a native run."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt
import pytest

from llds.cli import main
from llds.errors import DataFormatError, UserInputError
from llds.io import write_json, write_jsonl
from llds.report import sources
from llds.report.html import load_run, write_report
from llds.report.plots import RunSeries, draw_comparison
from synthetic_logs import synthetic_rows

NATIVE_TO_TRL = {
    "reward/mean": "reward",
    "policy/entropy": "entropy",
    "policy/grad_norm": "grad_norm",
    "rollout/response_tokens": "completions/mean_length",
}
NATIVE_TO_VERL = {
    "reward/mean": "critic/score/mean",
    "policy/entropy": "actor/entropy",
    "policy/grad_norm": "actor/grad_norm",
    "rollout/response_tokens": "response_length/mean",
}


def _renamed(row: dict[str, Any], table: dict[str, str]) -> dict[str, Any]:
    """A native row under a framework's names; LLD keys as the adapters log them."""
    return {table.get(k, k): v for k, v in row.items() if k != "step"}


def trl_dir(root: Path, steps: int = 80) -> Path:
    """A TRL output directory: the GRPO log in a checkpoint's trainer state, with TRL's
    per-epoch bookkeeping and its closing runtime summary."""
    history: list[dict[str, Any]] = []
    for row in synthetic_rows("collapse", steps=steps, collapse_start=60, displacement=True):
        entry = _renamed(row, NATIVE_TO_TRL)
        entry.update({"step": row["step"], "epoch": row["step"] / steps, "learning_rate": 1e-6})
        entry["llds/loss"] = 0.0
        history.append(entry)
    history.append({"step": steps, "train_runtime": 12.5, "train_loss": 0.1})
    out = root / "trl_out"
    write_json(out / "checkpoint-40" / "trainer_state.json", {"log_history": history[:40]})
    write_json(out / "checkpoint-80" / "trainer_state.json", {"log_history": history})
    return out


def verl_rows(steps: int = 80) -> list[dict[str, Any]]:
    """veRL metric dicts per step holding only what a veRL run logs: veRL's own names, the LLDS
    loss's statistics under `actor/llds_` and its pre-mini-batch LLD counts under
    `actor/lld_premb_` (here 100 positive responses a step, the synthetic share of them fell);
    no native key veRL never logs (`lld/disp_pos`, `rollout/valid_searches`, ...)."""
    out = []
    for row in synthetic_rows("collapse", steps=steps, collapse_start=60, displacement=True):
        data = {NATIVE_TO_VERL[k]: v for k, v in row.items() if k in NATIVE_TO_VERL}
        data.update({"actor/llds_gate_frac": 0.25, "timing_s/step": 3.0, "actor/ppo_kl": 0.01})
        fell = round(100 * row["lld/frac_pos_fell"])
        data.update({"actor/lld_premb_n_pos": 100.0, "actor/lld_premb_n_pos_fell": float(fell)})
        out.append({"step": row["step"], "data": data})
    return out


def test_trl_output_directory_is_read_in_the_report_names(tmp_path):
    out = trl_dir(tmp_path)
    found = sources.find_source(out)
    assert found.kind == "trl" and found.path.parent.name == "checkpoint-80"  # the newest
    rows = sources.read_source(found)
    assert [r["step"] for r in rows] == list(range(1, 81))  # the runtime summary dropped
    first = synthetic_rows("collapse", steps=80, collapse_start=60, displacement=True)[0]
    assert rows[0]["reward/mean"] == first["reward/mean"]
    assert rows[0]["policy/entropy"] == first["policy/entropy"]
    assert rows[0]["rollout/response_tokens"] == first["rollout/response_tokens"]
    assert rows[0]["lld/disp_pos"] == first["lld/disp_pos"] and rows[0]["llds/loss"] == 0.0
    assert "epoch" not in rows[0] and "learning_rate" not in rows[0]


def test_verl_file_logger_jsonl_is_read_and_actor_llds_renamed(tmp_path):
    log = tmp_path / "verl" / "exp.jsonl"
    write_jsonl(log, verl_rows())
    with log.open("a", encoding="utf-8") as f:
        f.write('{"step": 81, "da')  # a crash mid-write
    for path in (log, log.parent):
        found = sources.find_source(path)
        assert found == sources.MetricSource("verl-jsonl", log)
    rows = sources.read_source(found)
    assert len(rows) == 80
    assert rows[4]["llds/gate_frac"] == 0.25 and rows[4]["policy/approx_kl"] == 0.01
    assert "timing_s/step" not in rows[4] and "step" in rows[4]
    assert rows[4]["reward/mean"] == verl_rows()[4]["data"]["critic/score/mean"]


def test_verl_tensorboard_events_are_read(tmp_path):
    from torch.utils.tensorboard import SummaryWriter

    tb = tmp_path / "tensorboard_log" / "proj" / "exp"
    writer = SummaryWriter(str(tb))
    for record in verl_rows(30):
        for key, value in record["data"].items():
            writer.add_scalar(key, value, record["step"])
    writer.close()
    found = sources.find_source(tmp_path / "tensorboard_log")
    assert found.kind == "tensorboard"
    rows = sources.read_source(found)
    assert [r["step"] for r in rows] == list(range(1, 31))
    expected = verl_rows(30)[9]["data"]["actor/entropy"]
    assert rows[9]["policy/entropy"] == pytest.approx(expected, rel=1e-6)  # stored as float32


def test_verl_flattened_names_are_unflattened():
    logged = {"actor/mismatch_k3_kl": 0.01, "actor/lld_premb_share_pos_fell": 0.4}
    logged |= {"actor/turns_void_share": 0.2, "train/lld/disp_pos": -0.1, "actor/pg_loss": 1.0}
    assert sources.map_row(2, logged, sources.VERL_NAMES) == {
        "step": 2,
        "mismatch/k3_kl": 0.01,
        "lld/premb_share_pos_fell": 0.4,
        "turns/void_share": 0.2,
        "lld/disp_pos": -0.1,
    }


def test_a_native_name_beats_the_framework_alias():
    row = sources.map_row(3, {"actor/entropy": 1.0, "policy/entropy": 2.0, "note": "x"}, {})
    assert row == {"step": 3, "policy/entropy": 2.0}
    row = sources.map_row(3, {"policy/entropy": 2.0, "actor/entropy": 1.0}, sources.VERL_NAMES)
    assert row == {"step": 3, "policy/entropy": 2.0}


def test_bad_logs_name_the_file(tmp_path):
    state = tmp_path / "t" / "trainer_state.json"
    write_json(state, {"global_step": 3})
    with pytest.raises(DataFormatError, match=r"trainer_state\.json.*log_history"):
        sources.read_source(sources.find_source(state.parent))
    log = tmp_path / "v.jsonl"
    log.write_text('{"step": 1, "data": {"a": 1}}\nnot json\n{"step": 3, "data": {}}\n')
    with pytest.raises(DataFormatError, match=r"v\.jsonl: line 2"):
        sources.read_source(sources.find_source(log))
    other = tmp_path / "other.txt"
    other.write_text("hello")
    with pytest.raises(UserInputError, match="neither a veRL metrics JSONL nor a TRL"):
        sources.find_source(other)


def test_trl_and_verl_runs_draw_the_same_panels_as_a_native_run(tmp_path):
    write_jsonl(tmp_path / "native" / "metrics.jsonl", synthetic_rows("healthy", steps=80))
    log = tmp_path / "verl" / "exp.jsonl"
    write_jsonl(log, verl_rows())
    runs = [load_run(p, p.name) for p in (tmp_path / "native", trl_dir(tmp_path), log)]
    assert [r.source for r in runs] == ["native", "trl", "verl-jsonl"]
    for run in runs:
        fig = draw_comparison([RunSeries(run.label, "#1f77b4", run.rows, run.phases, run.alarms)])
        empty = [
            ax.get_title() for ax in fig.axes if "not logged" in [t.get_text() for t in ax.texts]
        ]
        # reward, entropy, grad norm, length and the displacement panels are drawn for all three
        for title in ("Reward", "Policy entropy", "Gradient norm", "Response length"):
            assert not any(t.startswith(title) for t in empty), (run.source, title)
        plt.close(fig)
    assert runs[1].phases[-1].phase == "collapse" and runs[2].phases[-1].phase == "collapse"


def test_cli_reports_a_verl_log_beside_it(tmp_path, capsys):
    log = tmp_path / "verl" / "exp.jsonl"
    rows = verl_rows(110)  # 37 steps logged after the collapse at 73: not censored
    native_only = (
        "lld/disp_pos",
        "lld/frac_pos_fell",
        "rollout/valid_searches",
        "policy/ratio_max",
    )
    assert not any(k in r["data"] for r in rows for k in native_only)  # only what veRL logs
    write_jsonl(log, rows)
    assert main(["report", str(log)]) == 0
    report = tmp_path / "verl" / "report" / "report.json"
    data = json.loads(report.read_text())["runs"][0]
    assert data["source"] == "verl-jsonl" and data["collapsed"] and not data["censored"]
    # veRL logs no learning rate: the grown gradients are the death spiral's, downstream of LLD
    assert capsys.readouterr().out.startswith(
        "exp.jsonl: collapsed at step 73; cause named: LLD; also present, downstream: entropy, "
        "learning-rate divergence;"
    )
    page = (report.parent / "report.html").read_text()
    assert "Signatures present before the collapse at step 73 (steps 54&ndash;73): LLD (" in page
    # the synthetic entropy rises about 2.8x over its early median: at least 2x, a blow-up
    assert "entropy (blow-up: max" in page


def test_report_of_a_trl_run_and_a_verl_log(tmp_path):
    log = tmp_path / "verl" / "exp.jsonl"
    write_jsonl(log, verl_rows())
    path = write_report([trl_dir(tmp_path), log], tmp_path / "out", labels=["TRL", "veRL"])
    page = path.read_text()
    assert page.count("Signatures present before the collapse at step") == 2
    assert "<h3 style='color:#1f77b4'>TRL" in page and "<h3 style='color:#d62728'>veRL" in page


def test_verl_pre_mini_batch_counts_become_the_share():
    logged = {"actor/lld_premb_n_pos": 8.0, "actor/lld_premb_n_pos_fell": 2.0}
    row = sources.map_row(3, logged, sources.VERL_NAMES)
    assert row["lld/premb_share_pos_fell"] == 0.25
    none = sources.map_row(3, {"actor/lld_premb_n_pos": 0.0}, sources.VERL_NAMES)
    assert "lld/premb_share_pos_fell" not in none  # no positive response: no share


def test_a_committed_gzipped_log_is_read_as_the_live_one(tmp_path, capsys):
    """A study commits `metrics.jsonl.gz` in place of the live log: the report reads the same
    rows from it and `llds report` renders it."""
    import gzip

    live = tmp_path / "live"
    write_jsonl(live / "metrics.jsonl", synthetic_rows("collapse", steps=80))
    committed = tmp_path / "committed"
    committed.mkdir()
    with gzip.open(committed / "metrics.jsonl.gz", "wt", encoding="utf-8") as f:
        f.write((live / "metrics.jsonl").read_text(encoding="utf-8"))
    found = sources.find_source(committed)
    assert found.kind == "native"
    assert sources.read_source(found) == sources.read_source(sources.find_source(live))
    rc = main(["report", str(committed), "--out", str(tmp_path / "report")])
    assert rc == 0, capsys.readouterr()
    assert (tmp_path / "report" / "report.html").is_file()
