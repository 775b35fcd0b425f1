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
from llds.config.loader import to_dict
from llds.data.example import QAExample
from llds.env.prompts import build_prompt_ids
from llds.errors import ServiceUnavailableError
from llds.evaluation.periodic import is_due
from llds.monitor.alarms import Alarm
from llds.monitor.rollout_metrics import rollout_metrics
from llds.policy.float_env import float_environment
from llds.retrieval.client import RetrievalServiceError
from llds.retrieval.faults import DegradingRetriever
from llds.rollout import RolloutBatch, RolloutRequest
from llds.runs.tracking import MetricsLogger, read_metrics
from llds.train import build, fsdp
from llds.train.checkpoint import load_training_state, set_rng_state
from llds.train.config import TrainConfig
from llds.train.distributed import Dist
from llds.train.outage import generate_on_every_rank, retriever_gone_message
from llds.train.phase_profile import summary_line, write_step_profile
from llds.train.policy_update import PolicyUpdate
from llds.train.progress import PhaseTimes, StepProgress
from llds.train.prompts import PromptStream
from llds.train.resume import FLOAT_ENV_KEY, apply_optimizer_changes, prepare_run_dir
from llds.train.rollback import (
    CollapseAlarmStop,
    decide,
    keep_abandoned_log,
    new_monitor,
    rollback_algo,
    rollback_target,
)
from llds.train.saving import (
    RunState,
    load_run_state,
    restore_checkpoint,
    save_run_checkpoint,
)
from llds.train.step_logprobs import old_logprobs, reference_logprobs

__all__ = ["CollapseAlarmStop", "GRPOTrainer", "rollout_seed"]

log = logging.getLogger("llds.train")


class GRPOTrainer:
    """Trains `model` with GRPO + LLDS. Pass live objects to bypass loading (Python API, tests)."""

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
        """`resume`: continue from the newest valid checkpoint in `cfg.run_dir` (an earlier run
        without one is refused); False moves an earlier run aside and starts at step 0.
        `allow_config_change`: dotted keys (or sections, or `all`) a resume may change; other
        differences from the checkpoint's config are refused (see `llds.train.resume`)."""
        self.cfg = cfg
        self.run_dir = Path(cfg.run_dir)
        self.ckpt_root = self.run_dir / "checkpoints"
        torch.manual_seed(cfg.seed)
        self.dist = Dist()
        build.check_loss_terms(cfg)
        build.check_whole_groups(cfg, self.dist)
        self.resume = resume
        start = build.resume_point(
            cfg, self.dist, self.ckpt_root, resume=resume, allow_config_change=allow_config_change
        )
        self.damaged = start.damaged
        # the questions and the retriever before the model: a data problem or a dead retrieval
        # service is found before weights load
        train_examples = build.train_examples(cfg, train_examples)
        self.retriever = build.degrading(cfg, build.retriever(cfg, retriever))

        policy = build.policy(cfg, self.dist, start.checkpoint, model, tokenizer)
        self.model, self.tokenizer = policy.model, policy.tokenizer
        self.precision, self.ref_model = policy.precision, policy.reference
        self.scaler = self.precision.grad_scaler()
        self.sharded = cfg.fsdp.enabled
        self.rollout_model = build.rollout_model(cfg, self.dist, self.model, self.precision)
        self.model.train()
        self.sampler = build.sampler(cfg, self.rollout_model)

        self.stream = PromptStream(train_examples, cfg.seed)
        self.template = build.prompt_template(cfg)
        self._prompt_cache: dict[str, list[int]] = {}
        self.engine = build.rollout_engine(cfg, self.sampler.model, self.tokenizer, self.retriever)
        self._compile_seconds = 0.0  # the engine's compile time already logged
        self.protocol = build.protocol(cfg, self.template)
        self.evaluator = build.periodic_evaluator(
            cfg,
            self.dist,
            eval_examples,
            search=self.retriever,
            tokenizer=self.tokenizer,
            rollout=self.engine.config,
            template=self.template,
            run_dir=self.run_dir,
        )
        self.probe_set = build.probe_set(cfg, self.dist, train_examples)

        self.optimizer = build.optimizer(cfg, self.model)
        self.scheduler = build.scheduler(cfg, self.optimizer)
        self.updater = PolicyUpdate(
            cfg,
            self.model,
            self.optimizer,
            self.scaler,
            self.precision,
            self.dist,
            sharded=self.sharded,
        )
        self.step = 0 if start.checkpoint is None else self._restore(start)
        prepare_run_dir(self.run_dir, start.checkpoint, self.damaged, resume=resume, dist=self.dist)
        self.diagnostics = build.diagnostics(cfg, self.dist, self)
        self.reference = self.diagnostics.load_reference(
            self.run_dir,
            self.step,
            self.evaluator.examples if self.evaluator is not None else eval_examples,
        )

        self.logger: MetricsLogger | None = None
        self.monitor = new_monitor(cfg, self.run_dir, self.step)
        self.rollbacks = 0
        self.algo = cfg.algo
        """the loss's settings in force: the config's, swapped once by a rollback (LLDS on)"""

    def _restore(self, start: build.ResumePoint) -> int:
        """Continue from `start`'s checkpoint, whose weights `build.policy` has loaded: the
        optimizer, schedule, loss scale, random streams and guard counters; returns its step."""
        assert start.checkpoint is not None
        state, blobs = load_training_state(start.checkpoint)
        load_run_state(start.checkpoint, blobs, self._run_state(), sharded=self.sharded)
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
        if self.logger is not None:
            self.logger.close()
        if self.dist.is_main:
            self.logger = build.metrics_logger(cfg, self.run_dir, self.step)
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
                    self.ckpt_root,
                )
            ) from None
        finally:
            if self.logger is not None:
                self.logger.close()
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
                self._prompt_ids(examples[j]),
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
        with times("old_logprob"):
            from_rollout, old_logp, entropy = old_logprobs(
                cfg,
                batch,
                self.rollout_model,
                self.precision,
                sampled_by_copy=self.sampler.is_copy,
                llds_coef=self.algo.llds.active_coef,
            )
        with times("ref_logprob"):
            ref_logp = reference_logprobs(cfg, batch, self.ref_model, self.precision)
        with times("update"):
            update_stats = self._update(batch, adv, old_logp, ref_logp, k)
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

    def _update(self, batch: RolloutBatch, adv, old_logp, ref_logp, k: int) -> dict[str, float]:
        """The step's optimizer updates, then the copies refreshed from the new weights."""
        self.model.train()
        # each local row's index in the step's global batch (question j, rollout i), so that
        # mini-batches are drawn from the global batch as a single process would draw them
        g = self.cfg.rollout.group_size
        global_rows = [
            j * g + i for j in self.dist.shard(self.cfg.prompts_per_step) for i in range(g)
        ]
        stats = self.updater.run(batch, adv, old_logp, ref_logp, k, global_rows, self.algo)
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
        metrics.update(self.diagnostics.periodic(self.step))
        if self.logger is not None:
            self.logger.log(self.step, metrics)
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
        """Reload the newest sound checkpoint at or before `before_step` (the checks resume
        makes: a damaged one is passed over, named) and go on with LLDS on."""
        target = rollback_target(self.ckpt_root, before_step)
        if self.logger is not None:  # keep the evidence: the abandoned branch of the log
            self.logger.close()
            keep_abandoned_log(self.run_dir, self.rollbacks)
        state, blobs = load_training_state(target)
        restore_checkpoint(target, blobs, self._run_state(), self.cfg.model, sharded=self.sharded)
        self._sync_copies()
        self.step = int(state["step"])
        self.algo = rollback_algo(self.cfg)
        self.rollbacks += 1
        log.warning(
            "rolled back to %s; continuing with LLDS on (coef %.3g)",
            target.name,
            self.algo.llds.coef,
        )
        if self.dist.is_main:
            c = self.cfg
            self.logger = MetricsLogger(
                self.run_dir,
                tensorboard=c.logging.tensorboard,
                wandb=False,
                resume_step=self.step,
            )
        self.monitor = new_monitor(self.cfg, self.run_dir, self.step)

    # ------------------------------------------------------------------ pieces
    def _prompt_ids(self, ex: QAExample) -> list[int]:
        ids = self._prompt_cache.get(ex.id)
        if ids is None:
            ids = build_prompt_ids(
                self.tokenizer, ex.question, self.template, chat=self.cfg.model.chat
            )
            self._prompt_cache[ex.id] = ids
        return ids

    def _sync_copies(self, *, sampler: bool = True) -> None:
        """After the policy's weights changed: refresh the unsharded copy (FSDP) and, unless it
        lags (`rollout.sync_every`), the sampling copy (`rollout.dtype`), in that order."""
        if self.sharded:
            fsdp.sync_unsharded_copy(self.model, self.rollout_model)
        if sampler:
            self.sampler.refresh()

    def _run_state(self) -> RunState:
        return RunState(self.model, self.tokenizer, self.optimizer, self.scheduler, self.scaler)

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
        return save_run_checkpoint(
            self.ckpt_root,
            self.step,
            self._run_state(),
            state,
            keep=self.cfg.keep_checkpoints,
            protocol=self.protocol,
            dist=self.dist,
            sharded=self.sharded,
        )


def rollout_seed(seed: int, step: int, row: int) -> int:
    """A distinct 62-bit sampling seed per (run seed, step, global rollout index)."""
    return ((seed * 1_000_003 + step) * 1_000_033 + row) % (1 << 62)
