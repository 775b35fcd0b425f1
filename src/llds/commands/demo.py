"""`llds demo`: world -> warm start -> GRPO vs GRPO+LLDS -> evaluation -> report, on a CPU."""

from __future__ import annotations

import argparse

HELP = "the main job on the embedded default: GRPO vs GRPO+LLDS on the organism, with a report"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", default="runs/demo", help="output directory")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--sft-steps", type=int, default=400)
    p.add_argument("--grpo-steps", type=int, default=20)
    p.add_argument("--eval-questions", type=int, default=120)
    p.add_argument("--skip-train", action="store_true", help="stop after the warm start")


def run(args: argparse.Namespace) -> int:
    from llds.demo import DemoConfig, run_demo

    run_demo(
        DemoConfig(
            out=args.out,
            seed=args.seed,
            sft_steps=args.sft_steps,
            grpo_steps=args.grpo_steps,
            eval_questions=args.eval_questions,
            skip_train=args.skip_train,
        )
    )
    return 0
