"""Supervised warm start: teacher-forced cross-entropy on the action tokens of expert trajectories.

A randomly initialised or off-the-shelf model does not follow the search protocol, so GRPO would
see reward 0 on every rollout and learn nothing. A short SFT on expert trajectories (see
`sft_data`) teaches the tag format and the habit of searching; it is kept deliberately short
so that RL still has headroom (multi-hop questions, in particular).

Loss: the mean over every loss-mask token of the optimizer batch (a masked token-mean), so the
result does not depend on how the batch is split into micro-batches. Observation and prompt tokens
are context only, unless `loss_on="all"` (see `sft_train`). Logits are computed only at the
positions that predict a loss token.
"""

from __future__ import annotations

import json
import math
import os
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import Tensor

from llds.algo.lr_schedule import scheduled_lr
from llds.errors import ConfigError
from llds.io import atomic_write, write_json
from llds.policy.forward import pack_by_length, split_lm_head
from llds.sft.config import SFTConfig
from llds.sft.data import ExpertEpisode

_DEFAULTS = SFTConfig()  # the one set of SFT defaults; `sft_train`'s keywords fall back to it

METRICS_FILE = "sft_metrics.jsonl"
PLOT_FILE = "sft_loss.png"
MODEL_DIR = "model"


@dataclass
class SFTResult:
    """What one SFT run did; `losses[i]` is the masked token-mean loss of step i+1."""

    losses: list[float]
    tokens: list[int]
    steps: int
    wall_s: float
    model_dir: Path | None
    metrics_path: Path | None
    plot_path: Path | None
    skipped_steps: int = 0
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def initial_loss(self) -> float:
        return self.losses[0] if self.losses else float("nan")

    @property
    def final_loss(self) -> float:
        """Mean of the last few steps (single steps are noisy)."""
        tail = self.losses[-5:]
        return sum(tail) / len(tail) if tail else float("nan")


LossOn = Literal["actions", "all"]


def _loss_mask(ep: ExpertEpisode, loss_on: LossOn) -> list[int]:
    """Which tokens of `ep` are predicted: its action tokens, or (`all`) every token but the first
    (prompt and observations too: language modelling of questions and passages)."""
    return ep.loss_mask if loss_on == "actions" else [0] + [1] * (len(ep) - 1)


def _pad_batch(
    episodes: Sequence[ExpertEpisode], pad_id: int, loss_on: LossOn = "actions"
) -> tuple[Tensor, Tensor, Tensor]:
    """Right-pad to the longest row: `(input_ids, attention_mask, loss_mask)`, all `[B, L]`."""
    width = max(len(e) for e in episodes)
    ids = torch.full((len(episodes), width), pad_id, dtype=torch.long)
    attn = torch.zeros((len(episodes), width), dtype=torch.long)
    loss = torch.zeros((len(episodes), width), dtype=torch.bool)
    for i, ep in enumerate(episodes):
        n = len(ep)
        ids[i, :n] = torch.tensor(ep.input_ids, dtype=torch.long)
        attn[i, :n] = 1
        loss[i, :n] = torch.tensor(_loss_mask(ep, loss_on), dtype=torch.bool)
    return ids, attn, loss


def masked_token_loss_sum(
    model: Any, input_ids: Tensor, attention_mask: Tensor, loss_mask: Tensor
) -> tuple[Tensor, int]:
    """Sum of `-log p(token)` over loss-mask tokens (and their count), teacher-forced.

    Position t predicts token t+1, so the hidden states at `loss_mask[:, 1:]` positions go
    through the LM head and nothing else does.
    """
    targets = loss_mask[:, 1:] & attention_mask[:, 1:].bool()
    labels = input_ids[:, 1:][targets]
    count = int(targets.sum())
    if count == 0:
        return input_ids.new_zeros((), dtype=torch.float32), 0
    split = split_lm_head(model)
    if split is not None:
        backbone, head = split
        hidden = backbone(
            input_ids=input_ids, attention_mask=attention_mask, use_cache=False
        ).last_hidden_state
        logits = head(hidden[:, :-1][targets])
    else:
        out = model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False)
        logits = out.logits[:, :-1][targets]
    return F.cross_entropy(logits.float(), labels, reduction="sum"), count


def batch_order(n: int, batch_size: int, steps: int, seed: int) -> list[list[int]]:
    """Episode indices for each step: a fresh seeded shuffle every epoch, batches cut in order.

    A batch never spans two epochs, so every epoch shows every episode exactly once.
    """
    rng = random.Random(seed)
    batches: list[list[int]] = []
    while len(batches) < steps:
        perm = list(range(n))
        rng.shuffle(perm)
        for s in range(0, n, batch_size):
            batches.append(perm[s : s + batch_size])
            if len(batches) == steps:
                break
    return batches


def plot_losses(losses: Sequence[float], path: Path) -> Path:
    """Write the loss curve as a PNG (atomically)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.plot(range(1, len(losses) + 1), losses, lw=1.2)
    ax.set_xlabel("step")
    ax.set_ylabel("SFT loss (action tokens)")
    ax.set_yscale("log")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    with atomic_write(path, "wb") as f:
        fig.savefig(f, format="png", dpi=110)
    plt.close(fig)
    return path


def _save_model(model: Any, tokenizer: Any, target: Path) -> Path:
    from llds.models.tiny import save_tiny  # an atomic save of any HF model + tokenizer

    return save_tiny(model, tokenizer, target)


def _progress(enabled: bool):
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    return Progress(
        TextColumn("[progress.description]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("loss {task.fields[loss]}"),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        console=Console(stderr=True),
        disable=not enabled,
    )


def _check_args(
    episodes: Sequence[ExpertEpisode],
    lr: float,
    steps: int | None,
    epochs: float | None,
    batch_size: int,
    micro_batch_tokens: int,
    warmup: int,
    max_grad_norm: float,
) -> None:
    if not episodes:
        raise ConfigError("sft: no training trajectories (check max_hops / num_examples)")
    if (steps is None) == (epochs is None):
        raise ConfigError("sft: give exactly one of steps or epochs")
    checks = {
        "lr": lr > 0,
        "steps": steps is None or steps >= 1,
        "epochs": epochs is None or epochs > 0,
        "batch_size": batch_size >= 1,
        "micro_batch_tokens": micro_batch_tokens >= 1,
        "warmup": warmup >= 0,
        "max_grad_norm": max_grad_norm > 0,
    }
    for key, ok in checks.items():
        if not ok:
            raise ConfigError(f"sft.{key}: invalid value")


def sft_train(
    model: Any,
    tokenizer: Any,
    episodes: Sequence[ExpertEpisode],
    *,
    lr: float = _DEFAULTS.lr,
    steps: int | None = None,
    epochs: float | None = None,
    batch_size: int = _DEFAULTS.batch_size,
    micro_batch_tokens: int = _DEFAULTS.micro_batch_tokens,
    warmup: int = _DEFAULTS.warmup,
    weight_decay: float = 0.0,
    max_grad_norm: float = 1.0,
    seed: int = 0,
    out_dir: str | os.PathLike[str] | None = None,
    log_every: int = 1,
    progress: bool = True,
    save: bool = True,
    loss_on: LossOn = "actions",
) -> SFTResult:
    """Train `model` in place on the action tokens of `episodes`; return the loss curve.

    Give `steps` (optimizer steps) or `epochs` (passes over the episodes). Each step takes
    `batch_size` episodes of a seeded per-epoch shuffle; rows are grouped into micro-batches of
    at most `micro_batch_tokens` padded tokens whose gradients add up to the batch's token-mean.
    AdamW, warm-up then cosine decay, gradient clipping; a step whose gradient is not finite is
    skipped. With `out_dir`: `sft_metrics.jsonl` (step, loss, tokens, lr, grad_norm),
    `sft_loss.png`, `sft_summary.json`, and (with `save`) the model and tokenizer in
    `out_dir/model`, written atomically.

    `loss_on="all"` also trains on the prompt and observation tokens. Predicting passages that
    repeat the names of the question and of earlier passages is what grows copying (induction)
    circuits; a small model trained on its actions alone tends to emit the names it saw most
    often instead of the ones it read. RL still trains on actions only.
    """
    if loss_on not in ("actions", "all"):
        raise ConfigError(f"sft.loss_on: {loss_on!r} is not one of 'actions', 'all'")
    _check_args(episodes, lr, steps, epochs, batch_size, micro_batch_tokens, warmup, max_grad_norm)
    n = len(episodes)
    batch_size = min(batch_size, n)
    total = steps if steps is not None else max(1, math.ceil(epochs * math.ceil(n / batch_size)))
    pad = tokenizer.pad_token_id
    pad_id = pad if pad is not None else (tokenizer.eos_token_id or 0)
    device = next(model.parameters()).device
    out = Path(out_dir) if out_dir is not None else None
    metrics_path = out / METRICS_FILE if out is not None else None
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        with atomic_write(metrics_path, "w", encoding="utf-8"):
            pass  # start a fresh log; rows are appended below

    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay)
    model.train()
    losses: list[float] = []
    tokens: list[int] = []
    skipped = 0
    start = time.perf_counter()
    log = metrics_path.open("a", encoding="utf-8") if metrics_path is not None else None
    try:
        with torch.random.fork_rng(devices=[]), _progress(progress) as bar:
            torch.manual_seed(seed)  # dropout, if the model has any
            task = bar.add_task("SFT", total=total, loss="-")
            for step, rows in enumerate(batch_order(n, batch_size, total, seed)):
                current_lr = scheduled_lr(
                    step, base_lr=lr, schedule="cosine", warmup=warmup, total=total, min_ratio=0.1
                )
                for group in optimizer.param_groups:
                    group["lr"] = current_lr
                batch = [episodes[i] for i in rows]
                n_tokens = sum(sum(_loss_mask(e, loss_on)[1:]) for e in batch)
                optimizer.zero_grad(set_to_none=True)
                loss_sum = 0.0
                lengths = [len(e) for e in batch]
                for micro in pack_by_length(lengths, range(len(batch)), micro_batch_tokens):
                    ids, attn, mask = _pad_batch([batch[i] for i in micro], pad_id, loss_on)
                    part, _ = masked_token_loss_sum(
                        model, ids.to(device), attn.to(device), mask.to(device)
                    )
                    (part / max(n_tokens, 1)).backward()
                    loss_sum += float(part.detach())
                grad_norm = float(torch.nn.utils.clip_grad_norm_(params, max_grad_norm))
                if math.isfinite(grad_norm):
                    optimizer.step()
                else:
                    skipped += 1
                loss = loss_sum / max(n_tokens, 1)
                losses.append(loss)
                tokens.append(n_tokens)
                if log is not None and ((step + 1) % log_every == 0 or step + 1 == total):
                    row = {
                        "step": step + 1,
                        "loss": loss,
                        "tokens": n_tokens,
                        "lr": current_lr,
                        "grad_norm": grad_norm,
                        "elapsed_s": round(time.perf_counter() - start, 3),
                    }
                    log.write(json.dumps(row) + "\n")
                    log.flush()
                bar.update(task, advance=1, loss=f"{loss:.4f}")
    finally:
        if log is not None:
            log.close()
    model.eval()
    wall = time.perf_counter() - start
    plot_path = model_dir = None
    if out is not None:
        plot_path = plot_losses(losses, out / PLOT_FILE)
        if save:
            model_dir = _save_model(model, tokenizer, out / MODEL_DIR)
        write_json(
            out / "sft_summary.json",
            {
                "steps": total,
                "episodes": n,
                "batch_size": batch_size,
                "lr": lr,
                "loss_on": loss_on,
                "initial_loss": losses[0],
                "final_loss": sum(losses[-5:]) / len(losses[-5:]),
                "skipped_steps": skipped,
                "wall_s": round(wall, 2),
            },
        )
    return SFTResult(losses, tokens, total, wall, model_dir, metrics_path, plot_path, skipped)
