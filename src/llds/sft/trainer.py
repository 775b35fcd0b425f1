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
import shutil
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
from llds.sft.progress import SFTProgress

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


def _save_trained(model: Any, tokenizer: Any, out: Path, base_path: str | None) -> Path:
    """The model and tokenizer in `out/model`; a LoRA model's adapter alone (with the record of
    its base, `base_path`) in `out/adapter`, renamed into place once complete."""
    from llds.policy.lora import ADAPTER_DIR, is_lora, save_adapter

    if not is_lora(model):
        from llds.models.tiny import save_tiny  # an atomic save of any HF model + tokenizer

        return save_tiny(model, tokenizer, out / MODEL_DIR)
    if not base_path:
        raise ConfigError("sft: a LoRA model's adapter needs the path of its base (base_path)")
    target = out / ADAPTER_DIR
    partial = out / f".{ADAPTER_DIR}.partial"
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    save_adapter(model, partial, base_path=base_path, tokenizer=tokenizer)
    shutil.rmtree(target, ignore_errors=True)
    partial.rename(target)
    return target


def _check_args(
    episodes: Sequence[ExpertEpisode],
    lr: float,
    steps: int | None,
    epochs: float | None,
    batch_size: int,
    micro_batch_tokens: int,
    warmup: int,
    max_grad_norm: float,
    loss_on: str,
) -> None:
    if loss_on not in ("actions", "all"):
        raise ConfigError(f"sft.loss_on: {loss_on!r} is not one of 'actions', 'all'")
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


@dataclass(frozen=True)
class StepPlan:
    """Everything the loop does, fixed before its first step: the episodes of each step and the
    rules of a step (learning-rate schedule, micro-batches, clipping, which tokens count)."""

    batches: list[list[int]]
    """episode indices of each optimizer step"""
    episodes: int
    batch_size: int
    lr: float
    warmup: int
    micro_batch_tokens: int
    max_grad_norm: float
    loss_on: LossOn
    pad_id: int
    seed: int

    @property
    def total(self) -> int:
        return len(self.batches)

    def lr_at(self, step: int) -> float:
        """The learning rate of step `step` (0-based): warm-up, then cosine decay to 10%."""
        return scheduled_lr(
            step,
            base_lr=self.lr,
            schedule="cosine",
            warmup=self.warmup,
            total=self.total,
            min_ratio=0.1,
        )


def plan_steps(
    episodes: Sequence[ExpertEpisode],
    tokenizer: Any,
    *,
    steps: int | None,
    epochs: float | None,
    batch_size: int,
    seed: int,
    lr: float,
    warmup: int,
    micro_batch_tokens: int,
    max_grad_norm: float,
    loss_on: LossOn,
) -> StepPlan:
    """The data side of a run: `steps` batches, or as many as `epochs` passes take, of a seeded
    per-epoch shuffle (`batch_order`), padded with the tokenizer's pad token (else EOS); the
    other settings pass through to the plan."""
    n = len(episodes)
    batch_size = min(batch_size, n)
    total = steps if steps is not None else max(1, math.ceil(epochs * math.ceil(n / batch_size)))
    pad = tokenizer.pad_token_id
    return StepPlan(
        batches=batch_order(n, batch_size, total, seed),
        episodes=n,
        batch_size=batch_size,
        lr=lr,
        warmup=warmup,
        micro_batch_tokens=micro_batch_tokens,
        max_grad_norm=max_grad_norm,
        loss_on=loss_on,
        pad_id=pad if pad is not None else (tokenizer.eos_token_id or 0),
        seed=seed,
    )


@dataclass
class Trainee:
    """The model being trained, its trainable parameters and their AdamW."""

    model: Any
    params: list[Tensor]
    optimizer: torch.optim.Optimizer

    @classmethod
    def of(cls, model: Any, lr: float, weight_decay: float) -> Trainee:
        params = [p for p in model.parameters() if p.requires_grad]
        return cls(model, params, torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay))

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device


def train_step(
    trainee: Trainee, batch: Sequence[ExpertEpisode], plan: StepPlan, lr: float
) -> tuple[float, int, float]:
    """One optimizer step on `batch` at learning rate `lr`: (its masked token-mean loss, its loss
    tokens, the gradient norm before clipping). Micro-batches of at most `micro_batch_tokens`
    padded tokens add their gradients up to the batch's token-mean; a gradient that is not
    finite is not applied."""
    for group in trainee.optimizer.param_groups:
        group["lr"] = lr
    n_tokens = sum(sum(_loss_mask(e, plan.loss_on)[1:]) for e in batch)
    trainee.optimizer.zero_grad(set_to_none=True)
    loss_sum = 0.0
    device = trainee.device
    lengths = [len(e) for e in batch]
    for micro in pack_by_length(lengths, range(len(batch)), plan.micro_batch_tokens):
        ids, attn, mask = _pad_batch([batch[i] for i in micro], plan.pad_id, plan.loss_on)
        part, _ = masked_token_loss_sum(
            trainee.model, ids.to(device), attn.to(device), mask.to(device)
        )
        (part / max(n_tokens, 1)).backward()
        loss_sum += float(part.detach())
    grad_norm = float(torch.nn.utils.clip_grad_norm_(trainee.params, plan.max_grad_norm))
    if math.isfinite(grad_norm):
        trainee.optimizer.step()
    return loss_sum / max(n_tokens, 1), n_tokens, grad_norm


class MetricsLog:
    """`sft_metrics.jsonl` in `out` (started fresh): one row every `every` steps and at the
    last; with no `out`, nothing."""

    def __init__(self, out: Path | None, every: int, total: int) -> None:
        self.path = out / METRICS_FILE if out is not None else None
        self.every, self.total = every, total
        self.started = time.perf_counter()
        self._file: Any = None

    def __enter__(self) -> MetricsLog:
        self.started = time.perf_counter()
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with atomic_write(self.path, "w", encoding="utf-8"):
                pass  # start a fresh log; rows are appended as the steps finish
            self._file = self.path.open("a", encoding="utf-8")
        return self

    def __exit__(self, *exc: object) -> None:
        if self._file is not None:
            self._file.close()

    def write(self, step: int, **values: float) -> None:
        if self._file is None or (step % self.every and step != self.total):
            return
        row = {"step": step, **values, "elapsed_s": round(time.perf_counter() - self.started, 3)}
        self._file.write(json.dumps(row) + "\n")
        self._file.flush()


@dataclass
class LossCurve:
    """What the loop measured: each step's loss and loss tokens, and how many were skipped."""

    losses: list[float] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)
    skipped: int = 0


def run_steps(
    trainee: Trainee,
    episodes: Sequence[ExpertEpisode],
    plan: StepPlan,
    metrics: MetricsLog,
    progress: bool,
) -> LossCurve:
    """The loop: every step of `plan`, logged and shown, under a forked torch RNG seeded with
    the plan's seed (dropout, if the model has any), so the caller's RNG is left as it was."""
    curve = LossCurve()
    trainee.model.train()
    with torch.random.fork_rng(devices=[]), SFTProgress(plan.total, enabled=progress) as bar:
        torch.manual_seed(plan.seed)
        for step, rows in enumerate(plan.batches):
            lr = plan.lr_at(step)
            loss, n_tokens, grad_norm = train_step(trainee, [episodes[i] for i in rows], plan, lr)
            curve.losses.append(loss)
            curve.tokens.append(n_tokens)
            if not math.isfinite(grad_norm):
                curve.skipped += 1
            metrics.write(step + 1, loss=loss, tokens=n_tokens, lr=lr, grad_norm=grad_norm)
            bar.step_done(step + 1, loss, lr)
    trainee.model.eval()
    return curve


def save_outputs(
    out: Path,
    trainee: Trainee,
    tokenizer: Any,
    plan: StepPlan,
    result: SFTResult,
    save: bool,
    base_path: str | None = None,
) -> SFTResult:
    """`sft_loss.png`, the model and tokenizer in `out/model` (with `save`; a LoRA model's
    adapter in `out/adapter` instead) and `sft_summary.json`, each written atomically; returns
    `result` with their paths."""
    result.plot_path = plot_losses(result.losses, out / PLOT_FILE)
    if save:
        result.model_dir = _save_trained(trainee.model, tokenizer, out, base_path)
    summary = {
        "steps": plan.total,
        "episodes": plan.episodes,
        "batch_size": plan.batch_size,
        "lr": plan.lr,
        "loss_on": plan.loss_on,
        "initial_loss": result.initial_loss,
        "final_loss": result.final_loss,
        "skipped_steps": result.skipped_steps,
        "wall_s": round(result.wall_s, 2),
    }
    write_json(out / "sft_summary.json", summary)
    return result


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
    base_path: str | None = None,
) -> SFTResult:
    """Train `model` in place on the action tokens of `episodes`; return the loss curve.

    Give `steps` (optimizer steps) or `epochs` (passes over the episodes). Each step takes
    `batch_size` episodes of a seeded per-epoch shuffle; rows are grouped into micro-batches of
    at most `micro_batch_tokens` padded tokens whose gradients add up to the batch's token-mean.
    AdamW, warm-up then cosine decay, gradient clipping; a step whose gradient is not finite is
    skipped. With `out_dir`: `sft_metrics.jsonl` (step, loss, tokens, lr, grad_norm),
    `sft_loss.png`, `sft_summary.json`, and (with `save`) the model and tokenizer in
    `out_dir/model`, written atomically. A peft `model` (adapters attached, `attach_lora`)
    trains its adapters alone and saves them in `out_dir/adapter` with the record of its base
    `base_path` (the `model.path` that loads it again).

    `loss_on="all"` also trains on the prompt and observation tokens. Predicting passages that
    repeat the names of the question and of earlier passages is what grows copying (induction)
    circuits; a small model trained on its actions alone tends to emit the names it saw most
    often instead of the ones it read. RL still trains on actions only.
    """
    _check_args(
        episodes, lr, steps, epochs, batch_size, micro_batch_tokens, warmup, max_grad_norm, loss_on
    )
    plan = plan_steps(  # data
        episodes,
        tokenizer,
        steps=steps,
        epochs=epochs,
        batch_size=batch_size,
        seed=seed,
        lr=lr,
        warmup=warmup,
        micro_batch_tokens=micro_batch_tokens,
        max_grad_norm=max_grad_norm,
        loss_on=loss_on,
    )
    out = Path(out_dir) if out_dir is not None else None
    trainee = Trainee.of(model, lr, weight_decay)  # model
    with MetricsLog(out, log_every, plan.total) as metrics:  # loop
        curve = run_steps(trainee, episodes, plan, metrics, progress)
    wall = time.perf_counter() - metrics.started
    result = SFTResult(
        curve.losses, curve.tokens, plan.total, wall, None, metrics.path, None, curve.skipped
    )
    if out is None:
        return result
    return save_outputs(out, trainee, tokenizer, plan, result, save, base_path)  # save
