"""What the trainer measures besides training: after each update, how it moved the batch's
likelihood (`lld/*`, the pooled shares, by mini-batch index, hidden-state similarity); every N
steps, the one-step probe and the fixed reference chains.

Every measurement runs on the policy's forward (`rollout_model`: under FSDP the unsharded
copy) with the random streams forked, so that it changes neither the weights nor the sampling.
"""

from __future__ import annotations

import contextlib
import copy
import logging
from collections.abc import Iterator, Sequence
from pathlib import Path

import torch

from llds import metrics as keys
from llds.config.algo import LLDSConfig
from llds.data.example import QAExample
from llds.evaluation.periodic import eval_rollout_config
from llds.monitor.likelihood import (
    displacement_metrics,
    group_correct_share,
    group_hidden_similarity,
    lld_share_metrics,
    mixed_group_rows,
    share_by_part,
)
from llds.policy.forward import (
    batched_log_probs,
    batched_log_probs_and_hidden,
    pooled_response_hidden,
)
from llds.policy.precision import Precision
from llds.probe.one_step import probe_metrics, run_probe
from llds.probe.reference import REFERENCE_FILE, ReferenceChains
from llds.probe.update import AdamSettings
from llds.rollout import RolloutBatch, RolloutEngine
from llds.train.config import TrainConfig
from llds.train.distributed import Dist
from llds.train.prompts import PromptEncoder

log = logging.getLogger("llds.train")


class Diagnostics:
    """The run's measurements, given what they measure: `forward` is the policy's forward (the
    trained module, or under FSDP its unsharded copy), `model` the trained module (put back in
    train mode after a measurement), `engine` the run's rollout engine (its limits, retriever,
    tokenizer and padding), `prompts(example)` the run's prompt encoder (with its template),
    `probe_set` the probe's fixed training questions."""

    def __init__(
        self,
        cfg: TrainConfig,
        dist: Dist,
        *,
        model: torch.nn.Module,
        forward: torch.nn.Module,
        precision: Precision,
        engine: RolloutEngine,
        prompts: PromptEncoder,
        probe_set: Sequence[QAExample],
    ) -> None:
        self.cfg = cfg
        self.dist = dist
        self.model = model
        self.rollout_model = forward
        self.precision = precision
        self.engine = engine
        self.prompts = prompts
        self.probe_set = probe_set
        self.reference: ReferenceChains | None = None

    # ------------------------------------------------------------------ after every update
    def after_update(
        self,
        batch: RolloutBatch,
        old_logp: torch.Tensor,
        adv: torch.Tensor,
        k: int,
        minibatch_of_row: Sequence[int],
    ) -> dict[str, float]:
        """Step `k`'s measurements once its updates are done: the displacement and the pooled
        shares, and every `hidden_similarity_every` steps the hidden-state similarity (from the
        displacement's own forward pass where the model allows, see `_after_update_logp`)."""
        every = self.cfg.diagnostics.hidden_similarity_every
        hidden_due = every > 0 and k % every == 0
        rows = self._displacement_rows(len(batch), k)
        pool = hidden_due and len(rows) == len(batch)
        new_logp, pooled = self._after_update_logp(batch.select(rows), pool)
        out = self.displacement(batch, old_logp, adv, rows, new_logp, minibatch_of_row)
        if hidden_due:
            out[keys.HIDDEN_COSINE] = self.hidden_similarity(batch, pooled)
        return out

    def _displacement_rows(self, b: int, k: int) -> list[int]:
        """The rows the displacement measures: all, or a seeded `sample_fraction` of them."""
        frac = self.cfg.diagnostics.sample_fraction
        if frac >= 1.0:
            return list(range(b))
        gen = torch.Generator().manual_seed(self.cfg.seed * 104_729 + k)
        return sorted(torch.randperm(b, generator=gen)[: max(1, round(frac * b))].tolist())

    def _after_update_logp(
        self, sub: RolloutBatch, pool_hidden: bool
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The policy's log-probs of `sub` after the update, and with `pool_hidden` each row's
        pooled last hidden state from the same forward pass (None when the model's head cannot
        be split off; `hidden_similarity` then runs its own pass)."""
        self.rollout_model.eval()  # after the update: under FSDP the refreshed copy
        try:
            with self.precision.autocast():
                budget = self.cfg.optim.logprob_tokens
                how = {
                    "temperature": self.cfg.rollout.temperature,
                    "prefix_sharing": self.cfg.rollout.prefix_sharing,
                }
                both = (
                    batched_log_probs_and_hidden(self.rollout_model, sub, budget, **how)
                    if pool_hidden
                    else None
                )
                if both is not None:
                    return both
                new_logp, _ = batched_log_probs(self.rollout_model, sub, budget, **how)
                return new_logp, None
        finally:
            self.model.train()

    def displacement(
        self,
        batch: RolloutBatch,
        old_logp: torch.Tensor,
        adv: torch.Tensor,
        rows: list[int],
        new_logp: torch.Tensor,
        minibatch_of_row: Sequence[int] = (),
    ) -> dict[str, float]:
        """How did this step's updates move the likelihood of the batch's `rows`, whose
        log-probs after the update are `new_logp`?"""
        sub = batch.select(rows)
        w = sub.response_len
        correct = torch.tensor([e.em > 0 for e in sub.episodes])
        out = displacement_metrics(
            old_logp[rows, :w], new_logp, sub.loss_mask, sub.action_index, correct, adv[rows]
        )
        shares = lld_share_metrics(
            old_logp[rows, :w],
            new_logp,
            sub.loss_mask,
            adv[rows],
            sub.group_ids,
            sub.rewards,
            group_accuracy=group_correct_share(batch.group_ids, batch.rewards),
        )
        out.update(self._pooled_over_processes(shares))
        if self.cfg.diagnostics.share_by_minibatch:
            parts = [minibatch_of_row[r] for r in rows]
            out.update(
                self._share_by_minibatch(old_logp[rows, :w], new_logp, sub, adv[rows], parts)
            )
        return out

    def _share_by_minibatch(
        self, before: torch.Tensor, after: torch.Tensor, sub: RolloutBatch, adv, parts: list[int]
    ) -> dict[str, float]:
        """`diagnostics.share_by_minibatch`: the share by mini-batch index, pooled over
        processes (counts summed)."""
        n_parts = self.cfg.optim.mini_batches
        table = torch.zeros(n_parts, 2, dtype=torch.float64)
        for part, (fell, n) in share_by_part(before, after, sub.loss_mask, adv, parts).items():
            table[part] = torch.tensor([fell, n], dtype=torch.float64)
        table = self.dist.sum(table)
        out: dict[str, float] = {}
        for part in range(n_parts):
            share_key, count_key = keys.minibatch_share_keys(part)
            fell, n = table[part].tolist()
            out[count_key] = n
            if n > 0:
                out[share_key] = fell / n
        return out

    def _pooled_over_processes(self, shares: dict[str, float]) -> dict[str, float]:
        """The step's LLD shares over every process's responses: counts summed, shares weighted
        by their counts (one all-reduce; every rank then holds the global values)."""
        if not self.dist.enabled:
            return shares
        pairs = list(keys.SHARE_COUNTS.items())
        fallen = [shares.get(s, 0.0) * shares[n] for s, n in pairs]
        counts = sorted(set(keys.SHARE_COUNTS.values()))
        total = self.dist.sum(torch.tensor(fallen + [shares[n] for n in counts])).tolist()
        pooled = dict(zip(counts, total[len(pairs) :], strict=True))
        for (share, n), f in zip(pairs, total[: len(pairs)], strict=True):
            if pooled[n] > 0:
                pooled[share] = f / pooled[n]
        return pooled

    def hidden_similarity(self, batch: RolloutBatch, pooled: torch.Tensor | None = None) -> float:
        """Fig. 3b of the paper: how alike the model represents correct and incorrect responses
        of the same question (after this step's update; the mixed groups only). `pooled` is
        every row's pooled hidden state when the displacement's pass computed it for all rows;
        else this runs its own pass over the mixed groups' rows."""
        correct = [e.em > 0 for e in batch.episodes]
        rows = mixed_group_rows(batch.group_ids, correct)
        if not rows:
            return float("nan")
        if pooled is not None and len(pooled) == len(batch):
            mixed = pooled[rows]
        else:
            sub = batch.select(rows)
            self.rollout_model.eval()
            with self.precision.autocast():
                mixed = pooled_response_hidden(
                    self.rollout_model, sub, self.cfg.optim.logprob_tokens
                )
            self.model.train()
        return group_hidden_similarity(
            mixed, [batch.group_ids[r] for r in rows], [correct[r] for r in rows]
        )

    # ------------------------------------------------------------------ every N steps
    def periodic(self, step: int, llds: LLDSConfig) -> dict[str, float]:
        """The measurements due after step `step`: the probe (`probe_every`, with the LLDS
        settings in force, `llds`) and the reference chains (`reference_every`)."""
        d, out = self.cfg.diagnostics, {}
        if self.probe_set and step % d.probe_every == 0:
            out.update(self.probe(llds))
        if self.reference is not None and step % d.reference_every == 0:
            with self.scoring_mode():
                out.update(
                    self.reference.metrics(
                        self.rollout_model, self.engine.pad_id, self.cfg.optim.logprob_tokens
                    )
                )
        return out

    def probe(self, llds: LLDSConfig) -> dict[str, float]:
        """The one-step probe on a float32 copy of the policy, with the run's objective (its
        extra terms included) and the LLDS settings in force (`llds`): the trained weights,
        optimizer and random streams are left exactly as they were."""
        cfg = self.cfg
        model = copy.deepcopy(self.rollout_model).float().requires_grad_(True)
        adamw = cfg.diagnostics.probe_optimizer == "adamw"  # the run's own optimizer and lr
        with self.forked_streams():
            results = run_probe(
                model,
                self.engine.tokenizer,
                self.engine.retriever,
                self.probe_set,
                group_size=cfg.rollout.group_size,
                rollout=self.engine.config,
                lr=cfg.optim.lr if adamw else cfg.diagnostics.probe_lr,
                optimizer=cfg.diagnostics.probe_optimizer,
                adam=AdamSettings(tuple(cfg.optim.betas), cfg.optim.eps, cfg.optim.weight_decay),
                seed=cfg.seed,
                template=self.prompts.template,
                chat=cfg.model.chat,
                progress=False,
                objective=cfg.algo,
                llds=llds,
            )
        del model
        return probe_metrics(results)

    def load_reference(
        self, run_dir: Path, step: int, examples: Sequence[QAExample] | None
    ) -> ReferenceChains | None:
        """The fixed reference chains (main process only; None when off): built from the
        starting policy at step 0 and written beside the run, read back on a resume, so that
        every `lld/ref_*` value is a change against the same start."""
        cfg = self.cfg
        d = cfg.diagnostics
        self.reference = None
        if d.reference_every <= 0 or not d.enabled or not self.dist.is_main:
            return None
        path = run_dir / REFERENCE_FILE
        if step > 0:
            if path.is_file():
                self.reference = ReferenceChains.read(path)
            else:
                log.warning(
                    "%s is missing: no lld/ref_* metrics in this resumed run (the reference "
                    "chains are built from the starting policy, at step 0)",
                    path,
                )
            return self.reference
        if examples is None:
            from llds.data.loaders import load_examples

            examples = load_examples(cfg.data.eval, limit=cfg.data.eval_limit)
        greedy = eval_rollout_config(
            self.engine.config, cfg.eval_max_turns if self.engine.retriever else 0
        )
        engine = RolloutEngine(
            self.rollout_model, self.engine.tokenizer, self.engine.retriever, greedy
        )
        with self.scoring_mode():
            chains = ReferenceChains.build(
                self.rollout_model,
                engine,
                [(self.prompts(ex), ex) for ex in examples],
                self.engine.pad_id,
                cfg.optim.logprob_tokens,
            )
        chains.write(path)
        self.reference = chains
        return chains

    # ------------------------------------------------------------------ contexts
    @contextlib.contextmanager
    def forked_streams(self) -> Iterator[None]:
        """The run's autocast with forked random streams: a diagnostic leaves the sampling
        streams exactly as they were."""
        devices = [torch.cuda.current_device()] if torch.cuda.is_available() else []
        with torch.random.fork_rng(devices=devices), self.precision.autocast():
            yield

    @contextlib.contextmanager
    def scoring_mode(self) -> Iterator[None]:
        """Eval mode on top of `forked_streams`, for a diagnostic forward pass of the policy."""
        was_training = self.rollout_model.training
        self.rollout_model.eval()
        try:
            with self.forked_streams():
                yield
        finally:
            self.rollout_model.train(was_training)
