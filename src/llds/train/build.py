"""The pieces of a GRPO run, each built from the config by one function.

`GRPOTrainer.__init__` calls these in order: the policy (with its KL reference), the sampler,
the prompts and the rollout engine, the periodic evaluator, the update, the checkpoints, the
diagnostics. The order matters where it is stated (the KL reference is copied before a
checkpoint's weights replace the starting ones, the unsharded copy before the policy is sharded,
LoRA's fresh adapters draw from the seeded torch stream). Every function takes the objects it
needs and returns what it built, so that a reader (or a test) can build one piece without a
trainer.
"""

from __future__ import annotations

import dataclasses
import logging
import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import torch

from llds.algo.lr_schedule import lr_factor
from llds.algo.objective import active_terms
from llds.data.example import QAExample
from llds.env.prompts import PromptTemplate
from llds.env.protocol import Protocol
from llds.env.rewards import FormatRewardConfig
from llds.errors import ConfigError, UserInputError
from llds.evaluation.periodic import PeriodicEvaluator, eval_rollout_config
from llds.policy.lora import ADAPTER_DIR, WithoutAdapters, attach_lora, load_adapter
from llds.policy.precision import Precision, compute_dtype_of
from llds.policy.sampling_copy import Sampler, sampler_for
from llds.policy.setup import frozen_copy, load_model
from llds.retrieval.base import Retriever
from llds.rollout import RolloutEngine
from llds.train import fsdp
from llds.train.checkpoint import find_resumable
from llds.train.config import TrainConfig, check_prompts_fit
from llds.train.diagnostics import Diagnostics
from llds.train.distributed import Dist
from llds.train.policy_update import PolicyUpdate
from llds.train.prompts import PromptEncoder
from llds.train.resume import checked_config_changes, parse_allowances, warn_if_float_env_changed
from llds.train.saving import RunCheckpoints, RunState

log = logging.getLogger("llds.train")

CHECKPOINTS = "checkpoints"
"""the folder of a run's checkpoints, inside its `run_dir`"""


@dataclass(frozen=True)
class ResumePoint:
    """Where a run starts: the checkpoint to resume (None: step 0), the damaged newer ones set
    aside, and the config keys the resume is allowed to change."""

    checkpoint: Path | None
    damaged: list[tuple[Path, str]]
    changed: set[str]


class Policy(NamedTuple):
    """The trained model with its tokenizer, its compute dtype and its KL reference (None when
    `algo.kl_coef` is 0)."""

    model: Any
    tokenizer: Any
    precision: Precision
    reference: Any | None


def check_run(cfg: TrainConfig, dist: Dist) -> None:
    """What can be refused before anything is read: the loss terms, the groups per process."""
    check_loss_terms(cfg)
    check_whole_groups(cfg, dist)


def check_loss_terms(cfg: TrainConfig) -> None:
    """Import `algo.term_modules` (their terms register themselves), then check that every
    term named in `algo.extra_terms` is registered, before anything loads."""
    for spec in cfg.algo.term_modules:
        import_term_module(spec)
    active_terms(cfg.algo)


def import_term_module(spec: str) -> None:
    """Import one entry of `algo.term_modules`: a module name, or the path of a `.py` file."""
    import importlib
    import importlib.util
    import sys

    try:
        if not spec.endswith(".py"):
            importlib.import_module(spec)
            return
        path = Path(spec).expanduser()
        if not path.is_file():
            raise ConfigError(f"algo.term_modules: {spec} does not exist")
        name = f"llds_terms_{path.stem}"
        if name in sys.modules:
            return
        module_spec = importlib.util.spec_from_file_location(name, path)
        assert module_spec is not None and module_spec.loader is not None
        module = importlib.util.module_from_spec(module_spec)
        sys.modules[name] = module
        module_spec.loader.exec_module(module)
    except ImportError as exc:
        raise ConfigError(f"algo.term_modules: cannot import {spec!r} ({exc})") from None


def check_whole_groups(cfg: TrainConfig, dist: Dist) -> None:
    """A question's group of rollouts stays on one process (group advantages then need no
    communication), so the questions of a step must split evenly over the processes."""
    if cfg.prompts_per_step % dist.world:
        raise UserInputError(
            f"prompts_per_step={cfg.prompts_per_step} must be divisible by the number of "
            f"processes ({dist.world}) so that every rank gets whole groups"
        )


def resume_point(
    cfg: TrainConfig,
    dist: Dist,
    *,
    resume: bool,
    allow_config_change: str | Sequence[str] | None,
) -> ResumePoint:
    """The newest checkpoint in `run_dir/checkpoints` that verifies (when resuming) and the
    config changes allowed against it; a refused change raises here, before anything is
    loaded."""
    ckpt_root = Path(cfg.run_dir) / CHECKPOINTS
    # verified (every file hashed) once, on the main process: the disk is shared
    ckpt, damaged = dist.from_main(lambda: find_resumable(ckpt_root)) if resume else (None, [])
    changed = checked_config_changes(
        cfg, ckpt, parse_allowances(allow_config_change), report=dist.is_main
    )
    if dist.is_main:
        warn_if_float_env_changed(ckpt)
    return ResumePoint(ckpt, damaged, changed)


def policy(
    cfg: TrainConfig, dist: Dist, checkpoint: Path | None, model: Any = None, tokenizer: Any = None
) -> Policy:
    """The policy in float32 master weights (whatever `model.dtype` says: that is the compute
    dtype), in train mode: the given or configured model, with LoRA's adapters (fresh, or the
    checkpoint's) or the checkpoint's full weights. The KL reference is the starting model: a
    frozen copy taken before a checkpoint's weights are loaded, or with LoRA the policy with its
    adapters off."""
    if model is None or tokenizer is None:
        model, tokenizer = load_model(cfg.model, dtype="float32")
    to_float32(model)
    if dist.enabled:
        model.to(dist.device)
    device_type = next(model.parameters()).device.type
    compute = compute_dtype_of(cfg.model.dtype, cfg.model.path, device_type)
    precision = Precision(compute, device_type)
    lora, kl = cfg.model.lora, cfg.algo.kl_coef > 0
    reference = frozen_copy(model, precision.compute_dtype) if kl and lora is None else None
    if lora is not None:
        model = (
            attach_lora(model, lora)
            if checkpoint is None
            else load_adapter(model, checkpoint / ADAPTER_DIR)
        )
        if kl:
            reference = WithoutAdapters(model)
    elif checkpoint is not None:
        model, tokenizer = load_model(cfg.model, path=str(checkpoint / "model"), dtype="float32")
        to_float32(model)
        model.to(device_type if not dist.enabled else dist.device)
    model.train()
    return Policy(model, tokenizer, precision, reference)


def rollout_model(cfg: TrainConfig, dist: Dist, policy: Policy) -> Any:
    """The model that samples, scores pi_old and runs the diagnostics: the policy itself, or
    under FSDP an unsharded copy in the compute dtype (refreshed from the shards every step),
    taken before this function shards the policy in place."""
    model, precision = policy.model, policy.precision
    if not cfg.fsdp.enabled:
        return model
    if not dist.enabled:
        raise ConfigError(
            "fsdp.enabled: needs a multi-process launch (torchrun or accelerate launch)"
        )
    unsharded = frozen_copy(model, precision.compute_dtype)
    fsdp.shard_policy(
        model,
        compute_dtype=precision.compute_dtype,
        reshard_after_forward=cfg.fsdp.reshard_after_forward,
    )
    return unsharded


def sampler(cfg: TrainConfig, rollout: Any) -> Sampler:
    """What rollouts and periodic evaluation sample from: the rollout model, or with
    `rollout.dtype` a copy of it in that dtype (refreshed after every update)."""
    return sampler_for(rollout, cfg.rollout.dtype, cfg.rollout.attn_implementation)


def retriever(cfg: TrainConfig, given: Retriever | None) -> Retriever | None:
    """The given retriever, else `retriever.source` opened; single-turn runs never search and
    open none."""
    if given is not None or cfg.rollout.max_turns <= 0:
        return given
    from llds.retrieval.factory import is_url, open_answering_retriever

    source = cfg.retriever.source
    options = {"retry_seconds": cfg.retriever.retry_seconds} if is_url(source) else {}
    return open_answering_retriever(source, "retriever.source", topk=cfg.retriever.topk, **options)


def degrading(cfg: TrainConfig, search: Retriever | None) -> Retriever | None:
    """`search` behind the fault `retriever.degrade` asks for (itself when there is none)."""
    if search is None or cfg.retriever.degrade.kind == "none":
        return search
    from llds.retrieval.faults import DegradingRetriever

    return DegradingRetriever(search, cfg.retriever.degrade)


def train_examples(cfg: TrainConfig, given: Sequence[QAExample] | None) -> Sequence[QAExample]:
    """The given training questions, else `data.train` read (up to `data.train_limit`); either
    must hold a step's questions."""
    if given is not None:
        examples = given
    else:
        from llds.data.loaders import load_examples

        examples = load_examples(cfg.data.train, limit=cfg.data.train_limit)
    check_prompts_fit(cfg, len(examples), "data.train" if given is None else "the given questions")
    return examples


def prompt_template(cfg: TrainConfig) -> PromptTemplate:
    """`data.prompt_template`: inline text with {question}, a file, or null for the default."""
    return PromptTemplate.from_spec(cfg.data.prompt_template, "data.prompt_template")


def prompts(cfg: TrainConfig, tokenizer: Any) -> PromptEncoder:
    """The run's prompt encoder: `data.prompt_template`, through the chat template or not
    (`model.chat`)."""
    return PromptEncoder(tokenizer, prompt_template(cfg), chat=cfg.model.chat)


def rollout_engine(
    cfg: TrainConfig, sampler: Any, tokenizer: Any, search: Retriever | None
) -> RolloutEngine:
    """The multi-turn sampler of the training rollouts, with the retriever's one top-k."""
    fmt = FormatRewardConfig(enabled=True) if cfg.algo.format_reward else None
    rollout_cfg = dataclasses.replace(cfg.rollout, topk=cfg.retriever.topk)
    return RolloutEngine(sampler, tokenizer, search, rollout_cfg, format_reward=fmt)


def protocol(cfg: TrainConfig, template: PromptTemplate) -> Protocol:
    """How the model was talked to, saved beside every checkpoint's weights so that `llds eval`
    talks to it the same way."""
    return Protocol(
        prompt_template=None if cfg.data.prompt_template is None else template.text,
        chat=cfg.model.chat,
        topk=cfg.retriever.topk,
        max_turns=cfg.eval_max_turns,
        max_turn_tokens=cfg.rollout.max_turn_tokens,
        max_obs_tokens=cfg.rollout.max_obs_tokens,
        max_total_tokens=cfg.rollout.max_total_tokens,
    )


def periodic_evaluator(
    cfg: TrainConfig,
    dist: Dist,
    given: Sequence[QAExample] | None,
    engine: RolloutEngine,
    prompts: PromptEncoder,
) -> PeriodicEvaluator | None:
    """Greedy held-out evaluation every `eval_every` steps (main process only; None when off)
    on the given questions, else `data.eval`'s, with the training engine's limits, retriever
    and tokenizer and the run's prompts; each result is kept in `run_dir`."""
    if cfg.eval_every <= 0 or not dist.is_main:
        return None
    examples = given
    if examples is None:
        if not cfg.data.eval:
            raise ConfigError("eval_every: set data.eval (held-out questions) or eval_every=0")
        from llds.data.loaders import load_examples

        examples = load_examples(cfg.data.eval, limit=cfg.data.eval_limit)
    search = engine.retriever
    return PeriodicEvaluator(
        examples,
        search,
        engine.tokenizer,
        # a single-turn run (no retriever) is evaluated single-turn too
        eval_rollout_config(engine.config, cfg.eval_max_turns if search else 0),
        template=prompts.template,
        chat=prompts.chat,
        out_dir=Path(cfg.run_dir),
    )


def probe_set(cfg: TrainConfig, dist: Dist, examples: Sequence[QAExample]) -> list[QAExample]:
    """The fixed training questions the periodic probe uses, drawn once from the run's seed
    (main process only; empty when off)."""
    d = cfg.diagnostics
    if d.probe_every <= 0 or not d.enabled or not dist.is_main:
        return []
    n = min(d.probe_questions, len(examples))
    return random.Random(cfg.seed + 7919).sample(list(examples), n)


def optimizer(cfg: TrainConfig, model: Any) -> torch.optim.AdamW:
    """AdamW over the trainable parameters (all of them, or LoRA's adapters)."""
    params = [p for p in model.parameters() if p.requires_grad]
    return torch.optim.AdamW(
        params,
        lr=cfg.optim.lr,
        betas=tuple(cfg.optim.betas),
        eps=cfg.optim.eps,
        weight_decay=cfg.optim.weight_decay,
        fused=fusable(params),
    )


def update(cfg: TrainConfig, dist: Dist, policy: Policy) -> PolicyUpdate:
    """The run's optimizer steps: AdamW over the policy's trainable weights, with the loss
    scale float16 autocast needs (None otherwise)."""
    return PolicyUpdate(
        cfg,
        policy.model,
        optimizer(cfg, policy.model),
        policy.precision.grad_scaler(),
        policy.precision,
        dist,
        sharded=cfg.fsdp.enabled,
    )


def scheduler(cfg: TrainConfig, optim: torch.optim.Optimizer) -> torch.optim.lr_scheduler.LambdaLR:
    """The learning-rate schedule (`optim.schedule` with its warm-up, or `optim.lr_points`)
    over `steps`."""
    factor = lr_factor(cfg.optim.schedule, cfg.warmup_steps, cfg.steps, cfg.optim.lr_points)
    return torch.optim.lr_scheduler.LambdaLR(optim, factor)


def to_float32(model: Any) -> None:
    """Make every floating parameter float32 in place: these are the master weights the
    optimizer steps (low precision is for compute only, see `llds.policy.precision`)."""
    low = {p.dtype for p in model.parameters() if p.is_floating_point()} - {torch.float32}
    if low:
        log.info("policy weights %s -> float32 master weights", sorted(map(str, low)))
        model.float()


def fusable(params: Sequence[torch.nn.Parameter]) -> bool:
    """Whether AdamW can use its fused kernel: the same update in one pass over each tensor
    instead of a handful of elementwise ops (the default per-tensor loop is several times slower
    on CPU)."""
    return all(p.is_floating_point() and p.device.type in ("cpu", "cuda") for p in params)


def checkpoints(
    cfg: TrainConfig, dist: Dist, run: RunState, template: PromptTemplate
) -> RunCheckpoints:
    """The run's checkpoints under `run_dir/checkpoints`, each with the protocol beside its
    weights, `keep_checkpoints` of them kept."""
    return RunCheckpoints(
        Path(cfg.run_dir) / CHECKPOINTS,
        run,
        protocol(cfg, template),
        keep=cfg.keep_checkpoints,
        dist=dist,
        sharded=cfg.fsdp.enabled,
        model_cfg=cfg.model,
    )


def diagnostics(
    cfg: TrainConfig,
    dist: Dist,
    policy: Policy,
    sampler: Sampler,
    engine: RolloutEngine,
    prompts: PromptEncoder,
    examples: Sequence[QAExample],
) -> Diagnostics:
    """The run's measurements: of the policy's forward (`sampler.policy`: under FSDP the
    unsharded copy), with the engine's limits, retriever and padding, the run's prompts and the
    probe's fixed questions drawn from `examples`."""
    return Diagnostics(
        cfg,
        dist,
        model=policy.model,
        forward=sampler.policy,
        precision=policy.precision,
        engine=engine,
        prompts=prompts,
        probe_set=probe_set(cfg, dist, examples),
    )
