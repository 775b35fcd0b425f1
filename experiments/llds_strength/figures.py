"""The LLDS-strength study's figures: from `results/study.json` (tables.py writes it) the
pooled share of pushed-up responses that fell against lambda (every complete seed, the median,
one binomial SE of the share pooled over seeds) and the share by mini-batch index k; from the
confirmation's logs and summaries (`confirm.py --collect` writes them) the runs of each of its
parts over their steps, complete or not.

    python experiments/llds_strength/figures.py    # -> docs/results/llds-strength-*.png
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # experiments/: the studies' modules
from llds_strength.strength_confirmation import BASE_ARM, STEPS, load_logs
from llds_strength.strength_study import DOSE_ARMS

HERE = Path(__file__).resolve().parent
DOCS = HERE.parents[1] / "docs" / "results"
CONFIRMATION_PARTS = (
    ("confirm", "llds-strength-confirmation.png"),  # part A
    ("confirm_b", "llds-strength-confirmation-b.png"),  # part B (CONFIRMATION.md, amendment 1)
)


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


def confirmation_runs(summary: dict, logs: dict, out: Path) -> None:
    """Each confirmation run over its steps: reward (mean of the last 10 steps), held-out EM,
    and the pooled share of pushed-up responses that fell per 25-step window; a dashed line at
    a run's collapse step."""
    colors = {BASE_ARM: "#1f77b4", summary["llds_arm"]: "#d62728"}
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.8))
    for arm, by_seed in logs.items():
        for seed, rows in sorted(by_seed.items()):
            run = summary["runs"][arm][str(seed)]
            label = f"{arm} seed {seed}" + ("" if run["steps"] >= STEPS else f" ({run['steps']})")
            steps = [r["step"] for r in rows if "reward/mean" in r]
            reward = [r["reward/mean"] for r in rows if "reward/mean" in r]
            smooth = [
                sum(reward[max(0, i - 9) : i + 1]) / len(reward[max(0, i - 9) : i + 1])
                for i in range(len(reward))
            ]
            axes[0].plot(steps, smooth, color=colors[arm], alpha=0.8, lw=1, label=label)
            em = sorted((int(k), v) for k, v in run["em"].items())
            axes[1].plot(*zip(*em, strict=True), marker="o", ms=3, color=colors[arm], alpha=0.8)
            windows = [w for w in run["windows"] if w["share"] is not None]
            mids = [int(w["window"].split("-")[0]) + 12 for w in windows]
            axes[2].plot(
                mids, [w["share"] for w in windows], marker="s", ms=3, color=colors[arm], alpha=0.8
            )
            if run["collapse"] is not None:
                for ax in axes:
                    ax.axvline(run["collapse"], color=colors[arm], ls="--", lw=0.8)
    titles = ("reward (mean of the last 10 steps)", "held-out EM", "pushed-up that fell (window)")
    for ax, title in zip(axes, titles, strict=True):
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("step")
        ax.set_xlim(0, STEPS)
        ax.grid(True, alpha=0.3)
    axes[0].legend(fontsize=7)
    if summary.get("part"):
        fig.suptitle(f"confirmation, {summary['part']}", fontsize=10)
    fig.tight_layout()
    fig.savefig(out, dpi=110)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--study", default=str(HERE / "results" / "study.json"))
    p.add_argument("--out", default=str(DOCS))
    args = p.parse_args()
    study = json.loads(Path(args.study).read_text(encoding="utf-8"))
    out = Path(args.out)
    share_vs_lambda(study, out / "llds-strength-lambda.png")
    share_by_k(study, out / "llds-strength-minibatch.png")
    for folder, name in CONFIRMATION_PARTS:
        summary_path = HERE / "results" / folder / "summary.json"
        if not summary_path.is_file():  # part B before its first collect
            continue
        summary = json.loads(summary_path.read_text(encoding="utf-8"))
        logs = load_logs(summary_path.parent / "runs", summary["llds_arm"])
        if logs:
            confirmation_runs(summary, logs, out / name)


if __name__ == "__main__":
    main()
