"""The tensor arguments of `llds.algo`'s public functions, checked where they enter: a list or
None where a tensor belongs is one `TypeError` naming the function and the argument, instead of
an AttributeError from deep inside the math. Their numeric bounds are the config's
(`llds.config.algo.check_arguments`)."""

from __future__ import annotations

from torch import Tensor


def check_tensors(where: str, /, **values: object) -> None:
    """Refuse any of `values` that is not a `torch.Tensor` (None included: leave an optional
    argument out when it is None)."""
    for name, value in values.items():
        if not isinstance(value, Tensor):
            raise TypeError(
                f"{where}: {name} must be a torch.Tensor, got {type(value).__name__} "
                "(torch.tensor(...) makes one)"
            )
