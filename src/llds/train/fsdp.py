"""Fully sharded data parallelism (torch FSDP2, `fully_shard`) for the policy.

Why: with plain data parallelism (`llds.train.distributed`) every rank holds the whole model,
its gradients and both AdamW moments. FSDP shards all of that over the ranks; each forward and
backward all-gathers one transformer block at a time. The conventions here match the rest of
the trainer:

* Gradients are SUMMED over ranks, never averaged: every loss already divides by the GLOBAL
  token/sequence count (see `Dist.sum` and `PolicyUpdate.run`), so the summed gradient is the
  single-process gradient of the global batch. `shard_policy` configures FSDP that way, so the
  caller must NOT also call `Dist.sum_grads` on a sharded model.
* The sharded parameters are float32 master weights; the optimizer steps them. With
  `compute_dtype=torch.bfloat16` FSDP all-gathers bf16 copies for forward/backward and reduces
  gradients in float32 (`MixedPrecisionPolicy`).
* Every forward and backward of a sharded model is a collective. All ranks must run the same
  number of forward and backward passes, in the same order, or the job hangs. Use
  `max_over_ranks` to agree on the number of micro-batches and pad with zero-weight dummies.

Typical use (every rank runs every line unless marked)::

    model = shard_policy(model, compute_dtype=torch.bfloat16)   # after model.to(device)
    opt = torch.optim.AdamW(model.parameters(), ...)            # built AFTER sharding
    for micro in range(max_over_ranks(len(my_micro_batches))):
        loss = ...                              # a dummy micro-batch: (loss * 0.0)
        loss.backward()                         # reduce-scatter: gradients summed over ranks
    norm = clip_grad_norm(model.parameters(), max_norm)   # global norm, a plain tensor
    opt.step(); opt.zero_grad(set_to_none=True)
    sync_unsharded_copy(model, rollout_model)   # refresh the unsharded rollout copy
    save_sharded(tmp_dir, model, opt)           # resumable checkpoint (all ranks)
    state = full_state_dict(model)              # HF export: tensors on rank 0 only
    if rank == 0: model.save_pretrained(out_dir, state_dict=state)

No-grad forwards (old/ref log-probs) work on the sharded model as usual under `torch.no_grad()`,
but they too are collectives. Generation is better done on an unsharded copy
(`sync_unsharded_copy`): `generate` stops at data-dependent lengths, which differ per rank.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

log = logging.getLogger(__name__)

_LOW_PRECISION = (torch.bfloat16, torch.float16)
# wrapper segments that torch inserts into parameter names (activation checkpointing, compile)
_WRAPPER_SEGMENTS = ("_checkpoint_wrapped_module.", "_orig_mod.", "_fsdp_wrapped_module.")


# ---------------------------------------------------------------- process group


def _initialized() -> bool:
    import torch.distributed as td

    return td.is_available() and td.is_initialized()


def _collective_device() -> torch.device:
    """Where small tensors for a collective must live: CUDA for an NCCL-only group."""
    import torch.distributed as td

    backend = str(td.get_backend()).lower()
    if "nccl" in backend and "gloo" not in backend and torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def max_over_ranks(n: int) -> int:
    """The largest `n` over all ranks (an all-reduce MAX); `n` itself when not distributed.

    Why: under FSDP each forward/backward is a collective, so every rank must run the same
    number of micro-batches even when its share of the data packs into fewer. Loop
    `max_over_ranks(len(local))` times; on the extra iterations run a forward/backward on a dummy
    micro-batch (e.g. a repeat of a real one) whose loss is multiplied by 0.0. It adds nothing to
    the summed gradient, but it keeps the all-gathers and reduce-scatters in step. Every rank
    must call this (it is itself a collective).
    """
    if not _initialized():
        return int(n)
    import torch.distributed as td

    t = torch.tensor([int(n)], dtype=torch.int64, device=_collective_device())
    td.all_reduce(t, op=td.ReduceOp.MAX)
    return int(t.item())


# ---------------------------------------------------------------- sharding


def is_sharded(model: nn.Module) -> bool:
    """Whether `fully_shard` was applied to `model` (its root)."""
    from torch.distributed.fsdp import FSDPModule

    return isinstance(model, FSDPModule)


def transformer_blocks(model: nn.Module) -> list[nn.Module]:
    """The modules that become their own FSDP unit (one all-gather each).

    Modules whose class name is in `model._no_split_modules` (HF's list of blocks that must stay
    on one device: exactly the decoder layers), outermost only; otherwise `model.model.layers`;
    otherwise none.
    """
    names = set(getattr(model, "_no_split_modules", None) or ())
    blocks: list[nn.Module] = []
    if names:
        inside: set[int] = set()
        for mod in model.modules():
            if mod is model or id(mod) in inside:
                continue
            if type(mod).__name__ in names:
                blocks.append(mod)
                inside.update(id(m) for m in mod.modules())
    if not blocks:
        layers = getattr(getattr(model, "model", None), "layers", None)
        if isinstance(layers, nn.ModuleList | list | tuple):
            blocks = list(layers)
    return blocks


def _check_shared_parameters(model: nn.Module, blocks: list[nn.Module]) -> None:
    """Refuse a parameter shared between a block and anything outside that block.

    FSDP2 manages each parameter in exactly one unit; a parameter reachable from two units
    (e.g. an output head tied to an embedding inside a block) would be sharded twice and its
    gradient split. Ties among modules that all stay in the root unit (the usual tie of
    `embed_tokens` and `lm_head`, neither inside a decoder layer) are fine.
    """
    names_of: dict[int, list[str]] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        names_of.setdefault(id(p), []).append(name)
    prefix_of = {id(m): name + "." for name, m in model.named_modules()}
    for block in blocks:
        prefix = prefix_of[id(block)]
        for p in block.parameters():
            outside = [n for n in names_of[id(p)] if not n.startswith(prefix)]
            if outside:
                raise ValueError(
                    f"parameter {names_of[id(p)][0]!r} is shared with {outside} outside its "
                    f"transformer block {prefix[:-1]!r}; FSDP cannot shard a parameter tied "
                    "across units. Untie it (clone the weight) before shard_policy."
                )


def shard_policy(
    model: nn.Module,
    *,
    compute_dtype: torch.dtype | None,
    reshard_after_forward: bool = True,
    mesh: Any = None,
) -> nn.Module:
    """Shard `model` in place with FSDP2 and return it (now also an `FSDPModule`).

    Each transformer block becomes one FSDP unit, the root holds the rest (embeddings, final
    norm, LM head; a tied `embed_tokens`/`lm_head` stays tied). Floating parameters are first
    cast to float32: the shards are the fp32 master weights. `compute_dtype` bf16/fp16 makes
    forward/backward run on low-precision all-gathered copies while gradients are reduced in
    float32; None/float32 computes in float32 (float16 would also need loss scaling, which is
    not provided here; prefer bfloat16). Gradients are summed over ranks (not averaged).
    `reshard_after_forward=False` keeps each block unsharded from forward to backward (one
    all-gather fewer per block, more memory).

    Needs an initialised process group (torchrun / `accelerate launch` with the model on the
    rank's device; `Dist()` initialises it). Build the optimizer AFTER this call: the
    parameters are replaced by sharded DTensors.
    """
    from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard

    if is_sharded(model):
        raise ValueError("model is already sharded")
    if compute_dtype not in (None, torch.float32, *_LOW_PRECISION):
        raise ValueError(
            f"compute_dtype must be None, float32, bfloat16 or float16, got {compute_dtype}"
        )
    blocks = transformer_blocks(model)
    _check_shared_parameters(model, blocks)
    if not _initialized():
        raise RuntimeError(
            "FSDP needs torch.distributed to be initialised: launch with torchrun or "
            "`accelerate launch` and create `Dist()` (or call init_process_group) first"
        )
    if not blocks:
        log.warning(
            "no transformer blocks found in %s: sharding it as a single FSDP unit "
            "(the whole model is all-gathered at once)",
            type(model).__name__,
        )
    if any(p.is_floating_point() and p.dtype != torch.float32 for p in model.parameters()):
        model.to(torch.float32)
    mp = (
        MixedPrecisionPolicy(param_dtype=compute_dtype, reduce_dtype=torch.float32)
        if compute_dtype in _LOW_PRECISION
        else MixedPrecisionPolicy()
    )
    kwargs: dict[str, Any] = {"mp_policy": mp, "reshard_after_forward": reshard_after_forward}
    if mesh is not None:
        kwargs["mesh"] = mesh
    for block in blocks:
        fully_shard(block, **kwargs)
    fully_shard(model, **kwargs)
    for mod in model.modules():
        if isinstance(mod, FSDPModule):
            # divide factor 1 = plain sum. Forcing SUM reductions avoids ReduceOp.PREMUL_SUM,
            # which gloo does not implement (and lets NCCL use zero-copy SUM collectives).
            mod.set_gradient_divide_factor(1.0)
            mod.set_force_sum_reduction_for_comms(True)
    return model


def clip_grad_norm(params: Iterable[nn.Parameter], max_norm: float) -> Tensor:
    """`torch.nn.utils.clip_grad_norm_` that returns the GLOBAL norm as a plain local tensor.

    On sharded (DTensor) gradients torch computes the norm over all shards (a collective, so
    every rank must call it) and returns a replicated DTensor; this unwraps it so the caller
    can test `torch.isfinite` and log `float(norm)` without DTensor semantics.
    """
    norm = torch.nn.utils.clip_grad_norm_(list(params), max_norm)
    full = getattr(norm, "full_tensor", None)
    return full() if full is not None else norm


# ---------------------------------------------------------------- full (unsharded) weights


def reshard_all(model: nn.Module) -> None:
    """Free every unsharded parameter copy, so the module holds only its shards. Local, cheap.

    Why: with `reshard_after_forward=False`, a no-grad forward (no backward follows) leaves the
    blocks unsharded: `model.parameters()` then yields plain unsharded tensors instead of the
    sharded DTensors, and a later forward reuses those copies even after `optimizer.step()`
    changed the shards (stale weights). Call this after no-grad passes in that mode. With the
    default `reshard_after_forward=True` every forward reshards by itself.
    """
    from torch.distributed.fsdp import FSDPModule

    for mod in model.modules():
        if isinstance(mod, FSDPModule):
            mod.reshard()


def _clean_name(name: str) -> str:
    for seg in _WRAPPER_SEGMENTS:
        name = name.replace(seg, "")
    return name


def _full_tensors(model: nn.Module) -> Iterator[tuple[list[str], Tensor]]:
    """(names, full tensor) for each distinct state-dict tensor, gathered one at a time.

    A collective for sharded models: every rank iterates in the same (state-dict) order.
    """
    reshard_all(model)  # no stray unsharded low-precision copies left by a no-grad forward
    groups: dict[int, list[str]] = {}
    tensors: dict[int, Tensor] = {}
    for name, t in model.state_dict(keep_vars=True).items():
        groups.setdefault(id(t), []).append(_clean_name(name))
        tensors[id(t)] = t
    for key, names in groups.items():
        t = tensors[key]
        full = t.full_tensor() if hasattr(t, "full_tensor") else t
        yield names, full.detach()


def full_state_dict(model: nn.Module, *, all_ranks: bool = False) -> dict[str, Tensor]:
    """The full, unsharded float32 state dict on CPU, keyed like the unwrapped HF model.

    All ranks must call it (it all-gathers). By default only rank 0 receives the tensors (other
    ranks get `{}`): that is what rank 0 needs to `model.save_pretrained(dir, state_dict=...)`
    an ordinary HF directory of the master weights. `all_ranks=True` gives every rank a copy
    (gathered tensor by tensor, so only one full tensor at a time sits on the accelerator).
    Works on an unsharded model too (then it is just a CPU copy).
    """
    import torch.distributed as td

    if not is_sharded(model):
        if _initialized() and not all_ranks and td.get_rank() != 0:
            return {}
        return {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}
    if all_ranks:
        out: dict[str, Tensor] = {}
        for names, full in _full_tensors(model):
            cpu = full.cpu()
            for name in names:
                out[name] = cpu
        return out
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    reshard_all(model)
    return get_model_state_dict(
        model, options=StateDictOptions(full_state_dict=True, cpu_offload=True)
    )


@torch.no_grad()
def copy_into(dst: nn.Module, state: dict[str, Tensor]) -> None:
    """Copy `state` into the existing unsharded `dst` in place, casting to dst's dtypes/device.

    Strict: every key of dst's state dict must be present and shapes must match. In place, so
    anything holding a reference to `dst` (a rollout engine) sees the new weights.
    """
    dst.load_state_dict(state, strict=True)


@torch.no_grad()
def sync_unsharded_copy(src: nn.Module, dst: nn.Module) -> None:
    """Copy the (sharded) weights of `src` into the unsharded `dst`, in place, on every rank.

    Why: rollouts run on an ordinary model (e.g. a bf16 copy on each GPU) that must follow the
    fp32 master weights after each optimizer step. Tensors are all-gathered one at a time and
    cast to dst's dtype on dst's device, so no full fp32 model is ever materialised. All ranks
    must call it. Raises KeyError if the two state dicts have different keys.
    """
    dst_sd = dst.state_dict(keep_vars=True)
    src_keys = {_clean_name(k) for k in src.state_dict(keep_vars=True)}
    if src_keys != set(dst_sd):
        missing, extra = sorted(src_keys - set(dst_sd)), sorted(set(dst_sd) - src_keys)
        raise KeyError(f"state dicts differ: only in src {missing[:5]}, only in dst {extra[:5]}")
    for names, full in _full_tensors(src):
        for name in names:
            target = dst_sd[name]
            if target.shape != full.shape:
                raise ValueError(f"{name}: shape {tuple(full.shape)} vs {tuple(target.shape)}")
            target.copy_(full)


# ---------------------------------------------------------------- sharded checkpoints


def save_sharded(directory: str | Path, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
    """Write a resumable sharded checkpoint of model + optimizer state with DCP. All ranks call.

    Layout of `directory` (torch.distributed.checkpoint's FileSystemWriter):
      `__<rank>_0.distcp`  - one file per rank: its shards of the parameters (fp32 master
                             weights, keys `model.<fqn>`) and of the AdamW state (keys
                             `optim.state.<fqn>.exp_avg` / `exp_avg_sq` / `step`, plus
                             `optim.param_groups.<group index>.<hyperparameter>`);
      `.metadata`          - written by rank 0 LAST, after every rank's file is complete: the
                             global index of what lies where.
    A directory without `.metadata` is incomplete. Every rank must pass the SAME path (on a
    file system all ranks see). For atomicity the caller writes into a temporary directory with
    a deterministic name and, after this returns on rank 0 (the returns happen only once
    `.metadata` is written), renames it. The LR scheduler, RNG and step counter are not included.
    DCP stores global shapes and offsets, so it can re-shard on load to another number of ranks
    (a DCP feature; not exercised by our tests).
    """
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    reshard_all(model)
    msd, osd = get_state_dict(model, optimizer)
    dcp.save({"model": msd, "optim": osd}, checkpoint_id=str(directory))


def load_sharded(directory: str | Path, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
    """Load a `save_sharded` checkpoint into an already sharded model and its optimizer.

    All ranks call. `model` must be sharded with `shard_policy` and `optimizer` built over its
    parameters (fresh is fine: its state is created first by a zero-lr step on zero gradients,
    then overwritten). Loads in place: parameters, AdamW moments and step counts, and the
    param-group hyperparameters (lr, betas, ...) saved with them; load the LR scheduler after.
    """
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    path = Path(directory)
    if not (path / ".metadata").is_file():
        raise FileNotFoundError(f"{path} is not a complete sharded checkpoint (no .metadata)")
    reshard_all(model)
    msd, osd = get_state_dict(model, optimizer)
    state = {"model": msd, "optim": osd}
    dcp.load(state, checkpoint_id=str(path))
    set_state_dict(
        model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"]
    )
