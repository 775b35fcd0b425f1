"""Load any Hugging Face causal LM (a local directory or a cached hub id) as a policy."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from llds.errors import UserInputError

DTYPES = ("float32", "bfloat16", "float16", "auto")


def _torch_dtype(dtype: str) -> Any:
    import torch

    if dtype == "auto":
        return "auto"
    if dtype not in DTYPES:
        raise UserInputError(f"dtype must be one of {DTYPES}, got {dtype!r}")
    return getattr(torch, dtype)


def _looks_like_path(name: str) -> bool:
    """Paths are resolved by us; everything else goes to the hub resolution (cache, or download)."""
    return name.startswith((".", "/", "~")) or Path(name).expanduser().exists()


def resolve_model_source(name_or_path: str | Path) -> str:
    """Return what `from_pretrained` should receive, or raise a UserInputError naming the input.

    A directory must hold a config.json. A hub id is passed through unchanged: transformers finds
    it in the local cache (and downloads only where the user's environment allows it).
    """
    name = str(name_or_path)
    if isinstance(name_or_path, Path) or _looks_like_path(name):
        path = Path(name).expanduser()
        if not path.is_dir():
            raise UserInputError(f"model path {name!r} is not a directory")
        if not (path / "config.json").is_file():
            raise UserInputError(
                f"model directory {name!r} has no config.json (not a Hugging Face model directory)"
            )
        return str(path)
    return name


def prepare_tokenizer(tokenizer: Any) -> Any:
    """Pad with EOS when the tokenizer has no pad token; pad on the left (batched generation)."""
    if tokenizer.pad_token is None:
        if tokenizer.eos_token is None:
            raise UserInputError("tokenizer has neither a pad nor an eos token; set one")
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "left"
    return tokenizer


def load_policy(
    name_or_path: str | Path,
    *,
    dtype: str = "float32",
    device: str = "cpu",
    trust_remote_code: bool = False,
    local_files_only: bool | None = None,
) -> tuple[Any, Any]:
    """Load `(model, tokenizer)` for a causal LM directory or hub id.

    The tokenizer pads on the left, which batched generation needs; training code that wants
    right padding sets `tokenizer.padding_side` itself. `local_files_only=None` keeps the
    Hugging Face default (which honours HF_HUB_OFFLINE); True never touches the network.
    The model is returned in eval mode, as `from_pretrained` leaves it.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    source = resolve_model_source(name_or_path)
    torch_dtype = _torch_dtype(dtype)
    kwargs: dict[str, Any] = {"trust_remote_code": trust_remote_code}
    if local_files_only is not None:
        kwargs["local_files_only"] = local_files_only
    try:
        tokenizer = AutoTokenizer.from_pretrained(source, **kwargs)
        model = AutoModelForCausalLM.from_pretrained(source, dtype=torch_dtype, **kwargs)
    except OSError as exc:
        raise UserInputError(
            f"cannot load model {source!r}: it is neither a model directory with config.json "
            f"nor a hub id present in the local Hugging Face cache ({exc})"
        ) from exc
    prepare_tokenizer(tokenizer)
    if model.config.pad_token_id is None:
        model.config.pad_token_id = tokenizer.pad_token_id
    gen = getattr(model, "generation_config", None)
    if gen is not None and gen.pad_token_id is None:
        gen.pad_token_id = tokenizer.pad_token_id
    return model.to(device), tokenizer


def enable_activation_checkpointing(model: Any, **checkpoint_kwargs: Any) -> None:
    """Recompute each layer's activations in the backward pass, under this release's name.

    transformers 5 renamed `gradient_checkpointing_enable` to `activation_checkpointing_enable`
    and keeps the old name, with a warning, only until v6; older releases have only the old one.
    `checkpoint_kwargs` go to `torch.utils.checkpoint` (e.g. `use_reentrant=False`).
    """
    kwargs = checkpoint_kwargs or None
    if hasattr(model, "activation_checkpointing_enable"):
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
