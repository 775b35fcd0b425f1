"""How often LLDS's gate opens on float rounding noise at a rollout batch's first optimizer step.

On the first optimizer step pi_theta == pi_old, so `d = log pi_old - log pi_theta` is 0 in exact
arithmetic and rounding noise in floats; the gradient of max(0, d) is the full -grad log pi
wherever d > 0, so a gate that opens there acts on noise. The trainer logs the share of
preserving actions whose gate opens at that step (`llds/first_step_gate_frac`) whatever
`algo.llds.first_update` says; with `computed` (the authors' behaviour) those gates act, with
`zero` (the default) LLDS is exactly 0 there (value and gradient: see
tests/test_train_llds_first_step.py).

Runs the `organism` preset from the demo's warm start for each compute dtype (float32,
bfloat16) x source of pi_old (a recomputed forward pass, or the rollout's sampling logits) x
first_update (computed, zero), a few steps each, one process, 1 thread, and prints a table of
the gate share over steps (median, max) and the share of first-step gates that acted.

    llds demo --out runs/demo --skip-train        # the warm start (once)
    python experiments/organism/first_step_noise.py --demo runs/demo [--steps 10] [--out runs/noise]
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import torch

from llds.analysis.machine import machine
from llds.train.config import load_config
from llds.train.trainer import GRPOTrainer

ROOT = Path(__file__).resolve().parents[2]


def run_arm(demo: Path, out: Path, steps: int, dtype: str, old: str, first: str) -> list[float]:
    """First-step gate shares, one per step, of one short organism run."""
    cfg = load_config(
        "organism",
        [
            f"run_dir={out / f'{dtype}-{old}-{first}'}",
            f"model.path={demo / 'sft' / 'model'}",
            f"data.train={demo / 'world' / 'train.jsonl'}",
            f"data.eval={demo / 'world' / 'test.jsonl'}",
            f"retriever.source={demo / 'world' / 'corpus.jsonl'}",
            f"steps={steps}",
            "eval_every=0",
            f"save_every={steps}",
            "logging.progress=false",
            "logging.tensorboard=false",
            f"model.dtype={dtype}",
            f"algo.old_logprobs={old}",
            f"algo.llds.first_update={first}",
            "optim.minibatch_order=shuffled",  # the order the recorded runs used
        ],
    )
    rows = GRPOTrainer(cfg, resume=False).train()
    return [float(r["llds/first_step_gate_frac"]) for r in rows]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--demo", type=Path, default=ROOT / "runs" / "demo")
    p.add_argument("--out", type=Path, default=ROOT / "runs" / "first_step_noise")
    p.add_argument("--steps", type=int, default=10)
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    results = []
    for dtype in ("float32", "bfloat16"):
        for old in ("recompute", "rollout"):
            for first in ("computed", "zero"):
                shares = run_arm(args.demo, args.out, args.steps, dtype, old, first)
                results.append(
                    {
                        "dtype": dtype,
                        "old_logprobs": old,
                        "first_update": first,
                        "first_step_gate_frac": shares,
                        "median": statistics.median(shares),
                        "max": max(shares),
                        "acted": statistics.median(shares) if first == "computed" else 0.0,
                    }
                )
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "noise.json").write_text(json.dumps(results, indent=2))
    print(f"machine: {machine()}; {args.steps} steps per arm, preset organism\n")
    print(
        "| compute dtype | pi_old | first_update | gates open on noise: median (max) | "
        "gates that acted on noise (median) |"
    )
    print("|---|---|---|---|---|")
    for r in results:
        print(
            f"| {r['dtype']} | {r['old_logprobs']} | {r['first_update']} | "
            f"{r['median']:.1%} ({r['max']:.1%}) | {r['acted']:.1%} |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
