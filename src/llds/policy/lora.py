"""Low-rank adapters through peft: attach, the adapter-free reference, save and reload.

With LoRA only the adapter weights are trained (and kept in the optimizer); the base weights
stay frozen. The KL reference policy is the same model with its adapters switched off, so a
run holds one copy of the base weights, not two.

A LoRA run's state is the adapter and its optimizer state (SmolLM2-135M at rank 16 on every
linear layer: 56 MiB, against 1.6 GB for full fine-tuning), never the merged weights:
`save_adapter` writes the adapter and a record of its base (`llds_base.json`: the run's
`model.path` and a fingerprint of the base weights and vocabulary), and every load of an
adapter (resume, evaluation, export) checks the base it is put on against that record, so an
adapter is never silently applied to other weights. Merged weights are made only when asked
(`merged`).
"""

from __future__ import annotations

import copy
import hashlib
import json
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from llds.errors import ConfigError, UserInputError
from llds.policy.config import LoRAConfig

if TYPE_CHECKING:
    import torch

ADAPTER_DIR = "adapter"
"""a LoRA checkpoint's adapter directory (peft's format plus `BASE_FILE`)"""
ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
BASE_FILE = "llds_base.json"
"""the record of the base model an adapter was trained on"""
FINGERPRINT_SAMPLES = 4096
"""values read from each base tensor for its fingerprint (evenly spaced): reading every value
of a 135M-parameter model would cost seconds per checkpoint; another model, or another
fine-tune of the same one, differs in almost every value"""

log = logging.getLogger("llds.policy")


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


def adapter_dir_of(path: str | Path) -> Path | None:
    """The adapter directory `path` names: itself (`.../adapter`), or a LoRA checkpoint's
    `adapter/`; None when `path` is neither (a plain model directory, a hub id)."""
    path = Path(path).expanduser()
    for candidate in (path, path / ADAPTER_DIR):
        if (candidate / ADAPTER_CONFIG).is_file():
            return candidate
    return None


# ------------------------------------------------------------------ the base's fingerprint


def base_parameters(model) -> Iterator[tuple[str, torch.Tensor]]:
    """The frozen base weights of `model` (a peft model or a plain one) under the plain
    model's names: peft's `base_model.model.` prefix and `.base_layer` dropped, adapters
    skipped, so a base and the same base wrapped with adapters name the same tensors."""
    prefix = "base_model.model."
    for name, param in model.named_parameters():
        if "lora_" in name:
            continue
        plain = name.removeprefix(prefix) if is_lora(model) else name
        yield plain.replace(".base_layer.", "."), param


def base_fingerprint(model, tokenizer=None) -> dict[str, Any]:
    """`{parameters, weights_sha256[, tokenizer_sha256]}` of `model`'s base: its parameter count
    and a SHA-256 over each base tensor's name, shape and `FINGERPRINT_SAMPLES` evenly spaced
    values (as float32), and of the tokenizer's vocabulary when given."""
    import torch  # here, not at the top: an adapter is found and checked without torch

    digest, count = hashlib.sha256(), 0
    with torch.no_grad():
        for name, param in sorted(base_parameters(model), key=lambda item: item[0]):
            flat = param.detach().reshape(-1)
            stride = max(1, flat.numel() // FINGERPRINT_SAMPLES)
            sample = flat[::stride][:FINGERPRINT_SAMPLES].to("cpu", torch.float32).contiguous()
            digest.update(f"{name}:{tuple(param.shape)}:".encode())
            digest.update(sample.numpy().tobytes())
            count += param.numel()
    record: dict[str, Any] = {"parameters": count, "weights_sha256": digest.hexdigest()}
    if tokenizer is not None:
        vocab = json.dumps(sorted(tokenizer.get_vocab().items()), ensure_ascii=True)
        record["tokenizer_sha256"] = hashlib.sha256(vocab.encode()).hexdigest()
    return record


def read_base_record(adapter_dir: str | Path) -> dict[str, Any] | None:
    """An adapter's `llds_base.json`; None for an adapter saved without one (older llds, or
    by peft alone)."""
    path = Path(adapter_dir) / BASE_FILE
    if not path.is_file():
        return None
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise UserInputError(f"{path}: not a readable base record ({exc})") from None
    if not isinstance(record, dict) or not isinstance(record.get("path"), str):
        raise UserInputError(f"{path}: expected a JSON object with the base model's path")
    return record


def check_base(adapter_dir: str | Path, model, tokenizer=None) -> None:
    """Refuse (one line) to put the adapter of `adapter_dir` on a base other than the one it
    was trained on, by the recorded fingerprint (the vocabulary too when `tokenizer` is given);
    an adapter without a record is let through."""
    record = read_base_record(adapter_dir)
    if record is None:
        return
    now = base_fingerprint(model, tokenizer if "tokenizer_sha256" in record else None)
    for key in ("parameters", "weights_sha256", "tokenizer_sha256"):
        if key in record and key in now and record[key] != now[key]:
            raise UserInputError(
                f"{adapter_dir}: this adapter was trained on the base model {record['path']!r} "
                f"({_describe(record)}), but the base loaded now differs ({_describe(now)}): "
                "load the same base (model.path), or export the merged weights where it exists"
            )


def _describe(record: dict[str, Any]) -> str:
    weights = str(record.get("weights_sha256"))[:12]
    text = f"{record.get('parameters')} parameters, weights {weights}"
    if "tokenizer_sha256" in record:
        text += f", vocabulary {str(record['tokenizer_sha256'])[:12]}"
    return text


# ------------------------------------------------------------------ save and load


def save_adapter(model, out: Path, *, base_path: str, tokenizer=None) -> None:
    """The adapter alone, in peft's format (float32, as trained), into `out`, with the record of
    its base (`base_path`: the run's `model.path`). No merged weights: `merged` makes them when
    asked."""
    model.save_pretrained(out, safe_serialization=True)
    record = {"path": base_path, **base_fingerprint(model, tokenizer)}
    (out / BASE_FILE).write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")


def load_adapter(base, adapter_dir: str | Path, tokenizer=None) -> Any:
    """`base` with the trained adapters saved in `adapter_dir`, trainable (for resuming), after
    checking that `base` is the base they were trained on."""
    check_base(adapter_dir, base, tokenizer)
    peft = _peft()
    return peft.PeftModel.from_pretrained(base, str(adapter_dir), is_trainable=True)


def load_adapter_weights(model, adapter_dir: str | Path) -> None:
    """Put the adapter weights saved in `adapter_dir` into the live peft `model` in place (a
    rollback: the optimizer keeps pointing at the same tensors)."""
    from safetensors.torch import load_file

    peft = _peft()
    state = load_file(str(Path(adapter_dir) / ADAPTER_WEIGHTS))
    result = peft.set_peft_model_state_dict(model, state)
    unexpected = list(getattr(result, "unexpected_keys", []) or [])
    if unexpected:
        raise UserInputError(
            f"{adapter_dir}: adapter weights {unexpected[:3]} do not fit this model's adapters"
        )


def merged(model) -> Any:
    """A plain model with `model`'s adapters folded into its weights (`merge_exactly`); `model`
    itself keeps its adapters."""
    return merge_exactly(copy.deepcopy(model))


def merge_exactly(model) -> Any:
    """Fold the adapters of the peft `model` into its base weights, `W + (alpha / r) B A`, and
    return the plain model. The product is summed in float64 one rank at a time (element-wise
    products and sums in a fixed order, no matrix kernel), then added to `W` and rounded once:
    the same bits on every machine. A base merged from a committed adapter is then the same
    model wherever it is rebuilt, so adapters trained on it (which record its fingerprint) load
    there; peft's own merge goes through a matrix product whose rounding depends on the CPU's
    kernels."""
    import torch

    with torch.no_grad():
        for module in model.modules():
            if not hasattr(module, "lora_A") or not hasattr(module, "base_layer"):
                continue
            for name in list(module.lora_A.keys()):
                if getattr(module, "use_dora", {}).get(name, False):
                    raise ConfigError(f"adapter {name!r} uses DoRA: not merged exactly")
                weight = module.base_layer.weight
                a = module.lora_A[name].weight.detach().to("cpu", torch.float64)
                b = module.lora_B[name].weight.detach().to("cpu", torch.float64)
                delta = torch.zeros(b.shape[0], a.shape[1], dtype=torch.float64)
                for k in range(a.shape[0]):
                    delta += b[:, k : k + 1] * a[k : k + 1, :]
                if getattr(module, "fan_in_fan_out", False):
                    delta = delta.T
                total = weight.detach().to("cpu", torch.float64) + module.scaling[name] * delta
                weight.copy_(total.to(weight.dtype))
    plain = model.unload()
    plain.requires_grad_(True)  # a plain model, as loaded from its weights (peft froze them)
    return plain


def load_adapted(
    adapter_dir: str | Path, *, dtype: str = "float32", device: str = "auto", checked: bool = False
):
    """`(model, tokenizer)` for inference from an adapter directory: its recorded base loaded in
    float32, checked against the record, the adapter put on and merged in (`merge_exactly`: the
    same weights on any machine), then stored in
    `dtype` (`auto`: float32, the dtype the adapter was trained in). `checked`: the caller has
    checked the base (`base_model_path`) before its other work; its directory is not read
    again."""
    import torch

    from llds.policy.config import ModelConfig
    from llds.policy.setup import load_model

    adapter_dir = Path(adapter_dir)
    base = base_model_path(adapter_dir, checked=checked)
    model, tokenizer = load_model(
        ModelConfig(path=base, device=device), dtype="float32", checked=checked
    )
    check_base(adapter_dir, model, tokenizer)
    peft = _peft()
    model = merge_exactly(peft.PeftModel.from_pretrained(model, str(adapter_dir)))
    if dtype in ("bfloat16", "float16"):
        model.to(getattr(torch, dtype))
    model.eval()
    log.info("loaded %s on its base %s (merged)", adapter_dir, base)
    return model, tokenizer


def base_model_path(adapter_dir: Path, *, checked: bool = False) -> str:
    """The base an adapter directory names (its record's path, else peft's
    `base_model_name_or_path`), refused in one line when it is a local path that is not here
    (`checked`: the caller has checked it already; only the name is read)."""
    from llds.models.hf import check_model_source

    record = read_base_record(adapter_dir)
    if record is not None:
        base = record["path"]
    else:
        config = json.loads((adapter_dir / ADAPTER_CONFIG).read_text(encoding="utf-8"))
        base = config.get("base_model_name_or_path") or ""
    if not base:
        raise UserInputError(f"{adapter_dir}: names no base model ({BASE_FILE} is missing)")
    if checked:
        return base
    try:
        check_model_source("model.path", base)
    except UserInputError as exc:
        raise UserInputError(
            f"{adapter_dir}: its base model cannot be loaded ({exc}); an adapter needs the base "
            "it was trained on: make it, or run from the directory the run was trained in"
        ) from None
    return base


class WithoutAdapters:
    """The KL reference of a LoRA policy: the policy itself called with its adapters off.

    Not an `nn.Module` on purpose: it must not own the policy (`.eval()` on it would switch
    the policy's mode); it offers what the log-prob passes use: a call, `parameters()`,
    `modules()` and `training` (always False)."""

    training = False

    def __init__(self, model) -> None:
        self.model = model

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        import torch

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
        import torch

        with torch.no_grad(), self.policy.disable_adapter():
            return self.part(*args, **kwargs)

    def modules(self) -> Any:
        return self.part.modules()
