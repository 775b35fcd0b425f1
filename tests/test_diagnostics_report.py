"""`llds report`: HTML + PNG report over fixture runs written as metrics.jsonl."""

from __future__ import annotations

import base64
import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from llds.cli import main
from llds.diagnostics import report as report_mod
from llds.diagnostics.phases import detect_phases
from llds.diagnostics.plots import moving_average, smoothing_width
from llds.diagnostics.report import summarize, write_report
from llds.diagnostics.synthetic import synthetic_rows
from llds.errors import DataFormatError, UserInputError
from llds.io import write_json, write_jsonl

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> tuple[Path, Path]:
    """A vanilla-GRPO run that collapses and a GRPO+LLDS run that stays healthy."""
    root = tmp_path_factory.mktemp("runs")
    grpo, llds = root / "grpo", root / "grpo_llds"
    write_jsonl(grpo / "metrics.jsonl", synthetic_rows("collapse", seed=1, steps=160))
    write_jsonl(llds / "metrics.jsonl", synthetic_rows("healthy", seed=2, steps=140))
    overall = {"em": 0.412, "f1": 0.5, "sub_em": 0.45, "valid_searches": 1.8, "answered": 0.9}
    overall["n"] = 500
    # the evaluation convention: RUN/eval/step_N.json; the report reads the newest
    write_json(llds / "eval" / "step_000140.json", {"overall": overall, "by_source": {}})
    older = {**overall, "em": 0.1}
    write_json(llds / "eval" / "step_000050.json", {"overall": older, "by_source": {}})
    return grpo, llds


@pytest.fixture(scope="module")
def written(runs, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("report")
    return write_report(list(runs), out, labels=["GRPO", "GRPO + LLDS"])


def test_report_files_and_embedded_images(written):
    out = written.parent
    assert written.name == "report.html"
    pngs = sorted(p.name for p in out.glob("*.png"))
    assert pngs == ["compare.png", "run1_GRPO.png", "run2_GRPO_LLDS.png", "timeline.png"]
    for name in pngs:
        assert (out / name).read_bytes().startswith(PNG_MAGIC)
    page = written.read_text(encoding="utf-8")
    embedded = re.findall(r'src="data:image/png;base64,([A-Za-z0-9+/=]+)"', page)
    assert len(embedded) == 4
    # the embedded images are exactly the files written beside the page
    assert sorted(base64.b64decode(e) for e in embedded) == sorted(
        (out / n).read_bytes() for n in pngs
    )
    assert "GRPO + LLDS" in page and "yes, from step 120" in page
    assert not list(out.glob(".*.tmp"))  # no temp files left behind


def test_report_summary_numbers(written, runs):
    data = json.loads((written.parent / "report.json").read_text())
    grpo, llds = data["runs"]
    rows = synthetic_rows("collapse", seed=1, steps=160)
    tail = [r["reward/mean"] for r in rows[-10:]]
    assert grpo["final_reward"] == pytest.approx(sum(tail) / 10)
    assert grpo["steps"] == 160 and llds["steps"] == 140
    assert grpo["collapsed"] and grpo["collapse_step"] == 120 and grpo["last_phase"] == "collapse"
    assert grpo["first_alarm_kind"] == "likelihood_decay" and grpo["first_alarm_step"] < 80
    assert grpo["eval_em"] is None
    assert not llds["collapsed"] and llds["eval_em"] == pytest.approx(0.412)
    assert llds["first_alarm_step"] is None and llds["alarms"] == []
    assert sum(grpo["phase_steps"].values()) == 160
    kinds = [a["kind"] for a in grpo["alarms"]]
    assert "reward_collapse" in kinds and "collapse" in kinds


def test_summarize_peak_is_max_of_five_step_medians():
    rewards = [0.1, 0.9, 0.1, 0.1, 0.5, 0.5, 0.5, 0.2]
    rows = [{"step": i + 1, "reward/mean": r} for i, r in enumerate(rewards)]
    run = report_mod.RunData("r", Path("r"), rows, detect_phases(rows), [], None)
    s = summarize(run)
    # 5-step trailing medians: .1 .5 .1 .1 .1 .5 .5 .5 -> peak 0.5 (the lone 0.9 is ignored)
    assert s["peak_reward"] == pytest.approx(0.5)
    assert s["final_reward"] == pytest.approx(sum(rewards) / len(rewards))
    assert s["last_phase"] == "warmup" and not s["collapsed"]


def test_missing_metrics_names_the_directory(tmp_path, capsys):
    empty = tmp_path / "not_a_run"
    empty.mkdir()
    with pytest.raises(UserInputError, match=r"not_a_run.*metrics\.jsonl"):
        write_report([empty], tmp_path / "out")
    assert main(["report", str(empty), "--out", str(tmp_path / "out")]) == 2
    assert "not_a_run" in capsys.readouterr().err
    with pytest.raises(UserInputError, match="does not exist"):
        write_report([tmp_path / "nope"], tmp_path / "out")


def test_bad_inputs(runs, tmp_path):
    grpo, _ = runs
    with pytest.raises(UserInputError, match="2 labels given for 1"):
        write_report([grpo], tmp_path / "out", labels=["a", "b"])
    bad = tmp_path / "bad_eval"
    write_jsonl(bad / "metrics.jsonl", synthetic_rows("healthy", steps=30))
    (bad / "eval").mkdir()
    (bad / "eval" / "step_000030.json").write_text("{not json", encoding="utf-8")
    with pytest.raises(DataFormatError, match=r"step_000030\.json"):
        write_report([bad], tmp_path / "out")


def test_failed_render_keeps_previous_report(runs, tmp_path, monkeypatch):
    grpo, _ = runs
    path = write_report([grpo], tmp_path)
    before = path.read_bytes()

    def boom(_runs):
        raise RuntimeError("render failed")

    monkeypatch.setattr(report_mod, "comparison_figure", boom)
    with pytest.raises(RuntimeError):
        write_report([grpo], tmp_path)
    assert path.read_bytes() == before


def test_cli_labels_and_default_out(runs, tmp_path, monkeypatch, capsys):
    grpo, llds = runs
    out = tmp_path / "cli"
    assert main(["report", str(grpo), str(llds), "--out", str(out), "--labels", "a,b"]) == 0
    assert (out / "report.html").is_file() and "report written" in capsys.readouterr().out
    assert json.loads((out / "report.json").read_text())["runs"][1]["label"] == "b"
    monkeypatch.chdir(tmp_path)
    assert main(["report", str(grpo), str(llds)]) == 0
    assert (tmp_path / "llds_report" / "report.html").is_file()
    assert main(["report", str(grpo), "--labels", "a,"]) == 2


def test_smoothing_helpers():
    assert moving_average([0, 3, 6, 9], 3) == [1.5, 3.0, 6.0, 7.5]
    assert smoothing_width(10) == 1 and smoothing_width(100) == 5 and smoothing_width(10_000) == 15


def _chromium() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable"):
        found = shutil.which(name)
        if found:
            return found
    return None


def test_report_renders_in_headless_chromium(written, tmp_path):
    browser = _chromium()
    if browser is None:
        pytest.skip("no chromium binary on PATH (apt-get install chromium)")
    shot = tmp_path / "shot.png"
    cmd = [
        browser,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        f"--user-data-dir={tmp_path / 'profile'}",
        f"--screenshot={shot}",
        "--window-size=1400,2000",
        written.resolve().as_uri(),
    ]
    subprocess.run(cmd, check=True, capture_output=True, timeout=120)
    import matplotlib.image as mpimg

    img = mpimg.imread(shot)
    assert img.shape[:2] == (2000, 1400)
    rgb = (img[..., :3] * 255).round().astype(int)
    non_white = (rgb.min(axis=-1) < 240).mean()
    assert 0.03 < non_white < 0.9  # text, tables and figures, not a blank or solid page
    colours = {tuple(c) for c in rgb[::7, ::7].reshape(-1, 3)}
    assert len(colours) > 50  # the run colours, phase shading, anti-aliased text...
