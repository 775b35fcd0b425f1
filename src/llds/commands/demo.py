"""`llds demo`: world -> warm start -> GRPO vs GRPO+LLDS -> evaluation -> report, on a CPU."""

from __future__ import annotations

import argparse

HELP = "the main job on the embedded default: GRPO vs GRPO+LLDS on the organism, with a report"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", default="runs/demo", help="output directory")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--sft-steps", type=int, help="warm-start SFT steps (1200)")
    p.add_argument(
        "--relabel-copies", type=int, help="relabeled copies of the world in the warm start (8)"
    )
    p.add_argument(
        "--early-answer",
        type=float,
        help="share of warm-start trajectories that stop searching early (0.5)",
    )
    p.add_argument("--grpo-steps", type=int, default=50)
    p.add_argument("--eval-questions", type=int, default=120)
    p.add_argument("--skip-train", action="store_true", help="stop after the warm start")


def run(args: argparse.Namespace) -> int:
    from llds.demo import DemoConfig, run_demo

    given = {k: getattr(args, k) for k in ("sft_steps", "relabel_copies", "early_answer")}
    run_demo(
        DemoConfig(
            out=args.out,
            seed=args.seed,
            grpo_steps=args.grpo_steps,
            eval_questions=args.eval_questions,
            skip_train=args.skip_train,
            **{k: v for k, v in given.items() if v is not None},
        )
    )
    return 0
