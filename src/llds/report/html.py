"""Run report: one self-contained HTML page comparing training runs.

Reads each run's `metrics.jsonl`, its evaluations (`eval/step_N.json`) and its saved config,
recomputes phases and alarms with the same detector the trainer uses, and writes `report.html`
(figures embedded as base64) plus the PNGs and a machine-readable `report.json` next to it. The
page explains what it shows (LLD, the phases, the alarms), lists the settings that tell the runs
apart and plots held-out EM against the EM the runs started from. Every file is written
atomically.
"""

from __future__ import annotations

import base64
import html
import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from llds import metrics as keys
from llds.errors import DataFormatError, UserInputError
from llds.io import atomic_write, write_json
from llds.monitor.alarms import Alarm, AlarmMonitor
from llds.monitor.phases import PHASES, PhaseLabel, phase_spans
from llds.monitor.replay import monitor_config_from
from llds.monitor.robust import as_float
from llds.monitor.settings import MonitorConfig
from llds.report.attribution import Verdict, run_events, verdict_of
from llds.report.collapse import MIN_PEAK, SMOOTH, median_window
from llds.report.plots import (
    PHASE_COLORS,
    PHASE_NAMES,
    RUN_COLORS,
    SEVERITY_COLORS,
    RunSeries,
    comparison_figure,
    has_reference,
    heldout_figure,
    reference_figure,
    run_detail_figure,
    timeline_figure,
)
from llds.report.run_info import (
    HeldOut,
    differing_keys,
    flatten,
    format_setting,
    held_out,
    load_config,
    read_eval_json,
    saved_monitor,
    settings_rows,
)
from llds.report.sources import SourceKind, find_source, read_source
from llds.report.text import (
    attribution_paragraph,
    curves_caption,
    detail_caption,
    differences_line,
    heldout_caption,
    how_to_read,
    reference_caption,
    verdict_box,
)
from llds.runs.eval_result import EvalResult, latest_eval_file

EVAL_FILE = "eval.json"
REPORT_FILE = "report.html"


@dataclass(frozen=True)
class RunData:
    """One run, loaded and analysed."""

    label: str
    path: Path
    rows: list[dict[str, Any]]
    phases: list[PhaseLabel]
    alarms: list[Alarm]
    eval: EvalResult | None
    config: dict[str, Any] | None = None
    """the training config the run saved (None: none found)"""
    held_out: HeldOut | None = None
    """held-out EM by step and the starting EM"""
    source: SourceKind = "native"
    """the format its metrics were read from"""
    monitor: MonitorConfig | None = None
    """the monitor settings its alarms were replayed with"""

    @property
    def verdict(self) -> Verdict:
        """The report's verdict on it (`attribution.verdict_of`)."""
        return verdict_of(self.rows, self.alarms)


def load_eval(run_dir: Path, last_step: int) -> EvalResult | None:
    """The run's newest evaluation (`eval/step_N.json`, the periodic and final evaluations;
    a single `eval.json` for runs written before that convention, a study's by step
    included: `run_info.read_eval_json`), or None."""
    path = latest_eval_file(run_dir)
    if path is not None:
        return EvalResult.read(path)
    legacy = run_dir / EVAL_FILE
    return read_eval_json(legacy, last_step)[-1][1] if legacy.is_file() else None


def run_monitor_config(path: Path, source: SourceKind) -> MonitorConfig:
    """The monitor settings a run ran with: its saved config's `monitor` section, else the
    defaults (a TRL or veRL log, or a config saved before the monitor had settings)."""
    if source != "native":
        return MonitorConfig()
    section, where = saved_monitor(path)
    return monitor_config_from(section, str(where))


def load_run(run_dir: str | Path, label: str, config: MonitorConfig | None = None) -> RunData:
    """Read a run's metrics (a native run directory, a TRL output directory, a veRL metrics
    log: `sources.find_source`) and run the phase detector and alarms over them, with `config`
    or, when None, the run's own monitor settings."""
    path = Path(run_dir)
    source = find_source(path)
    rows = read_source(source)
    if not rows:
        raise UserInputError(f"{source.path} has no complete rows yet")
    for i, row in enumerate(rows, 1):
        if not isinstance(row, dict):
            raise DataFormatError(f"{source.path}: row {i} is not a JSON object")
    monitor = AlarmMonitor(config or run_monitor_config(path, source.kind))
    phases = []
    for row in rows:
        monitor.update(row)
        assert monitor.label is not None
        phases.append(monitor.label)
    last = phases[-1].step if phases else 0
    used = monitor.config
    if source.kind != "native":  # evaluations and saved configs are the native run's files
        return RunData(
            label, path, rows, phases, monitor.alarms, None, source=source.kind, monitor=used
        )
    config = load_config(path)
    return RunData(
        label,
        path,
        rows,
        phases,
        monitor.alarms,
        load_eval(path, last),
        config,
        held_out(path, config, last),
        monitor=used,
    )


def default_labels(run_dirs: Sequence[Path]) -> list[str]:
    """Directory names; parent/name where two runs share a name."""
    names = [p.resolve().name or str(p) for p in run_dirs]
    if len(set(names)) == len(names):
        return names
    return [f"{p.resolve().parent.name}/{p.resolve().name}" for p in run_dirs]


MIN_RISE = 0.05
"""A run learned if its smoothed reward peaked at least this far above where it started (and
at `collapse.MIN_PEAK` or more, the least peak a collapse can fall from)."""


def reward_levels(run: RunData) -> list[float]:
    """The reward's `collapse.SMOOTH`-step trailing median at every logged step: the one
    statistic the summary's final and peak reward and the collapse definition read."""
    rewards = [v for v in (as_float(r.get(keys.REWARD_MEAN)) for r in run.rows) if v is not None]
    levels = [median_window(rewards, i, SMOOTH) for i in range(len(rewards))]
    return [v for v in levels if v is not None]


def learned(levels: Sequence[float]) -> bool:
    """Whether the smoothed reward ever rose: a peak of at least `MIN_PEAK` and `MIN_RISE`
    above its level after the first `SMOOTH` steps (the first full window)."""
    if not levels:
        return False
    start = levels[min(SMOOTH, len(levels)) - 1]
    peak = max(levels)
    return peak >= MIN_PEAK and peak >= start + MIN_RISE


def summarize(run: RunData) -> dict[str, Any]:
    """The per-run summary row (JSON-friendly)."""
    levels = reward_levels(run)
    serious = [a for a in run.alarms if a.severity != "info"]
    # the one collapse definition the attribution uses, so the page names one step
    v = run.verdict
    collapse = v.collapse_step
    detector = next((p.step for p in run.phases if p.phase == "collapse"), None)
    overall = run.eval.overall if run.eval is not None else None
    ho = run.held_out
    start = ho.baseline if ho is not None else None
    ems = [p.em for p in (ho.points if ho is not None else ()) if p.em is not None]
    em_rose = start is not None and start.em is not None and any(e > start.em for e in ems)
    return {
        "label": run.label,
        "run_dir": str(run.path),
        "source": run.source,
        "steps": run.phases[-1].step if run.phases else 0,
        "final_reward": levels[-1] if levels else None,
        "peak_reward": max(levels) if levels else None,
        "learned": learned(levels) or em_rose,
        "reward_rose": learned(levels),
        "heldout_em_rose": em_rose,
        "eval_em": overall.em if overall is not None and overall.n else None,
        "eval_n": overall.n if overall is not None else None,
        "start_em": start.em if start is not None else None,
        "start_em_from": str(start.source) if start is not None else None,
        "held_out": [
            {
                "step": p.step,
                "em": p.em,
                "n": p.n,
                **(
                    {"by_source": {k: {"em": em, "n": n} for k, em, n in p.by_set}}
                    if p.by_set
                    else {}
                ),
            }
            for p in (ho.points if ho is not None else ())
        ],
        "first_alarm_step": serious[0].step if serious else None,
        "first_alarm_kind": serious[0].kind if serious else None,
        "last_phase": run.phases[-1].phase if run.phases else None,
        "collapsed": v.collapsed,
        "collapse_step": collapse,
        "censored": v.censored,
        "cause_named": list(v.named),
        "first_timely_alarm_step": v.first_timely.step if v.first_timely else None,
        "first_timely_alarm_kind": v.first_timely.kind if v.first_timely else None,
        "detector_collapse_step": detector,
        "phase_steps": {p: sum(1 for lab in run.phases if lab.phase == p) for p in PHASES},
    }


def _num(x: Any, digits: int = 3) -> str:
    return "&mdash;" if x is None else f"{x:.{digits}f}"


def _summary_table(summaries: Sequence[dict[str, Any]], colors: Sequence[str]) -> str:
    head = (
        "<tr><th>run</th><th>steps</th>"
        f"<th>final reward<br><small>{SMOOTH}-step median at the last step</small></th>"
        f"<th>peak reward<br><small>highest {SMOOTH}-step median</small></th>"
        "<th>held-out EM<br><small>start &rarr; latest</small></th>"
        "<th>first alarm</th><th>phase at last step</th><th>collapsed</th></tr>"
    )
    body = []
    for s, color in zip(summaries, colors, strict=True):
        alarm = (
            f"step {s['first_alarm_step']}: {html.escape(s['first_alarm_kind'])}"
            if s["first_alarm_step"] is not None
            else "none"
        )
        phase = s["last_phase"] or "unknown"
        if s["censored"]:
            collapsed = (
                f'<span class="warn">censored</span> <small>(fell at step {s["collapse_step"]}, '
                f"the log ends at {s['steps']})</small>"
            )
        elif s["collapsed"]:
            collapsed = f'<span class="bad">yes, from step {s["collapse_step"]}</span>'
        elif not s["learned"]:
            collapsed = (
                '<span class="warn">no, but did not learn</span> '
                "<small>(neither the smoothed reward nor held-out EM rose)</small>"
            )
        else:
            collapsed = '<span class="good">no</span>'

        em = _num(s["eval_em"]) + (f" <small>(n={s['eval_n']})</small>" if s["eval_n"] else "")
        if s["start_em"] is not None:
            em = f"{_num(s['start_em'])} &rarr; {em}"
        body.append(
            f'<tr><td><span class="swatch" style="background:{color}"></span>'
            f"<b>{html.escape(s['label'])}</b></td><td>{s['steps']}</td>"
            f"<td>{_num(s['final_reward'])}</td><td>{_num(s['peak_reward'])}</td>"
            f"<td>{em}</td><td>{alarm}</td>"
            f'<td><span class="phase" style="background:{PHASE_COLORS.get(phase, "#fff")}">'
            f"{html.escape(PHASE_NAMES.get(phase, phase))}</span></td><td>{collapsed}</td></tr>"
        )
    return f"<table>{head}{''.join(body)}</table>"


def _alarm_table(run: RunData) -> str:
    if not run.alarms:
        return "<p class='muted'>No alarms.</p>"
    rows = "".join(
        f"<tr><td>{a.step}</td><td>{html.escape(a.kind)}</td>"
        f'<td style="color:{SEVERITY_COLORS[a.severity]}"><b>{a.severity}</b></td>'
        f"<td>{html.escape(a.message)}</td></tr>"
        for a in run.alarms
    )
    return (
        "<table class='alarms'><tr><th>step</th><th>kind</th><th>severity</th>"
        f"<th>message</th></tr>{rows}</table>"
    )


def _setting_cell(flat: dict[str, Any] | None, key: str) -> str:
    if flat is None or key not in flat:
        return "<td class='muted'>&mdash;</td>"
    return f"<td>{html.escape(format_setting(flat[key]))}</td>"


def _settings_table(runs: Sequence[RunData], colors: Sequence[str]) -> str:
    """Each run's key settings side by side; rows whose value differs across runs are marked,
    since those are what the comparison is about."""
    configs = [r.config for r in runs]
    rows = settings_rows(configs)
    if not rows:
        return (
            "<p class='muted'>No run saved a config (<code>RUN/config.yaml</code> or a "
            "checkpoint's <code>trainer_state.json</code>), so their settings are unknown.</p>"
        )
    flat = [flatten(c) if c is not None else None for c in configs]
    head = "<tr><th>setting</th>" + "".join(
        f'<th><span class="swatch" style="background:{c}"></span>{html.escape(r.label)}</th>'
        for r, c in zip(runs, colors, strict=True)
    )
    body = []
    for key, name, differs in rows:
        label = html.escape(name) if name == key else f"{html.escape(name)} <code>{key}</code>"
        cells = "".join(_setting_cell(f, key) for f in flat)
        mark = " class='differs'" if differs else ""
        body.append(f"<tr{mark}><td>{label}</td>{cells}</tr>")
    return f"<table class='settings'>{head}</tr>{''.join(body)}</table>"


def _phase_spans_text(run: RunData) -> str:
    parts = [
        f"{a}&ndash;{b}: {PHASE_NAMES[p]}" if a != b else f"{a}: {PHASE_NAMES[p]}"
        for a, b, p in phase_spans(run.phases)
    ]
    return "<p class='muted'>Phases: " + "; ".join(parts) + "</p>"


def _img(name: str, png: bytes, alt: str) -> str:
    data = base64.b64encode(png).decode("ascii")
    return f'<img src="data:image/png;base64,{data}" alt="{html.escape(alt)}" title="{name}">'


_CSS = """
body{font-family:-apple-system,'Segoe UI',Helvetica,Arial,sans-serif;margin:24px auto;
max-width:1400px;color:#222;padding:0 16px}
h1{font-size:24px;margin-bottom:4px}h2{font-size:19px;margin-top:30px;
border-bottom:1px solid #ddd;padding-bottom:4px}h3{font-size:16px;margin-bottom:6px}
table{border-collapse:collapse;margin:8px 0;font-size:14px}
th,td{border:1px solid #ddd;padding:5px 9px;text-align:left;vertical-align:top}
th{background:#f5f5f5}img{max-width:100%;display:block;margin:8px 0}
.swatch{display:inline-block;width:12px;height:12px;border-radius:2px;margin-right:6px}
.phase{padding:1px 6px;border-radius:3px}.bad{color:#c51b1b;font-weight:bold}
.good{color:#2a7a2a;font-weight:bold}.warn{color:#b35900;font-weight:bold}
p.attribution{max-width:980px;font-size:14px;line-height:1.45}.muted{color:#666;font-size:13px}
table.alarms td:last-child{max-width:900px}
dl{font-size:14px;margin:4px 0}dt{font-weight:bold;margin-top:6px}dd{margin-left:18px}
.explain{max-width:980px;font-size:14px;line-height:1.45;background:#fafafa;
border:1px solid #e4e4e4;border-radius:4px;padding:4px 16px;margin:14px 0}
.explain summary{cursor:pointer;padding:6px 0;font-size:15px}
.explain dl{display:grid;grid-template-columns:max-content 1fr;gap:3px 14px}
.explain dt{margin:0}.explain dd{margin:0}
code{font-size:12.5px;background:#f0f0f0;padding:0 3px;border-radius:2px}
tr.differs td{background:#fff4c2;font-weight:bold}code.diff{background:#fff4c2}
table.settings td:first-child code{color:#666;font-weight:normal}
.verdict{max-width:980px;border:2px solid #333;border-radius:6px;padding:4px 14px;margin:12px 0}
.verdict-run p{display:inline;margin:0}.verdict-run{margin:6px 0;font-size:14px;line-height:1.45}
"""


def _slug(label: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "_", label).strip("_")[:40] or "run"


def write_report(
    run_dirs: Sequence[str | Path],
    out_dir: str | Path,
    labels: Sequence[str] | None = None,
    config: MonitorConfig | None = None,
    verdicts: list[str] | None = None,
) -> Path:
    """Write the comparison report for `run_dirs` into `out_dir`; returns the HTML path.
    `config`: the monitor settings for every run (None: each run's own); `verdicts`, when
    given, gets each run's verdict as one plain line (for the terminal)."""
    dirs = [Path(d) for d in run_dirs]
    if not dirs:
        raise UserInputError("no run directories given")
    if labels is not None and len(labels) != len(dirs):
        raise UserInputError(f"{len(labels)} labels given for {len(dirs)} run directories")
    names = list(labels) if labels is not None else default_labels(dirs)
    runs = [load_run(d, name, config) for d, name in zip(dirs, names, strict=True)]
    colors = [RUN_COLORS[i % len(RUN_COLORS)] for i in range(len(runs))]
    series = [
        RunSeries(r.label, c, r.rows, r.phases, r.alarms, r.held_out)
        for r, c in zip(runs, colors, strict=True)
    ]
    cfg = config or runs[0].monitor or MonitorConfig()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)

    figures: list[tuple[str, bytes, str]] = [
        ("timeline.png", timeline_figure(series), "phases and alarms per run"),
        ("heldout.png", heldout_figure(series), "held-out exact match per run"),
        ("compare.png", comparison_figure(series, cfg.phase), "metrics of all runs"),
    ]
    if has_reference(series):
        figures.append(("reference.png", reference_figure(series), "reference chains per run"))
    else:
        # a figure an earlier report wrote here would sit beside a page that no longer shows it
        (out / "reference.png").unlink(missing_ok=True)
    details = []
    for i, s in enumerate(series):
        name = f"run{i + 1}_{_slug(s.label)}.png"
        figures.append((name, run_detail_figure(s), f"details of {s.label}"))
        details.append(name)
    for name, png, _ in figures:
        with atomic_write(out / name, "wb") as f:
            f.write(png)
    imgs = {name: _img(name, png, alt) for name, png, alt in figures}

    summaries = [summarize(r) for r in runs]
    events = [run_events(r.rows, r.alarms) for r in runs]
    judged = [r.verdict for r in runs]
    if verdicts is not None:
        verdicts.extend(v.line(r.label) for v, r in zip(judged, runs, strict=True))
    per_run = "".join(
        f"<h3 style='color:{c}'>{html.escape(r.label)} "
        f"<small class='muted'>{html.escape(str(r.path))}</small></h3>"
        f"{imgs[d]}{detail_caption(s)}{attribution_paragraph(e)}"
        f"{_phase_spans_text(r)}{_alarm_table(r)}"
        for r, s, c, d, e in zip(runs, series, colors, details, events, strict=True)
    )
    reference = (
        f"<h3>Held-out reference chains</h3>{imgs['reference.png']}{reference_caption(series)}"
        if "reference.png" in imgs
        else ""
    )
    stamp = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    page = (
        "<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>"
        f"<title>llds run report: {html.escape(', '.join(names))}</title>"
        f"<style>{_CSS}</style></head><body>"
        "<h1>llds run report</h1>"
        f"<p class='muted'>{len(runs)} run(s), generated {stamp}. Phases and alarms are "
        "recomputed from each run's metrics log (<code>metrics.jsonl</code>, a TRL trainer "
        "state or a veRL log) with the same detector the trainer runs online.</p>"
        f"{verdict_box(names, colors, summaries, events, judged)}{how_to_read(cfg)}"
        f"<h2>Summary</h2>{_summary_table(summaries, colors)}"
        f"<h2>Settings</h2>{differences_line(names, [r.config for r in runs])}"
        f"{_settings_table(runs, colors)}"
        f"<h2>Held-out exact match</h2>{imgs['heldout.png']}{heldout_caption(series)}{reference}"
        f"<h2>Phases and alarms</h2>{imgs['timeline.png']}"
        f"<h2>Training curves</h2>{curves_caption(series, cfg)}{imgs['compare.png']}"
        f"<h2>Runs</h2>{per_run}</body></html>"
    )
    write_json(
        out / "report.json",
        {
            "runs": [
                {**s, "alarms": [a.to_dict() for a in r.alarms]}
                for s, r in zip(summaries, runs, strict=True)
            ],
            "differing_settings": differing_keys([r.config for r in runs]),
        },
    )
    path = out / REPORT_FILE
    with atomic_write(path, "w", encoding="utf-8") as f:
        f.write(page)
    return path
