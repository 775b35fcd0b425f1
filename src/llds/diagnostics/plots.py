"""Matplotlib figures of the run report (Agg backend, returned as PNG bytes).

One colour per run everywhere; raw points faint, a light centred moving average on top; phases
as coloured spans and alarms as vertical lines, so collapse is visible at a glance.
"""

from __future__ import annotations

import io
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from llds import metrics as keys
from llds.diagnostics.alarms import Alarm
from llds.diagnostics.phases import PhaseLabel, phase_spans
from llds.diagnostics.robust import as_float

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

PHASE_COLORS = {
    "warmup": "#e0e0e0",
    "healthy": "#e3f4e1",
    "stagnation": "#fff1a8",
    "steady_decay": "#fdc58f",
    "collapse": "#f4978e",
}
PHASE_NAMES = {
    "warmup": "warm-up",
    "healthy": "healthy",
    "stagnation": "stagnation",
    "steady_decay": "steady decay",
    "collapse": "collapse",
}
SEVERITY_COLORS = {"info": "#7f7f7f", "warning": "#e08214", "critical": "#c51b1b"}
RUN_COLORS = (
    "#1f77b4",
    "#d62728",
    "#2ca02c",
    "#9467bd",
    "#ff7f0e",
    "#17becf",
    "#8c564b",
    "#e377c2",
)


@dataclass(frozen=True)
class RunSeries:
    """What the plots need from one run."""

    label: str
    color: str
    rows: Sequence[dict[str, Any]]
    phases: Sequence[PhaseLabel]
    alarms: Sequence[Alarm]


@dataclass(frozen=True)
class Panel:
    """One comparison panel: a solid series, optionally a dashed companion (e.g. incorrect)."""

    title: str
    ylabel: str
    key: str
    dashed_key: str | None = None
    log_y: bool = False
    hline: float | None = None
    note: str = ""


PANELS: tuple[Panel, ...] = (
    Panel("Reward", "mean reward (dotted: EM)", keys.REWARD_MEAN, keys.REWARD_EM),
    Panel(
        "Log-likelihood of responses",
        "mean log-prob per token",
        keys.LOGP_CORRECT,
        keys.LOGP_INCORRECT,
        note="solid: correct, dashed: incorrect",
    ),
    Panel(
        "Likelihood displacement per update",
        "sum of log-prob change",
        keys.DISP_CORRECT,
        keys.DISP_INCORRECT,
        hline=0.0,
        note="solid: correct, dashed: incorrect",
    ),
    Panel(
        "Correct responses whose likelihood fell",
        "share of responses",
        keys.FRAC_CORRECT_FELL,
        hline=0.5,
    ),
    Panel("Policy entropy", "nats per token", keys.ENTROPY),
    Panel("Gradient norm", "L2 norm (log scale)", keys.GRAD_NORM, log_y=True),
    Panel("Max likelihood ratio", "pi / pi_old (log scale)", keys.RATIO_MAX, log_y=True),
    Panel("Valid searches", "searches per rollout", keys.VALID_SEARCHES),
    Panel("Response length", "model tokens per rollout", keys.RESPONSE_TOKENS),
)


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def series(rows: Sequence[dict[str, Any]], key: str) -> tuple[list[float], list[float]]:
    """(steps, values) of one metric with missing / non-finite values dropped."""
    xs, ys = [], []
    for i, row in enumerate(rows):
        y = as_float(row.get(key))
        if y is not None:
            step = as_float(row.get("step"))
            xs.append(step if step is not None else float(i + 1))
            ys.append(y)
    return xs, ys


def moving_average(ys: Sequence[float], width: int) -> list[float]:
    """Centred moving average; the window shrinks at both ends instead of padding."""
    half = width // 2
    out = []
    for i in range(len(ys)):
        part = ys[max(0, i - half) : i + half + 1]
        out.append(sum(part) / len(part))
    return out


def smoothing_width(n: int) -> int:
    """Light smoothing: about 1/25 of the run, odd, between 1 and 15 points."""
    w = max(1, min(15, n // 25))
    return w if w % 2 else w + 1


def _plot_series(ax: Axes, xs: list[float], ys: list[float], color: str, **kw: Any) -> None:
    if not xs:
        return
    if len(xs) > 1:
        ax.plot(xs, ys, color=color, alpha=0.22, linewidth=0.8, linestyle=kw.get("linestyle"))
    smooth = moving_average(ys, smoothing_width(len(ys)))
    ax.plot(xs, smooth, color=color, linewidth=1.8, marker="o" if len(xs) == 1 else None, **kw)


def _to_png(fig: Figure, dpi: int = 96) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi, bbox_inches="tight", facecolor="white")
    _pyplot().close(fig)
    return buf.getvalue()


def _phase_bands(ax: Axes, runs: Sequence[RunSeries]) -> None:
    """A thin strip per run along the bottom of a panel: its non-healthy phases."""
    height = min(0.05, 0.2 / max(1, len(runs)))
    for r, run in enumerate(runs):
        for a, b, phase in phase_spans(run.phases):
            if phase in ("healthy", "warmup"):
                continue
            ax.axvspan(
                a - 0.5,
                b + 0.5,
                ymin=r * height,
                ymax=(r + 1) * height,
                color=PHASE_COLORS[phase],
                alpha=0.95,
                linewidth=0,
            )


def _log_axis(ax: Axes) -> None:
    """Log scale with plain tick labels (0.5, 2, 10) instead of 5x10^-1."""
    from matplotlib.ticker import FuncFormatter

    ax.set_yscale("log")
    plain = FuncFormatter(lambda v, _: f"{v:g}")
    ax.yaxis.set_major_formatter(plain)
    low, high = ax.get_ylim()
    if low > 0 and high / low < 10:  # less than a decade: label minor ticks too
        ax.yaxis.set_minor_formatter(plain)
        ax.tick_params(axis="y", which="minor", labelsize=7)
    else:
        ax.yaxis.set_minor_formatter(FuncFormatter(lambda v, _: ""))


def _alarm_lines(ax: Axes, run: RunSeries, *, annotate: bool = False) -> None:
    by_step: dict[int, list[Alarm]] = {}
    for alarm in run.alarms:
        if alarm.severity != "info":
            by_step.setdefault(alarm.step, []).append(alarm)
    for step, alarms in by_step.items():
        ax.axvline(step, color=run.color, linestyle=":", linewidth=1.2, alpha=0.9)
        if annotate:
            worst = "critical" if any(a.severity == "critical" for a in alarms) else "warning"
            ax.annotate(
                ", ".join(a.kind.replace("_", " ") for a in alarms[:2])
                + (" ..." if len(alarms) > 2 else ""),
                (step, 1.0),
                xycoords=("data", "axes fraction"),
                xytext=(2, -2),
                textcoords="offset points",
                rotation=90,
                va="top",
                fontsize=7,
                color=SEVERITY_COLORS[worst],
            )


def comparison_figure(runs: Sequence[RunSeries]) -> bytes:
    """All runs overlaid, one panel per metric."""
    plt = _pyplot()
    ncols = 3
    nrows = math.ceil(len(PANELS) / ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(15, 3.6 * nrows), squeeze=False)
    for ax, panel in zip(axes.flat, PANELS, strict=False):
        has_data = False
        for run in runs:
            xs, ys = series(run.rows, panel.key)
            _plot_series(ax, xs, ys, run.color)
            has_data |= bool(xs)
            if panel.dashed_key:
                dx, dy = series(run.rows, panel.dashed_key)
                if panel.dashed_key == keys.REWARD_EM and dy == ys:
                    continue  # EM is the reward: one line says it
                style = ":" if panel.dashed_key == keys.REWARD_EM else "--"
                _plot_series(ax, dx, dy, run.color, linestyle=style)
                has_data |= bool(dx)
            _alarm_lines(ax, run)
        if panel.log_y and has_data:
            _log_axis(ax)
        if panel.hline is not None:
            ax.axhline(panel.hline, color="#555555", linewidth=0.8, linestyle="-", alpha=0.5)
        if not has_data:
            ax.text(0.5, 0.5, "not logged", ha="center", va="center", transform=ax.transAxes)
        _phase_bands(ax, runs)
        title = panel.title + (f"\n({panel.note})" if panel.note else "")
        ax.set_title(title, fontsize=11)
        ax.set_xlabel("training step")
        ax.set_ylabel(panel.ylabel)
        ax.grid(True, alpha=0.3)
    for ax in list(axes.flat)[len(PANELS) :]:
        ax.set_visible(False)
    handles = [plt.Line2D([], [], color=run.color, linewidth=2.5, label=run.label) for run in runs]
    handles.append(plt.Line2D([], [], color="#555555", linestyle=":", label="alarm"))
    fig.legend(
        handles=handles, loc="upper center", ncol=min(6, len(handles)), frameon=False, fontsize=11
    )
    fig.tight_layout(rect=(0, 0, 1, 0.97))
    return _to_png(fig)


def timeline_figure(runs: Sequence[RunSeries]) -> bytes:
    """One row per run: phases as coloured spans, alarms as markers coloured by severity."""
    plt = _pyplot()
    from matplotlib.patches import Patch

    fig, ax = plt.subplots(figsize=(15, 0.7 * len(runs) + 1.6))
    for r, run in enumerate(runs):
        y = len(runs) - 1 - r
        spans = phase_spans(run.phases)
        for a, b, phase in spans:
            ax.broken_barh([(a - 0.5, b - a + 1)], (y - 0.35, 0.7), color=PHASE_COLORS[phase])
        for alarm in run.alarms:
            ax.plot(
                [alarm.step],
                [y + 0.42],
                marker="v",
                markersize=8,
                color=SEVERITY_COLORS[alarm.severity],
                clip_on=False,
            )
    ax.set_yticks(range(len(runs)))
    ax.set_yticklabels([run.label for run in reversed(runs)], fontsize=11)
    for tick, run in zip(ax.get_yticklabels(), reversed(runs), strict=True):
        tick.set_color(run.color)
    ax.set_ylim(-0.6, len(runs) - 0.3)
    ax.set_xlabel("training step")
    ax.set_title("Phases and alarms (triangles: alarms; orange = warning, red = critical)")
    ax.grid(True, axis="x", alpha=0.3)
    legend = [Patch(color=PHASE_COLORS[p], label=PHASE_NAMES[p]) for p in PHASE_COLORS]
    ax.legend(handles=legend, loc="upper center", bbox_to_anchor=(0.5, -0.35), ncol=5)
    fig.tight_layout()
    return _to_png(fig)


DETAIL_PANELS: tuple[Panel, ...] = (
    Panel("Reward", "mean reward", keys.REWARD_MEAN),
    Panel(
        "Log-likelihood (solid: correct, dashed: incorrect)",
        "mean log-prob per token",
        keys.LOGP_CORRECT,
        keys.LOGP_INCORRECT,
    ),
    Panel("Policy entropy", "nats per token", keys.ENTROPY),
    Panel("Gradient norm", "L2 norm (log scale)", keys.GRAD_NORM, log_y=True),
)


def run_detail_figure(run: RunSeries) -> bytes:
    """One run's key signals with its phases shaded full-height and its alarms labelled."""
    plt = _pyplot()
    fig, axes = plt.subplots(1, len(DETAIL_PANELS), figsize=(15, 3.4), squeeze=False)
    spans = phase_spans(run.phases)
    for ax, panel in zip(axes.flat, DETAIL_PANELS, strict=True):
        for a, b, phase in spans:
            ax.axvspan(a - 0.5, b + 0.5, color=PHASE_COLORS[phase], alpha=0.6, linewidth=0)
        xs, ys = series(run.rows, panel.key)
        _plot_series(ax, xs, ys, run.color)
        if panel.dashed_key:
            dx, dy = series(run.rows, panel.dashed_key)
            _plot_series(ax, dx, dy, run.color, linestyle="--")
        if panel.log_y and xs:
            _log_axis(ax)
        _alarm_lines(ax, run, annotate=True)
        ax.set_title(panel.title, fontsize=10)
        ax.set_xlabel("training step")
        ax.set_ylabel(panel.ylabel)
        ax.grid(True, alpha=0.3)
    fig.tight_layout()
    return _to_png(fig)
