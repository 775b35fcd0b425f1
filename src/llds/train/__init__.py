"""GRPO (+LLDS) training: configs, the trainer, checkpoints, SFT, evaluation.

`llds.train.run(cfg)` is the library entry point that `llds train`, the demo and the benchmarks
call; the trainer itself is `llds.train.trainer.GRPOTrainer`.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from llds.train.config import TrainConfig


def run(cfg: TrainConfig, *, resume: bool = True) -> Path:
    """Train to `cfg.steps` (resuming from `cfg.run_dir`'s last checkpoint unless told not to);
    returns the run directory."""
    import torch

    from llds.train.tracking import check_trackers
    from llds.train.trainer import GRPOTrainer

    # a missing tracker package fails here, not after the model and data have been loaded
    check_trackers(tensorboard=cfg.logging.tensorboard, wandb=cfg.logging.wandb)
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    GRPOTrainer(cfg, resume=resume).train()
    import torch.distributed as td

    if td.is_available() and td.is_initialized():  # a clean exit for multi-process runs:
        td.barrier()  # gloo threads still alive at interpreter exit can abort the process
        td.destroy_process_group()
    return Path(cfg.run_dir)
