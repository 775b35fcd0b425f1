"""Where did the held-out answers go? The likelihood of the warm start's own held-out chains
along the first steps of an LLD-study run.

The study's displacement metrics (`lld/disp_pos`, ...) only see the rollouts of the batch. When
held-out EM falls while the batch's pushed-up responses gain likelihood (the `long-chains`
factor), they cannot say whether the updates took likelihood from correct chains that no batch
contained. This script measures it directly:

1. the reference set: the warm start's greedy trajectories on the held-out questions (fixed
   token ids), split into correct and wrong;
2. the first `--steps` steps of a study run, rerun with a checkpoint every `--every` steps (same
   config and seed; each rerun is compared row by row with the study run's metrics);
3. at every checkpoint: each reference trajectory's summed log-likelihood change against the
   warm start (total, first action, later searches, final answer) and the greedy held-out EM.

    python experiments/lld_study/heldout_drift.py --factor long-chains --study runs/lld-study \\
        --arms GRPO GRPO+LLDS --out runs/heldout-drift
    python experiments/lld_study/heldout_drift.py --factor organism --warm runs/demo \\
        --study runs/lld-study --arms GRPO --out runs/heldout-drift

Resumable (finished reruns and measured checkpoints are kept). The parts, readings and alarm are
`lld_study.chain_drift`. Protocol: experiments/lld_study/PROTOCOL.md; results:
docs/results/lld-study.md, "`long-chains`: where did the held-out answers go?".
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from _common import run_unfinished
from lld_study.chain_drift import (
    chain_parts,
    compare_with_study,
    reading,
    reference_alarm,
    rows_of,
)
from llds.analysis.machine import machine
from llds.io import write_json
from study import ARMS, COLORS, arm_config, run_dir

HELD_OUT = 120  # the study's held-out questions (its `data.eval_limit`)
TOKEN_BUDGET = 16384


@dataclasses.dataclass(frozen=True)
class HeldOut:
    """The held-out questions and the retriever over the world's corpus, opened once per
    invocation (every checkpoint's greedy evaluation reuses them)."""

    examples: list[Any]
    retriever: Any

    @classmethod
    def of(cls, warm: Path) -> HeldOut:
        from llds.data.loaders import load_examples
        from llds.retrieval.factory import open_retriever

        examples = load_examples(warm / "world" / "test.jsonl", limit=HELD_OUT)
        return cls(examples, open_retriever(warm / "world" / "corpus.jsonl"))


def greedy_batch(model, tokenizer, held: HeldOut):
    """Greedy trajectories of `model` on the held-out questions, as the study evaluates them."""
    from llds.demo import TEMPLATE, organism_rollout
    from llds.env.prompts import build_prompt_ids
    from llds.rollout import RolloutEngine, RolloutRequest

    greedy = dataclasses.replace(organism_rollout(), temperature=0.0, group_size=1)
    engine = RolloutEngine(model, tokenizer, held.retriever, greedy)
    reqs = [
        RolloutRequest(build_prompt_ids(tokenizer, ex.question, TEMPLATE), ex.id, ex.id, ex.answers)
        for ex in held.examples
    ]
    return engine.generate(reqs)


def measure(model_dir: Path, held: HeldOut, reference) -> dict[str, Any]:
    """The reference chains' log-likelihood parts under `model_dir`, and its own greedy EM."""
    from llds.models.hf import load_policy
    from llds.policy.forward import batched_log_probs

    model, tok = load_policy(model_dir)
    logp, _ = batched_log_probs(model, reference, TOKEN_BUDGET)
    parts = chain_parts(logp, reference.loss_mask)
    own = greedy_batch(model, tok, held).episodes
    return {
        "parts": {k: v.tolist() for k, v in parts.items()},
        "em": sum(ep.em for ep in own) / len(own),
        "valid_searches": sum(ep.num_valid_searches for ep in own) / len(own),
    }


def run_one(args, warm: Path, arm: str, seed: int) -> dict[str, Any]:
    """Rerun (if needed) and measure one (arm, seed); the result is kept in drift.json."""
    out = args.out / args.factor
    cfg = arm_config(
        warm,
        out,
        arm,
        seed,
        [f"steps={args.steps}", f"save_every={args.every}", "keep_checkpoints=1000"],
    )
    run_unfinished([cfg], 1)
    rerun = Path(cfg.run_dir)
    path = rerun / "drift.json"
    done = json.loads(path.read_text()) if path.is_file() else {"checkpoints": {}}
    for step in range(args.every, args.steps + 1, args.every):
        if str(step) not in done["checkpoints"]:
            model_dir = rerun / "checkpoints" / f"step_{step:06d}" / "model"
            done["checkpoints"][str(step)] = measure(model_dir, args.held, args.reference)
            write_json(path, done)
    study = run_dir(args.study / (args.factor if args.factor != "organism" else ""), arm, seed)
    done["vs_study"] = compare_with_study(rerun, study, args.steps)
    write_json(path, done)
    return done


STYLES = ("-", "--", ":", "-.")


def plot(summaries: dict[str, dict[str, Any]], path: Path) -> None:
    """Per run: held-out EM, and the median change of the correct and the wrong reference
    chains' log-likelihood, from step 0 (the warm start); one line style per factor."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    handles = []
    for style, (factor, summary) in zip(STYLES, sorted(summaries.items()), strict=False):
        arms = []
        for name, run in summary["runs"].items():
            arm = name.split("/")[0]
            color = COLORS.get(arm, "black")
            steps = [0] + [r["step"] for r in run["rows"]]
            em = [summary["start_em"]] + [r["em"] for r in run["rows"]]
            axes[0].plot(steps, em, color=color, ls=style, lw=1)
            for ax, label in zip(axes[1:], ("correct", "wrong"), strict=True):
                ys = [0.0] + [r[f"{label}/total"]["median"] for r in run["rows"]]
                ax.plot(steps, ys, color=color, ls=style, lw=1)
            if arm not in arms:
                arms.append(arm)
                handles.append(plt.Line2D([], [], color=color, ls=style, label=f"{factor} {arm}"))
    axes[0].set_title("held-out EM (greedy)", fontsize=10)
    axes[1].set_title("warm start's correct held-out chains: median change (nats)", fontsize=10)
    axes[2].set_title("warm start's wrong held-out chains: median change (nats)", fontsize=10)
    for ax in axes:
        ax.set_xlabel("step")
    for ax in axes[1:]:
        ax.axhline(0, color="black", lw=0.6)
    axes[0].legend(handles=handles, fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _f(v: float | None, digits: int = 2) -> str:
    return "-" if v is None else f"{v:+.{digits}f}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--factor", default="long-chains", help="long-chains, similar-names, organism")
    ap.add_argument("--study", type=Path, default=Path("runs/lld-study"))
    ap.add_argument("--warm", type=Path, help="the warm start (default: STUDY/FACTOR/warm)")
    ap.add_argument("--arms", nargs="+", choices=list(ARMS), default=["GRPO", "GRPO+LLDS"])
    ap.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--every", type=int, default=10)
    ap.add_argument("--out", type=Path, default=Path("runs/heldout-drift"))
    args = ap.parse_args()
    warm = args.warm or args.study / args.factor / "warm"
    if not (warm / "sft" / "model").is_dir() or not (warm / "world" / "test.jsonl").is_file():
        raise SystemExit(f"{warm}: no warm start (sft/model) and world (world/test.jsonl) here")
    from llds.models.hf import load_policy

    torch.set_num_threads(1)
    model, tok = load_policy(warm / "sft" / "model")
    args.held = HeldOut.of(warm)
    args.reference = greedy_batch(model, tok, args.held)
    correct = [bool(ep.em) for ep in args.reference.episodes]
    start = measure(warm / "sft" / "model", args.held, args.reference)
    print(f"machine: {machine()}")
    print(
        f"{args.factor}: warm start held-out EM {start['em']:.3f}; reference chains: "
        f"{sum(correct)} correct, {len(correct) - sum(correct)} wrong"
    )
    # runs measured by earlier invocations (other arms or seeds) stay in the summary
    summary_path = args.out / args.factor / "heldout_drift.json"
    earlier = json.loads(summary_path.read_text()) if summary_path.is_file() else {}
    summary: dict[str, Any] = {"start_em": start["em"], "runs": earlier.get("runs", {})}
    for arm in args.arms:
        for seed in args.seeds:
            result = run_one(args, warm, arm, seed)
            rows = rows_of(start, result, correct)
            half = next((r for r in rows if r["em"] <= start["em"] / 2), None)
            verdict = reading(half["correct/total"]) if half else "no EM fall"
            alarm = reference_alarm(rows)
            summary["runs"][f"{arm}/{seed}"] = {
                "rows": rows,
                "vs_study": result["vs_study"],
                "half_em_step": half["step"] if half else None,
                "reading": verdict,
                "reference_alarm": alarm,
            }
            vs = result["vs_study"]
            print(
                f"\n{arm} seed {seed}: rerun vs study run, {vs['rows']} rows, largest difference "
                f"{vs['max_abs_diff']:.3g} ({vs['where']}); EM at most half the warm start's "
                f"first at step {half['step'] if half else '-'}: {verdict}; reference-chain "
                f"alarm: {alarm if alarm is not None else 'none'}"
            )
            print(
                "| step | EM | searches | correct chains: median change (fell) | first | "
                "later searches | answer | wrong chains: median change (fell) |"
            )
            print("|---|---|---|---|---|---|---|---|")
            for r in rows:
                c, w = r["correct/total"], r["wrong/total"]
                print(
                    f"| {r['step']} | {r['em']:.3f} | {r['searches']:.2f} | "
                    f"{_f(c['median'])} ({c['fell']:.2f}) | {_f(r['correct/first']['median'])} | "
                    f"{_f(r['correct/later_searches']['median'])} | "
                    f"{_f(r['correct/answer']['median'])} | {_f(w['median'])} ({w['fell']:.2f}) |"
                )
    write_json(summary_path, summary)
    # one figure over every factor measured so far under --out
    done = {p.parent.name: json.loads(p.read_text()) for p in args.out.glob("*/heldout_drift.json")}
    plot(done, args.out / "heldout_drift.png")


if __name__ == "__main__":
    main()
