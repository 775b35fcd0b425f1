"""Matplotlib figures of the run report (Agg backend, returned as PNG bytes).

One colour per run everywhere; raw points faint, a light centred moving average on top; phases
as coloured spans and alarms as vertical lines, so collapse is visible at a glance. Each figure
has a `draw_*` function that returns the matplotlib figure (tests read its ticks and lines) and a
`*_figure` wrapper that renders it to PNG bytes. Step axes carry integer ticks only: a 3-step run
has no step 1.5.
"""

from __future__ import annotations

import io
import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from llds import metrics as keys
from llds.monitor.alarms import Alarm
from llds.monitor.phases import PhaseConfig, PhaseLabel, phase_spans
from llds.monitor.robust import as_float
from llds.report.run_info import EvalPoint, HeldOut

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
    held_out: HeldOut | None = None
    """held-out EM by step and the starting EM (None: not looked up)"""


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
    fallback: str | None = None
    """drawn, dashed, for the runs that never log `key` (logs written before it existed)"""
    fallback_ylabel: str = ""
    """the y label when every run falls back"""
    fallback_note: str = ""
    """the title's note when some run falls back"""
    below: Panel | None = None
    """a shorter axis under this one, over the same steps, with its own y scale"""


DISPLACEMENT = Panel(
    "Likelihood displacement per update",
    "advantage > 0",
    keys.DISP_POS,
    hline=0.0,
    note="log-prob change, nats per response",
    fallback=keys.DISP_CORRECT,
    fallback_ylabel="correct",
    fallback_note="nats per response; dashed: by correctness",
    below=Panel(
        "",
        "advantage < 0",
        keys.DISP_NEG,
        hline=0.0,
        fallback=keys.DISP_INCORRECT,
        fallback_ylabel="incorrect",
    ),
)
"""The paper's displacement (Def. 4.1): the summed log-likelihood change over a step's updates
of the responses GRPO pushes up (advantage > 0, mixed groups), with a zero line; under it, on its
own scale (several nats, against a few tenths), the responses it pushes down. Older logs: the
same change by correctness (which also counts all-correct groups, which GRPO does not push)."""

POS_FELL = Panel(
    "Reinforced responses whose likelihood fell",
    "share of advantage > 0",
    keys.FRAC_POS_FELL,
    hline=0.5,
    fallback=keys.FRAC_CORRECT_FELL,
    fallback_ylabel="share of correct responses",
    fallback_note="dashed: share of correct ones instead",
)
"""`lld/frac_pos_fell`; its line is the detector's threshold (`PhaseConfig.pos_fell_frac`)."""

RESPONSE_LENGTH = Panel(
    "Response length",
    "model tokens per rollout",
    keys.RESPONSE_TOKENS,
    below=Panel("", "punct. runs", keys.PUNCT_RUN_FRAC, hline=0.0),
)
"""Tokens the model wrote per rollout; under it the share of rollouts padded with a run of one
punctuation character (`rollout/punct_run_frac`), a degeneration that exact match, which drops
punctuation, does not see in the reward."""

MONITOR_PANELS: tuple[Panel, ...] = (
    Panel(
        "Pushed-up responses that fell, by group accuracy",
        "pooled share",
        keys.SHARE_POS_FELL_ACC_LO,
        keys.SHARE_POS_FELL_ACC_HI,
        hline=0.5,
        note="solid: groups at most half right, dashed: more than half",
        fallback="lld/premb_share_pos_fell",
        fallback_ylabel="share before each mini-batch",
        fallback_note="dashed: the share a TRL or veRL loss sees (all groups)",
    ),
    Panel(
        "Sampler / trainer mismatch",
        "k3 KL (log scale)",
        keys.MISMATCH_K3_KL,
        log_y=True,
        below=Panel("", "max |dlogp|", keys.MISMATCH_ABS_LOGP_DIFF_MAX),
    ),
    Panel(
        "Importance weights",
        "mean weight",
        keys.MISMATCH_IS_WEIGHT_MEAN,
        hline=1.0,
        below=Panel("", "clipped share", keys.MISMATCH_IS_CLIPPED_FRAC, hline=0.0),
    ),
    Panel(
        "Turns",
        "share of rollouts / turns",
        keys.TURNS_VOID_SHARE,
        keys.TURNS_VALID_SEARCH_SHARE,
        note="solid: rollouts with a void turn, dashed: turns that are valid searches",
        below=Panel("", "turns per rollout", keys.TURNS_PER_ROLLOUT),
    ),
)
"""The monitor's panels, drawn when some run logs their metrics: LLD by group accuracy,
the sampler's mismatch and the correction's weights, void turns and valid searches."""


def panel_logged(panel: Panel, runs: Sequence[RunSeries]) -> bool:
    """Whether some run logs any metric the panel (or the axis under it) draws."""
    names = [panel.key, panel.dashed_key, panel.fallback]
    if panel.below is not None:
        names += [panel.below.key, panel.below.dashed_key]
    return any(series(run.rows, k)[0] for run in runs for k in names if k)


PANELS: tuple[Panel, ...] = (
    Panel("Reward", "mean reward", keys.REWARD_MEAN, keys.REWARD_EM),
    Panel(
        "Log-likelihood of responses",
        "mean log-prob per token",
        keys.LOGP_CORRECT,
        keys.LOGP_INCORRECT,
        note="solid: correct, dashed: incorrect",
    ),
    DISPLACEMENT,
    POS_FELL,
    Panel("Policy entropy", "nats per token", keys.ENTROPY),
    Panel("Gradient norm", "L2 norm (log scale)", keys.GRAD_NORM, log_y=True),
    Panel("Max likelihood ratio", "pi / pi_old (log scale)", keys.RATIO_MAX, log_y=True),
    Panel("Valid searches", "searches per rollout", keys.VALID_SEARCHES),
    RESPONSE_LENGTH,
)


def comparison_panels(phase: PhaseConfig | None = None) -> tuple[Panel, ...]:
    """`PANELS` with the share-fell line at the detector's threshold in use."""
    threshold = (phase or PhaseConfig()).pos_fell_frac
    return tuple(replace(p, hline=threshold) if p is POS_FELL else p for p in PANELS)


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


EM_STYLE: dict[str, Any] = {"linestyle": (0, (1.5, 1.5)), "gapcolor": "white", "zorder": 4.0}
"""Training EM on the reward panel: above the reward line and broken by white gaps, so it stays
visible where the two coincide (EM is the reward when the reward is exact match)."""

NO_EVAL_TEXT = (
    "No held-out evaluation found for any run.\n"
    "Evaluations are read from RUN/eval/step_N.json: train with eval_every > 0,\n"
    "or write one with `llds eval ... --out RUN/eval/step_N.json`."
)


def _plot_series(
    ax: Axes,
    xs: list[float],
    ys: list[float],
    color: str,
    *,
    linestyle: Any = "-",
    zorder: float = 2.0,
    gapcolor: str | None = None,
) -> None:
    """Raw values faint, their light moving average bold; a single point gets a marker."""
    if not xs:
        return
    if len(xs) > 1:
        ax.plot(xs, ys, color=color, alpha=0.22, linewidth=0.8, linestyle=linestyle, zorder=zorder)
    smooth = moving_average(ys, smoothing_width(len(ys)))
    extra = {"gapcolor": gapcolor} if gapcolor else {}
    ax.plot(
        xs,
        smooth,
        color=color,
        linewidth=1.8,
        linestyle=linestyle,
        zorder=zorder + 0.1,
        marker="o" if len(xs) == 1 else None,
        **extra,
    )


def _to_png(fig: Figure, dpi: int = 96) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi, bbox_inches="tight", facecolor="white")
    _pyplot().close(fig)
    return buf.getvalue()


def _integer_steps(ax: Axes) -> None:
    """Training steps are whole numbers: never tick a short run at 1.5 (and tick long ones at
    round numbers: 10, 20, ... rather than 6, 12, ...)."""
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True, steps=[1, 2, 5, 10]))


def same_series(a: tuple[list[float], list[float]], b: tuple[list[float], list[float]]) -> bool:
    """Equal steps and values up to float32 noise (metrics are reduced in float32, so the
    reward and the EM it equals differ in the eighth digit): then one line says both."""
    (xa, ya), (xb, yb) = a, b
    if xa != xb:
        return False
    return all(abs(u - v) <= 1e-6 * max(1.0, abs(u)) for u, v in zip(ya, yb, strict=True))


def alarm_steps(run: RunSeries) -> dict[int, list[Alarm]]:
    """The run's warning and critical alarms by step: what the curve panels mark (info alarms,
    e.g. stagnation, appear only in the timeline and the alarm table)."""
    by_step: dict[int, list[Alarm]] = {}
    for alarm in run.alarms:
        if alarm.severity != "info":
            by_step.setdefault(alarm.step, []).append(alarm)
    return by_step


def has_alarm_lines(runs: Sequence[RunSeries]) -> bool:
    """Whether the curve panels show any alarm line (captions mention them only then)."""
    return any(alarm_steps(run) for run in runs)


def strip_phases(run: RunSeries) -> list[tuple[int, int, str]]:
    """The phase spans drawn as strips under the curves: the ones that are not fine."""
    return [s for s in phase_spans(run.phases) if s[2] not in ("healthy", "warmup")]


def has_phase_strips(runs: Sequence[RunSeries]) -> bool:
    """Whether any curve panel shows a phase strip (captions mention them only then)."""
    return any(strip_phases(run) for run in runs)


def shows_training_em(runs: Sequence[RunSeries]) -> bool:
    """Whether the reward panel draws training EM as its own line (it is left out where it equals
    the reward)."""
    for run in runs:
        em = series(run.rows, keys.REWARD_EM)
        if em[0] and not same_series(series(run.rows, keys.REWARD_MEAN), em):
            return True
    return False


def _phase_bands(ax: Axes, runs: Sequence[RunSeries]) -> None:
    """A thin strip per run along the bottom of a panel: its non-healthy phases."""
    height = min(0.05, 0.2 / max(1, len(runs)))
    for r, run in enumerate(runs):
        for a, b, phase in strip_phases(run):
            ax.axvspan(
                a - 0.5,
                b + 0.5,
                ymin=r * height,
                ymax=(r + 1) * height,
                color=PHASE_COLORS[phase],
                alpha=0.95,
                linewidth=0,
            )


def _log_ticks(low: float, high: float) -> Any:
    """A major-tick locator for a log axis from `low` to `high` that labels at least three
    values: decades over a wide range, 1-2-5 over a few decades, 1-2-3-5 within one decade, and
    evenly spaced values when even that leaves fewer than three (0.8 to 1.2, say)."""
    from matplotlib.ticker import LogLocator, MaxNLocator

    decades = math.log10(high / low)
    subs = (1.0,) if decades > 3 else (1.0, 2.0, 5.0) if decades > 1 else (1.0, 2.0, 3.0, 5.0)
    locator = LogLocator(base=10, subs=subs, numticks=12)
    inside = [v for v in locator.tick_values(low, high) if low <= v <= high]
    return locator if len(inside) >= 3 else MaxNLocator(nbins=4, min_n_ticks=3)


def _log_axis(ax: Axes) -> None:
    """Log scale with enough plainly written tick labels (0.5, 1, 2) to read values off."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    ax.set_yscale("log")
    ax.relim()
    ax.autoscale_view()
    low, high = ax.get_ylim()
    if not (low > 0 and high > low):
        return
    ax.yaxis.set_major_locator(_log_ticks(low, high))
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.yaxis.set_minor_locator(LogLocator(base=10, subs=tuple(range(1, 10)), numticks=12))
    ax.yaxis.set_minor_formatter(NullFormatter())
    ax.set_ylim(low, high)


LABEL_GAP = 1 / 30
"""Alarm labels closer than this share of the run's steps to the last one drawn are left out
(their lines stay), so that labels never pile up into an unreadable block."""


def labelled_alarm_steps(steps: Sequence[int], span: float) -> list[int]:
    """The alarm steps that get a label: the first, then each at least `LABEL_GAP * span`
    steps after the last labelled one."""
    out: list[int] = []
    for step in sorted(steps):
        if not out or step - out[-1] >= LABEL_GAP * span:
            out.append(step)
    return out


def _alarm_lines(ax: Axes, run: RunSeries, *, annotate: bool = False) -> None:
    by_step = alarm_steps(run)
    last = max((int(r.get("step", 0)) for r in run.rows), default=1)
    labelled = set(labelled_alarm_steps(list(by_step), max(last, 1)))
    for step, alarms in by_step.items():
        ax.axvline(step, color=run.color, linestyle=":", linewidth=1.2, alpha=0.9)
        if annotate and step in labelled:
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


def panel_series(rows: Any, key: str, panel: Panel) -> tuple[list[Any], list[float]]:
    """A panel's points of `key`; on a log axis only the positive ones (a gradient norm of 0,
    say, would draw a line down to the axis floor)."""
    xs, ys = series(rows, key)
    if not panel.log_y:
        return xs, ys
    kept = [(x, y) for x, y in zip(xs, ys, strict=True) if y is not None and y > 0]
    return [x for x, _ in kept], [y for _, y in kept]


def panel_key(run: RunSeries, panel: Panel) -> str:
    """The metric a panel draws for one run: its own, or its fallback where the run's log never
    has the former (a log written before the metric existed) but has the latter."""
    if panel.fallback is None or series(run.rows, panel.key)[0]:
        return panel.key
    return panel.fallback if series(run.rows, panel.fallback)[0] else panel.key


def fallback_runs(runs: Sequence[RunSeries], panel: Panel = DISPLACEMENT) -> list[RunSeries]:
    """The runs for which `panel` draws its fallback metric (captions name them)."""
    return [run for run in runs if panel_key(run, panel) != panel.key]


def _draw_panel(
    ax: Axes, panel: Panel, runs: Sequence[RunSeries], *, bottom: bool = True, top: bool = True
) -> None:
    """One comparison panel; its title names only the line styles actually drawn. `bottom`:
    the axis carries the step labels and the phase strips; `top`: it carries the title (a panel
    with `below` is drawn as two axes, one above the other)."""
    has_data = companion = em_is_reward = False
    primary = fallback = False
    for run in runs:
        key = panel_key(run, panel)
        xs, ys = panel_series(run.rows, key, panel)
        if key == panel.key:
            _plot_series(ax, xs, ys, run.color)
            primary |= bool(xs)
        else:
            _plot_series(ax, xs, ys, run.color, linestyle="--", zorder=3.0)
            fallback |= bool(xs)
        has_data |= bool(xs)
        if panel.dashed_key:
            dx, dy = series(run.rows, panel.dashed_key)
            if panel.dashed_key == keys.REWARD_EM and dx and same_series((xs, ys), (dx, dy)):
                em_is_reward = True
            elif panel.dashed_key == keys.REWARD_EM:
                _plot_series(ax, dx, dy, run.color, **EM_STYLE)
            else:
                _plot_series(ax, dx, dy, run.color, linestyle="--", zorder=3.0)
            companion |= bool(dx) and not em_is_reward
            has_data |= bool(dx)
        _alarm_lines(ax, run)
    if panel.log_y and has_data:
        _log_axis(ax)
    if panel.hline is not None:
        ax.axhline(panel.hline, color="#555555", linewidth=0.8, linestyle="-", alpha=0.5)
    if not has_data:
        ax.text(0.5, 0.5, "not logged", ha="center", va="center", transform=ax.transAxes)
    if bottom:
        _phase_bands(ax, runs)
    if panel.dashed_key == keys.REWARD_EM:
        note = "dotted: EM of the rollouts" if companion else "EM = reward" if em_is_reward else ""
    elif fallback:
        note = panel.fallback_note
    elif panel.dashed_key:
        note = panel.note if companion else ""
    else:
        note = panel.note
    if top:
        ax.set_title(panel.title + (f"\n({note})" if note else ""), fontsize=11)
    if bottom:
        ax.set_xlabel("training step")
    else:
        ax.tick_params(labelbottom=False)
    ax.set_ylabel(panel.fallback_ylabel if fallback and not primary else panel.ylabel)
    ax.grid(True, alpha=0.3)
    _integer_steps(ax)


def draw_comparison(runs: Sequence[RunSeries], phase: PhaseConfig | None = None) -> Figure:
    """All runs overlaid, one panel per metric (`phase`: the detector's thresholds, for the line
    in the share-fell panel). A panel with `below` takes its cell as two axes over the same
    steps, the upper one taller (5:3)."""
    plt = _pyplot()
    from matplotlib.ticker import MaxNLocator

    panels = [*comparison_panels(phase), *(p for p in MONITOR_PANELS if panel_logged(p, runs))]
    ncols = 3
    nrows = math.ceil(len(panels) / ncols)
    fig = plt.figure(figsize=(15, 3.6 * nrows))
    grid = fig.add_gridspec(nrows, ncols)
    for i, panel in enumerate(panels):
        cell = grid[i // ncols, i % ncols]
        if panel.below is None:
            _draw_panel(fig.add_subplot(cell), panel, runs)
            continue
        upper, lower = cell.subgridspec(2, 1, height_ratios=(5, 3), hspace=0.08)
        ax = fig.add_subplot(upper)
        _draw_panel(ax, panel, runs, bottom=False)
        below = fig.add_subplot(lower, sharex=ax)
        _draw_panel(below, panel.below, runs, top=False)
        below.yaxis.set_major_locator(MaxNLocator(nbins=3, min_n_ticks=3))
        fig.align_ylabels([ax, below])
    handles = [plt.Line2D([], [], color=run.color, linewidth=2.5, label=run.label) for run in runs]
    if has_alarm_lines(runs):
        handles.append(plt.Line2D([], [], color="#555555", linestyle=":", label="alarm"))
    fig.legend(
        handles=handles, loc="upper center", ncol=min(6, len(handles)), frameon=False, fontsize=11
    )
    fig.tight_layout(rect=(0, 0, 1, 0.97))
    return fig


def comparison_figure(runs: Sequence[RunSeries], phase: PhaseConfig | None = None) -> bytes:
    """`draw_comparison` as PNG."""
    return _to_png(draw_comparison(runs, phase))


def _timeline_title(runs: Sequence[RunSeries]) -> str:
    """Name the alarm markers and their colours only when some are drawn."""
    present = {a.severity for run in runs for a in run.alarms}
    if not present:
        return "Phases per run (no alarms)"
    words = {"info": "grey = info", "warning": "orange = warning", "critical": "red = critical"}
    colours = "; ".join(words[s] for s in SEVERITY_COLORS if s in present)
    return f"Phases and alarms per run (triangles: alarms; {colours})"


def draw_timeline(runs: Sequence[RunSeries]) -> Figure:
    """One row per run: phases as coloured spans, alarms as markers coloured by severity."""
    plt = _pyplot()
    from matplotlib.patches import Patch

    fig, ax = plt.subplots(figsize=(15, 0.7 * len(runs) + 1.6))
    for r, run in enumerate(runs):
        y = len(runs) - 1 - r
        for a, b, phase in phase_spans(run.phases):
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
    ax.set_title(_timeline_title(runs))
    ax.grid(True, axis="x", alpha=0.3)
    _integer_steps(ax)
    legend = [Patch(color=PHASE_COLORS[p], label=PHASE_NAMES[p]) for p in PHASE_COLORS]
    ax.legend(handles=legend, loc="upper center", bbox_to_anchor=(0.5, -0.35), ncol=5)
    fig.tight_layout()
    return fig


def timeline_figure(runs: Sequence[RunSeries]) -> bytes:
    """`draw_timeline` as PNG."""
    return _to_png(draw_timeline(runs))


def _last_step(run: RunSeries) -> int:
    return run.phases[-1].step if run.phases else 0


def _from_step_zero(held_out: HeldOut) -> list[EvalPoint]:
    """The evaluations by step, led by the starting evaluation at step 0 when the run has no
    step-0 evaluation of its own."""
    points = sorted(held_out.points, key=lambda p: p.step)
    base = held_out.baseline
    if base is not None and (not points or points[0].step != 0):
        points = [replace(base, step=0), *points]
    return points


def em_curve(held_out: HeldOut) -> tuple[list[int], list[float]]:
    """(steps, EM) of the held-out curve: the starting EM at step 0, then every evaluation."""
    points = _from_step_zero(held_out)
    return [p.step for p in points], [p.em for p in points]


def set_curves(held_out: HeldOut) -> dict[str, tuple[list[int], list[float]]]:
    """(steps, EM) per question source, for runs evaluated on more than one (the starting EM
    at step 0 where the baseline has the source too); empty for a single source."""
    curves: dict[str, tuple[list[int], list[float]]] = {}
    for point in _from_step_zero(held_out):
        for name, em, _ in point.by_set:
            xs, ys = curves.setdefault(name, ([], []))
            xs.append(point.step)
            ys.append(em)
    return curves


MIN_LINE_POINTS = 3
"""Held-out points (the starting EM included) needed before they are joined by a line: two
evaluations joined would read as a measured trend between them; they are drawn as markers."""


def is_measured_line(steps: Sequence[float]) -> bool:
    """Whether a held-out curve has enough points to be drawn as a line."""
    return len(steps) >= MIN_LINE_POINTS


SET_STYLES = (":", "-.", (0, (1, 3)))
"""Line styles of the per-source held-out curves, in source order (the overall line is solid,
starting EMs are dashed)."""


def shared_baseline(runs: Sequence[RunSeries]) -> bool:
    """Whether every run starts from the same evaluation file (the demo's two arms share their
    warm start): then one baseline stands for all."""
    bases = [run.held_out.baseline for run in runs if run.held_out and run.held_out.baseline]
    return len(bases) == len(runs) > 0 and len({b.source.resolve() for b in bases}) == 1


def _baselines(ax: Axes, runs: Sequence[RunSeries]) -> None:
    """The starting EM as a horizontal line: one grey line when every run starts from the same
    evaluation, else one per run in its colour."""
    known = [(run, run.held_out.baseline) for run in runs if run.held_out and run.held_out.baseline]
    shared = shared_baseline(runs)
    for run, base in known[:1] if shared else known:
        assert run.held_out is not None
        who = "" if shared else f"{run.label} "
        ax.axhline(
            base.em,
            color="#666666" if shared else run.color,
            linestyle="--",
            linewidth=1.1,
            alpha=0.8,
            zorder=1,
            label=f"{who}start: {base.em:.3f} ({run.held_out.baseline_label}, n={base.n})",
        )


def draw_heldout(runs: Sequence[RunSeries]) -> Figure:
    """Held-out EM by training step for every run, against the EM the runs started from; a
    message instead of an empty axis when nothing was evaluated."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(10, 3.6))
    curves = [(run, em_curve(run.held_out)) for run in runs if run.held_out is not None]
    if not any(xs for _, (xs, _) in curves):
        ax.set_axis_off()
        ax.text(0.5, 0.5, NO_EVAL_TEXT, ha="center", va="center", fontsize=12, color="#555555")
        return fig
    _baselines(ax, runs)
    with_sets = False
    for run in runs:
        xs, ys = em_curve(run.held_out) if run.held_out is not None else ([], [])
        if not xs:
            ax.plot([], [], linestyle="none", label=f"{run.label}: not evaluated")
            continue
        line = "-" if is_measured_line(xs) else "none"
        ax.plot(
            xs,
            ys,
            color=run.color,
            linewidth=2,
            linestyle=line,
            marker="o",
            zorder=3,
            label=run.label,
        )
        assert run.held_out is not None
        sizes = {name: n for p in run.held_out.points for name, _, n in p.by_set}
        by_set = set_curves(run.held_out)
        with_sets = with_sets or bool(by_set)
        for i, (name, (sx, sy)) in enumerate(by_set.items()):
            style = SET_STYLES[i % len(SET_STYLES)]
            label = f"{run.label}: {name} ({sizes.get(name, '?')} q.)"
            style = style if is_measured_line(sx) else "none"
            ax.plot(sx, sy, color=run.color, linewidth=1, linestyle=style, marker=".", label=label)
        ax.annotate(
            f"{ys[-1]:.3f}",
            (xs[-1], ys[-1]),
            xytext=(6, 0),
            textcoords="offset points",
            va="center",
            fontsize=9,
            color=run.color,
        )
    right = max([_last_step(run) for run in runs] + [max(xs, default=0) for _, (xs, _) in curves])
    ax.set_xlim(-0.5, max(right, 1) * 1.08 + 0.5)
    ax.set_ylim(0, 1.02)
    ax.set_xlabel("training step")
    ax.set_ylabel("exact match (greedy)")
    ax.set_title("Held-out exact match", fontsize=11)
    ax.grid(True, alpha=0.3)
    _integer_steps(ax)
    if with_sets:
        # per-source curves double the entries: the legend goes beside the axis, not over it
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8)
        fig.set_size_inches(13, 3.6)
    else:
        ax.legend(loc="lower right", fontsize=9)
    fig.tight_layout()
    return fig


def heldout_figure(runs: Sequence[RunSeries]) -> bytes:
    """`draw_heldout` as PNG."""
    return _to_png(draw_heldout(runs))


REFERENCE_PANELS: tuple[Panel, ...] = (
    Panel(
        "Held-out reference chains: change since step 0",
        "median log-lik change, nats",
        keys.REF_CORRECT_CHANGE,
        keys.REF_WRONG_CHANGE,
        hline=0.0,
        note="solid: correct at step 0, dashed: wrong",
    ),
    Panel(
        "Reference chains whose likelihood fell",
        "share of chains",
        keys.REF_CORRECT_FELL,
        keys.REF_WRONG_FELL,
        hline=0.5,
        note="solid: correct at step 0, dashed: wrong",
    ),
)
"""`diagnostics.reference_every`: the starting policy's greedy held-out chains re-read with the
current weights. They show what the batch metrics cannot: likelihood leaving the answers the run
started with on questions it never trains on."""


def has_reference(runs: Sequence[RunSeries]) -> bool:
    """Whether any run logged reference-chain readings (the report adds their figure only then)."""
    changes = (keys.REF_CORRECT_CHANGE, keys.REF_WRONG_CHANGE)
    return any(series(run.rows, key)[0] for run in runs for key in changes)


def draw_reference(runs: Sequence[RunSeries]) -> Figure:
    """The reference-chain readings of every run, side by side: median change and share fell."""
    plt = _pyplot()
    fig, axes = plt.subplots(1, len(REFERENCE_PANELS), figsize=(15, 3.6), squeeze=False)
    for ax, panel in zip(axes.flat, REFERENCE_PANELS, strict=True):
        _draw_panel(ax, panel, runs)
    handles = [plt.Line2D([], [], color=run.color, linewidth=2.5, label=run.label) for run in runs]
    fig.legend(
        handles=handles, loc="upper center", ncol=min(6, len(handles)), frameon=False, fontsize=11
    )
    fig.tight_layout(rect=(0, 0, 1, 0.9))
    return fig


def reference_figure(runs: Sequence[RunSeries]) -> bytes:
    """`draw_reference` as PNG."""
    return _to_png(draw_reference(runs))


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


def draw_run_detail(run: RunSeries) -> Figure:
    """One run's key signals with its phases shaded full-height and its alarms labelled."""
    plt = _pyplot()
    fig, axes = plt.subplots(1, len(DETAIL_PANELS), figsize=(15, 3.4), squeeze=False)
    spans = phase_spans(run.phases)
    for ax, panel in zip(axes.flat, DETAIL_PANELS, strict=True):
        for a, b, phase in spans:
            ax.axvspan(a - 0.5, b + 0.5, color=PHASE_COLORS[phase], alpha=0.6, linewidth=0)
        xs, ys = panel_series(run.rows, panel.key, panel)
        _plot_series(ax, xs, ys, run.color)
        if panel.dashed_key:
            dx, dy = panel_series(run.rows, panel.dashed_key, panel)
            _plot_series(ax, dx, dy, run.color, linestyle="--", zorder=3.0)
        if panel.log_y and xs:
            _log_axis(ax)
        _alarm_lines(ax, run, annotate=True)
        ax.set_title(panel.title, fontsize=10)
        ax.set_xlabel("training step")
        ax.set_ylabel(panel.ylabel)
        ax.grid(True, alpha=0.3)
        _integer_steps(ax)
    fig.tight_layout()
    return fig


def run_detail_figure(run: RunSeries) -> bytes:
    """`draw_run_detail` as PNG."""
    return _to_png(draw_run_detail(run))
