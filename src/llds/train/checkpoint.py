"""Atomic checkpoints: a run killed at any instant resumes from the last complete one.

A checkpoint is a directory written under a temporary name and renamed into place; `latest`
(a one-line file, itself replaced atomically) names the newest complete checkpoint.

Renaming protects against a crash while writing, not against a file damaged afterwards (a full
disk, a copy cut short, a bit flip). So every checkpoint carries `manifest.json`, the size and
SHA-256 of each of its files, written before the rename; `checkpoint_problem` checks a
checkpoint against it, and `find_resumable` picks the newest checkpoint that passes. Its
`trainer_state.json` records `checkpoint_format`, so a checkpoint whose manifest was lost is told
apart from one written before manifests existed.

A write that fails (a full disk, a permission) removes its temporary directory and stops the run
with `CheckpointWriteError`, one line naming the path; the previous checkpoints are untouched.
"""

from __future__ import annotations

import hashlib
import json
import random
import re
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import torch

from llds.env.protocol import Protocol
from llds.errors import WriteFailedError
from llds.io import atomic_write, write_failure, write_json
from llds.policy.lora import ADAPTER_DIR, is_lora, save_adapter

LATEST = "latest"
MANIFEST = "manifest.json"
MANIFEST_FORMAT = 1
CHECKPOINT_FORMAT = 2
"""Recorded in every checkpoint's trainer state. 1 (or no record): written before manifests
existed; 2: a manifest is always written."""
FORMAT_KEY = "checkpoint_format"
STAGING_PREFIX = ".tmp_step_"
TRAINER_STATE = "trainer_state.json"
OPTIM = "optim.pt"
MODEL_DIR = "model"
"""a full fine-tuning checkpoint's weights, an HF model directory (a LoRA checkpoint has
`adapter/` instead, see `llds.policy.lora`)"""
_STEP_DIR = re.compile(r"step_(\d+)")


class CheckpointWriteError(WriteFailedError):
    """A checkpoint could not be written (disk full, permission); earlier ones are intact."""


class _Writing:
    """Which file of a checkpoint is being written, for the error line when a write fails
    with an error that does not name it (torch's and safetensors' do not)."""

    def __init__(self, path: Path) -> None:
        self.path = path


@contextmanager
def failing_write_stops(tmp: Path) -> Iterator[_Writing]:
    """A failed write inside (a full disk, a permission; an `OSError`, or torch's or
    safetensors' own error for it) removes the partial directory `tmp` and becomes one
    `CheckpointWriteError` line naming the checkpoint and the file (the block may set
    `.path` of what it yields to the file it is about to write)."""
    writing = _Writing(tmp)
    try:
        yield writing
    except Exception as exc:
        if isinstance(exc, WriteFailedError):  # a helper that already named its file
            why, where = exc.why, exc.path
        else:
            why = write_failure(exc, tmp)
            where = getattr(exc, "filename", None) or writing.path
        if why is None:
            raise
        shutil.rmtree(tmp, ignore_errors=True)
        raise CheckpointWriteError(
            f"checkpoint {tmp.parent}/{tmp.name.removeprefix('.tmp_')} could not be written "
            f"({why}: {where}); the earlier checkpoints are intact: free space or "
            "fix the permission, then run the same command to resume"
        ) from None


def remove_staging_leftovers(ckpt_root: Path) -> list[str]:
    """Delete the temporary directories of checkpoints whose writer died (only the process that
    holds the run directory's lock may call this); returns their names."""
    if not ckpt_root.is_dir():
        return []
    gone = []
    for path in sorted(ckpt_root.glob(STAGING_PREFIX + "*")):
        shutil.rmtree(path, ignore_errors=True)
        gone.append(path.name)
    return gone


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
    tmp = ckpt_root / f"{STAGING_PREFIX}{step:06d}"
    with failing_write_stops(tmp):
        ckpt_root.mkdir(parents=True, exist_ok=True)
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
    """The weights, the optimizer/scheduler/RNG blobs and the trainer state, into `tmp`.
    The weights: a LoRA policy's adapter with the record of its base (`adapter/`, a few MB, no
    merged weights, no tokenizer: both come from the base), else an HF model directory
    (`model/`: float32 master weights, `state_dict` when the live model is sharded, and the
    tokenizer). `optimizer=None` when it is saved elsewhere (a sharded run's `sharded/`)."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # one progress line per checkpoint is noise in the run log
    with failing_write_stops(tmp) as writing:
        if is_lora(model):
            weights = writing.path = tmp / ADAPTER_DIR
            save_adapter(model, weights, base_path=_base_path(trainer_state), tokenizer=tokenizer)
        else:
            weights = tmp / MODEL_DIR
            writing.path = weights / "model.safetensors"
            model.save_pretrained(weights, safe_serialization=True, state_dict=state_dict)
            writing.path = weights
            tokenizer.save_pretrained(weights)
        if protocol is not None:
            protocol.write(weights)
        blobs: dict[str, Any] = {"scheduler": scheduler.state_dict(), "rng": rng_state()}
        if optimizer is not None:
            blobs["optimizer"] = optimizer.state_dict()
        if grad_scaler is not None:
            blobs["grad_scaler"] = grad_scaler.state_dict()
        writing.path = tmp / OPTIM
        torch.save(blobs, tmp / OPTIM)
        writing.path = tmp / TRAINER_STATE
        state = {**trainer_state, FORMAT_KEY: CHECKPOINT_FORMAT}
        (tmp / TRAINER_STATE).write_text(json.dumps(state, indent=2), encoding="utf-8")


def _base_path(trainer_state: dict[str, Any]) -> str:
    """The run config's `model.path`: the base a LoRA checkpoint's adapter goes on."""
    model = (trainer_state.get("config") or {}).get("model") or {}
    return str(model.get("path") or "")


def publish_checkpoint(ckpt_root: Path, step: int, tmp: Path, keep: int = 2) -> Path:
    """Record `tmp`'s manifest, rename it into place, point `latest` at it, prune old ones.

    Called once per checkpoint (rank 0) when every file is written, the shards of every rank
    of a sharded run included, so the manifest covers all of them."""
    final = ckpt_root / f"step_{step:06d}"
    with failing_write_stops(tmp):
        write_json(tmp / MANIFEST, build_manifest(tmp))
        if final.exists():
            shutil.rmtree(final)
        tmp.rename(final)
        point_latest(ckpt_root, final)
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
    done = checkpoint_dirs(ckpt_root)[::-1]  # oldest first
    for old in done[: max(0, len(done) - keep)]:
        if old.name != protect:
            shutil.rmtree(old, ignore_errors=True)


def load_training_state(path: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """`(trainer_state, {optimizer, scheduler, rng})` of a checkpoint directory."""
    state = read_trainer_state(path)
    blobs = torch.load(path / OPTIM, map_location="cpu", weights_only=False)
    return state, blobs


def read_trainer_state(path: Path) -> dict[str, Any]:
    """A checkpoint's `trainer_state.json` (step, counters, the run's config)."""
    return json.loads((path / TRAINER_STATE).read_text(encoding="utf-8"))


# ------------------------------------------------------------------ verification


def checkpoint_step(path: Path) -> int | None:
    """The step of a `step_XXXXXX` directory name; None for any other name."""
    match = _STEP_DIR.fullmatch(path.name)
    return int(match.group(1)) if match else None


def checkpoint_dirs(ckpt_root: Path) -> list[Path]:
    """Every published checkpoint directory, newest step first (temporary and set-aside
    directories do not match the `step_N` name)."""
    if not ckpt_root.is_dir():
        return []
    found = [p for p in ckpt_root.iterdir() if p.is_dir() and checkpoint_step(p) is not None]
    return sorted(found, key=lambda p: checkpoint_step(p) or 0, reverse=True)


def file_sha256(path: Path) -> str:
    """Hex SHA-256 of a file, read in chunks (checkpoint files can be many GB)."""
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def build_manifest(directory: Path) -> dict[str, Any]:
    """Size and SHA-256 of every file under `directory` (relative POSIX paths, sorted), the
    manifest itself excepted."""
    files = {}
    for path in sorted(p for p in directory.rglob("*") if p.is_file()):
        rel = path.relative_to(directory).as_posix()
        if rel != MANIFEST:
            files[rel] = {"size": path.stat().st_size, "sha256": file_sha256(path)}
    return {"format": MANIFEST_FORMAT, "files": files}


def manifest_problem(directory: Path, manifest: dict[str, Any]) -> str | None:
    """What in `directory` differs from `manifest` (the first difference), or None. Sizes are
    compared before hashing, so a truncated file is named without reading the others."""
    entries = manifest.get("files")
    if not isinstance(entries, dict) or TRAINER_STATE not in entries:
        return f"{MANIFEST} lists no {TRAINER_STATE}"
    for rel, want in entries.items():
        path = directory / rel
        if not path.is_file():
            return f"{rel} is missing"
        size = path.stat().st_size
        if size != want.get("size"):
            return f"{rel} has {size} bytes, the manifest says {want.get('size')} (truncated?)"
    for rel, want in entries.items():
        if file_sha256(directory / rel) != want.get("sha256"):
            return f"{rel} does not match its SHA-256 in the manifest"
    return None


def checkpoint_problem(path: Path) -> str | None:
    """Why checkpoint directory `path` cannot be resumed from, or None when it can.

    With a manifest every file is checked by size and SHA-256. Without one, a checkpoint whose
    trainer state records a format that always writes a manifest is refused (its manifest was
    lost, so nothing vouches for its files); one written before manifests existed is accepted
    only when its trainer state parses, its optimizer blob loads, and every tensor of its
    safetensors files loads and is finite. That catches truncation and most damage, but not a
    changed byte that still decodes to a finite number."""
    manifest_path = path / MANIFEST
    if manifest_path.is_file():
        try:
            manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            return f"{MANIFEST} is unreadable ({exc})"
        if not isinstance(manifest, dict):
            return f"{MANIFEST} is not a JSON object"
        return manifest_problem(path, manifest)
    return _legacy_problem(path)


def _legacy_problem(path: Path) -> str | None:
    """`checkpoint_problem` for a checkpoint without a manifest (older versions of llds)."""
    try:
        state = read_trainer_state(path)
    except FileNotFoundError:
        return f"{TRAINER_STATE} is missing"
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        return f"{TRAINER_STATE} is unreadable ({exc})"
    if not isinstance(state, dict) or not isinstance(state.get("step"), int):
        return f"{TRAINER_STATE} has no step"
    fmt = state.get(FORMAT_KEY, 1)
    if not isinstance(fmt, int) or fmt >= CHECKPOINT_FORMAT:
        return (
            f"{MANIFEST} is missing, and this checkpoint's format ({fmt}) always writes one: "
            "its files cannot be verified"
        )
    if not (path / OPTIM).is_file():
        return f"{OPTIM} is missing"
    try:
        torch.load(path / OPTIM, map_location="cpu", weights_only=False)
    except Exception as exc:  # torch raises many kinds of error for a damaged archive
        return f"{OPTIM} does not load ({type(exc).__name__})"
    weights = sorted(path.rglob("*.safetensors"))
    if not weights:
        return "no *.safetensors weights"
    for file in weights:
        problem = _safetensors_problem(file)
        if problem:
            return f"{file.relative_to(path).as_posix()}: {problem}"
    return None


def _safetensors_problem(file: Path) -> str | None:
    """Whether a safetensors file loads and every tensor in it is finite."""
    from safetensors import safe_open

    try:
        with safe_open(str(file), "pt") as f:
            for name in f.keys():  # noqa: SIM118 (safe_open has no __iter__)
                tensor = f.get_tensor(name)
                if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
                    return f"tensor {name} has non-finite values"
    except Exception as exc:  # the Rust binding raises its own error type
        return f"does not load ({exc})"
    return None


def find_resumable(
    ckpt_root: Path, at_or_before: int | None = None
) -> tuple[Path | None, list[tuple[Path, str]]]:
    """The newest checkpoint that passes `checkpoint_problem` (at a step <= `at_or_before` when
    given: a rollback's target), and every newer one that did not with its reason. The
    `latest` pointer is not needed: the `step_N` directories are scanned (only complete
    checkpoints carry that name), so a lost pointer loses nothing."""
    damaged: list[tuple[Path, str]] = []
    for path in checkpoint_dirs(ckpt_root):
        if at_or_before is not None and (checkpoint_step(path) or 0) > at_or_before:
            continue
        problem = checkpoint_problem(path)
        if problem is None:
            return path, damaged
        damaged.append((path, problem))
    return None, damaged


def point_latest(ckpt_root: Path, path: Path) -> None:
    """Make the `latest` pointer name checkpoint `path` (atomically)."""
    with atomic_write(ckpt_root / LATEST, "w", encoding="utf-8") as f:
        f.write(path.name + "\n")
