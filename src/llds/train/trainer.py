"""The GRPO (+LLDS) training loop for search agents.

One step: sample a rollout batch (G rollouts per question, multi-turn, with search) -> reward ->
group advantages -> old log-probs (from the rollout's own sampling passes in float32, else a
no-grad forward pass) -> reference log-probs (KL) ->
`mini_batches x epochs` optimizer steps on policy loss + KL + entropy bonus + LLDS -> LLD
diagnostics -> metrics -> periodic atomic checkpoint.

The constructor builds the run's pieces in order, one `llds.train.build` function each; the
optimizer steps are `llds.train.policy_update.PolicyUpdate`.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from llds.algo import group_advantages
from llds.algo.llds_in_force import LLDSInForce, llds_in_force
from llds.config.loader import to_dict
from llds.data.example import QAExample
from llds.errors import ServiceUnavailableError
from llds.evaluation.periodic import is_due
from llds.monitor.alarms import Alarm
from llds.monitor.rollout_metrics import rollout_metrics
from llds.policy.float_env import float_environment
from llds.retrieval.client import RetrievalServiceError
from llds.retrieval.faults import DegradingRetriever
from llds.rollout import RolloutBatch, RolloutRequest
from llds.runs.tracking import read_metrics
from llds.train import build, fsdp
from llds.train.checkpoint import set_rng_state
from llds.train.config import TrainConfig
from llds.train.distributed import Dist
from llds.train.global_batch import global_mean_searches
from llds.train.outage import generate_on_every_rank, retriever_gone_message
from llds.train.phase_profile import summary_line, write_step_profile
from llds.train.progress import PhaseTimes, StepProgress
from llds.train.prompts import PromptStream
from llds.train.resume import FLOAT_ENV_KEY, apply_optimizer_changes, prepare_run_dir
from llds.train.rollback import (
    CollapseAlarmStop,
    decide,
    new_monitor,
    rollback_llds,
    rollback_target,
)
from llds.train.run_log import RunLog
from llds.train.saving import RunState
from llds.train.step_logprobs import old_logprobs, reference_logprobs

__all__ = ["CollapseAlarmStop", "GRPOTrainer", "rollout_seed"]

log = logging.getLogger("llds.train")


class GRPOTrainer:
    """Trains `model` with GRPO + LLDS. Pass live objects to bypass loading (Python API, tests).

    `resume`: continue from the newest valid checkpoint in `cfg.run_dir` (an earlier run without
    one is refused); False moves an earlier run aside and starts at step 0.
    `allow_config_change`: dotted keys (or sections, or `all`) a resume may change; other
    differences from the checkpoint's config are refused (see `llds.train.resume`)."""

    def __init__(
        self,
        cfg: TrainConfig,
        *,
        model=None,
        tokenizer=None,
        retriever=None,
        train_examples: Sequence[QAExample] | None = None,
        eval_examples: Sequence[QAExample] | None = None,
        resume: bool = True,
        allow_config_change: str | Sequence[str] | None = None,
    ) -> None:
        """Build the run's parts, in order; a resume restores its checkpoint into them."""
        dist = self.dist = Dist()
        self.cfg, self.run_dir = cfg, Path(cfg.run_dir)
        torch.manual_seed(cfg.seed)
        build.check_run(cfg, dist)
        start = build.resume_point(
            cfg, dist, resume=resume, allow_config_change=allow_config_change
        )
        # the questions and the retriever first: bad data or a dead service before weights load
        examples = build.train_examples(cfg, train_examples)
        self.retriever = build.degrading(cfg, build.retriever(cfg, retriever))
        # the parts, in order (each one `llds.train.build` function)
        policy = build.policy(cfg, dist, start.checkpoint, model, tokenizer)
        self.model, self.tokenizer, self.precision, self.ref_model = policy
        self.sampler = build.sampler(cfg, build.rollout_model(cfg, dist, policy))
        self.stream, prompts = PromptStream(examples, cfg.seed), build.prompts(cfg, self.tokenizer)
        self.prompt_ids = prompts
        self.engine = build.rollout_engine(cfg, self.sampler.model, self.tokenizer, self.retriever)
        self.evaluator = build.periodic_evaluator(cfg, dist, eval_examples, self.engine, prompts)
        self.updater = build.update(cfg, dist, policy)
        self.scheduler = build.scheduler(cfg, self.optimizer)
        self.checkpoints = build.checkpoints(cfg, dist, self._run_state(), prompts.template)
        self.step = 0 if start.checkpoint is None else self._resume(start)
        prepare_run_dir(self.run_dir, start.checkpoint, start.damaged, resume=resume, dist=dist)
        self.diagnostics = build.diagnostics(
            cfg, dist, policy, self.sampler, self.engine, prompts, examples
        )
        held_out = self.evaluator.examples if self.evaluator is not None else eval_examples
        self.diagnostics.load_reference(self.run_dir, self.step, held_out)
        self.run_log = RunLog(cfg, self.run_dir, dist)
        self.monitor = new_monitor(cfg, self.run_dir, self.step)
        self.rollbacks, self._compile_seconds = 0, 0.0  # the engine's compile time already logged
        self.llds_settings = cfg.algo.llds
        """the LLDS settings in force: the config's, swapped once by a rollback (LLDS on); each
        step's `LLDSInForce` is built from them"""

    @property
    def optimizer(self) -> torch.optim.Optimizer:
        return self.updater.optimizer

    @property
    def rollout_model(self):
        """The policy's forward that scores pi_old: the policy, or under FSDP its unsharded copy
        (the sampler's `policy`)."""
        return self.sampler.policy

    @property
    def reference(self):
        """The fixed reference chains of `diagnostics.reference_every` (None when off)."""
        return self.diagnostics.reference

    def _resume(self, start: build.ResumePoint) -> int:
        """Continue from `start`'s checkpoint, whose weights `build.policy` has loaded: the
        optimizer, schedule, loss scale, random streams and guard counters; returns its step."""
        assert start.checkpoint is not None
        state, blobs = self.checkpoints.restore(start.checkpoint, weights=False)
        set_rng_state(blobs["rng"])
        apply_optimizer_changes(self.optimizer, self.scheduler, self.cfg, start.changed)
        self.updater.nonfinite_in_a_row = int(state.get("nonfinite_in_a_row", 0))
        self.updater.skipped_updates = int(state.get("skipped_updates", 0))
        log.info("resumed from %s at step %d", start.checkpoint, int(state["step"]))
        return int(state["step"])

    # ------------------------------------------------------------------ loop
    def train(
        self, steps: int | None = None, *, progress: bool | None = None
    ) -> list[dict[str, Any]]:
        """Run until `cfg.steps` (or `steps` more); returns this call's metric rows."""
        cfg = self.cfg
        target = cfg.steps if steps is None else self.step + steps
        show = (cfg.logging.progress if progress is None else progress) and self.dist.is_main
        self.run_log.open(self.step)
        rows: list[dict[str, Any]] = []
        try:
            with StepProgress(target, self.step, enabled=show) as progress:
                while self.step < target:
                    profiled = self.step + 1 == cfg.logging.profile_step and self.dist.is_main
                    metrics = self._profiled_step() if profiled else self.train_step()
                    rows.append(metrics)
                    progress.update(self.step, metrics)
        except RetrievalServiceError as exc:
            if exc.status is not None:  # the service answered: a bad request, not an outage
                raise
            saved = [r["step"] for r in read_metrics(self.run_dir)] if self.dist.is_main else []
            raise ServiceUnavailableError(
                retriever_gone_message(
                    getattr(self.retriever, "url", cfg.retriever.source),
                    cfg.retriever.retry_seconds,
                    self.step + 1,
                    saved[-1] if saved else 0,
                    self.checkpoints.root,
                )
            ) from None
        finally:
            self.run_log.close()
        return rows

    def _profiled_step(self) -> dict[str, Any]:
        """`train_step` under `torch.profiler` (`logging.profile_step`): the trace and, on a
        CPU, each phase's time in matrix products go to RUN_DIR/profile/."""
        cuda = next(self.model.parameters()).device.type == "cuda"
        activities = [torch.profiler.ProfilerActivity.CPU]
        if cuda:
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        with torch.profiler.profile(activities=activities, with_flops=True) as prof:
            metrics = self.train_step()
        # on a GPU the host's time in a matrix product is its launch, not its arithmetic
        trace, split = write_step_profile(
            prof, self.run_dir / "profile", self.step, metrics["time/step"], split=not cuda
        )
        share = f": {summary_line(split, metrics['time/step'])}" if split else ""
        log.info("profiled step %d%s; trace %s", self.step, share, trace)
        return metrics

    def step_requests(self, k: int) -> list[RolloutRequest]:
        """The rollout requests of step `k` on this rank: its questions, in whole groups. Every
        rollout has its own sampling stream, so a step's rollouts are the same on any number of
        processes."""
        cfg, g = self.cfg, self.cfg.rollout.group_size
        examples = self.stream.take(k * cfg.prompts_per_step, cfg.prompts_per_step)
        return [
            RolloutRequest(
                self.prompt_ids(examples[j]),
                examples[j].id,
                f"{examples[j].id}@{k}:{j}",
                examples[j].answers,
                seed=rollout_seed(cfg.seed, k, j * g + i),
            )
            for j in self.dist.shard(len(examples))
            for i in range(g)
        ]

    def train_step(self) -> dict[str, Any]:
        """One GRPO step: rollouts, advantages, pi_old and reference log-probs, the updates,
        the measurements; then the alarms, the periodic evaluation and measurements, the log
        and the checkpoint. Returns the step's metric row."""
        cfg, k, times = self.cfg, self.step, PhaseTimes()
        if isinstance(self.retriever, DegradingRetriever):
            self.retriever.at_step(k + 1)
        with times("rollout"):
            context = self.sampler.context(self.precision.autocast())
            batch = generate_on_every_rank(self.engine, self.step_requests(k), self.dist, context)
        adv = group_advantages(batch.rewards, batch.group_ids, normalize_std=cfg.algo.normalize_std)
        llds = llds_in_force(self.llds_settings, lambda: global_mean_searches(batch, self.dist))
        with times("old_logprob"):
            from_rollout, old_logp, entropy = old_logprobs(
                cfg,
                batch,
                self.rollout_model,
                self.precision,
                sampled_by_copy=self.sampler.is_copy,
                llds=llds,
            )
        with times("ref_logprob"):
            ref_logp = reference_logprobs(cfg, batch, self.ref_model, self.precision)
        with times("update"):
            update_stats = self._update(batch, adv, old_logp, ref_logp, k, llds)
        self.scheduler.step()
        with times("diagnostics"):
            # rollouts from another policy (the sampling copy) and pi_old recomputed: their mismatch
            other_sampler = self.sampler.is_copy and not from_rollout
            metrics = rollout_metrics(
                batch,
                adv,
                old_logp,
                entropy,
                self.dist.sum,
                sampler_logp=batch.rollout_logprobs if other_sampler else None,
            )
            metrics.update(update_stats)
            if cfg.diagnostics.enabled:
                rows = self.updater.minibatch_of_row
                metrics.update(self.diagnostics.after_update(batch, old_logp, adv, k, rows))
        metrics.update(times.metrics())
        metrics.update(self._step_info(batch, times, from_rollout))
        metrics = self.dist.reduce_metrics(metrics, weight=len(batch))
        self.step += 1
        return self._after_step(metrics)

    def _update(
        self, batch: RolloutBatch, adv, old_logp, ref_logp, k: int, llds: LLDSInForce
    ) -> dict[str, float]:
        """The step's optimizer updates (with the LLDS `llds` applies), then the copies
        refreshed from the new weights."""
        self.model.train()
        # each local row's index in the step's global batch (question j, rollout i), so that
        # mini-batches are drawn from the global batch as a single process would draw them
        g = self.cfg.rollout.group_size
        global_rows = [
            j * g + i for j in self.dist.shard(self.cfg.prompts_per_step) for i in range(g)
        ]
        stats = self.updater.run(batch, adv, old_logp, ref_logp, k, global_rows, llds)
        self._sync_copies(sampler=(k + 1) % self.cfg.rollout.sync_every == 0)
        return stats

    def _step_info(self, batch: RolloutBatch, times: PhaseTimes, from_rollout: bool):
        """The step's bookkeeping metrics: throughput, learning rate, where pi_old came from."""
        model_tokens = int(batch.loss_mask.sum())
        compiled = self.engine.compile_seconds
        compile_s, self._compile_seconds = compiled - self._compile_seconds, compiled
        return {
            "throughput/rollout_tokens_per_s": model_tokens / max(times.seconds["rollout"], 1e-9),
            # part of time/rollout: compiling the decode step (rollout.compile), once per run
            "time/rollout_compile": compile_s,
            "lr": self.scheduler.get_last_lr()[0],
            "policy/old_logprobs_from_rollout": float(from_rollout),
            "dist/processes": self.dist.world,
        }

    def _after_step(self, metrics: dict[str, Any]) -> dict[str, Any]:
        """The monitor's alarms, the periodic evaluation and measurements, the log and the
        checkpoint of the step just taken; returns its row (after acting on its alarms)."""
        cfg = self.cfg
        alarms = self.monitor.update({"step": self.step, **metrics}) if self.monitor else []
        metrics["alarms/count"] = len(alarms)
        if self.monitor is not None:
            metrics["phase"] = self.monitor.label.phase if self.monitor.label else "warmup"
        if self.evaluator is not None and is_due(self.step, cfg.eval_every, cfg.steps):
            with self.sampler.context(self.precision.autocast()):
                metrics.update(self.evaluator(self.sampler.model, self.step))
        metrics.update(self.diagnostics.periodic(self.step, self.llds_settings))
        self.run_log.write(self.step, metrics)
        if self.step % cfg.save_every == 0 or self.step == cfg.steps:
            self.save()
        row = {"step": self.step, **metrics}
        if alarms:
            self._on_alarms(alarms)
        return row

    # ------------------------------------------------------------------ alarms
    def _on_alarms(self, alarms: list[Alarm]) -> None:
        action = decide(
            alarms, self.cfg.diagnostics.on_alarm, self.run_dir, write=self.dist.is_main
        )
        if action.kind == "stop":
            self.save()
            raise CollapseAlarmStop(f"stopping at step {self.step}: {action.reason}")
        if action.kind == "rollback":
            self._rollback(action.rollback_before_step or self.step)

    def _rollback(self, before_step: int) -> None:
        """Back to the newest sound checkpoint at or before `before_step` (the checks resume
        makes: a damaged one is passed over, named), restored through the run's checkpoints,
        its log cut back there (the abandoned branch kept), and on with LLDS on."""
        target = rollback_target(self.checkpoints.root, before_step)
        self.run_log.set_aside(self.rollbacks)
        state, _ = self.checkpoints.restore(target, weights=True)
        self._sync_copies()
        self.step = int(state["step"])
        self.llds_settings, self.rollbacks = rollback_llds(self.cfg), self.rollbacks + 1
        log.warning(
            "rolled back to %s; continuing with LLDS on (coef %.3g)",
            target.name,
            self.llds_settings.coef,
        )
        self.run_log.open(self.step)
        self.monitor = new_monitor(self.cfg, self.run_dir, self.step)

    # ------------------------------------------------------------------ pieces
    def _sync_copies(self, *, sampler: bool = True) -> None:
        """After the policy's weights changed: refresh the unsharded copy (FSDP) and, unless it
        lags (`rollout.sync_every`), the sampling copy (`rollout.dtype`), in that order."""
        if self.cfg.fsdp.enabled:
            fsdp.sync_unsharded_copy(self.model, self.rollout_model)
        if sampler:
            self.sampler.refresh()

    def _run_state(self) -> RunState:
        return RunState(
            self.model, self.tokenizer, self.optimizer, self.scheduler, self.updater.scaler
        )

    def save(self) -> Path | None:
        """Write the step's checkpoint atomically (`llds.train.saving`); every rank waits until
        it is complete."""
        state = {
            "step": self.step,
            "nonfinite_in_a_row": self.updater.nonfinite_in_a_row,
            "skipped_updates": self.updater.skipped_updates,
            "config": to_dict(self.cfg),
            FLOAT_ENV_KEY: float_environment(),
        }
        return self.checkpoints.save(self.step, state)


def rollout_seed(seed: int, step: int, row: int) -> int:
    """A distinct 62-bit sampling seed per (run seed, step, global rollout index)."""
    return ((seed * 1_000_003 + step) * 1_000_033 + row) % (1 << 62)
