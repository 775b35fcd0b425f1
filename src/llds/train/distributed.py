"""Data-parallel facts and collectives, on top of Accelerate's process setup.

Launch with `accelerate launch` (or `torchrun`); on a single process everything here is a no-op.
Each rank generates the rollouts of its share of the step's questions (a question's whole group
stays on one rank, so group advantages never need communication), computes its loss with the
GLOBAL token/sequence counts as denominators, and gradients are summed across ranks before each
optimizer step: the update equals the single-process update on the same global batch.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

import torch

from llds.metrics import reduction_of

T = TypeVar("T")


class Dist:
    def __init__(self) -> None:
        # `torch.distributed.nn.functional` binds the default process group into its functions'
        # default arguments when it is first imported. Imported after the group exists (loading
        # a model with transformers imports it), it keeps the group alive past
        # `destroy_process_group`: gloo's threads then outlive the group into interpreter exit,
        # where releasing a finished collective's tensor can abort the process. Imported first,
        # it binds nothing.
        import torch.distributed.nn.functional
        from accelerate import PartialState

        # without CUDA, Accelerate only recognises a multi-process CPU launch when told cpu=True
        self.state = PartialState(cpu=not torch.cuda.is_available())
        self.rank = self.state.process_index
        self.world = self.state.num_processes
        self.device = self.state.device

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def enabled(self) -> bool:
        return self.world > 1

    def shard(self, n: int) -> list[int]:
        """Indices 0..n-1 owned by this rank (round robin)."""
        return list(range(self.rank, n, self.world))

    def sum(self, value: float | torch.Tensor) -> torch.Tensor:
        t = torch.as_tensor(value, dtype=torch.float64).clone()
        if self.enabled:
            import torch.distributed as td

            t = t.to(self.device)
            td.all_reduce(t)
        return t.cpu()

    def sum_grads(self, params: Iterable[torch.nn.Parameter]) -> None:
        """Sum gradients over ranks (in place). Missing grads count as zero."""
        if not self.enabled:
            return
        import torch.distributed as td

        for p in params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            td.all_reduce(p.grad)

    def reduce_metrics(self, metrics: dict[str, Any], weight: float) -> dict[str, Any]:
        """Combine each metric over ranks as `llds.metrics.reduction_of` says (NaN-aware)."""
        if not self.enabled:
            return metrics
        import torch.distributed as td

        gathered: list[Any] = [None] * self.world
        td.all_gather_object(gathered, (metrics, weight))
        out: dict[str, Any] = {}
        keys = sorted({k for m, _ in gathered for k in m})
        for k in keys:
            vals = [(m.get(k), w) for m, w in gathered]
            nums = [(v, w) for v, w in vals if isinstance(v, int | float) and not _isnan(v)]
            if not nums:
                out[k] = float("nan")
            elif (how := reduction_of(k)) == "max":
                out[k] = max(v for v, _ in nums)
            elif how == "min":
                out[k] = min(v for v, _ in nums)
            elif how == "same":
                out[k] = nums[0][0]
            else:
                total = sum(w for _, w in nums)
                out[k] = sum(v * w for v, w in nums) / total if total else float("nan")
        return out

    def from_main(self, make: Callable[[], T]) -> T:
        """`make()` computed on the main process only and sent to every rank (picklable): for
        work whose answer is the same everywhere, such as verifying a checkpoint on a shared
        disk, which would otherwise be read and hashed once per rank."""
        if not self.enabled:
            return make()
        import torch.distributed as td

        box = [make() if self.is_main else None]
        td.broadcast_object_list(box, src=0)
        return box[0]

    def barrier(self) -> None:
        if self.enabled:
            self.state.wait_for_everyone()


def close_process_group() -> None:
    """Leave the process group together: a barrier (no rank tears its connections down while a
    peer is still in a collective), then teardown, which stops gloo's threads; threads left
    running into interpreter exit can abort a finished process ("terminate called without an
    active exception") instead of letting it end with its exit status and message (see
    `Dist.__init__` for what kept them alive). Call it on every rank, on success or after a
    failure every rank agreed on."""
    import torch.distributed as td

    if td.is_available() and td.is_initialized():
        td.barrier()
        td.destroy_process_group()


def _isnan(v: float) -> bool:
    return isinstance(v, float) and math.isnan(v)
