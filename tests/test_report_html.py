"""`llds report`: HTML + PNG report over fixture runs written as metrics.jsonl."""

from __future__ import annotations

import base64
import json
import re
import shutil
import statistics
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest

from llds.cli import main
from llds.errors import DataFormatError, UserInputError
from llds.io import write_json, write_jsonl, write_yaml
from llds.monitor.alarms import ALARM_KINDS, AlarmConfig
from llds.monitor.phases import PhaseConfig, detect_phases
from llds.report import html as report_mod
from llds.report.html import summarize, write_report
from llds.report.plots import (
    PHASE_NAMES,
    RunSeries,
    _log_ticks,
    draw_comparison,
    draw_heldout,
    draw_reference,
    draw_run_detail,
    draw_timeline,
    em_curve,
    has_reference,
    moving_average,
    smoothing_width,
)
from llds.report.text import curves_caption, heldout_caption, reference_caption
from synthetic_logs import synthetic_rows

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> tuple[Path, Path]:
    """A vanilla-GRPO run that collapses and a GRPO+LLDS run that stays healthy, from the same
    warm start; their saved configs differ only in `algo.llds.enabled`."""
    root = tmp_path_factory.mktemp("runs")
    grpo, llds = root / "grpo", root / "grpo_llds"
    write_jsonl(grpo / "metrics.jsonl", synthetic_rows("collapse", seed=1, steps=170))
    write_jsonl(llds / "metrics.jsonl", synthetic_rows("healthy", seed=2, steps=140))
    overall = {"em": 0.412, "f1": 0.5, "sub_em": 0.45, "valid_searches": 1.8, "answered": 0.9}
    overall["n"] = 500
    # the evaluation convention: RUN/eval/step_N.json; the report reads the newest
    write_json(llds / "eval" / "step_000140.json", {"overall": overall, "by_source": {}})
    older = {**overall, "em": 0.1}
    write_json(llds / "eval" / "step_000050.json", {"overall": older, "by_source": {}})
    # the warm start both runs name, evaluated at step 0 (the layout `llds demo` writes)
    (root / "sft" / "model").mkdir(parents=True)
    write_json(root / "sft" / "eval" / "step_000000.json", {"overall": {**overall, "em": 0.05}})
    for run, enabled in ((grpo, False), (llds, True)):
        config = {
            "run_dir": str(run),
            "seed": 0,
            "model": {"path": str(root / "sft" / "model"), "dtype": "float32"},
            "optim": {"lr": 2e-4, "mini_batches": 4},
            "algo": {"kl_coef": 0.001, "llds": {"enabled": enabled, "coef": 0.2}},
        }
        write_yaml(run / "config.yaml", config)
    return grpo, llds


@pytest.fixture(scope="module")
def written(runs, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("report")
    return write_report(list(runs), out, labels=["GRPO", "GRPO + LLDS"])


def test_report_files_and_embedded_images(written):
    out = written.parent
    assert written.name == "report.html"
    pngs = sorted(p.name for p in out.glob("*.png"))
    assert pngs == [
        "compare.png",
        "heldout.png",
        "run1_GRPO.png",
        "run2_GRPO_LLDS.png",
        "timeline.png",
    ]
    for name in pngs:
        assert (out / name).read_bytes().startswith(PNG_MAGIC)
    page = written.read_text(encoding="utf-8")
    embedded = re.findall(r'src="data:image/png;base64,([A-Za-z0-9+/=]+)"', page)
    assert len(embedded) == 5
    # the embedded images are exactly the files written beside the page
    assert sorted(base64.b64decode(e) for e in embedded) == sorted(
        (out / n).read_bytes() for n in pngs
    )
    step = json.loads((out / "report.json").read_text())["runs"][0]["collapse_step"]
    # one collapse step on the whole page: the summary's, the verdict's and the attribution's
    assert "GRPO + LLDS" in page and f"yes, from step {step}" in page
    assert f"collapsed at step {step}" in page
    assert f"Signatures present before the collapse at step {step}" in page
    assert page.index("<h2>Verdict</h2>") < page.index("How to read this report")
    assert not list(out.glob(".*.tmp"))  # no temp files left behind


def test_report_summary_numbers(written, runs):
    data = json.loads((written.parent / "report.json").read_text())
    grpo, llds = data["runs"]
    rows = synthetic_rows("collapse", seed=1, steps=170)
    tail = sorted(r["reward/mean"] for r in rows[-10:])
    assert grpo["final_reward"] == pytest.approx((tail[4] + tail[5]) / 2)  # 10-step median
    assert grpo["steps"] == 170 and llds["steps"] == 140
    # the pre-registered definition, computed here by hand: the first step from which the
    # 10-step median reward stays at or below half of its running peak to the end
    reward = [r["reward/mean"] for r in rows]
    smooth = [statistics.median(reward[max(0, i - 9) : i + 1]) for i in range(len(reward))]
    peaks = [max(smooth[: i + 1]) for i in range(len(smooth))]
    low = [s <= 0.5 * p and p >= 0.2 for s, p in zip(smooth, peaks, strict=True)]
    first = next(i for i in range(len(low)) if all(low[i:]))
    assert grpo["collapsed"] and grpo["collapse_step"] == rows[first]["step"]
    assert grpo["detector_collapse_step"] == 120 and grpo["last_phase"] == "collapse"
    assert grpo["first_alarm_kind"] == "likelihood_decay" and grpo["first_alarm_step"] < 80
    assert grpo["eval_em"] is None
    assert not llds["collapsed"] and llds["eval_em"] == pytest.approx(0.412)
    assert llds["first_alarm_step"] is None and llds["alarms"] == []
    assert sum(grpo["phase_steps"].values()) == 170
    kinds = [a["kind"] for a in grpo["alarms"]]
    assert "reward_collapse" in kinds and "collapse" in kinds


def test_final_and_peak_reward_are_the_same_ten_step_median():
    # 10 steps at 0.1, a lone 0.9, 9 steps at 0.5, then 12 at 0.3
    rewards = [0.1] * 10 + [0.9] + [0.5] * 9 + [0.3] * 12
    rows = [{"step": i + 1, "reward/mean": r} for i, r in enumerate(rewards)]
    run = report_mod.RunData("r", Path("r"), rows, detect_phases(rows), [], None)
    s = summarize(run)
    assert s["peak_reward"] == pytest.approx(0.5)  # the lone 0.9 is ignored
    assert s["final_reward"] == pytest.approx(0.3)  # the same median, at the last step
    assert s["learned"] and not s["collapsed"]
    # the peak statistic is the final one's maximum: a run ending at its peak has them equal
    flat = [{"step": i + 1, "reward/mean": 0.1 + 0.02 * i} for i in range(30)]
    s = summarize(report_mod.RunData("f", Path("f"), flat, detect_phases(flat), [], None))
    assert s["final_reward"] == pytest.approx(s["peak_reward"])


def test_a_run_that_learned_nothing_does_not_read_as_healthy(tmp_path):
    flat = [{"step": i + 1, "reward/mean": 0.05 + 0.01 * (i % 3)} for i in range(40)]
    s = summarize(report_mod.RunData("f", Path("f"), flat, detect_phases(flat), [], None))
    assert not s["learned"] and not s["collapsed"]
    # high but never rising: no rise over its first full window, so nothing was learned either
    high = [{"step": i + 1, "reward/mean": 0.6} for i in range(40)]
    s = summarize(report_mod.RunData("h", Path("h"), high, detect_phases(high), [], None))
    assert not s["learned"]
    write_jsonl(tmp_path / "flat" / "metrics.jsonl", flat)
    write_jsonl(tmp_path / "rising" / "metrics.jsonl", synthetic_rows("healthy", steps=60))
    page = write_report([tmp_path / "flat", tmp_path / "rising"], tmp_path / "out").read_text()
    cells = re.findall(r"<td>(<span class=\"(?:good|warn|bad)\">[^<]*</span>)", page)
    assert cells == [
        '<span class="warn">no, but did not learn</span>',
        '<span class="good">no</span>',
    ]


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

    def boom(*_args):
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


# --- the report explains itself -------------------------------------------------------------


def test_report_explains_lld_phases_and_alarms(written):
    page = written.read_text(encoding="utf-8")
    assert "How to read this report" in page
    assert "Lazy likelihood displacement" in page
    for metric in ("lld/disp_pos", "lld/frac_pos_fell", "lld/disp_correct"):
        assert metric in page
    for phase in PHASE_NAMES.values():
        assert f"<dt>{phase}</dt>" in page
    for kind in ALARM_KINDS:
        assert kind in page.split("How to read this report")[1].split("<h2>")[0]


def test_explanation_quotes_the_thresholds_in_use(runs, tmp_path):
    grpo, _ = runs
    config = AlarmConfig(phase=PhaseConfig(decay_steps=7, disp_window=25), rearm_steps=9)
    page = write_report([grpo], tmp_path, config=config).read_text(encoding="utf-8")
    assert "at least 7 steps in a row, the 25-step rolling median" in page
    assert "quiet for 9 steps" in page


def test_heldout_curve_matches_eval_files(runs):
    _, llds = runs
    run = report_mod.load_run(llds, "GRPO + LLDS")
    assert run.held_out is not None and run.held_out.baseline_label == "warm start"
    # the warm start's step-0 evaluation, then the two files the fixture wrote
    assert em_curve(run.held_out) == ([0, 50, 140], [0.05, 0.1, 0.412])
    fig = draw_heldout([RunSeries("x", "#123456", run.rows, run.phases, [], run.held_out)])
    (line,) = [ln for ln in fig.axes[0].get_lines() if ln.get_label() == "x"]
    assert list(line.get_xdata()) == [0, 50, 140]
    assert list(line.get_ydata()) == pytest.approx([0.05, 0.1, 0.412])
    baseline = [ln for ln in fig.axes[0].get_lines() if ln.get_label().startswith("start")]
    assert len(baseline) == 1 and list(baseline[0].get_ydata()) == [0.05, 0.05]
    assert line.get_linestyle() == "-" and line.get_marker() == "o"  # three points: a line


def test_two_heldout_points_are_markers_not_a_line(runs, tmp_path):
    _, llds = runs
    run = report_mod.load_run(llds, "GRPO + LLDS")
    assert run.held_out is not None
    two = replace(run.held_out, points=run.held_out.points[-1:])  # the start and one evaluation
    assert em_curve(two)[0] == [0, 140]
    fig = draw_heldout([RunSeries("x", "#123456", run.rows, run.phases, [], two)])
    (line,) = [ln for ln in fig.axes[0].get_lines() if ln.get_label() == "x"]
    assert line.get_linestyle() == "None" and line.get_marker() == "o"
    caption = heldout_caption([RunSeries("x", "#123456", run.rows, run.phases, [], two)])
    assert "markers only, too few points for a line; step 140" in caption
    three = heldout_caption([RunSeries("x", "#123456", run.rows, run.phases, [], run.held_out)])
    assert "markers only" not in three


def test_report_json_holds_heldout_and_start(written):
    data = json.loads((written.parent / "report.json").read_text())
    grpo, llds = data["runs"]
    assert [p["step"] for p in llds["held_out"]] == [50, 140]
    assert llds["start_em"] == pytest.approx(0.05) and grpo["start_em"] == pytest.approx(0.05)
    assert grpo["held_out"] == [] and data["differing_settings"] == ["algo.llds.enabled"]


def test_no_evaluation_says_so_instead_of_an_empty_axis(tmp_path):
    run = tmp_path / "plain"
    write_jsonl(run / "metrics.jsonl", synthetic_rows("healthy", seed=3, steps=30))
    page = write_report([run], tmp_path / "out").read_text(encoding="utf-8")
    assert "<b>plain</b>: no evaluation found" in page
    loaded = report_mod.load_run(run, "plain")
    fig = draw_heldout([RunSeries("plain", "#000", loaded.rows, [], [], loaded.held_out)])
    (ax,) = fig.axes
    assert not ax.axison and not ax.get_lines()
    assert any("No held-out evaluation" in t.get_text() for t in ax.texts)


def test_settings_table_marks_the_differing_key(written):
    page = written.read_text(encoding="utf-8")
    settings = page.split("<h2>Settings</h2>")[1].split("<h2>")[0]
    assert "differ in</b> <code class='diff'>algo.llds.enabled</code>" in settings
    assert "(GRPO: off / GRPO + LLDS: on)" in settings
    marked = re.findall(r"<tr class='differs'><td>(.*?)</td>", settings)
    assert marked == ["LLDS regularizer <code>algo.llds.enabled</code>"]
    lr_row = re.search(r"<tr><td>learning rate <code>optim.lr</code></td>(.*?)</tr>", settings)
    assert lr_row is not None and lr_row.group(1) == "<td>0.0002</td><td>0.0002</td>"


def test_captions_mention_alarms_only_when_drawn(runs, written, tmp_path):
    _, llds = runs  # the healthy run raises no alarm
    quiet = write_report([llds], tmp_path).read_text(encoding="utf-8")
    curves = quiet.split("<h2>Training curves</h2>")[1].split("<img")[0]
    assert "Dotted vertical lines" not in curves and "no alarm lines are drawn" in curves
    assert "Coloured strips" not in curves
    assert "Dotted lines: alarms" not in quiet.split("<h2>Runs</h2>")[1]
    loud = written.read_text(encoding="utf-8").split("<h2>Training curves</h2>")[1]
    assert "Dotted vertical lines: warning and critical alarms" in loud.split("<img")[0]
    assert "Coloured strips" in loud.split("<img")[0]

    healthy = report_mod.load_run(llds, "healthy")
    series = [RunSeries("healthy", "#1f77b4", healthy.rows, healthy.phases, healthy.alarms)]
    legend = draw_comparison(series).legends[0]
    assert [t.get_text() for t in legend.get_texts()] == ["healthy"]
    assert draw_timeline(series).axes[0].get_title() == "Phases per run (no alarms)"


def _step_axes(fig):
    """Axes over training steps that show something (empty panels keep matplotlib's 0..1)."""
    return [
        ax
        for ax in fig.axes
        if ax.get_visible()
        and ax.get_xlabel() == "training step"
        and not any(t.get_text() == "not logged" for t in ax.texts)
    ]


def test_three_step_run_gets_integer_step_ticks():
    rows = [
        {"step": s, "reward/mean": r, "policy/grad_norm": g, "lld/logp_correct": -0.1 * s}
        for s, r, g in ((1, 0.2, 0.5), (2, 0.4, 0.9), (3, 0.5, 1.7))
    ]
    phases = detect_phases(rows)
    run = RunSeries("short", "#1f77b4", rows, phases, [])
    figures = [draw_comparison([run]), draw_timeline([run]), draw_run_detail(run)]
    for fig in figures:
        axes = _step_axes(fig)
        assert axes
        for ax in axes:
            low, high = ax.get_xlim()
            ticks = [t for t in ax.get_xticks() if low <= t <= high]
            assert ticks and all(float(t).is_integer() for t in ticks), ticks
            assert {1, 2, 3} <= set(ticks)


def test_log_axes_label_at_least_three_values():
    for low, high in ((0.3, 2.0), (0.8, 1.2), (0.05, 40.0), (1e-3, 1e3)):
        ticks = _log_ticks(low, high).tick_values(low, high)
        assert len([t for t in ticks if low <= t <= high]) >= 3, (low, high, ticks)
    rows = [{"step": i + 1, "policy/grad_norm": 0.4 + 0.05 * i} for i in range(30)]
    fig = draw_comparison([RunSeries("g", "#1f77b4", rows, detect_phases(rows), [])])
    (ax,) = [a for a in fig.axes if a.get_title() == "Gradient norm"]
    fig.canvas.draw()
    low, high = ax.get_ylim()
    labels = [
        t.get_text()
        for t, v in zip(ax.get_yticklabels(), ax.get_yticks(), strict=True)
        if low <= v <= high
    ]
    assert len([t for t in labels if t]) >= 3, labels


def test_training_em_is_drawn_above_the_reward_or_left_out():
    base = synthetic_rows("healthy", seed=4, steps=40)
    same = [{**r, "reward/em": r["reward/mean"] + 1e-8} for r in base]  # float32 noise
    differs = [{**r, "reward/em": max(0.0, r["reward/mean"] - 0.1)} for r in base]
    for rows, drawn in ((same, False), (differs, True)):
        run = RunSeries("r", "#d62728", rows, detect_phases(rows), [])
        (ax,) = [a for a in draw_comparison([run]).axes if a.get_title().startswith("Reward")]
        reward_z = max(ln.get_zorder() for ln in ax.get_lines() if ln.get_linestyle() == "-")
        em = [ln for ln in ax.get_lines() if ln.get_linestyle() != "-"]
        assert bool(em) == drawn
        if drawn:
            assert all(ln.get_zorder() > reward_z for ln in em)
            assert "dotted: EM" in ax.get_title()
        else:
            assert "EM = reward" in ax.get_title()


# --- the displacement panels draw the paper's quantity ------------------------------------------


def _with_neg(rows):
    """Rows as the trainer logs them now: `lld/disp_neg` next to `lld/disp_pos`."""
    return [{**r, "lld/disp_neg": -3.0 - 0.01 * r["step"]} for r in rows]


def _axis(fig, ylabel):
    (ax,) = [a for a in fig.axes if a.get_ylabel() == ylabel]
    return ax


def _curves(ax, color):
    """(linestyle, x, y) of the lines of one run's colour (raw and smoothed)."""
    return [
        (ln.get_linestyle(), list(ln.get_xdata()), list(ln.get_ydata()))
        for ln in ax.get_lines()
        if ln.get_color() == color
    ]


def _raw(rows, key):
    return [float(r["step"]) for r in rows], [r[key] for r in rows]


def test_displacement_panel_draws_the_logged_disp_pos_and_disp_neg():
    rows = _with_neg(synthetic_rows("steady_decay", seed=5, steps=80, displacement=True))
    run = RunSeries("new", "#1f77b4", rows, detect_phases(rows), [])
    fig = draw_comparison([run], PhaseConfig(pos_fell_frac=0.4))
    upper, lower = _axis(fig, "advantage > 0"), _axis(fig, "advantage < 0")
    for ax, key in ((upper, "lld/disp_pos"), (lower, "lld/disp_neg")):
        xs, ys = _raw(rows, key)
        drawn = _curves(ax, "#1f77b4")
        assert ("-", xs, ys) in drawn  # the faint raw values are exactly the logged ones
        assert ("-", xs, moving_average(ys, smoothing_width(len(ys)))) in drawn
        assert all(style == "-" for style, _, _ in drawn)
        assert [0.0, 0.0] in [list(ln.get_ydata()) for ln in ax.get_lines()]  # the zero line
    correct = _raw(rows, "lld/disp_correct")[1]
    assert all(y != correct for _, _, y in _curves(upper, "#1f77b4"))
    assert upper.get_title() == (
        "Likelihood displacement per update\n(log-prob change, nats per response)"
    )
    assert lower.get_title() == "" and upper.get_shared_x_axes().joined(upper, lower)
    fell = _axis(fig, "share of advantage > 0")
    assert ("-", *_raw(rows, "lld/frac_pos_fell")) in _curves(fell, "#1f77b4")
    assert [0.4, 0.4] in [list(ln.get_ydata()) for ln in fell.get_lines()]  # the threshold


def test_displacement_panel_falls_back_to_correctness_for_older_logs():
    old_rows = synthetic_rows("healthy", seed=6, steps=40)  # no lld/disp_pos, as older logs
    new_rows = _with_neg(synthetic_rows("healthy", seed=7, steps=40, displacement=True))
    old = RunSeries("old", "#d62728", old_rows, detect_phases(old_rows), [])
    new = RunSeries("new", "#1f77b4", new_rows, detect_phases(new_rows), [])
    fig = draw_comparison([old])
    upper, lower = _axis(fig, "correct"), _axis(fig, "incorrect")
    for ax, key in ((upper, "lld/disp_correct"), (lower, "lld/disp_incorrect")):
        assert ("--", *_raw(old_rows, key)) in _curves(ax, "#d62728")
    assert upper.get_title().endswith("(nats per response; dashed: by correctness)")
    assert ("--", *_raw(old_rows, "lld/frac_correct_fell")) in _curves(
        _axis(fig, "share of correct responses"), "#d62728"
    )
    # side by side: the new run solid with its disp_pos, the old one dashed with disp_correct
    mixed = draw_comparison([new, old])
    upper = _axis(mixed, "advantage > 0")
    assert ("-", *_raw(new_rows, "lld/disp_pos")) in _curves(upper, "#1f77b4")
    assert ("--", *_raw(old_rows, "lld/disp_correct")) in _curves(upper, "#d62728")
    assert "dashed: by correctness" in upper.get_title()


def test_curves_caption_names_the_metrics_drawn():
    old_rows = synthetic_rows("healthy", seed=6, steps=40)
    new_rows = _with_neg(synthetic_rows("healthy", seed=7, steps=40, displacement=True))
    old = RunSeries("old", "#d62728", old_rows, detect_phases(old_rows), [])
    new = RunSeries("new", "#1f77b4", new_rows, detect_phases(new_rows), [])
    cfg = AlarmConfig(phase=PhaseConfig(pos_fell_frac=0.4, disp_window=25))

    text = curves_caption([new], cfg)
    assert "Upper axis: <code>lld/disp_pos</code>, responses with advantage &gt; 0." in text
    assert "Lower axis, on its own scale: <code>lld/disp_neg</code>, advantage &lt; 0." in text
    assert "the grey line at 0.4 is the detector's threshold for the 25-step" in text
    assert "disp_correct" not in text and "dashed" not in text

    text = curves_caption([old], cfg)
    assert (
        "Upper axis: <code>lld/disp_correct</code>, correct responses (dashed), since no run "
        "logged <code>lld/disp_pos</code>."
    ) in text
    assert "<code>lld/disp_incorrect</code>, incorrect responses (dashed)" in text
    assert "all correct, which GRPO does not push" in text

    text = curves_caption([new, old], cfg)
    assert (
        "Upper axis: <code>lld/disp_pos</code>, responses with advantage &gt; 0 (solid); for "
        "<b>old</b>, whose log has no <code>lld/disp_pos</code>, <code>lld/disp_correct</code>"
    ) in text


def test_report_caption_says_when_the_displacement_falls_back(written):
    curves = written.read_text(encoding="utf-8").split("<h2>Training curves</h2>")[1]
    caption = curves.split("<img")[0]
    # the fixture runs are written without the paper's displacement, as older logs are
    assert "since no run logged <code>lld/disp_pos</code>" in caption


def _with_reference(rows, every=10):
    """Rows as a run with `diagnostics.reference_every: every` logs them: a reading every
    `every` steps, nothing in between."""
    out = []
    for r in rows:
        step = r["step"]
        if step % every == 0:
            r = {
                **r,
                "lld/ref_correct_change": 0.5 - 0.1 * step,
                "lld/ref_correct_fell": min(1.0, 0.01 * step),
                "lld/ref_wrong_change": -0.2 * step,
                "lld/ref_wrong_fell": 0.9,
            }
        out.append(r)
    return out


def test_reference_figure_draws_the_logged_readings():
    rows = _with_reference(synthetic_rows("healthy", seed=3, steps=60))
    plain_rows = synthetic_rows("healthy", seed=4, steps=60)
    run = RunSeries("ref", "#1f77b4", rows, detect_phases(rows), [])
    plain = RunSeries("plain", "#d62728", plain_rows, detect_phases(plain_rows), [])
    assert has_reference([plain, run]) and not has_reference([plain])
    fig = draw_reference([run, plain])
    steps = [10.0, 20.0, 30.0, 40.0, 50.0, 60.0]
    change = _axis(fig, "median log-lik change, nats")
    drawn = _curves(change, "#1f77b4")
    assert ("-", steps, [0.5 - 0.1 * s for s in steps]) in drawn  # correct at step 0: solid
    assert ("--", steps, [-0.2 * s for s in steps]) in drawn  # wrong at step 0: dashed
    assert not _curves(change, "#d62728")  # the run without readings draws nothing
    assert [0.0, 0.0] in [list(ln.get_ydata()) for ln in change.get_lines()]
    assert change.get_title() == (
        "Held-out reference chains: change since step 0\n(solid: correct at step 0, dashed: wrong)"
    )
    fell = _axis(fig, "share of chains")
    assert ("-", steps, [min(1.0, 0.01 * s) for s in steps]) in _curves(fell, "#1f77b4")
    assert ("--", steps, [0.9] * 6) in _curves(fell, "#1f77b4")
    assert [0.5, 0.5] in [list(ln.get_ydata()) for ln in fell.get_lines()]
    caption = reference_caption([run, plain])
    assert "<b>ref</b>: 6 readings, steps 10-60, every 10 steps" in caption
    assert "<b>plain</b>: not read" in caption


def test_report_shows_reference_chains_only_when_logged(tmp_path):
    run = tmp_path / "run"
    write_jsonl(run / "metrics.jsonl", _with_reference(synthetic_rows("healthy", seed=3, steps=40)))
    page = write_report([run], tmp_path / "report").read_text(encoding="utf-8")
    assert (tmp_path / "report" / "reference.png").read_bytes().startswith(PNG_MAGIC)
    assert "Held-out reference chains" in page and "4 readings, steps 10-40" in page
    plain = tmp_path / "plain"
    write_jsonl(plain / "metrics.jsonl", synthetic_rows("healthy", seed=3, steps=40))
    page = write_report([plain], tmp_path / "plain_report").read_text(encoding="utf-8")
    assert "reference chains" not in page.lower()
    assert not (tmp_path / "plain_report" / "reference.png").exists()
    # rewritten into the first report's folder: its reference figure does not linger there
    write_report([plain], tmp_path / "report")
    assert not (tmp_path / "report" / "reference.png").exists()


def test_response_length_panel_has_the_punctuation_run_share_below_it():
    rows = synthetic_rows("healthy", seed=8, steps=30, displacement=True)
    rows = [{**r, "rollout/punct_run_frac": 0.1 * (r["step"] % 3)} for r in rows]
    run = RunSeries("new", "#1f77b4", rows, detect_phases(rows), [])
    fig = draw_comparison([run])
    upper, lower = _axis(fig, "model tokens per rollout"), _axis(fig, "punct. runs")
    assert ("-", *_raw(rows, "rollout/punct_run_frac")) in _curves(lower, "#1f77b4")
    assert [0.0, 0.0] in [list(ln.get_ydata()) for ln in lower.get_lines()]
    assert upper.get_shared_x_axes().joined(upper, lower)
    assert "<code>rollout/punct_run_frac</code>, the share of rollouts" in curves_caption([run])
    old = [{k: v for k, v in r.items() if k != "rollout/punct_run_frac"} for r in rows]
    fig = draw_comparison([RunSeries("old", "#d62728", old, detect_phases(old), [])])
    texts = [t.get_text() for t in _axis(fig, "punct. runs").texts]
    assert texts == ["not logged"]


def _scores(em: float, n: int) -> dict[str, float]:
    return {"n": n, "em": em, "f1": em, "sub_em": em, "valid_searches": 1.0, "answered": 1.0}


def test_heldout_splits_by_question_source_when_there_are_two(tmp_path):
    """An evaluation file holding held-out and transfer questions: the report draws each source
    beside the pooled EM, names them in the caption and keeps them in report.json."""
    run = tmp_path / "two_sets"
    write_jsonl(run / "metrics.jsonl", synthetic_rows("healthy", seed=4, steps=40))
    for step, (a, b) in {0: (0.62, 0.164), 20: (0.66, 0.218), 40: (0.63, 0.091)}.items():
        # pooled EM over 100 + 55 questions, as the evaluation writes it
        pooled = _scores((100 * a + 55 * b) / 155, 155)
        sets = {"held-out": _scores(a, 100), "transfer": _scores(b, 55)}
        write_json(run / "eval" / f"step_{step:06d}.json", {"overall": pooled, "by_source": sets})
    loaded = report_mod.load_run(run, "two")
    assert loaded.held_out is not None
    assert loaded.held_out.points[1].by_set == (("held-out", 0.66, 100), ("transfer", 0.218, 55))
    fig = draw_heldout([RunSeries("two", "#123", loaded.rows, [], [], loaded.held_out)])
    lines = {ln.get_label(): ln for ln in fig.axes[0].get_lines()}
    assert list(lines["two: transfer (55 q.)"].get_xdata()) == [0, 20, 40]
    assert list(lines["two: transfer (55 q.)"].get_ydata()) == pytest.approx([0.164, 0.218, 0.091])
    assert list(lines["two: held-out (100 q.)"].get_ydata()) == pytest.approx([0.62, 0.66, 0.63])
    assert list(lines["two"].get_ydata())[1] == pytest.approx((66 + 55 * 0.218) / 155)
    page = write_report([run], tmp_path / "out").read_text(encoding="utf-8")
    assert (
        "thin lines by question source: held-out (100 questions), transfer (55 questions)" in page
    )
    data = json.loads((tmp_path / "out" / "report.json").read_text())
    first = data["runs"][0]["held_out"][1]
    assert first["by_source"]["transfer"] == {"em": pytest.approx(0.218), "n": 55}


def test_one_question_source_draws_no_extra_lines(runs):
    _, llds = runs  # its evaluations have no by_source entries
    loaded = report_mod.load_run(llds, "one")
    assert loaded.held_out is not None
    assert all(p.by_set == () for p in loaded.held_out.points)
    fig = draw_heldout([RunSeries("one", "#123", loaded.rows, [], [], loaded.held_out)])
    assert not [ln for ln in fig.axes[0].get_lines() if ln.get_label().startswith("one:")]


def _render(browser: str, page: Path, tmp_path: Path, what: str) -> str:
    """The DOM headless Chromium renders from `page` (and a screenshot of its first screen,
    checked not to be blank)."""
    common = [
        browser,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        f"--user-data-dir={tmp_path / ('profile-' + what)}",
    ]
    shot = tmp_path / f"{what}.png"
    subprocess.run(
        [*common, f"--screenshot={shot}", "--window-size=1400,900", page.resolve().as_uri()],
        check=True,
        capture_output=True,
        timeout=120,
    )
    import matplotlib.image as mpimg

    rgb = (mpimg.imread(shot)[..., :3] * 255).round().astype(int)
    assert 0.01 < (rgb.min(axis=-1) < 240).mean() < 0.9, what  # the verdict is on screen
    dom = subprocess.run(
        [*common, "--dump-dom", page.resolve().as_uri()],
        check=True,
        capture_output=True,
        text=True,
        timeout=120,
    )
    return dom.stdout


def _no_empty_panel_with_keys(run_dir: Path) -> None:
    """No panel of a run's comparison figure says "not logged" while its log has the panel's
    metrics (the panel's own key, its dashed or fallback key, or the axis under it)."""
    from llds.report.html import load_run
    from llds.report.plots import MONITOR_PANELS, comparison_panels

    run = load_run(run_dir, run_dir.name)
    fig = draw_comparison([RunSeries(run.label, "#1f77b4", run.rows, run.phases, run.alarms)])
    logged = {k for row in run.rows for k, v in row.items() if isinstance(v, int | float)}
    for panel in (*comparison_panels(), *MONITOR_PANELS):
        if not {panel.key, panel.dashed_key, panel.fallback} & logged:
            continue  # (a panel drawn only for its lower axis has its own title-less axis)
        axes = [ax for ax in fig.axes if ax.get_title().startswith(panel.title)]
        assert axes, (run_dir.name, panel.title)
        assert "not logged" not in [t.get_text() for t in axes[0].texts], (run_dir, panel.title)
    import matplotlib.pyplot as plt

    plt.close(fig)


def test_native_trl_and_verl_reports_render_one_collapse_step(written, runs, tmp_path):
    """In Chromium, each report's verdict box (at the top) names the collapse step the
    attribution below names, or no collapse in both."""
    browser = _chromium()
    if browser is None:
        pytest.skip("no chromium binary on PATH (apt-get install chromium)")
    fixtures = Path(__file__).resolve().parent / "fixtures"
    pages = {"native": written}
    for name, file in (
        ("trl", "trl_log/trainer_state.json"),
        ("verl", "verl_log/metrics.verl.jsonl"),
    ):
        run = tmp_path / f"{name}-run"
        run.mkdir()
        shutil.copy(fixtures / file, run)
        pages[name] = write_report([run], tmp_path / f"{name}-report")
    # the comparison draws every panel whose keys the log has
    for run_dir in (*runs, tmp_path / "trl-run", tmp_path / "verl-run"):
        _no_empty_panel_with_keys(run_dir)
    collapsed, censored = {}, {}
    for name, page in pages.items():
        dom = _render(browser, page, tmp_path, name)
        box = dom.split("<h2>Verdict</h2>")[1].split("</div></div>")[0]
        body = dom.split("<h2>Runs</h2>")[1]
        # a collapse too near the log's end is boxed as censored, with the same step
        boxed = re.findall(r"(?:collapsed|reward fell to half its peak) at step (\d+)", box)
        attributed = re.findall(r"before the collapse at step (\d+)", body)
        assert boxed == attributed, name
        assert dom.index("<h2>Verdict</h2>") < dom.index("How to read this report"), name
        collapsed[name] = boxed
        censored[name] = bool(re.search(r"at step \d+, censored", box))
    assert collapsed["native"] and collapsed["verl"] and not collapsed["trl"]
    # the veRL fixture ends 16 steps after its collapse at step 44: fewer than CENSOR_STEPS
    assert censored == {"native": False, "trl": False, "verl": True}
