"""The words of `llds report`: what LLD is, how the detector reads it, and captions that describe
only what a figure actually draws.

The numbers quoted (window lengths, thresholds) come from the `MonitorConfig` the report was
computed with, so the explanation stays true when a user changes them.
"""

from __future__ import annotations

import html
from collections.abc import Mapping, Sequence
from itertools import pairwise
from typing import Any

from llds import metrics as keys
from llds.monitor.registry import severity_of
from llds.monitor.settings import MonitorConfig, configured_detectors
from llds.report.attribution import (
    COLLAPSE,
    EARLY,
    LEAD,
    STABILIZERS,
    WINDOW,
    Event,
    Finding,
    Verdict,
)
from llds.report.collapse import CENSOR_STEPS
from llds.report.plots import (
    DISPLACEMENT,
    POS_FELL,
    Panel,
    RunSeries,
    em_curve,
    fallback_runs,
    has_alarm_lines,
    has_phase_strips,
    is_measured_line,
    series,
    shared_baseline,
    shows_training_em,
)
from llds.report.run_info import HeldOut, differing_keys, flatten, format_setting


def _code(name: str) -> str:
    return f"<code>{html.escape(name)}</code>"


def _lld_text() -> str:
    """What lazy likelihood displacement is and which logged numbers measure it."""
    return (
        "<p><b>Lazy likelihood displacement (LLD).</b> GRPO raises the likelihood of responses "
        "with a positive advantage (the correct answers of a group that also has wrong ones) and "
        "lowers the likelihood of those with a negative advantage. Right and wrong responses to "
        "the same question share most of their tokens and states (the format, the search calls, "
        "the retrieved passages), so pushing the wrong ones down can drag the right ones down "
        "too: the responses GRPO is reinforcing end up <i>less</i> likely after the update, or "
        "barely move. The paper (Deng et al., arXiv 2512.04220) calls this lazy likelihood "
        "displacement.</p>"
        "<p><b>How it is measured.</b> After each step's updates the trainer scores that step's "
        "rollouts again and takes, per response, the change of its log-likelihood summed over "
        "the tokens the model wrote (retrieved text is not counted): log &pi;<sub>after</sub> "
        "&minus; log &pi;<sub>before</sub>. "
        "Only groups with both right and wrong answers take part (in the others every "
        f"advantage is zero). {_code(keys.DISP_POS)} is the mean change over responses with "
        f"advantage &gt; 0, in nats per response; {_code(keys.FRAC_POS_FELL)} is the share of "
        f"them whose likelihood did not rise; {_code(keys.DISP_NEG)} is the mean change over "
        "responses with advantage &lt; 0. Under <i>Training curves</i>, the panel "
        "<i>Likelihood displacement per update</i> draws "
        f"{_code(keys.DISP_POS)} on its upper axis, with a zero line: below it, the update made "
        "the responses it reinforces less likely. Its lower axis draws "
        f"{_code(keys.DISP_NEG)} on a scale of its own, since the pushed-down responses "
        "typically lose several nats while the reinforced ones gain tenths of one. The panel "
        "<i>Reinforced responses whose likelihood fell</i> draws "
        f"{_code(keys.FRAC_POS_FELL)}. Logs written before these metrics existed have only the "
        f"change by correctness ({_code(keys.DISP_CORRECT)}, {_code(keys.DISP_INCORRECT)}, "
        f"{_code(keys.FRAC_CORRECT_FELL)}); the panels then draw those, dashed, and the caption "
        "says so. They also count groups whose responses are all correct, which GRPO does not "
        "push.</p>"
        "<p><b>Why it matters.</b> In the paper, a sustained fall of the correct responses' "
        "likelihood while the training reward is still rising comes before the collapse: a "
        "less confident policy gets larger gradients, which displace the likelihood further, "
        "until entropy, gradient norm and likelihood ratios spike and the reward falls to zero "
        "(the &ldquo;death spiral&rdquo;). The reward reacts last, so the displacement is the "
        "early warning. The LLDS regularizer penalizes likelihood decreases of responses with "
        "non-negative advantage, only in the units (<code>algo.llds.gate</code>: token, action "
        "or response) whose likelihood fell.</p>"
    )


def _phase_text(cfg: MonitorConfig) -> str:
    """The detector's phases, with the thresholds it runs with."""
    p = cfg.phase
    below = "negative" if p.disp_fall == 0 else f"below {-p.disp_fall:g}"
    falling = (
        f"the {p.disp_window}-step rolling median of {_code(keys.DISP_POS)} is {below} and the "
        f"median of {_code(keys.FRAC_POS_FELL)} is at least {p.pos_fell_frac:g}"
    )
    return (
        "<p><b>Phases</b> (recomputed here from <code>metrics.jsonl</code> with the detector "
        "the trainer runs online; each step's label uses only the steps up to it):</p><dl>"
        f"<dt>warm-up</dt><dd>the first {p.window} steps: too few to judge a trend.</dd>"
        "<dt>healthy</dt><dd>none of the below.</dd>"
        "<dt>stagnation</dt><dd>the reward trend over the last "
        f"{p.stagnation_window} steps rises while the displaced likelihood of the responses "
        f"GRPO pushes up stays near zero (|rolling median of {_code(keys.DISP_POS)}| &le; "
        f"{p.disp_flat:g} nats): learning without the likelihood following.</dd>"
        f"<dt>steady decay</dt><dd>for at least {p.decay_steps} steps in a row, {falling}: "
        "the responses being reinforced keep losing likelihood. This is the early warning; "
        "the reward may still rise.</dd>"
        "<dt>collapse</dt><dd>two signals at once among entropy, gradient-norm and "
        "likelihood-ratio spikes and a sharp likelihood drop; or one of them with steady decay "
        "or the smoothed reward at most "
        f"{1 - p.reward_drop_frac:g}&times; its peak; or the reward staying that low for "
        f"{p.reward_drop_steps} steps. A run leaves it after {p.recovery_steps} calm steps.</dd>"
        "</dl><p class='muted'>Logs without the displacement metrics fall back to the trend of "
        f"the correct responses' rollout-time likelihood ({_code(keys.LOGP_CORRECT)}).</p>"
    )


def markup(text: str) -> str:
    """A detector's plain description as HTML: escaped, `name` in backticks as code."""
    parts = html.escape(text).split("`")
    return "".join(_code(html.unescape(p)) if i % 2 else p for i, p in enumerate(parts))


def _alarm_text(cfg: MonitorConfig) -> str:
    """Every alarm detector the monitor ran (the registry's list), with its severity, the
    mechanism it points at, what it watches with the thresholds in force, and which ones can
    stop or roll back a run."""
    items, actionable = [], []
    for spec, settings in configured_detectors(cfg):
        off = "" if settings.enabled else ", off"
        mechanism = "" if spec.mechanism == "unspecific" else f", {spec.mechanism}"
        items.append(
            f"<dt>{spec.name} <small>({severity_of(spec, settings)}{mechanism}{off})</small></dt>"
            f"<dd>{markup(spec.describe(settings, cfg.phase))}</dd>"
        )
        if spec.actionable:
            actionable.append(_code(spec.name))
    return (
        "<p><b>Alarms</b> fire once when a condition starts and again only after it has been "
        f"quiet for {cfg.rearm_steps} steps. Each names the mechanism it points at (LLD, "
        "entropy, lr: learning rate, mismatch, tool: void turns and searches; none named: a "
        f"symptom several share).</p><dl>{''.join(items)}</dl>"
        f"<p class='muted'>{', '.join(actionable)} can stop or roll back a run "
        "(<code>diagnostics.on_alarm: stop</code> or <code>rollback</code>); the others only "
        "warn, since they also occur in healthy runs. Settings: "
        "<code>monitor.alarms.&lt;name&gt;.*</code> (docs/diagnostics.md).</p>"
    )


def how_to_read(cfg: MonitorConfig) -> str:
    """The explanatory section, folded below the verdicts (one click opens it)."""
    return (
        "<details class='explain'><summary><b>How to read this report</b></summary>"
        f"{_lld_text()}{_phase_text(cfg)}{_alarm_text(cfg)}</details>"
    )


def _stabilizers_text(findings: Sequence[Finding]) -> str:
    answers = []
    for f in findings:
        name, switch = STABILIZERS[f.mechanism]
        answers.append(f"{f.mechanism}: {name} ({_code(switch)})")
    return "; ".join(answers)


def verdict(summary: Mapping[str, Any], events: Sequence[Event], v: Verdict) -> str:
    """One run's verdict, the first thing the report says about it: collapsed or not by the
    pre-registered definition (censored when fewer than `CENSOR_STEPS` steps were logged after
    it), the cause named (of the signatures that depart from the run's early steps in the window
    before the collapse, the most upstream, `CAUSAL_TIERS`; else "no known signature"; the
    others listed as downstream) with the stabilizer docs/stabilizers.md names for each, and
    the first critical alarm that came at least `LEAD` steps ahead; "did not learn" only when
    neither the training reward nor the held-out EM (where evaluated) rose. Without a collapse,
    the signatures before the first alarm are listed, not named causes."""
    collapse = next((e for e in events if e.kind == COLLAPSE), None)
    alarm = next((e for e in events if e.kind != COLLAPSE), None)
    if collapse is not None and v.censored:
        head = (
            f"<span class='warn'>reward fell to half its peak at step {collapse.step}, "
            f"censored</span>: the log ends at step {v.last_step}, fewer than {CENSOR_STEPS} "
            f"steps later; nothing after step {v.last_step} was seen"
        )
    elif collapse is not None:
        head = f"<span class='bad'>collapsed at step {collapse.step}</span>"
    elif not summary["learned"]:
        head = (
            "<span class='warn'>did not collapse, but did not learn</span> <small>(the smoothed "
            "reward never rose, nor did held-out EM where it was evaluated)</small>"
        )
    else:
        head = "<span class='good'>did not collapse</span>"
    alarm_said = _timely_text(v)
    event = collapse or alarm
    if event is None:
        return f"<p>{head}; no warning or critical alarm.</p>"
    lo = max(1, event.step - WINDOW + 1)
    baseline = f"against the run's own first {EARLY} steps before step {lo}"
    if event is collapse:
        present = collapse.with_status("present")
        if not present:
            return (
                f"<p>{head}; <b>no known signature</b>: nothing in the {WINDOW} steps before it "
                f"departs from its healthy baseline ({baseline}). {alarm_said}</p>"
            )
        named = [f for f in present if f.mechanism in v.named]
        below = [f for f in present if f.mechanism in v.downstream]
        also = (
            f" Also present, downstream of it (not named): {_findings_text(below, False)}."
            if below
            else ""
        )
        return (
            f"<p>{head}; <b>cause named</b>: {_findings_text(named, True)} (the {WINDOW} "
            f"steps before it, {baseline}; the most upstream signature present).{also} "
            f"{alarm_said}<br><b>Stabilizers</b> (docs/stabilizers.md): "
            f"{_stabilizers_text(named)}.</p>"
        )
    assert alarm is not None
    where = f"before the first alarm ({_code(alarm.kind)}, step {alarm.step})"
    present = alarm.with_status("present")
    said = _findings_text(present, True) if present else "none"
    return (
        f"<p>{head}; signatures in the {WINDOW} steps {where}, {baseline}: {said}. {alarm_said}</p>"
    )


def _timely_text(v: Verdict) -> str:
    """The first critical alarm, and whether it came in time (`LEAD` steps ahead)."""
    if v.collapse_step is not None and v.first_timely is not None:
        a = v.first_timely
        return (
            f"First timely alarm: {_code(a.kind)} at step {a.step}, "
            f"{v.collapse_step - a.step} steps ahead."
        )
    if v.collapse_step is not None:
        return f"No critical alarm came {LEAD} or more steps ahead."
    if v.first_critical is not None:
        a = v.first_critical
        return f"First critical alarm: {_code(a.kind)} at step {a.step}."
    return "No critical alarm."


def verdict_box(
    labels: Sequence[str],
    colors: Sequence[str],
    summaries: Sequence[Mapping[str, Any]],
    events: Sequence[Sequence[Event]],
    verdicts: Sequence[Verdict],
) -> str:
    """Every run's verdict, in one box at the top of the report."""
    rows = "".join(
        f"<div class='verdict-run'><span class='swatch' style='background:{c}'></span>"
        f"<b>{html.escape(label)}</b>: {verdict(s, e, v)}</div>"
        for label, c, s, e, v in zip(labels, colors, summaries, events, verdicts, strict=True)
    )
    note = (
        "<p class='muted'>Collapse: the 10-step median training reward stays at or below half "
        f"of its running peak (at least 0.2) to the end of the run, with at least {CENSOR_STEPS} "
        "steps logged after it (else censored). A cause is named only where a signature departs "
        f"from the run's own first {EARLY} steps; it is a pattern in the signals before the "
        f"collapse, not an established cause. A timely alarm is a critical one at least {LEAD} "
        "steps ahead.</p>"
    )
    return f"<div class='verdict'><h2>Verdict</h2>{rows}{note}</div>"


def _axis_text(runs: Sequence[RunSeries], panel: Panel, pos: str, fb: str) -> str:
    """What one displacement axis draws: `panel.key` (for the responses `pos`), its fallback
    (for the responses `fb`, dashed) for the runs whose log lacks it, or both."""
    assert panel.fallback is not None
    old = fallback_runs(runs, panel)
    if not old:
        return f"{_code(panel.key)}, {pos}"
    if len(old) == len(runs):
        return f"{_code(panel.fallback)}, {fb} (dashed), since no run logged {_code(panel.key)}"
    names = ", ".join(f"<b>{html.escape(run.label)}</b>" for run in old)
    return (
        f"{_code(panel.key)}, {pos} (solid); for {names}, whose log has no "
        f"{_code(panel.key)}, {_code(panel.fallback)}, {fb} (dashed)"
    )


def displacement_caption(runs: Sequence[RunSeries], cfg: MonitorConfig) -> str:
    """The sentences on the two displacement panels, naming the metric each axis draws."""
    assert DISPLACEMENT.below is not None
    upper = _axis_text(runs, DISPLACEMENT, "responses with advantage &gt; 0", "correct responses")
    lower = _axis_text(runs, DISPLACEMENT.below, "advantage &lt; 0", "incorrect responses")
    fell = _axis_text(
        runs,
        POS_FELL,
        "the share of the responses with advantage &gt; 0 whose likelihood did not rise",
        "the same share among correct responses",
    )
    p = cfg.phase
    text = (
        "<i>Likelihood displacement per update</i>: the change of a response's log-likelihood "
        "over the step's updates (summed over its tokens, in nats), averaged over responses. "
        f"Upper axis: {upper}. Lower axis, on its own scale: {lower}. Grey lines at zero: below "
        "them the update made those responses less likely. "
        f"<i>Reinforced responses whose likelihood fell</i>: {fell}; the grey line at "
        f"{p.pos_fell_frac:g} is the detector's threshold for the {p.disp_window}-step rolling "
        f"median of {_code(keys.FRAC_POS_FELL)}."
    )
    if any(fallback_runs(runs, panel) for panel in (DISPLACEMENT, DISPLACEMENT.below, POS_FELL)):
        text += (
            " The by-correctness metrics also count groups whose responses are all correct, "
            "which GRPO does not push."
        )
    return text


def curves_caption(runs: Sequence[RunSeries], cfg: MonitorConfig | None = None) -> str:
    """Caption of the training curves naming only the marks that are drawn."""
    parts = ["Faint: raw per-step values; bold: light moving average."]
    if shows_training_em(runs):
        parts.append(
            "Reward panel: the dotted line with white gaps is the exact match of the training "
            "rollouts, drawn above the reward."
        )
    parts.append(displacement_caption(runs, cfg or MonitorConfig()))
    if any(series(run.rows, keys.PUNCT_RUN_FRAC)[0] for run in runs):
        parts.append(
            f"Under the response length: {_code(keys.PUNCT_RUN_FRAC)}, the share of rollouts whose "
            "own text has a run of 5 or more of one punctuation character (e.g. "
            "<code>Paris)))))</code>), a degeneration exact match does not see, since it drops "
            "punctuation."
        )
    if has_phase_strips(runs):
        parts.append(
            "Coloured strips along the bottom of each panel: steps in stagnation, steady decay "
            "or collapse (one strip per run, in run order)."
        )
    if has_alarm_lines(runs):
        parts.append("Dotted vertical lines: warning and critical alarms, in the run's colour.")
    else:
        parts.append("No warning or critical alarm was raised, so no alarm lines are drawn.")
    return f"<p class='muted'>{' '.join(parts)}</p>"


def detail_caption(run: RunSeries) -> str:
    """Caption of one run's detail figure."""
    text = "Background: the phase of every step (colours as in the timeline)."
    if has_alarm_lines([run]):
        text += " Dotted lines: alarms, labelled with their kinds."
    return f"<p class='muted'>{text}</p>"


def _start_text(held: HeldOut) -> str:
    base = held.baseline
    if base is None:
        return "starting EM unknown (no step-0 or warm-start evaluation)"
    return (
        f"started at EM {base.em:.3f}, from the {html.escape(held.baseline_label)} "
        f"(<code>{html.escape(str(base.source))}</code>)"
    )


def heldout_caption(runs: Sequence[RunSeries]) -> str:
    """Caption of the held-out EM figure: which steps were evaluated, where the starting EM
    comes from (once when the runs share it) and which runs have no evaluation."""
    shared = shared_baseline(runs)
    parts = []
    for run in runs:
        held = run.held_out
        name = f"<b>{html.escape(run.label)}</b>"
        if held is None or (not held.points and held.baseline is None):
            parts.append(f"{name}: no evaluation found")
            continue
        steps = [str(p.step) for p in sorted(held.points, key=lambda p: p.step)]
        word = "step" if len(steps) == 1 else "steps"
        if not is_measured_line(em_curve(held)[0]):
            word = f"markers only, too few points for a line; {word}"
        text = (
            f"{name}: evaluated after {word} {', '.join(steps)}"
            if steps
            else f"{name}: only its starting EM"
        )
        sets = {name: n for p in held.points for name, _, n in p.by_set}
        if sets:
            named = ", ".join(f"{html.escape(name)} ({n} questions)" for name, n in sets.items())
            text += f"; thin lines by question source: {named}"
        parts.append(text if shared else f"{text}; {_start_text(held)}")
    intro = (
        "Greedy exact match on held-out questions (<code>RUN/eval/step_N.json</code>, or a "
        "study's <code>RUN/eval.json</code> by step)."
    )
    if shared:
        first = runs[0].held_out
        assert first is not None
        who = "every run" if len(runs) > 1 else "the run"
        intro += f" Dashed line: where {who} {_start_text(first)}."
    elif any(run.held_out and run.held_out.baseline for run in runs):
        intro += " Dashed lines: the EM each run started from."
    return f"<p class='muted'>{intro} {'. '.join(parts)}.</p>"


def reference_caption(runs: Sequence[RunSeries]) -> str:
    """Caption of the reference-chain figure: what the chains are, and when each run read them."""
    parts = []
    for run in runs:
        steps = [int(x) for x in series(run.rows, keys.REF_CORRECT_CHANGE)[0]] or [
            int(x) for x in series(run.rows, keys.REF_WRONG_CHANGE)[0]
        ]
        name = f"<b>{html.escape(run.label)}</b>"
        if not steps:
            parts.append(f"{name}: not read (<code>diagnostics.reference_every</code> off)")
            continue
        gaps = sorted({b - a for a, b in pairwise(steps)})
        every = f", every {gaps[0]} steps" if len(gaps) == 1 else ""
        parts.append(f"{name}: {len(steps)} readings, steps {steps[0]}-{steps[-1]}{every}")
    intro = (
        "The starting policy's greedy answers to the held-out questions, kept at step 0 "
        "(<code>RUN/reference_chains.json</code>) and re-read with the current weights: the "
        "median change of a chain's summed log-likelihood against step 0, and the share of "
        "chains that lost likelihood. Solid: the chains that were correct at step 0; dashed: the "
        "wrong ones. Correct chains losing likelihood while the batch's pushed-up responses "
        "gain is the displacement reaching questions the run does not train on. No alarm reads "
        "these curves: a correct-chain fall can also come with a held-out EM that holds."
    )
    return f"<p class='muted'>{intro} {'. '.join(parts)}.</p>"


def differences_line(labels: Sequence[str], configs: Sequence[Mapping[str, Any] | None]) -> str:
    """One sentence saying how the runs' saved configs differ (or that they cannot be told)."""
    missing = [lab for lab, c in zip(labels, configs, strict=True) if c is None]
    note = f" No saved config for {', '.join(html.escape(m) for m in missing)}." if missing else ""
    known = [(lab, flatten(c)) for lab, c in zip(labels, configs, strict=True) if c is not None]
    if len(known) < 2:
        return f"<p>Settings of each run, from its saved config.{note}</p>"
    differ = differing_keys([c for c in configs if c is not None])
    if not differ:
        return f"<p><b>The runs' saved configs are identical</b> (apart from run_dir).{note}</p>"
    items = [
        f"<code class='diff'>{html.escape(k)}</code> ("
        + " / ".join(
            f"{html.escape(lab)}: {html.escape(format_setting(f.get(k)))}" for lab, f in known
        )
        + ")"
        for k in differ
    ]
    return f"<p><b>The runs differ in</b> {'; '.join(items)}.{note}</p>"


MAX_ALARM_EVENTS = 6
"""Alarm steps attributed in a run's paragraph; later ones are counted, not spelled out."""


def _findings_text(findings: Sequence[Finding], with_reason: bool) -> str:
    if not findings:
        return "none"
    if not with_reason:
        return ", ".join(f.mechanism for f in findings)
    return "; ".join(
        f"{f.mechanism} ({html.escape(f.reason)})" if f.reason else f.mechanism for f in findings
    )


def _event_sentence(event: Event, kinds: Sequence[str] = ()) -> str:
    """One event's sentence; `kinds`: the alarms raised at its step (they share its window)."""
    if event.kind == COLLAPSE:
        what = "the collapse"
    else:
        names = ", ".join(_code(k) for k in kinds or [event.kind])
        what = f"the alarm{'s' if len(kinds) > 1 else ''} {names}"
    lo = max(1, event.step - WINDOW + 1)
    text = (
        f"Signatures present before {what} at step {event.step} (steps {lo}&ndash;{event.step}): "
        f"{_findings_text(event.with_status('present'), True)}; absent: "
        f"{_findings_text(event.with_status('absent'), True)}"
    )
    missing = event.with_status("not logged")
    if missing:
        text += f"; not logged: {_findings_text(missing, False)}"
    return text + "."


def attribution_paragraph(events: Sequence[Event]) -> str:
    """One plain paragraph per run: for its collapse (the pre-registered definition) and its
    first alarms (those raised at one step share a sentence, since they share a window), which
    mechanisms' signatures the window before it shows. Signatures, never causes."""
    if not events:
        return (
            "<p class='attribution'>No collapse (by the pre-registered definition) and no warning "
            "or critical alarm: nothing to attribute.</p>"
        )
    collapses = [e for e in events if e.kind == COLLAPSE]
    by_step: dict[int, list[Event]] = {}
    for e in events:
        if e.kind != COLLAPSE:
            by_step.setdefault(e.step, []).append(e)
    sentences = [_event_sentence(e) for e in collapses]
    if not collapses:
        sentences.append("No collapse by the pre-registered definition.")
    steps = sorted(by_step)
    for step in steps[:MAX_ALARM_EVENTS]:
        group = by_step[step]
        sentences.append(_event_sentence(group[0], [e.kind for e in group]))
    if len(steps) > MAX_ALARM_EVENTS:
        rest = len(steps) - MAX_ALARM_EVENTS
        sentences.append(f"Alarms at {rest} later steps are not spelled out.")
    sentences.append(
        "A signature is a pattern in the logged signals before the event, not its established "
        "cause (rules: docs/diagnostics.md, &ldquo;Attributing a collapse&rdquo;)."
    )
    return f"<p class='attribution'>{' '.join(sentences)}</p>"
