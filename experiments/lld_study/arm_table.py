"""Every arm of one study side by side: held-out EM at the last evaluation, the change against
a reference arm on the same seed, collapses, and steps with `disp_pos` < 0, per seed and median.

It reads the per-run summaries a study writes (`lld_study.study_summary.summarize_run`, keyed
arm -> seed -> summary), so it answers "does a variant protect held-out EM, and does it change
the displacement?" at a glance, without training anything.
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

REFERENCE_ARM = "GRPO"
"""The arm every other arm is compared with, seed by seed."""


def last_em(run: dict[str, Any]) -> float | None:
    """Held-out EM at the run's last evaluation (the summaries key evaluations by step)."""
    evals = {int(step): em for step, em in run.get("eval_em", {}).items() if em is not None}
    return evals[max(evals)] if evals else None


def arm_rows(
    study: dict[str, dict[str, dict[str, Any]]], reference: str = REFERENCE_ARM
) -> list[dict[str, Any]]:
    """Per arm: each seed's last EM, its difference to the reference arm's same seed, collapse
    step and steps with `disp_pos` < 0, and the medians over the seeds that have a value.

    Only finished runs (a last evaluation) count; a seed the reference arm lacks gets no
    difference.
    """
    ref = {seed: last_em(run) for seed, run in study.get(reference, {}).items()}
    rows = []
    for arm, runs in study.items():
        seeds = sorted(runs, key=int)
        em = {s: last_em(runs[s]) for s in seeds}
        done = [s for s in seeds if em[s] is not None]
        diff = {s: em[s] - ref[s] for s in done if arm != reference and ref.get(s) is not None}
        lld = {s: runs[s].get("lld_steps") for s in done}
        rows.append(
            {
                "arm": arm,
                "seeds": done,
                "em": {s: em[s] for s in done},
                "diff": diff,
                "collapse": {s: runs[s].get("collapse_step") for s in done},
                "lld_steps": lld,
                "median_em": statistics.median(em[s] for s in done) if done else None,
                "median_diff": statistics.median(diff.values()) if diff else None,
                "above_reference": sum(d > 0 for d in diff.values()),
                "median_lld_steps": (
                    statistics.median(v for v in lld.values() if v is not None)
                    if any(v is not None for v in lld.values())
                    else None
                ),
            }
        )
    return rows


def _cell(values: dict[str, Any], seeds: list[str], fmt: str) -> str:
    return " / ".join("-" if values.get(s) is None else format(values[s], fmt) for s in seeds)


def _median_cell(value: float | None, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def markdown(rows: list[dict[str, Any]]) -> str:
    """The rows of `arm_rows` as one markdown table, every seed's value in each cell."""
    head = (
        "| arm | seeds | held-out EM at the end | median | minus GRPO, same seed | median "
        "| above GRPO | collapse step | steps with disp_pos < 0 | median |"
    )
    lines = [head, "|" + "---|" * 10]
    for r in rows:
        s = r["seeds"]
        collapse = {k: v for k, v in r["collapse"].items() if v is not None}
        cells = [
            r["arm"],
            ", ".join(s),
            _cell(r["em"], s, ".3f"),
            _median_cell(r["median_em"], ".3f"),
            _cell(r["diff"], s, "+.3f") if r["diff"] else "-",
            _median_cell(r["median_diff"], "+.3f"),
            f"{r['above_reference']} of {len(r['diff'])}" if r["diff"] else "-",
            _cell(collapse, s, "d"),
            _cell(r["lld_steps"], s, "d"),
            _median_cell(r["median_lld_steps"], "g"),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def figure(rows: list[dict[str, Any]], path: Path, start_em: float | None) -> None:
    """Two panels, one column per arm: last held-out EM (collapsed seeds hollow) and steps with
    `disp_pos` < 0; a dot per seed, a bar at the median."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 3.8))
    for x, r in enumerate(rows):
        for k, s in enumerate(r["seeds"]):
            dx = (k - (len(r["seeds"]) - 1) / 2) * 0.12
            hollow = r["collapse"][s] is not None
            axes[0].plot(x + dx, r["em"][s], "o", color="C0", mfc="white" if hollow else "C0", ms=7)
            if r["lld_steps"][s] is not None:
                axes[1].plot(x + dx, r["lld_steps"][s], "o", color="C3", ms=7)
        if r["median_em"] is not None:
            axes[0].hlines(r["median_em"], x - 0.3, x + 0.3, color="black", lw=2)
        if r["median_lld_steps"] is not None:
            axes[1].hlines(r["median_lld_steps"], x - 0.3, x + 0.3, color="black", lw=2)
    if start_em is not None:
        axes[0].axhline(start_em, color="grey", ls="--", lw=1, label=f"warm start {start_em:.3f}")
        axes[0].legend(fontsize=8, loc="lower left")
    axes[0].set_title("held-out EM at the end (hollow: collapsed)", fontsize=10)
    axes[1].set_title("steps with disp_pos < 0", fontsize=10)
    for ax in axes:
        ax.set_xticks(range(len(rows)), [r["arm"] for r in rows], rotation=25, ha="right")
        ax.set_xlim(-0.6, len(rows) - 0.4)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
