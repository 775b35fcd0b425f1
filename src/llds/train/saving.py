"""Saving a run's checkpoint from every process, and restoring one into a live run.

Unsharded, rank 0 writes it; under FSDP every rank writes its shard of the weights and the
optimizer state into `sharded/`, and rank 0 adds the full float32 weights as an HF model
directory (`model/`, what `llds eval` loads) and the rest. Atomic either way
(`llds.train.checkpoint`), and every rank waits until it is complete. A LoRA run's checkpoint
holds its adapter instead of weights (`adapter/`, see `llds.policy.lora`)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from llds.env.protocol import Protocol
from llds.policy.config import ModelConfig
from llds.policy.lora import ADAPTER_DIR, is_lora, load_adapter_weights
from llds.train import fsdp
from llds.train.checkpoint import (
    MODEL_DIR,
    STAGING_PREFIX,
    load_training_state,
    publish_checkpoint,
    save_checkpoint,
    stage_checkpoint,
    write_checkpoint_files,
)
from llds.train.distributed import Dist

SHARDED = "sharded"
"""a checkpoint's directory of FSDP shards (the weights and the optimizer state)"""


@dataclass(frozen=True)
class RunState:
    """What a checkpoint holds besides the trainer's own state."""

    model: Any
    tokenizer: Any
    optimizer: Any
    scheduler: Any
    scaler: Any = None


@dataclass(frozen=True)
class RunCheckpoints:
    """A run's checkpoints: where they go (`root`), what each holds (the run's state, the
    protocol), how many are kept; written from every process, restored into the live run by a
    resume and by a rollback alike."""

    root: Path
    run: RunState
    protocol: Protocol | None
    keep: int
    dist: Dist
    sharded: bool
    model_cfg: ModelConfig

    def save(self, step: int, trainer_state: dict[str, Any]) -> Path | None:
        """Checkpoint `step` atomically; its path on rank 0 (None elsewhere)."""
        return save_run_checkpoint(
            self.root,
            step,
            self.run,
            trainer_state,
            keep=self.keep,
            protocol=self.protocol,
            dist=self.dist,
            sharded=self.sharded,
        )

    def restore(self, ckpt: Path, *, weights: bool) -> tuple[dict[str, Any], dict[str, Any]]:
        """Checkpoint `ckpt` into the live run: the optimizer, schedule and loss scale, and with
        `weights` the weights too (a rollback; a resume's are loaded with the policy). Returns
        its trainer state and blobs (the random streams among them)."""
        state, blobs = load_training_state(ckpt)
        if weights:
            restore_checkpoint(ckpt, blobs, self.run, self.model_cfg, sharded=self.sharded)
        else:
            load_run_state(ckpt, blobs, self.run, sharded=self.sharded)
        return state, blobs


def save_run_checkpoint(
    ckpt_root: Path,
    step: int,
    run: RunState,
    trainer_state: dict[str, Any],
    *,
    keep: int,
    protocol: Protocol | None,
    dist: Dist,
    sharded: bool,
) -> Path | None:
    """Checkpoint `step`; returns its path on rank 0 (None elsewhere)."""
    if not sharded:
        if not dist.is_main:
            dist.barrier()
            return None
        path = save_checkpoint(
            ckpt_root,
            step,
            model=run.model,
            tokenizer=run.tokenizer,
            optimizer=run.optimizer,
            scheduler=run.scheduler,
            grad_scaler=run.scaler,
            trainer_state=trainer_state,
            keep=keep,
            protocol=protocol,
        )
        dist.barrier()
        return path
    tmp = ckpt_root / f"{STAGING_PREFIX}{step:06d}"
    if dist.is_main:
        stage_checkpoint(ckpt_root, step)
    dist.barrier()
    fsdp.save_sharded(tmp / SHARDED, run.model, run.optimizer)
    full = fsdp.full_state_dict(run.model)  # rank 0 gets the tensors, the others {}
    path = None
    if dist.is_main:
        write_checkpoint_files(
            tmp,
            model=run.model,  # float32 parameters: config.json records float32
            tokenizer=run.tokenizer,
            optimizer=None,
            scheduler=run.scheduler,
            trainer_state=trainer_state,
            state_dict=full,
            protocol=protocol,
        )
        path = publish_checkpoint(ckpt_root, step, tmp, keep)
    dist.barrier()
    return path


def load_run_state(ckpt: Path, blobs: dict[str, Any], run: RunState, *, sharded: bool) -> None:
    """The optimizer, schedule and loss scale of checkpoint `ckpt` into `run`; under FSDP its
    shards (the weights and the Adam state together)."""
    if sharded:
        fsdp.load_sharded(ckpt / SHARDED, run.model, run.optimizer)
    else:
        run.optimizer.load_state_dict(blobs["optimizer"])
    run.scheduler.load_state_dict(blobs["scheduler"])
    if run.scaler is not None and "grad_scaler" in blobs:
        run.scaler.load_state_dict(blobs["grad_scaler"])


def restore_checkpoint(
    ckpt: Path, blobs: dict[str, Any], run: RunState, model_cfg: ModelConfig, *, sharded: bool
) -> None:
    """Checkpoint `ckpt` into the live `run` in place (a rollback): its weights (a LoRA
    policy's adapter, else the full weights; under FSDP the shards hold them), then what
    `load_run_state` restores."""
    if not sharded:
        restore_weights(ckpt, run.model, model_cfg)
    load_run_state(ckpt, blobs, run, sharded=sharded)


def restore_weights(ckpt: Path, model: Any, model_cfg: ModelConfig) -> None:
    """The weights of unsharded checkpoint `ckpt` into the live `model`, whose tensors (those
    the optimizer steps) stay the same objects."""
    if is_lora(model):
        load_adapter_weights(model, ckpt / ADAPTER_DIR)
        return
    from llds.policy.setup import load_model

    saved, _ = load_model(model_cfg, path=str(ckpt / MODEL_DIR), dtype="float32")
    model.load_state_dict(saved.state_dict())
