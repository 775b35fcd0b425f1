"""The name transformers gives the key/value cache, on the way into a model and on the way out.

transformers 5.x renamed `past_key_values` to `cache` (both as the forward argument and as the
output field) and announced that the old name goes away in 5.40. The rollout engine and the
shared-prompt log-prob pass feed a cache back into the model, so they ask the model which name
it takes rather than pin a transformers version: the new name where the model declares it, the
old one on older releases (which never knew `cache`).
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from torch import nn

NEW_NAME = "cache"
OLD_NAME = "past_key_values"


def transformers_model_in(model: nn.Module) -> Any | None:
    """The transformers model that owns the weights, past the wrappers around it.

    PEFT models, DDP and `torch.compile` wrap a transformers model in a module whose forward
    passes keyword arguments through. The first module (in `modules()` order, the outermost
    first) whose class is a transformers `PreTrainedModel` is the one whose forward finally
    reads them and whose config says how it runs. None for a model outside transformers.
    """
    try:
        from transformers import PreTrainedModel
    except ImportError:
        return None
    return next((m for m in model.modules() if isinstance(m, PreTrainedModel)), None)


def _innermost_forward(model: nn.Module):
    """The forward that reads the cache argument: the inner transformers model's, else the
    model's own (the wrappers' signatures say nothing about the name)."""
    inner = transformers_model_in(model)
    return type(model if inner is None else inner).forward


def cache_argument(model: nn.Module) -> str:
    """`"cache"` when the model's forward declares it, else `"past_key_values"`."""
    return _name_for(_innermost_forward(model))


@functools.lru_cache(maxsize=64)
def _name_for(forward) -> str:
    """Read one forward's signature once: the decode loop asks at every token."""
    try:
        params = inspect.signature(forward).parameters
    except (TypeError, ValueError):  # a builtin or C forward: assume the long-standing name
        return OLD_NAME
    return NEW_NAME if NEW_NAME in params else OLD_NAME


def returned_cache(output: Any) -> Any:
    """The cache a forward returned, read under the name its output class declares.

    Reading the old name on new releases works but warns, and will stop working; reading the
    new name on old ones fails. The output classes are dataclasses, so their fields say which.
    """
    if dataclasses.is_dataclass(output):
        names = {f.name for f in dataclasses.fields(output)}
        if NEW_NAME in names:
            return getattr(output, NEW_NAME)
        return getattr(output, OLD_NAME)
    return getattr(output, OLD_NAME) if hasattr(output, OLD_NAME) else getattr(output, NEW_NAME)
