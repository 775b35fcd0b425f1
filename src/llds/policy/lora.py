"""Low-rank adapters through peft: attach, the adapter-free reference, save and reload.

With LoRA only the adapter weights are trained (and kept in the optimizer); the base weights
stay frozen. The KL reference policy is the same model with its adapters switched off, so a
run holds one copy of the base weights, not two.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import torch

from llds.errors import ConfigError
from llds.policy.config import LoRAConfig

ADAPTER_DIR = "adapter"


def _peft() -> Any:
    try:
        import peft
    except ModuleNotFoundError:
        raise ConfigError(
            "model.lora needs the peft package: pip install 'llds[lora]' (or set model.lora: null)"
        ) from None
    return peft


def attach_lora(model, cfg: LoRAConfig) -> Any:
    """`model` wrapped with fresh adapters on `cfg.target_modules` (B = 0: the wrapped model
    computes exactly what `model` did); only adapter weights require gradients."""
    peft = _peft()
    names = {name.rsplit(".", 1)[-1] for name, _ in model.named_modules()}
    missing = sorted(set(cfg.target_modules) - names)
    if missing:
        raise ConfigError(
            f"model.lora.target_modules: {missing} are not modules of this model "
            f"(e.g. {sorted(n for n in names if n.endswith('proj'))[:8]})"
        )
    config = peft.LoraConfig(
        r=cfg.r,
        lora_alpha=cfg.alpha,
        lora_dropout=cfg.dropout,
        target_modules=list(cfg.target_modules),
        bias="none",
        task_type="CAUSAL_LM",
    )
    return peft.get_peft_model(model, config)


def is_lora(model) -> bool:
    return hasattr(model, "disable_adapter") and hasattr(model, "peft_config")


def load_adapter(base, adapter_dir: str | Path) -> Any:
    """`base` with the trained adapters saved in `adapter_dir`, trainable (for resuming)."""
    peft = _peft()
    return peft.PeftModel.from_pretrained(base, str(adapter_dir), is_trainable=True)


def save_lora(model, out: Path) -> None:
    """The adapter alone (`out/adapter`) and the merged weights as a plain HF model
    (`out/model`: what evaluation and other tools load without peft)."""
    model.save_pretrained(out / ADAPTER_DIR, safe_serialization=True)
    merged = copy.deepcopy(model).merge_and_unload()
    merged.save_pretrained(out / "model", safe_serialization=True)


class WithoutAdapters:
    """The KL reference of a LoRA policy: the policy itself called with its adapters off.

    Not an `nn.Module` on purpose: it must not own the policy (`.eval()` on it would switch
    the policy's mode); it offers what the log-prob passes use: a call, `parameters()`,
    `modules()` and `training` (always False)."""

    training = False

    def __init__(self, model) -> None:
        self.model = model

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        with torch.no_grad(), self.model.disable_adapter():
            return self.model(*args, **kwargs)

    def parameters(self) -> Any:
        return self.model.parameters()

    def modules(self) -> Any:
        return self.model.modules()

    def lm_head_split(self) -> tuple[Any, Any] | None:
        """The policy's `(backbone, lm_head)` split (see `split_lm_head`), each called with the
        adapters off and without gradients, so the reference pass runs the head only on the
        model-written tokens too; None when the policy cannot be split."""
        from llds.policy.forward import split_lm_head

        parts = split_lm_head(self.model)
        if parts is None:
            return None
        backbone, head = parts
        return _AdaptersOff(self.model, backbone), _AdaptersOff(self.model, head)


class _AdaptersOff:
    """A part of a LoRA policy called with the policy's adapters off and no gradients; offers
    what `response_log_probs` reads from the model it calls (`training`, `modules()`)."""

    training = False

    def __init__(self, policy, part) -> None:
        self.policy, self.part = policy, part

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        with torch.no_grad(), self.policy.disable_adapter():
            return self.part(*args, **kwargs)

    def modules(self) -> Any:
        return self.part.modules()
