"""Atomic checkpoints: a run killed at any instant resumes from the last complete one.

A checkpoint is a directory written under a temporary name and renamed into place; `latest`
(a one-line file, itself replaced atomically) names the newest complete checkpoint.
"""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch

from llds.env.protocol import Protocol
from llds.io import atomic_write
from llds.train.lora import is_lora, save_lora

LATEST = "latest"


def rng_state() -> dict[str, Any]:
    state = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def stage_checkpoint(ckpt_root: Path, step: int) -> Path:
    """A fresh, empty temporary directory for step `step`'s checkpoint (the same name on every
    rank, so that all ranks of a sharded run can write into it)."""
    ckpt_root.mkdir(parents=True, exist_ok=True)
    tmp = ckpt_root / f".tmp_step_{step:06d}"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    return tmp


def write_checkpoint_files(
    tmp: Path,
    *,
    model,
    tokenizer,
    optimizer: torch.optim.Optimizer | None,
    scheduler,
    trainer_state: dict[str, Any],
    grad_scaler: torch.amp.GradScaler | None = None,
    state_dict: dict[str, torch.Tensor] | None = None,
    protocol: Protocol | None = None,
) -> None:
    """The HF model directory (float32 master weights; `state_dict` when the live model is
    sharded), the optimizer/scheduler/RNG blobs and the trainer state, into `tmp`.
    `optimizer=None` when it is saved elsewhere (a sharded run's `sharded/` directory)."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # one progress line per checkpoint is noise in the run log
    if is_lora(model):  # the adapter, and the merged weights as a plain model
        save_lora(model, tmp)
    else:
        model.save_pretrained(tmp / "model", safe_serialization=True, state_dict=state_dict)
    tokenizer.save_pretrained(tmp / "model")
    if protocol is not None:
        protocol.write(tmp / "model")
    blobs: dict[str, Any] = {"scheduler": scheduler.state_dict(), "rng": rng_state()}
    if optimizer is not None:
        blobs["optimizer"] = optimizer.state_dict()
    if grad_scaler is not None:
        blobs["grad_scaler"] = grad_scaler.state_dict()
    torch.save(blobs, tmp / "optim.pt")
    (tmp / "trainer_state.json").write_text(json.dumps(trainer_state, indent=2), encoding="utf-8")


def publish_checkpoint(ckpt_root: Path, step: int, tmp: Path, keep: int = 2) -> Path:
    """Rename a complete `tmp` into place, point `latest` at it, prune old ones."""
    final = ckpt_root / f"step_{step:06d}"
    if final.exists():
        shutil.rmtree(final)
    tmp.rename(final)
    with atomic_write(ckpt_root / LATEST, "w", encoding="utf-8") as f:
        f.write(final.name + "\n")
    _prune(ckpt_root, keep, protect=final.name)
    return final


def save_checkpoint(
    ckpt_root: Path,
    step: int,
    *,
    model,
    tokenizer,
    optimizer: torch.optim.Optimizer,
    scheduler,
    trainer_state: dict[str, Any],
    keep: int = 2,
    grad_scaler: torch.amp.GradScaler | None = None,
    protocol: Protocol | None = None,
) -> Path:
    """Write `ckpt_root/step_XXXXXX` atomically (single process, unsharded model)."""
    tmp = stage_checkpoint(ckpt_root, step)
    write_checkpoint_files(
        tmp,
        model=model,
        tokenizer=tokenizer,
        optimizer=optimizer,
        scheduler=scheduler,
        trainer_state=trainer_state,
        grad_scaler=grad_scaler,
        protocol=protocol,
    )
    return publish_checkpoint(ckpt_root, step, tmp, keep)


def _prune(ckpt_root: Path, keep: int, protect: str) -> None:
    done = sorted(p for p in ckpt_root.glob("step_*") if p.is_dir())
    for old in done[: max(0, len(done) - keep)]:
        if old.name != protect:
            shutil.rmtree(old, ignore_errors=True)


def latest_checkpoint(ckpt_root: Path) -> Path | None:
    pointer = ckpt_root / LATEST
    if not pointer.is_file():
        return None
    path = ckpt_root / pointer.read_text(encoding="utf-8").strip()
    return path if (path / "trainer_state.json").is_file() else None


def load_training_state(path: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """`(trainer_state, {optimizer, scheduler, rng})` of a checkpoint directory."""
    state = json.loads((path / "trainer_state.json").read_text(encoding="utf-8"))
    blobs = torch.load(path / "optim.pt", map_location="cpu", weights_only=False)
    return state, blobs
