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

import contextlib
import copy
import json
import logging
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from llds import metrics as keys
from llds.algo import group_advantages
from llds.config.loader import to_dict
from llds.data.example import QAExample
from llds.env.prompts import build_prompt_ids
from llds.errors import ServiceUnavailableError
from llds.evaluation.periodic import eval_rollout_config, is_due
from llds.monitor.alarms import Alarm, AlarmMonitor, should_act
from llds.monitor.likelihood import (
    displacement_metrics,
    group_correct_share,
    group_hidden_similarity,
    lld_share_metrics,
    share_by_part,
)
from llds.monitor.rollout_metrics import rollout_metrics
from llds.policy.float_env import float_environment
from llds.policy.forward import batched_log_probs, pooled_response_hidden
from llds.policy.sampling_copy import refresh_sampling_copy, sampling_context
from llds.policy.setup import load_model
from llds.probe.one_step import probe_metrics, run_probe
from llds.probe.reference import REFERENCE_FILE, ReferenceChains
from llds.probe.update import AdamSettings
from llds.retrieval.client import RetrievalServiceError
from llds.rollout import RolloutBatch, RolloutEngine, RolloutRequest
from llds.runs.tracking import MetricsLogger, read_metrics
from llds.train import build, fsdp
from llds.train.checkpoint import (
    find_resumable,
    load_training_state,
    publish_checkpoint,
    save_checkpoint,
    set_rng_state,
    stage_checkpoint,
    write_checkpoint_files,
)
from llds.train.config import TrainConfig
from llds.train.distributed import Dist
from llds.train.policy_update import PolicyUpdate
from llds.train.progress import StepProgress
from llds.train.prompts import PromptStream
from llds.train.resume import FLOAT_ENV_KEY, apply_optimizer_changes, prepare_run_dir

log = logging.getLogger("llds.train")


SHARDED = "sharded"  # a checkpoint's FSDP shards of the weights and the optimizer state


class CollapseAlarmStop(RuntimeError):
    """`diagnostics.on_alarm=stop` and an actionable collapse alarm fired."""


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
        self.retriever = build.retriever(cfg, retriever)

        policy = build.policy(cfg, self.dist, start.checkpoint, model, tokenizer)
        self.model, self.tokenizer = policy.model, policy.tokenizer
        self.precision, self.ref_model = policy.precision, policy.reference
        self.scaler = self.precision.grad_scaler()
        self.sharded = cfg.fsdp.enabled
        self.rollout_model = build.rollout_model(cfg, self.dist, self.model, self.precision)
        self.model.train()
        self.sampler = build.sampling_model(cfg, self.rollout_model)

        self.stream = PromptStream(train_examples, cfg.seed)
        self.template = build.prompt_template(cfg)
        self._prompt_cache: dict[str, list[int]] = {}
        self.engine = build.rollout_engine(cfg, self.sampler, self.tokenizer, self.retriever)
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
        self.reference = self._reference_chains(
            self.evaluator.examples if self.evaluator is not None else eval_examples
        )

        self.logger: MetricsLogger | None = None
        self.monitor = self._new_monitor()
        self.rollbacks = 0
        self.rollback_llds_coef: float | None = None  # LLDS turned on by a rollback

    def _restore(self, start: build.ResumePoint) -> int:
        """Continue from `start`'s checkpoint, whose weights `build.policy` has loaded: the
        optimizer, schedule, loss scale, random streams and guard counters; returns its step."""
        assert start.checkpoint is not None
        state, blobs = load_training_state(start.checkpoint)
        self._load_optimizer_state(start.checkpoint, blobs)
        set_rng_state(blobs["rng"])
        apply_optimizer_changes(self.optimizer, self.scheduler, self.cfg, start.changed)
        self.updater.nonfinite_in_a_row = int(state.get("nonfinite_in_a_row", 0))
        self.updater.skipped_updates = int(state.get("skipped_updates", 0))
        log.info("resumed from %s at step %d", start.checkpoint, int(state["step"]))
        return int(state["step"])

    def _load_optimizer_state(self, ckpt: Path, blobs: dict[str, Any]) -> None:
        """The optimizer, schedule and loss scale of checkpoint `ckpt`; under FSDP its shards
        (the weights and the Adam state together)."""
        if self.sharded:
            fsdp.load_sharded(ckpt / SHARDED, self.model, self.optimizer)
        else:
            self.optimizer.load_state_dict(blobs["optimizer"])
        self.scheduler.load_state_dict(blobs["scheduler"])
        if self.scaler is not None and "grad_scaler" in blobs:
            self.scaler.load_state_dict(blobs["grad_scaler"])

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
            self.logger = MetricsLogger(
                self.run_dir,
                tensorboard=cfg.logging.tensorboard,
                wandb=cfg.logging.wandb,
                wandb_project=cfg.logging.wandb_project,
                resume_step=self.step,
                config=to_dict(cfg),
            )
        rows: list[dict[str, Any]] = []
        try:
            with StepProgress(target, self.step, enabled=show) as progress:
                while self.step < target:
                    metrics = self.train_step()
                    rows.append(metrics)
                    progress.update(self.step, metrics)
        except RetrievalServiceError as exc:
            if exc.status is not None:  # the service answered: a bad request, not an outage
                raise
            raise ServiceUnavailableError(self._retriever_gone_message()) from None
        finally:
            if self.logger is not None:
                self.logger.close()
        return rows

    def _retriever_gone_message(self) -> str:
        """The one line a run stopped by an unreachable retriever ends with: which URL, where
        the run stands, and that the same command resumes it."""
        url = getattr(self.retriever, "url", self.cfg.retriever.source)
        saved = [r["step"] for r in read_metrics(self.run_dir)] if self.dist.is_main else []
        return (
            f"retriever {url} did not answer for retriever.retry_seconds="
            f"{self.cfg.retriever.retry_seconds:g}s during step {self.step + 1}; the run stopped "
            f"(metrics.jsonl up to step {saved[-1] if saved else 0}, checkpoints in "
            f"{self.ckpt_root}); once the retriever is back, resume with the same command"
        )

    def _generate_on_every_rank(self, requests: list[RolloutRequest]) -> RolloutBatch:
        """This rank's rollouts; when the retriever stopped answering on any rank, every rank
        raises here, before the update's collectives: otherwise the others would go on into them
        with a rank that left and fail there with a transport error (or wait, by backend)."""
        failure: RetrievalServiceError | None = None
        try:
            with sampling_context(self.cfg.rollout.dtype, self.precision.autocast()):
                batch = self.engine.generate(requests)
        except RetrievalServiceError as exc:
            if exc.status is not None or not self.dist.enabled:
                raise  # the service answered (a bad request), or there is no one to tell
            failure = exc
        if self.dist.enabled and float(self.dist.sum(float(failure is not None))) > 0:
            raise failure or RetrievalServiceError(None, "the retriever failed on another rank")
        return batch

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
        cfg = self.cfg
        k = self.step
        t0 = time.perf_counter()
        batch = self._generate_on_every_rank(self.step_requests(k))
        t_rollout = time.perf_counter() - t0

        adv = group_advantages(batch.rewards, batch.group_ids, normalize_std=cfg.algo.normalize_std)
        t1 = time.perf_counter()
        temp = cfg.rollout.temperature
        budget = cfg.optim.micro_batch_tokens
        from_rollout = self._old_logprobs_from_rollout(batch)
        if from_rollout:
            old_logp, entropy = batch.rollout_logprobs, batch.rollout_entropy
        else:
            self.rollout_model.eval()
            with self.precision.autocast():
                old_logp, entropy = batched_log_probs(
                    self.rollout_model, batch, budget, temperature=temp, with_entropy=True
                )
        t_old = time.perf_counter() - t1
        ref_logp = None
        t2 = time.perf_counter()
        if self.ref_model is not None:
            with self.precision.autocast():
                ref_logp, _ = batched_log_probs(self.ref_model, batch, budget, temperature=temp)
        t_ref = time.perf_counter() - t2

        t3 = time.perf_counter()
        self.model.train()
        # each local row's index in the step's global batch (question j, rollout i), so that
        # mini-batches are drawn from the global batch as a single process would draw them
        g = cfg.rollout.group_size
        global_rows = [j * g + i for j in self.dist.shard(cfg.prompts_per_step) for i in range(g)]
        update_stats = self.updater.run(
            batch, adv, old_logp, ref_logp, k, global_rows, llds_coef=self._llds_coef()
        )
        self._sync_copies()
        t_update = time.perf_counter() - t3
        self.scheduler.step()

        t4 = time.perf_counter()
        # rollouts from another policy (the sampling copy) and pi_old recomputed: their mismatch
        other_sampler = self.sampler is not self.rollout_model and not from_rollout
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
            metrics.update(self._displacement(batch, old_logp, adv, k))
            every = cfg.diagnostics.hidden_similarity_every
            if every > 0 and k % every == 0:
                metrics[keys.HIDDEN_COSINE] = self._hidden_similarity(batch)
        t_diag = time.perf_counter() - t4
        model_tokens = int(batch.loss_mask.sum())
        metrics.update(
            {
                "time/rollout": t_rollout,
                "time/old_logprob": t_old,
                "time/ref_logprob": t_ref,
                "time/update": t_update,
                "time/diagnostics": t_diag,
                "time/step": time.perf_counter() - t0,
                "throughput/rollout_tokens_per_s": model_tokens / max(t_rollout, 1e-9),
                "lr": self.scheduler.get_last_lr()[0],
                "policy/old_logprobs_from_rollout": float(from_rollout),
                "dist/processes": self.dist.world,
            }
        )
        metrics = self.dist.reduce_metrics(metrics, weight=len(batch))
        self.step += 1
        alarms = self.monitor.update({"step": self.step, **metrics}) if self.monitor else []
        metrics["alarms/count"] = len(alarms)
        if self.monitor is not None:
            metrics["phase"] = self.monitor.label.phase if self.monitor.label else "warmup"
        if self.evaluator is not None and is_due(self.step, cfg.eval_every, cfg.steps):
            with sampling_context(self.cfg.rollout.dtype, self.precision.autocast()):
                metrics.update(self.evaluator(self.sampler, self.step))
        if self.probe_set and self.step % cfg.diagnostics.probe_every == 0:
            metrics.update(self._probe())
        if self.reference is not None and self.step % cfg.diagnostics.reference_every == 0:
            metrics.update(self._reference_metrics())
        if self.logger is not None:
            self.logger.log(self.step, metrics)
        if self.step % cfg.save_every == 0 or self.step == cfg.steps:
            self.save()
        row = {"step": self.step, **metrics}
        if alarms:
            self._on_alarms(alarms)
        return row

    def _probe(self) -> dict[str, float]:
        """The one-step probe on a float32 copy of the policy: the trained weights, optimizer
        and random streams are left exactly as they were."""
        cfg = self.cfg
        model = copy.deepcopy(self.rollout_model).float().requires_grad_(True)
        adamw = cfg.diagnostics.probe_optimizer == "adamw"  # the run's own optimizer and lr
        with self._forked_streams():
            results = run_probe(
                model,
                self.tokenizer,
                self.retriever,
                self.probe_set,
                group_size=cfg.rollout.group_size,
                rollout=self.engine.config,
                lr=cfg.optim.lr if adamw else cfg.diagnostics.probe_lr,
                optimizer=cfg.diagnostics.probe_optimizer,
                adam=AdamSettings(tuple(cfg.optim.betas), cfg.optim.eps, cfg.optim.weight_decay),
                seed=cfg.seed,
                template=self.template,
                chat=cfg.model.chat,
                progress=False,
            )
        del model
        return probe_metrics(results)

    def _reference_chains(self, examples: Sequence[QAExample] | None) -> ReferenceChains | None:
        """The fixed reference chains (main process only; None when off): built from the
        starting policy at step 0 and written beside the run, read back on a resume, so that
        every `lld/ref_*` value is a change against the same start."""
        cfg = self.cfg
        d = cfg.diagnostics
        if d.reference_every <= 0 or not d.enabled or not self.dist.is_main:
            return None
        path = self.run_dir / REFERENCE_FILE
        if self.step > 0:
            if path.is_file():
                return ReferenceChains.read(path)
            log.warning(
                "%s is missing: no lld/ref_* metrics in this resumed run (the reference chains "
                "are built from the starting policy, at step 0)",
                path,
            )
            return None
        if examples is None:
            from llds.data.loaders import load_examples

            examples = load_examples(cfg.data.eval, limit=cfg.data.eval_limit)
        greedy = eval_rollout_config(
            self.engine.config, cfg.eval_max_turns if self.retriever else 0
        )
        engine = RolloutEngine(self.rollout_model, self.tokenizer, self.retriever, greedy)
        with self._scoring_mode():
            chains = ReferenceChains.build(
                self.rollout_model,
                engine,
                [(self._prompt_ids(ex), ex) for ex in examples],
                self.engine.pad_id,
                cfg.optim.micro_batch_tokens,
            )
        chains.write(path)
        return chains

    def _reference_metrics(self) -> dict[str, float]:
        assert self.reference is not None
        with self._scoring_mode():
            return self.reference.metrics(
                self.rollout_model, self.engine.pad_id, self.cfg.optim.micro_batch_tokens
            )

    @contextlib.contextmanager
    def _forked_streams(self):
        """The run's autocast with forked random streams: a diagnostic leaves the sampling
        streams exactly as they were."""
        devices = [torch.cuda.current_device()] if torch.cuda.is_available() else []
        with torch.random.fork_rng(devices=devices), self.precision.autocast():
            yield

    @contextlib.contextmanager
    def _scoring_mode(self):
        """Eval mode on top of `_forked_streams`, for a diagnostic forward pass of the policy."""
        was_training = self.rollout_model.training
        self.rollout_model.eval()
        try:
            with self._forked_streams():
                yield
        finally:
            self.rollout_model.train(was_training)

    # ------------------------------------------------------------------ alarms
    def _new_monitor(self) -> AlarmMonitor | None:
        """A fresh monitor fed with the run's logged history (so resume does not reset it)."""
        if not (self.cfg.diagnostics.enabled and self.cfg.diagnostics.alarms):
            return None
        monitor = AlarmMonitor()
        for row in read_metrics(self.run_dir):
            if row.get("step", 0) <= self.step:
                monitor.update(row)
        return monitor

    def _on_alarms(self, alarms: list[Alarm]) -> None:
        action = should_act(alarms, self.cfg.diagnostics.on_alarm)
        for a in alarms:
            log.warning("step %d: %s alarm (%s): %s", a.step, a.kind, a.severity, a.message)
        if self.dist.is_main:
            with (self.run_dir / "alarms.jsonl").open("a", encoding="utf-8") as f:
                for a in alarms:
                    f.write(json.dumps({**a.to_dict(), "action": action.kind}) + "\n")
        if action.kind == "stop":
            self.save()
            raise CollapseAlarmStop(f"stopping at step {self.step}: {action.reason}")
        if action.kind == "rollback":
            self._rollback(action.rollback_before_step or self.step)

    def _rollback(self, before_step: int) -> None:
        """Reload the newest sound checkpoint at or before `before_step` (the checks resume
        makes: a damaged one is passed over, named) and go on with LLDS on."""
        target, damaged = find_resumable(self.ckpt_root, at_or_before=before_step)
        for path, why in damaged:
            log.warning("rollback passes over checkpoint %s: %s", path.name, why)
        if target is None:
            raise CollapseAlarmStop(
                f"rollback requested to a step <= {before_step} but no sound checkpoint is kept "
                "(lower save_every or raise keep_checkpoints); stopping instead"
            )
        if self.logger is not None:  # keep the evidence: the abandoned branch of the log
            self.logger.close()
            abandoned = self.run_dir / f"metrics.rollback{self.rollbacks + 1}.jsonl"
            abandoned.write_text((self.run_dir / "metrics.jsonl").read_text(encoding="utf-8"))
        state, blobs = load_training_state(target)
        if not self.sharded:  # under FSDP the shards hold the weights
            model, _ = load_model(self.cfg.model, path=str(target / "model"), dtype="float32")
            self.model.load_state_dict(model.state_dict())
            del model
        self._load_optimizer_state(target, blobs)
        self._sync_copies()
        self.step = int(state["step"])
        self.rollback_llds_coef = max(
            self.cfg.algo.llds.coef, self.cfg.diagnostics.rollback_llds_coef
        )
        self.rollbacks += 1
        log.warning(
            "rolled back to %s; continuing with LLDS on (coef %.3g)",
            target.name,
            self.rollback_llds_coef,
        )
        if self.dist.is_main:
            c = self.cfg
            self.logger = MetricsLogger(
                self.run_dir,
                tensorboard=c.logging.tensorboard,
                wandb=False,
                resume_step=self.step,
            )
        self.monitor = self._new_monitor()

    # ------------------------------------------------------------------ pieces
    def _prompt_ids(self, ex: QAExample) -> list[int]:
        ids = self._prompt_cache.get(ex.id)
        if ids is None:
            ids = build_prompt_ids(
                self.tokenizer, ex.question, self.template, chat=self.cfg.model.chat
            )
            self._prompt_cache[ex.id] = ids
        return ids

    def _sync_copies(self) -> None:
        """After the policy's weights changed: refresh the unsharded copy (FSDP) and the
        sampling copy (`rollout.dtype`), in that order."""
        if self.sharded:
            fsdp.sync_unsharded_copy(self.model, self.rollout_model)
        if self.sampler is not self.rollout_model:
            refresh_sampling_copy(self.rollout_model, self.sampler)

    def _old_logprobs_from_rollout(self, batch: RolloutBatch) -> bool:
        """Take pi_old from the rollout (saving a forward pass over the whole batch) when the
        config allows it and the engine recorded them; see `AlgoConfig.old_logprobs`."""
        algo = self.cfg.algo
        if (
            algo.old_logprobs == "recompute"
            or batch.rollout_logprobs is None
            or batch.rollout_entropy is None
        ):
            return False
        if algo.old_logprobs == "rollout":
            return True
        if self.sampler is not self.rollout_model:  # sampled by a copy, not by this forward
            return False
        # auto: float32 sampling logits equal the training forward's to rounding; LLDS's first
        # step is exactly 0 whatever pi_old's rounding. The authors' first-step LLDS acts on that
        # rounding, so it gets their recomputed pi_old (read per step: rollback turns LLDS on).
        noisy_llds = self._llds_coef() > 0 and algo.llds.first_update == "computed"
        return not noisy_llds and not self.precision.mixed

    def _llds_coef(self) -> float:
        """LLDS's coefficient now: the config's, or after a rollback the rollback's (0 = off)."""
        if self.rollback_llds_coef is not None:
            return self.rollback_llds_coef
        lc = self.cfg.algo.llds
        return lc.coef if lc.enabled else 0.0

    def _displacement(self, batch: RolloutBatch, old_logp, adv, k: int) -> dict[str, float]:
        """One extra no-grad forward: how did this step's updates move the batch's likelihood?"""
        frac = self.cfg.diagnostics.sample_fraction
        b = len(batch)
        if frac < 1.0:
            gen = torch.Generator().manual_seed(self.cfg.seed * 104_729 + k)
            rows = sorted(torch.randperm(b, generator=gen)[: max(1, round(frac * b))].tolist())
        else:
            rows = list(range(b))
        sub = batch.select(rows)
        self.rollout_model.eval()  # after the update: under FSDP the refreshed copy
        with self.precision.autocast():
            new_logp, _ = batched_log_probs(
                self.rollout_model,
                sub,
                self.cfg.optim.micro_batch_tokens,
                temperature=self.cfg.rollout.temperature,
            )
        self.model.train()
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
            parts = [self.updater.minibatch_of_row[r] for r in rows]
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

    def _hidden_similarity(self, batch: RolloutBatch) -> float:
        """Fig. 3b of the paper: how alike the model represents correct and incorrect responses
        of the same question (after this step's update; the mixed groups only)."""
        correct = [e.em > 0 for e in batch.episodes]
        verdicts: dict[str, set[bool]] = {}
        for g, ok in zip(batch.group_ids, correct, strict=True):
            verdicts.setdefault(g, set()).add(ok)
        rows = [r for r, g in enumerate(batch.group_ids) if len(verdicts[g]) == 2]
        if not rows:
            return float("nan")
        sub = batch.select(rows)
        self.rollout_model.eval()
        with self.precision.autocast():
            pooled = pooled_response_hidden(
                self.rollout_model, sub, self.cfg.optim.micro_batch_tokens
            )
        self.model.train()
        return group_hidden_similarity(
            pooled, [batch.group_ids[r] for r in rows], [correct[r] for r in rows]
        )

    def save(self) -> Path | None:
        """Write the checkpoint atomically; every rank waits until it is complete.

        Unsharded: rank 0 writes it. Under FSDP every rank writes its shard of the weights and
        the optimizer state into `sharded/`, and rank 0 adds the full float32 weights as an HF
        model directory (`model/`, what `llds eval` loads) and the rest."""
        state = {
            "step": self.step,
            "nonfinite_in_a_row": self.updater.nonfinite_in_a_row,
            "skipped_updates": self.updater.skipped_updates,
            "config": to_dict(self.cfg),
            FLOAT_ENV_KEY: float_environment(),
        }
        if not self.sharded:
            if not self.dist.is_main:
                self.dist.barrier()
                return None
            path = save_checkpoint(
                self.ckpt_root,
                self.step,
                model=self.model,
                tokenizer=self.tokenizer,
                optimizer=self.optimizer,
                scheduler=self.scheduler,
                grad_scaler=self.scaler,
                trainer_state=state,
                keep=self.cfg.keep_checkpoints,
                protocol=self.protocol,
            )
            self.dist.barrier()
            return path
        tmp = self.ckpt_root / f".tmp_step_{self.step:06d}"
        if self.dist.is_main:
            stage_checkpoint(self.ckpt_root, self.step)
        self.dist.barrier()
        fsdp.save_sharded(tmp / SHARDED, self.model, self.optimizer)
        full = fsdp.full_state_dict(self.model)  # rank 0 gets the tensors, the others {}
        path = None
        if self.dist.is_main:
            write_checkpoint_files(
                tmp,
                model=self.model,  # float32 parameters: config.json records float32
                tokenizer=self.tokenizer,
                optimizer=None,
                scheduler=self.scheduler,
                trainer_state=state,
                state_dict=full,
                protocol=self.protocol,
            )
            path = publish_checkpoint(self.ckpt_root, self.step, tmp, self.cfg.keep_checkpoints)
        self.dist.barrier()
        return path


def rollout_seed(seed: int, step: int, row: int) -> int:
    """A distinct 62-bit sampling seed per (run seed, step, global rollout index)."""
    return ((seed * 1_000_003 + step) * 1_000_033 + row) % (1 << 62)
