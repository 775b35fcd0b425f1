"""`llds train`: GRPO (+LLDS) training from a YAML config with key=value overrides."""

from __future__ import annotations

import argparse

HELP = (
    "train a search agent with GRPO + LLDS (resumes from run_dir's newest valid checkpoint; "
    "see --no-resume and --allow-config-change)"
)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--config", help="a YAML config file, or a shipped preset by name (organism, collapse, ...)"
    )
    p.add_argument(
        "overrides", nargs="*", help="dotted overrides, e.g. algo.llds.coef=0.3 steps=50"
    )
    p.add_argument(
        "--no-resume",
        action="store_true",
        help="start again at step 0: an earlier run in run_dir is first renamed to "
        "RUN_DIR.old-<time> beside it (nothing is deleted). Without it, training resumes from "
        "the newest valid checkpoint (damaged ones are skipped) and refuses a run_dir that "
        "holds an earlier run without one",
    )
    p.add_argument(
        "--allow-config-change",
        action="append",
        metavar="KEYS",
        help="comma-separated dotted keys (or sections, or 'all') that may differ from the "
        "checkpoint's config on resume, e.g. optim.lr,rollout.group_size; other changes are "
        "refused. steps, run_dir, threads, save_every, keep_checkpoints and logging.* may "
        "always change",
    )
    p.add_argument("--print-config", action="store_true", help="print the resolved config and exit")


def run(args: argparse.Namespace) -> int:
    import logging

    import yaml
    from rich.logging import RichHandler

    from llds.config.loader import to_dict
    from llds.train.config import load_config

    cfg = load_config(args.config, args.overrides)
    if args.print_config:
        print(yaml.safe_dump(to_dict(cfg), sort_keys=False))
        return 0
    logging.basicConfig(
        level=logging.INFO, format="%(message)s", handlers=[RichHandler(show_path=False)]
    )
    from llds.train import run as train_run

    train_run(cfg, resume=not args.no_resume, allow_config_change=args.allow_config_change)
    print(f"run written to {cfg.run_dir} (metrics.jsonl, tensorboard/, checkpoints/)")
    return 0
