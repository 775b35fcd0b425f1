"""The run's metrics log as the trainer keeps it: one opener for the start of a `train` call and
for the branch a rollback starts, and the abandoned branch kept beside the run."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from llds.config.loader import to_dict
from llds.io import atomic_write
from llds.runs.tracking import METRICS_FILE, MetricsLogger
from llds.train.config import TrainConfig
from llds.train.distributed import Dist


class RunLog:
    """`metrics.jsonl` (and TensorBoard / W&B), written by the main process only: opened at a
    step (the log cut back to it), written once per step, closed at the end of a `train` call."""

    def __init__(self, cfg: TrainConfig, run_dir: Path, dist: Dist) -> None:
        self.cfg = cfg
        self.run_dir = run_dir
        self.dist = dist
        self.logger: MetricsLogger | None = None

    def open(self, step: int) -> None:
        """Go on logging after `step`: rows past it are dropped (a resume, a rollback)."""
        self.close()
        if self.dist.is_main:
            c = self.cfg.logging
            self.logger = MetricsLogger(
                self.run_dir,
                tensorboard=c.tensorboard,
                wandb=c.wandb,
                wandb_project=c.wandb_project,
                resume_step=step,
                config=to_dict(self.cfg),
            )

    def write(self, step: int, metrics: dict[str, Any]) -> None:
        if self.logger is not None:
            self.logger.log(step, metrics)

    def close(self) -> None:
        if self.logger is not None:
            self.logger.close()
            self.logger = None

    def set_aside(self, rollbacks: int) -> Path | None:
        """Close the log and keep the branch a rollback abandons beside it, as
        `metrics.rollback<N>.jsonl` (N: this rollback's number); its path on the main process."""
        self.close()
        if not self.dist.is_main:
            return None
        abandoned = self.run_dir / f"metrics.rollback{rollbacks + 1}.jsonl"
        with atomic_write(abandoned, "wb") as f:
            f.write((self.run_dir / METRICS_FILE).read_bytes())
        return abandoned
