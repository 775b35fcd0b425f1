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
from collections import Counter
from collections.abc import Sequence
from typing import Any

import torch

from llds import metrics as keys
from llds.algo import answer_weight_schedule, preserving_mask
from llds.algo.objective import LLDS_STATS, POLICY_STATS, Objective, grpo_objective
from llds.policy.forward import plan_micro_batches, response_log_probs
from llds.policy.precision import Precision, update_ratio
from llds.rollout import RolloutBatch
from llds.train import fsdp
from llds.train.config import AlgoConfig, TrainConfig
from llds.train.distributed import Dist

log = logging.getLogger("llds.train")


class NonFiniteError(RuntimeError):
    """Too many non-finite losses or gradients in a row: the run stops instead of diverging."""


def objective_for(algo: AlgoConfig, llds_coef: float) -> Objective:
    """The loss's settings from the config, with LLDS's coefficient of this step."""
    lc = algo.llds
    return Objective(
        clip_low=algo.clip_low,
        clip_high=algo.clip_high,
        ratio_type=algo.ratio_type,
        dual_clip=algo.dual_clip,
        aggregation=algo.aggregation,
        kl_coef=algo.kl_coef,
        kl_kind=algo.kl_kind,
        entropy_coef=algo.entropy_coef,
        llds_coef=llds_coef,
        llds_gate=lc.gate,
        llds_aggregation=lc.aggregation,
    )


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

    def run(
        self,
        batch: RolloutBatch,
        adv: torch.Tensor,
        old_logp: torch.Tensor,
        ref_logp: torch.Tensor | None,
        k: int,
        global_rows: list[int],
        llds_coef: float,
    ) -> dict[str, float]:
        """Step `k`'s `mini_batches x epochs` optimizer steps on `batch`; returns their stats.

        `global_rows`: each local row's index in the step's global batch, so that mini-batches
        are drawn from the global batch as a single process would draw them. `llds_coef`: LLDS's
        coefficient for this step (0 = off; a rollback may turn it on)."""
        cfg, algo, lc = self.cfg, self.cfg.algo, self.cfg.algo.llds
        use_llds = llds_coef > 0
        objective = objective_for(algo, llds_coef)
        beta = self._answer_weight(batch) if (use_llds and lc.mask_answer) else 1.0
        params = [p for p in self.model.parameters() if p.requires_grad]
        track = cfg.diagnostics.enabled and cfg.diagnostics.update_ratio
        start = [_local(p).clone() for p in params] if track else None
        local_of = {gid: local for local, gid in enumerate(global_rows)}
        n_global = cfg.prompts_per_step * cfg.rollout.group_size
        gen = torch.Generator().manual_seed(cfg.seed * 7_919 + k)
        acc: Counter[str] = Counter()
        extremes: dict[str, float] = {}
        grad_norms: list[float] = []
        n_updates = 0
        first_mini_batches = 0
        for _ in range(cfg.optim.epochs):
            order = torch.randperm(n_global, generator=gen).tolist()
            for part in _split(order, cfg.optim.mini_batches):
                mb = [local_of[gid] for gid in part if gid in local_of]  # this rank's rows
                # Before the batch's first successful optimizer step pi_theta == pi_old: d is
                # rounding noise only, and LLDS is exactly 0 unless the authors' behaviour is asked
                first = n_updates == 0
                first_mini_batches += first
                llds_acts = use_llds and (not first or lc.first_update == "computed")
                # denominators over the GLOBAL mini-batch (all ranks), so summed gradients equal
                # the single-process gradient
                lm = batch.loss_mask[mb]
                n_tok = self.dist.sum(lm.sum()).float().clamp(min=1)
                n_seq = self.dist.sum(lm.any(-1).sum()).float().clamp(min=1)
                n_pre = (
                    self.dist.sum(preserving_mask(adv[mb], lm).any(-1).sum()).float().clamp(min=1)
                )
                self.optimizer.zero_grad(set_to_none=True)
                plan = plan_micro_batches(batch, mb, cfg.optim.micro_batch_tokens)
                if self.sharded:  # every rank must make as many forward/backward calls
                    for _ in range(fsdp.max_over_ranks(len(plan)) - len(plan)):
                        self._zero_weight_backward(batch, plan[0] if plan else [0])
                for micro in plan:
                    sub = batch.select(micro)
                    w = sub.response_len
                    need_ent = algo.entropy_coef > 0
                    with self.precision.autocast():
                        lp, ent = response_log_probs(
                            self.model,
                            sub,
                            temperature=cfg.rollout.temperature,
                            with_entropy=need_ent,
                            share_prompts=not self.sharded,
                        )
                    mask = sub.loss_mask.to(lp.device)
                    old = old_logp[micro, :w].to(lp.device)
                    a = adv[micro].to(lp.device)
                    loss, st = grpo_objective(
                        lp,
                        old,
                        a,
                        mask,
                        objective,
                        ref_log_probs=None
                        if ref_logp is None
                        else ref_logp[micro, :w].to(lp.device),
                        entropy=ent,
                        answer_mask=sub.answer_mask.to(lp.device) if lc.mask_answer else None,
                        answer_weight=beta,
                        llds_acts=llds_acts,
                        num_sequences=n_seq,
                        num_tokens=n_tok,
                        num_preserving=n_pre,
                    )
                    share = float(mask.sum()) / max(1.0, float(lm.sum()))  # local mean weights
                    _accumulate(acc, extremes, st, share, first=first, llds_acts=llds_acts)
                    (loss if self.scaler is None else self.scaler.scale(loss)).backward()
                norm = self._clipped_step(params, k)
                if norm is None:  # non-finite: skipped
                    continue
                grad_norms.append(norm)
                n_updates += 1
        n_mb = cfg.optim.mini_batches * cfg.optim.epochs
        out = {key: val / n_mb for key, val in acc.items()}
        if (
            keys.LLDS_FIRST_STEP_GATE_FRAC in acc
        ):  # measured on one mini-batch, not averaged over all
            out[keys.LLDS_FIRST_STEP_GATE_FRAC] = acc[keys.LLDS_FIRST_STEP_GATE_FRAC] / max(
                1, first_mini_batches
            )
        for key in (keys.PG_LOSS, keys.KL, keys.LLDS_LOSS):
            if key in out:  # this rank's share of a global sum: the cross-rank mean restores it
                out[key] *= self.dist.world
        out.update(extremes)
        out[keys.GRAD_NORM] = sum(grad_norms) / len(grad_norms) if grad_norms else float("nan")
        out["policy/grad_norm_max"] = max(grad_norms) if grad_norms else float("nan")
        out["optim/updates"] = n_updates
        out[keys.SKIPPED_TOTAL] = self.skipped_updates
        if start is not None:
            moved, size = update_ratio(start, [_local(p) for p in params])
            if self.sharded:  # each rank holds a shard: sum both parts over ranks
                moved, size = float(self.dist.sum(moved)), float(self.dist.sum(size))
            out[keys.UPDATE_RATIO] = math.sqrt(moved / size) if size > 0 else 0.0
        if use_llds:
            out["llds/answer_weight"] = beta
        self.optimizer.zero_grad(set_to_none=True)
        return out

    def _clipped_step(self, params: list[torch.nn.Parameter], k: int) -> float | None:
        """Sum the gradients over processes, clip them and step the optimizer; returns the norm
        before clipping, or None when it is not finite (the update is skipped, and too many in a
        row stop the run)."""
        cfg = self.cfg
        if self.sharded:  # FSDP has already summed the gradients into each shard
            norm = fsdp.clip_grad_norm(params, cfg.optim.grad_clip)
        else:
            self.dist.sum_grads(params)
            if self.scaler is not None:
                self.scaler.unscale_(self.optimizer)
            norm = torch.nn.utils.clip_grad_norm_(params, cfg.optim.grad_clip)
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

    def _answer_weight(self, batch: RolloutBatch) -> float:
        """LLDS-MA's answer weight: the config's fixed one, else from the global batch."""
        lc = self.cfg.algo.llds
        if lc.answer_weight is not None:
            return lc.answer_weight
        return global_answer_weight(batch.episodes, self.dist, lc.answer_baseline)

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


def global_answer_weight(episodes: Sequence[Any], dist: Dist, baseline: float) -> float:
    """LLDS-MA's beta = min(V / baseline, 1) with V the mean valid searches per rollout of the
    GLOBAL batch (every process's rollouts): each rank then weights answers alike. A per-rank
    beta would differ between ranks whenever the clip at 1 acts on one of them."""
    searches = dist.sum(sum(e.num_valid_searches for e in episodes))
    rollouts = dist.sum(len(episodes))
    return answer_weight_schedule(float(searches) / max(1.0, float(rollouts)), baseline)


def _accumulate(
    acc: Counter[str],
    extremes: dict[str, float],
    stats: dict[str, torch.Tensor],
    share: float,
    *,
    first: bool,
    llds_acts: bool,
) -> None:
    """Add one micro-batch's objective stats to the mini-batch's: losses are shares of a global
    sum (added), fractions are weighted by the micro-batch's share of the tokens, ratio extremes
    are extremes; LLDS's gate on the batch's first step is kept apart (it measures noise)."""
    acc[keys.PG_LOSS] += float(stats[keys.PG_LOSS])
    for key in POLICY_STATS:
        acc[f"policy/{key}"] += float(stats[f"policy/{key}"]) * share
    extremes[keys.RATIO_MAX] = max(
        extremes.get(keys.RATIO_MAX, -1e30), float(stats[keys.RATIO_MAX])
    )
    extremes[keys.RATIO_MIN] = min(extremes.get(keys.RATIO_MIN, 1e30), float(stats[keys.RATIO_MIN]))
    if keys.KL in stats:
        acc[keys.KL] += float(stats[keys.KL])
    if keys.LLDS_GATE_FRAC not in stats:
        return
    if first:
        acc[keys.LLDS_FIRST_STEP_GATE_FRAC] += float(stats[keys.LLDS_GATE_FRAC]) * share
    if llds_acts:
        acc[keys.LLDS_LOSS] += float(stats[keys.LLDS_LOSS])
        for key in LLDS_STATS:
            acc[f"llds/{key}"] += float(stats[f"llds/{key}"]) * share


def _local(t: torch.Tensor) -> torch.Tensor:
    """A parameter's local data: the shard of a sharded (DTensor) parameter, else itself."""
    t = t.detach()
    return t.to_local() if hasattr(t, "to_local") else t


def _split(order: list[int], parts: int) -> list[list[int]]:
    size, extra = divmod(len(order), parts)
    out, start = [], 0
    for i in range(parts):
        end = start + size + (1 if i < extra else 0)
        out.append(order[start:end])
        start = end
    return out  # possibly empty parts: every rank must take the same number of optimizer steps
