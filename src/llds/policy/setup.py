"""Turning a config into live objects: device, policy, reference policy, data, retriever."""

from __future__ import annotations

import copy
from typing import Any

import torch

from llds.errors import ConfigError
from llds.policy.config import ModelConfig


def resolve_device(name: str, key: str = "model.device") -> torch.device:
    """The torch device `name` names (`auto`: CUDA when available, else CPU).

    A device this torch build or machine cannot use is a ConfigError naming `key`, raised
    before any weights are loaded, instead of an assertion deep inside torch.
    """
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except (RuntimeError, ValueError):
        raise ConfigError(f"{key}: {name!r} is not a device (cpu, cuda, cuda:N, auto)") from None
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ConfigError(
                f"{key}: {name!r} needs CUDA, but torch.cuda.is_available() is false (a CPU "
                "build of torch, or no GPU visible); use cpu or auto"
            )
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise ConfigError(
                f"{key}: {name!r} does not exist ({torch.cuda.device_count()} GPUs visible)"
            )
    if device.type == "mps" and not torch.backends.mps.is_available():
        raise ConfigError(f"{key}: {name!r} is not available on this machine; use cpu or auto")
    return device


def load_model(
    cfg: ModelConfig,
    path: str | None = None,
    *,
    dtype: str | None = None,
    device_key: str = "model.device",
    checked: bool = False,
) -> tuple[Any, Any]:
    """(model, tokenizer) from `path` (a checkpoint) or the configured model.

    `dtype` overrides `cfg.dtype` as the storage dtype: training loads float32 master weights
    whatever the compute dtype (see `llds.policy.precision`); evaluation may load bf16 directly.
    `device_key` is what an unusable device is called in the error (the caller's key or flag).
    A LoRA adapter (a checkpoint's `adapter/`, or the checkpoint) loads on its recorded base,
    merged (`llds.policy.lora.load_adapted`). `checked`: the caller has checked the model (or
    the adapter's base) with `check_model_source` before its other work; it is not read again.
    """
    from llds.models.hf import enable_activation_checkpointing, load_policy
    from llds.policy.lora import adapter_dir_of, load_adapted

    source = path or cfg.path
    adapter = adapter_dir_of(source) if source != "smollm2" else None
    if adapter is not None:
        resolve_device(cfg.device, device_key)
        return load_adapted(adapter, dtype=dtype or cfg.dtype, device=cfg.device, checked=checked)
    device = str(resolve_device(cfg.device, device_key))
    storage = dtype or cfg.dtype
    if source == "smollm2":
        from llds.models.smollm2 import load_smollm2

        model, tok = load_smollm2(dtype=storage, device=device)
    else:
        model, tok = load_policy(source, dtype=storage, device=device, checked=checked)
    if cfg.gradient_checkpointing:
        enable_activation_checkpointing(model)
        model.config.use_cache = True  # generation still uses the cache
    return model, tok


def frozen_copy(model, dtype: torch.dtype | None = None) -> Any:
    """A reference policy: same weights, no gradients, eval mode; stored in `dtype` if given
    (a frozen copy needs no float32 master: bf16 halves its memory)."""
    ref = copy.deepcopy(model)
    if dtype is not None:
        ref.to(dtype)
    ref.eval()
    for p in ref.parameters():
        p.requires_grad_(False)
    return ref
