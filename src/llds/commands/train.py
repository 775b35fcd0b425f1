"""`llds train`: GRPO (+LLDS) training from a config with key=value overrides."""

from __future__ import annotations

import argparse
from typing import Any

HELP = (
    "train a search agent with GRPO + LLDS (resumes from run_dir's newest valid checkpoint; "
    "see --no-resume and --allow-config-change)"
)
ALIASES = {
    "--model": "model.path",
    "--data": "data.train",
    "--retriever": "retriever.source",
    "--out": "run_dir",
}
OUTPUT_DIRS = ("run_dir",)
"""directories this command writes: refused up front when they exist as files"""
OUTPUT_OWNS = ("metrics.jsonl", "checkpoints", "tensorboard")
"""what an earlier run holds: such a folder may be written again (resumed)"""


CONFIG = "llds.train.config:TrainConfig"
LOAD = "llds.train.config:load_config"


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The flags that are actions, not settings."""
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


def run(cfg: Any, args: argparse.Namespace) -> int:
    from pathlib import Path

    from llds.errors import ConfigError
    from llds.logs import setup_logging
    from llds.retrieval.factory import url_hint
    from llds.train.config import check_inputs

    source = cfg.retriever.source or ""
    if url_hint(source) and not Path(source).exists():  # `localhost:8000`: not a missing file
        raise ConfigError(f"retriever.source: {source} is not a file or folder{url_hint(source)}")
    check_inputs(cfg, resume=not args.no_resume)
    setup_logging(cfg.logging.verbose)
    examples, search = read_inputs(cfg)
    from llds.train import run as train_run  # torch

    train_run(
        cfg,
        resume=not args.no_resume,
        allow_config_change=args.allow_config_change,
        train_examples=examples,
        retriever=search,
    )
    written = [
        "metrics.jsonl",
        *(["tensorboard/"] if cfg.logging.tensorboard else []),
        "checkpoints/",
    ]
    print(f"run written to {cfg.run_dir} ({', '.join(written)})")
    return 0


def read_inputs(cfg: Any) -> tuple[Any, Any]:
    """The training questions read and a retriever URL asked its first search, before torch is
    imported: a file that does not parse or a service that does not answer is named in under a
    second instead of after the trainer's imports. A corpus file's retriever is left to the
    trainer (its index build is the slow part, not the check)."""
    from llds.data.loaders import load_examples
    from llds.retrieval.factory import is_url, open_answering_retriever
    from llds.train.config import check_prompts_fit

    examples = load_examples(cfg.data.train, limit=cfg.data.train_limit)
    check_prompts_fit(cfg, len(examples))
    source = cfg.retriever.source
    if cfg.rollout.max_turns <= 0 or not source or not is_url(source):
        return examples, None
    search = open_answering_retriever(
        source,
        "retriever.source",
        topk=cfg.retriever.topk,
        retry_seconds=cfg.retriever.retry_seconds,
    )
    return examples, search
