"""The optimizer steps of one GRPO (+LLDS) step: mini-batches drawn from the global batch,
micro-batches accumulated to the mini-batch's exact gradient, clipping, the non-finite guard,
and the statistics of the objective.

Denominators (tokens, sequences, LLDS-preserving sequences) are counted over the GLOBAL
mini-batch, every process's rows, so that the gradients summed over processes equal the
single-process gradient; under FSDP every rank also makes as many forward/backward calls as the
rank with the most micro-batches.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Any

import torch

from llds import metrics as keys
from llds.algo.llds import preserving_mask
from llds.algo.llds_in_force import LLDSInForce
from llds.algo.objective import TermInputs, grpo_objective, llds_term
from llds.algo.rollout_correction import importance_weights
from llds.errors import ConfigError
from llds.monitor.mismatch import correction_metrics
from llds.monitor.turns import void_turn_count
from llds.policy.forward import (
    log_probs_from_states,
    mini_batch_prompts,
    plan_micro_batches,
    response_log_probs,
)
from llds.policy.precision import Precision, update_ratio
from llds.policy.prompt_once import MiniBatchPrompts, tail_micro_batches
from llds.rollout import RolloutBatch
from llds.train import fsdp
from llds.train.config import TrainConfig
from llds.train.distributed import Dist
from llds.train.global_batch import Counts, global_counts, mini_batches
from llds.train.update_stats import UpdateStats

log = logging.getLogger("llds.train")
FILTERED_SHARE = keys.TURNS_FILTERED_SHARE
"""share of the batch's rollouts left out of the loss for a void turn (`algo.filter_void_turns`)"""


class NonFiniteError(RuntimeError):
    """Too many non-finite losses or gradients in a row: the run stops instead of diverging."""


@dataclass(frozen=True)
class UpdateInputs:
    """What every micro-batch of a step reads: the rollout batch, its advantages, pi_old's and
    the reference's log-probs, the LLDS the step applies (the rest of the loss's settings are
    the run's `cfg.algo`), the loss mask (the batch's, less the rollouts
    `algo.filter_void_turns` leaves out) and the importance weights of `algo.rollout_correction`
    (None: unweighted)."""

    batch: RolloutBatch
    adv: torch.Tensor
    old_logp: torch.Tensor
    ref_logp: torch.Tensor | None
    llds: LLDSInForce
    loss_mask: torch.Tensor
    is_weights: torch.Tensor | None = None


def void_turn_keep(batch: RolloutBatch) -> torch.Tensor:
    """`[B]` bool: the rollouts without a void turn (a turn that parses as neither a search nor
    an answer, counted as `turns/void_share` counts it). SimpleTIR (arXiv 2509.02479) leaves the
    others out of the loss; their rewards still count in their groups' advantages."""
    return torch.tensor([void_turn_count(ep.action_texts) == 0 for ep in batch.episodes])


def step_loss_mask(batch: RolloutBatch, filter_void: bool) -> tuple[torch.Tensor, float | None]:
    """The loss mask of the step and the share of rollouts filtered out (None: no filter)."""
    if not filter_void:
        return batch.loss_mask, None
    keep = void_turn_keep(batch)
    share = float((~keep).float().mean()) if len(keep) else 0.0
    return batch.loss_mask * keep.to(batch.loss_mask.dtype).unsqueeze(-1), share


def step_is_weights(
    cfg: TrainConfig, batch: RolloutBatch, old_logp: torch.Tensor, loss_mask: torch.Tensor
) -> tuple[torch.Tensor | None, dict[str, float]]:
    """`algo.rollout_correction`'s per-token weights of the step (None: off) and their metrics.

    A correction is on only with a sampling copy (`rollout.dtype`; the config refuses it
    otherwise): the weights come from the copy's log-probs against pi_old."""
    rc = cfg.algo.rollout_correction
    if rc.mode == "off":
        return None, {}
    mask = loss_mask.to(old_logp.device)
    if batch.rollout_logprobs is None:
        raise RuntimeError(
            "algo.rollout_correction needs the sampler's log-probs, and this rollout batch has "
            "none (an action was appended without them)"
        )
    weights, clipped = importance_weights(
        old_logp,
        batch.rollout_logprobs.to(old_logp.device),
        mask,
        mode=rc.mode,
        level=rc.level,
        cap=rc.cap,
    )
    return weights, correction_metrics(weights, clipped, mask)


class PolicyUpdate:
    """Owns the optimizer steps of a run and the counters the non-finite guard keeps across
    steps (saved in every checkpoint by the trainer)."""

    def __init__(
        self,
        cfg: TrainConfig,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        scaler: Any,
        precision: Precision,
        dist: Dist,
        *,
        sharded: bool,
    ) -> None:
        self.cfg = cfg
        self.model = model
        self.optimizer = optimizer
        self.scaler = scaler  # a GradScaler under float16 autocast, else None
        self.precision = precision
        self.dist = dist
        self.sharded = sharded
        self.nonfinite_in_a_row = 0
        self.skipped_updates = 0
        self.minibatch_of_row: list[int] = []
        """each local row's mini-batch index (0-based, first epoch) in the last step's update"""
        if sharded and cfg.algo.llds.scope == "batch":
            raise ConfigError(
                "algo.llds.scope=batch is not supported with FSDP (parallel.fsdp): each rank "
                "would draw a different number of extra forward passes; use scope=minibatch"
            )

    def run(
        self,
        batch: RolloutBatch,
        adv: torch.Tensor,
        old_logp: torch.Tensor,
        ref_logp: torch.Tensor | None,
        k: int,
        global_rows: list[int],
        llds: LLDSInForce,
    ) -> dict[str, float]:
        """Step `k`'s `mini_batches x epochs` optimizer steps on `batch`; returns their stats.

        `global_rows`: each local row's index in the step's global batch, so that mini-batches
        are drawn from the global batch as a single process would draw them. `llds`: the LLDS
        the step applies (the config's, or after a rollback LLDS on)."""
        cfg, optim = self.cfg, self.cfg.optim
        loss_mask, filtered = step_loss_mask(batch, cfg.algo.filter_void_turns)
        is_weights, correction = step_is_weights(cfg, batch, old_logp, loss_mask)
        inputs = UpdateInputs(batch, adv, old_logp, ref_logp, llds, loss_mask, is_weights)
        params = [p for p in self.model.parameters() if p.requires_grad]
        start = self._snapshot(params)
        n_global = cfg.prompts_per_step * cfg.rollout.group_size
        gen = torch.Generator().manual_seed(cfg.seed * 7_919 + k)
        rest_gen = torch.Generator().manual_seed((cfg.seed * 15_485_863 + k) * 64 + self.dist.rank)
        stats = UpdateStats()
        self.minibatch_of_row = [0] * len(batch)
        for epoch in range(optim.epochs):
            cut = mini_batches(
                gen,
                global_rows,
                n_global,
                optim.mini_batches,
                optim.minibatch_order,
                cfg.rollout.group_size,
            )
            for part, rows in enumerate(cut):
                if epoch == 0:
                    for row in rows:
                        self.minibatch_of_row[row] = part
                first = stats.start_mini_batch()
                llds_acts = llds.acts(first)
                counts = global_counts(self.dist, loss_mask[rows], adv[rows])
                self.optimizer.zero_grad(set_to_none=True)
                prompts = self._shared_prompts(batch, rows)
                # with shared prompts, micro-batches of responses alone
                plan = (
                    plan_micro_batches(batch, rows, optim.micro_batch_tokens)
                    if prompts is None
                    else tail_micro_batches(batch, optim.micro_batch_tokens, rows)
                )
                self._match_busiest_rank(batch, plan)
                for micro in plan:
                    loss, st = self._loss(inputs, micro, counts, first, prompts)
                    stats.add(
                        st, _token_share(loss_mask, micro, rows), first=first, llds_acts=llds_acts
                    )
                    self._backward(loss)
                if prompts is not None:
                    prompts.backward()  # the prompts' own pass, once per mini-batch
                if llds_acts and llds.reaches_rest_of_batch:
                    stats.add_rest(*self._rest_of_batch_llds(inputs, rows, rest_gen))
                stats.add_update(self._clipped_step(params, k))
        out = stats.summary(optim.mini_batches * optim.epochs, self.dist.world)
        out[keys.SKIPPED_TOTAL] = self.skipped_updates
        if start is not None:
            out[keys.UPDATE_RATIO] = self._update_ratio(start, params)
        if llds.on:
            out["llds/answer_weight"] = llds.answer_weight
        out.update(correction)
        if filtered is not None:
            out[FILTERED_SHARE] = filtered
        self.optimizer.zero_grad(set_to_none=True)
        return out

    def _shared_prompts(self, batch: RolloutBatch, rows: list[int]) -> MiniBatchPrompts | None:
        """With `rollout.prefix_sharing`, the mini-batch's distinct prompts run once (with
        autograd) before its micro-batches, which then hold responses only
        (`llds.policy.prompt_once.MiniBatchPrompts`); None: whole rows per micro-batch. Never
        under FSDP, where every rank must make the same model calls."""
        if not self.cfg.rollout.prefix_sharing or self.sharded:
            return None
        with self.precision.autocast():
            return mini_batch_prompts(self.model, batch, rows, self.cfg.optim.micro_batch_tokens)

    def _backward(self, loss: torch.Tensor) -> None:
        (loss if self.scaler is None else self.scaler.scale(loss)).backward()

    def _rest_of_batch_llds(
        self, inputs: UpdateInputs, own_rows: list[int], gen: torch.Generator
    ) -> tuple[float, int]:
        """`algo.llds.scope: batch`: the LLDS term of a sample of preserving responses from the
        rest of the rollout batch (not in this mini-batch), normalized over that sample, its
        gradient added to the mini-batch's. Returns this process's share of the term's value
        and the number of responses it drew."""
        llds = inputs.llds
        preserving = preserving_mask(inputs.adv, inputs.loss_mask).any(-1).tolist()
        rows = rest_of_batch_rows(preserving, own_rows, llds.settings.batch_rows, gen)
        sequences = self.dist.sum(torch.tensor(len(rows))).float().clamp(min=1)
        tokens = self.dist.sum(inputs.loss_mask[rows].sum()).float().clamp(min=1)
        total = 0.0
        for micro in plan_micro_batches(inputs.batch, rows, self.cfg.optim.micro_batch_tokens):
            sub = inputs.batch.select(micro)
            w = sub.response_len
            with self.precision.autocast():
                lp, _ = response_log_probs(
                    self.model,
                    sub,
                    temperature=self.cfg.rollout.temperature,
                    share_prompts=not self.sharded,
                )
            reg, _ = llds_term(
                lp,
                inputs.old_logp[micro, :w].to(lp.device),
                inputs.adv[micro].to(lp.device),
                inputs.loss_mask[micro, :w].to(lp.device),
                llds.settings,
                answer_mask=sub.answer_mask.to(lp.device) if llds.masks_answer else None,
                answer_weight=llds.answer_weight,
                num_sequences=sequences,
                num_tokens=tokens,
            )
            self._backward(reg)
            total += float(reg.detach())
        return total, len(rows)

    def _loss(
        self,
        inputs: UpdateInputs,
        micro: list[int],
        counts: Counts,
        first: bool,
        prompts: MiniBatchPrompts | None = None,
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """One micro-batch's forward pass and its share of the mini-batch's objective (after
        the mini-batch's shared `prompts` when given); `first`: of the batch's first update."""
        cfg = self.cfg
        sub = inputs.batch.select(micro)
        w = sub.response_len
        dev = next(self.model.parameters()).device
        ref, weights = inputs.ref_logp, inputs.is_weights

        def on_device(t: torch.Tensor | None) -> torch.Tensor | None:
            # copied before the forward is queued: a copy to a GPU waits for what is queued
            return None if t is None else t.to(dev)

        old_logp, adv = on_device(inputs.old_logp[micro, :w]), on_device(inputs.adv[micro])
        loss_mask = on_device(inputs.loss_mask[micro, :w])
        ref_logp = on_device(None if ref is None else ref[micro, :w])
        is_weights = on_device(None if weights is None else weights[micro, :w])
        answer_mask = on_device(sub.answer_mask) if inputs.llds.masks_answer else None
        how = {"temperature": cfg.rollout.temperature, "with_entropy": cfg.algo.entropy_coef > 0}
        with self.precision.autocast():
            if prompts is None:
                lp, ent = response_log_probs(self.model, sub, share_prompts=not self.sharded, **how)
            else:
                lp, ent = log_probs_from_states(
                    self.model, sub, lambda: prompts.tail_states(sub, micro), **how
                )
        x = TermInputs(
            log_probs=lp,
            old_log_probs=old_logp,
            advantages=adv,
            loss_mask=loss_mask,
            ref_log_probs=ref_logp,
            entropy=ent,
            answer_mask=answer_mask,
            llds=inputs.llds,
            first_update=first,
            num_sequences=counts.sequences,
            num_tokens=counts.tokens,
            num_preserving=counts.preserving,
            is_weights=is_weights,
        )
        return grpo_objective(x, cfg.algo)

    def _match_busiest_rank(self, batch: RolloutBatch, plan: list[list[int]]) -> None:
        """Under FSDP every rank must make as many forward/backward calls (collectives) as the
        rank with the most micro-batches: the others add passes that contribute nothing."""
        if not self.sharded:
            return
        for _ in range(fsdp.max_over_ranks(len(plan)) - len(plan)):
            self._zero_weight_backward(batch, plan[0] if plan else [0])

    def _snapshot(self, params: list[torch.nn.Parameter]) -> list[torch.Tensor] | None:
        """The trainable weights before the step, when `optim/update_ratio` is logged."""
        d = self.cfg.diagnostics
        return [_local(p).clone() for p in params] if d.enabled and d.update_ratio else None

    def _update_ratio(self, start: list[torch.Tensor], params: list[torch.nn.Parameter]) -> float:
        """||delta theta|| / ||theta|| over the step; under FSDP over every rank's shard."""
        moved, size = update_ratio(start, [_local(p) for p in params])
        if self.sharded:  # each rank holds a shard: sum both parts over ranks
            moved, size = float(self.dist.sum(moved)), float(self.dist.sum(size))
        return math.sqrt(moved / size) if size > 0 else 0.0

    def _clipped_step(self, params: list[torch.nn.Parameter], k: int) -> float | None:
        """Sum the gradients over processes, clip them and step the optimizer; returns the norm
        before clipping, or None when it is not finite (the update is skipped, and too many in a
        row stop the run)."""
        cfg = self.cfg
        # null = no clipping: the norm is still measured (and logged), nothing is scaled
        max_norm = math.inf if cfg.optim.grad_clip is None else cfg.optim.grad_clip
        if self.sharded:  # FSDP has already summed the gradients into each shard
            norm = fsdp.clip_grad_norm(params, max_norm)
        else:
            self.dist.sum_grads(params)
            if self.scaler is not None:
                self.scaler.unscale_(self.optimizer)
            norm = torch.nn.utils.clip_grad_norm_(params, max_norm)
        if not torch.isfinite(norm):
            self.optimizer.zero_grad(set_to_none=True)
            if self.scaler is not None:  # float16 overflow: lower the loss scale, go on
                self.scaler.update()
            self.nonfinite_in_a_row += 1
            self.skipped_updates += 1
            log.warning(
                "step %d: non-finite gradient, update skipped (%d in a row)",
                k,
                self.nonfinite_in_a_row,
            )
            if self.nonfinite_in_a_row >= cfg.optim.max_nonfinite_in_a_row:
                raise NonFiniteError(
                    f"{self.nonfinite_in_a_row} non-finite gradients in a row at step {k}; "
                    "stopping (optim.max_nonfinite_in_a_row)"
                )
            return None
        self.nonfinite_in_a_row = 0
        if self.scaler is None:
            self.optimizer.step()
        else:
            self.scaler.step(self.optimizer)
            self.scaler.update()
        return float(norm)

    def _zero_weight_backward(self, batch: RolloutBatch, rows: list[int]) -> None:
        """A forward/backward that adds nothing to the gradient: under FSDP every rank must take
        part in as many collective passes as the rank with the most micro-batches."""
        with self.precision.autocast():
            lp, _ = response_log_probs(
                self.model,
                batch.select(rows),
                temperature=self.cfg.rollout.temperature,
                share_prompts=False,
            )
        (lp.sum() * 0.0).backward()


def rest_of_batch_rows(
    preserving: list[bool], own_rows: list[int], n: int, gen: torch.Generator
) -> list[int]:
    """`algo.llds.scope: batch`: up to `n` rows drawn without replacement from the preserving
    rows outside the mini-batch `own_rows`, in row order."""
    own = set(own_rows)
    pool = [r for r, keep in enumerate(preserving) if keep and r not in own]
    picks = torch.randperm(len(pool), generator=gen)[:n].tolist()
    return sorted(pool[i] for i in picks)


def _token_share(loss_mask: torch.Tensor, micro: list[int], rows: list[int]) -> float:
    """A micro-batch's share of this process's tokens of its mini-batch: the weight of its
    per-token fractions in the mini-batch's."""
    return float(loss_mask[micro].sum()) / max(1.0, float(loss_mask[rows].sum()))


def _local(t: torch.Tensor) -> torch.Tensor:
    """A parameter's local data: the shard of a sharded (DTensor) parameter, else itself."""
    t = t.detach()
    return t.to_local() if hasattr(t, "to_local") else t
