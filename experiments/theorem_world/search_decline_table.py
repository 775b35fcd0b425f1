"""The search-decline signature judged on recorded runs: where it is present, and when first
(`experiments/theorem_world/search_decline.py` runs it over every recorded run log).

For each run: its pre-registered collapse step (`llds.report.collapse`), the rule's verdict at
that step and the other mechanisms whose signatures are present there, the first step at which
the monitor's warning would have fired, and the valid searches per rollout early and at the end.
"""

from __future__ import annotations

import statistics
from pathlib import Path

from llds.analysis.study_logs import run_rows
from llds.monitor.alarms import scan_alarms
from llds.report.attribution import (
    COLLAPSE,
    EARLY,
    WINDOW,
    attribute,
    reward_collapse,
    search_decline_rule,
    signal_series,
)

KEY = "rollout/valid_searches"


def judge(run: Path, name: str | None = None) -> dict[str, object]:
    """The rule on one run (named `name`, else by its path): collapse step, verdict there,
    first present step, searches."""
    rows = run_rows(run)
    series = signal_series(rows)
    searches = series.get(KEY, [])
    steps = [s for s, _ in series.get("reward/mean", [])]
    collapse = reward_collapse(series)
    at_collapse = search_decline_rule(series, collapse).status if collapse else "-"
    others = "-"
    if collapse:
        event = attribute(series, COLLAPSE, collapse)
        present = [f.mechanism for f in event.with_status("present")]
        others = ", ".join(m for m in present if m != "search decline") or "none"
    # the monitor's own warning: the rule asked at every step, as in a live run
    first = next((a.step for a in scan_alarms(rows) if a.kind == "search_decline"), None)
    early = [v for _, v in searches[:EARLY]]
    late = [v for _, v in searches[-WINDOW:]]
    return {
        "run": name or str(run),
        "steps": steps[-1] if steps else 0,
        "collapse": collapse,
        "at_collapse": at_collapse if searches else "not logged",
        "others": others,
        "first_present": first,
        "searches_early": statistics.median(early) if early else None,
        "searches_last": statistics.median(late) if late else None,
    }


def _fmt(v: object) -> str:
    if v is None:
        return "-"
    return f"{v:.2f}" if isinstance(v, float) else str(v)


def table(rows: list[dict[str, object]]) -> str:
    head = [
        "| run | steps | collapse | search decline at the collapse | other signatures there | "
        "first step present | valid searches: early / last 20 steps |",
        "|---|---|---|---|---|---|---|",
    ]
    body = [
        f"| {r['run']} | {r['steps']} | {_fmt(r['collapse'])} | {r['at_collapse']} | "
        f"{r['others']} | {_fmt(r['first_present'])} | {_fmt(r['searches_early'])} / "
        f"{_fmt(r['searches_last'])} |"
        for r in rows
    ]
    collapsed = [r for r in rows if r["collapse"]]
    calm = [r for r in rows if not r["collapse"]]
    summary = (
        f"\n{len(rows)} runs. Collapsed: {len(collapsed)}, of which the signature is present at "
        f"the collapse in {sum(r['at_collapse'] == 'present' for r in collapsed)}. Never "
        f"collapsed: {len(calm)}, of which the rule would have fired at some step in "
        f"{sum(r['first_present'] is not None for r in calm)}.\n"
    )
    return "\n".join(head + body) + "\n" + summary
