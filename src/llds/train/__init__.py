"""GRPO (+LLDS) training: the loop, its optimizer steps, FSDP, checkpoints and resume.

`llds.train.run(cfg)` is the library entry point that `llds train`, the demo and the benchmarks
call; the trainer itself is `llds.train.trainer.GRPOTrainer`.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from llds.data.example import QAExample
    from llds.retrieval.base import Retriever
    from llds.train.config import TrainConfig


def run(
    cfg: TrainConfig,
    *,
    resume: bool = True,
    allow_config_change: str | Sequence[str] | None = None,
    train_examples: Sequence[QAExample] | None = None,
    retriever: Retriever | None = None,
) -> Path:
    """Train to `cfg.steps`; returns the run directory.

    `resume=True` continues from the newest valid checkpoint in `cfg.run_dir`, and refuses a
    run directory holding an earlier run it cannot resume; `resume=False` moves an earlier run
    aside (`RUN.old-<time>`) and starts at step 0. A resume whose config differs from the
    checkpoint's is refused unless every changed key is in `allow_config_change` (dotted keys,
    sections, or "all"); see `llds.train.resume.ALWAYS_ALLOWED` for the keys that need none.
    `train_examples` and `retriever`, when given, are used instead of reading `data.train` and
    opening `retriever.source` (`llds train` reads them before torch is imported, so that a bad
    data file or a dead retriever is named at once)."""
    import os
    from contextlib import nullcontext

    import torch

    from llds.errors import ConfigError, ServiceUnavailableError
    from llds.runs.tracking import check_trackers
    from llds.train.distributed import close_process_group
    from llds.train.lock import RunLock
    from llds.train.trainer import GRPOTrainer

    run_dir = Path(cfg.run_dir).expanduser()
    if run_dir.exists() and not run_dir.is_dir():
        raise ConfigError(f"run_dir: {run_dir} is a file, not a directory")
    # a missing tracker package fails here, not after the model and data have been loaded
    check_trackers(tensorboard=cfg.logging.tensorboard, wandb=cfg.logging.wandb)
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    # one writer per run directory: the launch's first process holds the lock (RANK is set by
    # torchrun / accelerate for multi-process runs, absent for one process)
    lock = RunLock(run_dir) if os.environ.get("RANK", "0") == "0" else nullcontext()
    with lock:
        try:
            GRPOTrainer(
                cfg,
                retriever=retriever,
                train_examples=train_examples,
                resume=resume,
                allow_config_change=allow_config_change,
            ).train()
        except ServiceUnavailableError:
            close_process_group()  # every rank stops on it together, so the barrier meets
            raise
        close_process_group()
    return Path(cfg.run_dir)
