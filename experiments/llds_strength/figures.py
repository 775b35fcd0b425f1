"""The LLDS-strength study's two figures from `results/study.json` (tables.py writes it):
the pooled share of pushed-up responses that fell against lambda (every complete seed, the
median, one binomial SE of the share pooled over seeds), and the share by mini-batch index k.

    python experiments/llds_strength/figures.py    # -> docs/results/llds-strength-*.png
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from llds.studies.strength_study import DOSE_ARMS

HERE = Path(__file__).resolve().parent
DOCS = HERE.parents[1] / "docs" / "results"


def share_vs_lambda(study: dict, out: Path) -> None:
    fig, ax = plt.subplots(figsize=(6, 4))
    for arm, lam in DOSE_ARMS.items():
        a = study["arms"].get(arm)
        if not a or not a["seeds"]:
            continue
        x = lam if lam > 0 else 0.06  # lambda 0 drawn at the left edge of the log axis
        ax.scatter([x] * len(a["shares"]), a["shares"], color="#1f77b4", alpha=0.5, s=18)
        pooled = a["pooled"]
        ax.errorbar(x, pooled["share"], yerr=pooled["se"], fmt="o", color="#d62728", capsize=4)
        ax.annotate(
            f"{len(a['seeds'])} seed(s)",
            (x, a["S"]),
            textcoords="offset points",
            xytext=(6, -12),
            fontsize=8,
        )
    ax.set_xscale("log")
    ax.set_xticks([0.06, 0.2, 0.6, 2, 6], ["0 (GRPO)", "0.2", "0.6", "2", "6"])
    ax.set_xlabel("LLDS lambda")
    ax.set_ylabel("pushed-up responses that fell (pooled)")
    ax.set_title("Share vs lambda: seeds (blue), pooled +- 1 binomial SE (red)", fontsize=10)
    ax.grid(True, alpha=0.3)
    fig.tight_layout()
    fig.savefig(out, dpi=120)


def share_by_k(study: dict, out: Path) -> None:
    fig, ax = plt.subplots(figsize=(6, 4))
    for arm in ("lam0", "lam0.2", "lam2", "batch-lam0.2"):
        a = study["arms"].get(arm)
        if not a or not a["seeds"] or len(a["by_minibatch"]) != 10:
            continue
        ks = [k + 1 for k, d in enumerate(a["by_minibatch"]) if d["share"] is not None]
        ys = [d["share"] for d in a["by_minibatch"] if d["share"] is not None]
        es = [d["se"] for d in a["by_minibatch"] if d["share"] is not None]
        ax.errorbar(ks, ys, yerr=es, marker="o", capsize=3, label=f"{arm} ({len(a['seeds'])})")
    ax.set_xlabel("mini-batch index k of the response in its step's update")
    ax.set_ylabel("pushed-up responses that fell (pooled)")
    ax.set_title("Share by mini-batch index (+- 1 binomial SE)", fontsize=10)
    ax.legend(fontsize=8)
    ax.grid(True, alpha=0.3)
    fig.tight_layout()
    fig.savefig(out, dpi=120)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--study", default=str(HERE / "results" / "study.json"))
    p.add_argument("--out", default=str(DOCS))
    args = p.parse_args()
    study = json.loads(Path(args.study).read_text(encoding="utf-8"))
    out = Path(args.out)
    share_vs_lambda(study, out / "llds-strength-lambda.png")
    share_by_k(study, out / "llds-strength-minibatch.png")


if __name__ == "__main__":
    main()
