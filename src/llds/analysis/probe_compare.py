"""Two probes of the same questions (`llds probe questions_from=...`), compared question by
question: does one update rule (say, with LLDS) leave fewer correct responses losing likelihood
than the other? Paired, because the questions differ far more from each other than the rules do.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from llds.analysis.significance import sign_test
from llds.probe.one_step import ProbeResult


@dataclass(frozen=True)
class ProbeComparison:
    """How probe `b` differs from probe `a` on the questions both probed."""

    questions: int
    fewer_fell: int
    """questions where a smaller share of the correct responses lost likelihood under `b`"""
    more_fell: int
    same: int
    p_value: float
    """two-sided sign test of fewer_fell against more_fell (ties left out)"""
    lld_share_a: float
    """share of the common questions whose correct responses lost likelihood on average"""
    lld_share_b: float
    mean_disp_correct_a: float
    mean_disp_correct_b: float


def paired(
    a: Sequence[ProbeResult], b: Sequence[ProbeResult]
) -> list[tuple[ProbeResult, ProbeResult]]:
    """The (a, b) results of every question both probed, in `a`'s order."""
    by_id = {r.example_id: r for r in b}
    return [(r, by_id[r.example_id]) for r in a if r.example_id in by_id]


def compare_probes(a: Sequence[ProbeResult], b: Sequence[ProbeResult]) -> ProbeComparison:
    pairs = paired(a, b)
    if not pairs:
        raise ValueError("compare_probes: the two probes have no question in common")
    fewer = sum(rb.frac_correct_fell < ra.frac_correct_fell for ra, rb in pairs)
    more = sum(rb.frac_correct_fell > ra.frac_correct_fell for ra, rb in pairs)
    n = len(pairs)
    return ProbeComparison(
        questions=n,
        fewer_fell=fewer,
        more_fell=more,
        same=n - fewer - more,
        p_value=sign_test(fewer, fewer + more),
        lld_share_a=sum(ra.disp_correct < 0 for ra, _ in pairs) / n,
        lld_share_b=sum(rb.disp_correct < 0 for _, rb in pairs) / n,
        mean_disp_correct_a=sum(ra.disp_correct for ra, _ in pairs) / n,
        mean_disp_correct_b=sum(rb.disp_correct for _, rb in pairs) / n,
    )


def plot_pairs(
    a: Sequence[ProbeResult],
    b: Sequence[ProbeResult],
    path: str | Path,
    labels: tuple[str, str] = ("a", "b"),
    title: str = "",
) -> None:
    """Per question (sorted by `a`), the change of its correct responses' log-likelihood under
    each probe, side by side: bars below zero are questions with LLD."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    pairs = sorted(paired(a, b), key=lambda p: p[0].disp_correct)
    xs = range(len(pairs))
    fig, ax = plt.subplots(figsize=(max(6, 0.22 * len(pairs) + 3), 3.6))
    ax.bar([x - 0.2 for x in xs], [p[0].disp_correct for p in pairs], 0.4, label=labels[0])
    ax.bar([x + 0.2 for x in xs], [p[1].disp_correct for p in pairs], 0.4, label=labels[1])
    ax.axhline(0, color="black", lw=0.8)
    ax.set_xlabel(f"question (sorted by {labels[0]})")
    ax.set_ylabel("Δ log-lik of correct responses")
    ax.set_title(title or f"{labels[0]} vs {labels[1]}, same questions and rollouts")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
