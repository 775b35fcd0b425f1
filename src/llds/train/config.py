"""The training configuration: one section per concern, loaded from YAML with overrides.

Types, choices and single-field ranges are declared on the fields (pydantic validates them);
`TrainConfig.__post_init__` holds the checks that involve several sections.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field

from llds.config.algo import AlgoConfig, LLDSConfig
from llds.config.loader import Overrides, build, gather
from llds.config.schema import Invalid, check, section
from llds.errors import ConfigError, UserInputError
from llds.monitor.settings import MonitorConfig
from llds.policy.config import LoRAConfig, ModelConfig
from llds.retrieval.faults import DegradeConfig
from llds.rollout.config import RolloutConfig

__all__ = [
    "AlgoConfig",
    "LLDSConfig",
    "LoRAConfig",
    "ModelConfig",
    "TrainConfig",
    "check_inputs",
    "load_config",
]

Beta = Annotated[float, Field(ge=0, lt=1)]
Step = Annotated[int, Field(ge=0)]
Factor = Annotated[float, Field(ge=0, allow_inf_nan=False)]


@section(key="data")
class DataConfig:
    """The questions."""

    train: str = ""
    """train questions: .parquet (Search-R1), .jsonl (FlashRAG), or `trivia:list1,list2`;
    required"""
    eval: str = ""
    """held-out questions for `eval_every` and `diagnostics.reference_every` (same formats)"""
    prompt_template: str | None = None
    """a template file or inline text containing {question}; null = the default instruction"""
    train_limit: int | None = Field(default=None, ge=1)
    """use the first N training questions; null = every question"""
    eval_limit: int | None = Field(default=None, ge=1)
    """use the first N held-out questions; null = every question"""


@section(key="retriever")
class RetrieverConfig:
    """The search engine the rollouts query."""

    source: str = ""
    """a corpus .jsonl (BM25 built on the fly), an index directory, or an http(s):// URL; not
    needed (and not opened) for single-turn training, `rollout.max_turns=0`"""
    topk: int = Field(default=3, ge=1)
    """passages per search (also `rollout.topk`: one top-k)"""
    retry_seconds: float = Field(default=120.0, gt=0)
    """how long a retrieval service (a URL source) that stops answering is retried, with
    backoff, before the run stops; it then exits with code 2 and resumes from its last
    checkpoint when started again with the same command"""
    degrade: DegradeConfig = dataclasses.field(default_factory=DegradeConfig)
    """make the retriever worse from a step on, to see what a run and its monitor do when
    search stops helping (`llds.retrieval.faults`); off by default"""


@section(key="optim")
class OptimConfig:
    """AdamW on float32 master weights, and how a rollout batch is split into optimizer steps."""

    lr: float = Field(default=1e-6, gt=0)
    """peak learning rate"""
    weight_decay: float = Field(default=0.01, ge=0)
    """AdamW's decoupled weight decay"""
    betas: tuple[Beta, Beta] = (0.9, 0.999)
    """AdamW's (beta1, beta2), each in [0, 1)"""
    eps: float = Field(default=1e-8, gt=0)
    """AdamW's epsilon"""
    warmup_steps: int = Field(default=0, ge=0)
    """linear warm-up length in training steps"""
    warmup_ratio: float | None = Field(default=None, ge=0, lt=1)
    """warm-up as a share of `steps` (Search-R1's code: 0.285); replaces warmup_steps when set"""
    schedule: Literal["constant", "cosine", "linear"] = "constant"
    """learning rate after the warm-up"""
    lr_points: list[tuple[Step, Factor]] | None = None
    """a piecewise-linear schedule instead of `schedule` and the warm-up: `[step, factor]`
    points, steps strictly increasing, the learning rate `lr * factor` on the line through them
    (the first factor before the first point, the last after the last). E.g. `[[0, 1], [60, 1],
    [160, 10]]` holds `lr` for 60 steps, then climbs to 10x it over 100 steps: a re-warm-up to a
    peak set too high, one of the ways a healthy run is made to diverge"""
    grad_clip: float | None = Field(default=1.0, gt=0)
    """clip the global gradient norm to this; null = no clipping"""
    mini_batches: int = Field(default=10, ge=1)
    """optimizer steps per rollout batch (per epoch), as the paper's 10; LLDS acts from the
    second on, so LLDS with one step in all is a config error"""
    minibatch_order: Literal["shuffled", "rollout"] = "shuffled"
    """how a rollout batch is cut into its `mini_batches`. `rollout`: in rollout order with every
    group whole, as the authors' veRL does (its mini-batches are consecutive slices of the batch,
    a question's G rollouts kept together); when the groups do not divide evenly the first
    mini-batches take one group more, epochs repeat the same cut, and there may be no more
    mini-batches than prompts per step. `shuffled`: rows permuted across the whole batch anew
    each epoch, so a group's right and wrong answers may land in different optimizer steps (this
    project's earlier behaviour, kept as the default so recorded runs reproduce)"""
    epochs: int = Field(default=1, ge=1)
    """passes over each rollout batch"""
    micro_batch_tokens: int = Field(default=16384, ge=1)
    """token budget of one forward+backward (rows x padded length)"""
    logprob_micro_batch_tokens: int | None = Field(default=None, ge=1)
    """token budget of one no-grad log-prob pass (the reference's, pi_old recomputed, the
    diagnostics'); None = `micro_batch_tokens`. A pass without a backward can take larger
    micro-batches: on a CPU the update is faster with small ones and these passes with large
    ones (docs/training.md). Changes float rounding only, like `threads`"""
    max_nonfinite_in_a_row: int = Field(default=3, ge=1)
    """optimizer steps with a non-finite loss or gradient (skipped) in a row before the run
    stops"""

    @property
    def logprob_tokens(self) -> int:
        """The no-grad passes' token budget (`logprob_micro_batch_tokens` or the update's)."""
        return self.logprob_micro_batch_tokens or self.micro_batch_tokens

    def __post_init__(self) -> None:
        if self.warmup_ratio is not None and self.warmup_steps:
            raise Invalid("warmup_ratio", "set either warmup_ratio or warmup_steps, not both")
        if self.lr_points is not None:
            steps = [s for s, _ in self.lr_points]
            if not steps:
                raise Invalid("lr_points", "give at least one [step, factor] point, or null")
            if any(b <= a for a, b in itertools.pairwise(steps)):
                raise Invalid("lr_points", f"steps must strictly increase, got {steps}")
            if self.warmup_ratio is not None or self.warmup_steps:
                raise Invalid("lr_points", "replaces the warm-up: unset warmup_steps/_ratio")


@section(key="logging")
class LoggingConfig:
    """Where metrics go and how much is printed."""

    tensorboard: bool = True
    """write TensorBoard event files under RUN_DIR/tensorboard"""
    wandb: bool = False
    """log to Weights & Biases (needs `pip install 'llds[wandb]'`)"""
    wandb_project: str = "llds"
    """the W&B project"""
    progress: bool = True
    """one line per step: a live bar on a terminal, else one printed line (log files, CI)"""
    verbose: bool = False
    """also log every retrieval HTTP request and third-party debug lines (default: one progress
    line per step)"""
    profile_step: int = Field(default=0, ge=0)
    """run step N (1-based; 0 = never) under `torch.profiler`: its trace goes to
    RUN_DIR/profile/step_N.pt.trace.json (open it in Perfetto or chrome://tracing),
    each phase an `llds/<phase>` range; on a CPU also each phase's time in matrix-product kernels
    (step_N.phases.json and one log line). Main process only"""


@section(key="diagnostics")
class DiagnosticsConfig:
    """Likelihood-displacement measurements and alarms computed inside the training loop."""

    enabled: bool = True
    """measure displacement (`lld/*`) after each update"""
    sample_fraction: float = Field(default=1.0, gt=0, le=1)
    """share of the rollout batch re-scored after the update for displacement metrics"""
    alarms: bool = True
    """watch the logged rows for the phases that precede a collapse"""
    on_alarm: Literal["warn", "stop", "rollback"] = "warn"
    """what an alarm does: log it, stop the run, or roll back to the last checkpoint and turn
    LLDS on"""
    rollback_llds_coef: float = Field(default=0.2, ge=0)
    """LLDS lambda after a rollback (`on_alarm: rollback`)"""
    share_by_minibatch: bool = False
    """also log `lld/share_pos_fell` by the index k of the response's mini-batch in the update
    (`lld/minibatch/share_pos_fell_kNN` with its count `lld/minibatch/n_pos_kNN`): a response in
    mini-batch k meets LLDS (`scope: minibatch`) only against the drift of updates 1..k-1"""
    update_ratio: bool = True
    """log `optim/update_ratio` = ||delta theta|| / ||theta|| per step (keeps one copy of the
    trainable weights during the update; off with `enabled: false` too)"""
    probe_every: int = Field(default=0, ge=0)
    """every N steps, the one-step probe (the paper's Eq. 3) on a fixed set of training
    questions, on a copy of the policy: `probe/*` metrics (main process only); 0 = off"""
    probe_questions: int = Field(default=16, ge=1)
    """questions in the probe set (only those whose sampled group is mixed are probed)"""
    probe_lr: float = Field(default=1e-2, gt=0)
    """plain-SGD step of the probe update (`probe/first_order_*` need no step size)"""
    probe_optimizer: Literal["sgd", "adamw"] = "sgd"
    """the probe update: plain SGD at `probe_lr` (Eq. 3), or a fresh AdamW per question with the
    run's own `optim.lr`, `optim.betas`, `optim.eps` and `optim.weight_decay`, as the paper's
    probe (`probe/lld_share` and `probe/disp_correct` then measure training's step;
    `probe/first_order_*` stay the SGD direction's)"""
    hidden_similarity_every: int = Field(default=10, ge=0)
    """every N steps, `lld/hidden_cos_correct_incorrect`: the mean cosine similarity of the last
    hidden states (averaged over response tokens) of correct and incorrect responses of a group
    (pooled in the displacement's forward pass; an extra pass over the mixed groups' rollouts
    only where the LM head cannot be split off or `sample_fraction` < 1); 0 = off"""
    reference_every: int = Field(default=0, ge=0)
    """every N steps, `lld/ref_*`: the likelihood change of fixed reference chains, the starting
    policy's greedy answers to the held-out questions (`data.eval`, `data.eval_limit`), split
    into those that were correct and wrong (one no-grad forward; main process only); 0 = off.
    Sees what the batch cannot: correct answers to questions outside it losing likelihood"""


@section(key="fsdp")
class FSDPConfig:
    """Fully sharded data parallel (torch FSDP2) for policies that do not fit one device.

    The float32 master weights, gradients and optimizer state are sharded over the processes;
    compute runs in `model.dtype`. Rollouts, pi_old, the reference and the diagnostics' passes
    run on unsharded copies in the compute dtype, refreshed from the shards after every step.
    Needs a multi-process launch (torchrun / accelerate launch)."""

    enabled: bool = False
    """shard the policy over the processes"""
    reshard_after_forward: bool = True
    """free each block's gathered weights after its forward (less memory, one more all-gather
    in the backward)"""


@section
class TrainConfig:
    """`llds train`: GRPO (+LLDS) on a search agent."""

    run_dir: str = "runs/default"
    """where metrics, evaluations, alarms and checkpoints go"""
    seed: int = 0
    """seed of the question order, sampling and initialisation"""
    steps: int = Field(default=100, ge=1)
    """training steps (one rollout batch each)"""
    prompts_per_step: int = Field(default=8, ge=1)
    """questions per step (each gets `rollout.group_size` rollouts)"""
    save_every: int = Field(default=10, ge=1)
    """checkpoint every N steps (and at the end)"""
    keep_checkpoints: int = Field(default=2, ge=1)
    """checkpoints kept on disk (the newest)"""
    eval_every: int = Field(default=0, ge=0)
    """greedy held-out evaluation on `data.eval` every N steps; 0 = off"""
    eval_max_turns: int = Field(default=4, ge=0)
    """searches allowed in that evaluation"""
    threads: int | None = Field(default=None, ge=1)
    """torch CPU threads (null = torch's default; 1 is often fastest for tiny models)"""
    model: ModelConfig = dataclasses.field(default_factory=ModelConfig)
    """the policy"""
    data: DataConfig = dataclasses.field(default_factory=DataConfig)
    """the questions"""
    retriever: RetrieverConfig = dataclasses.field(default_factory=RetrieverConfig)
    """the search engine"""
    rollout: RolloutConfig = dataclasses.field(default_factory=RolloutConfig)
    """multi-turn generation"""
    algo: AlgoConfig = dataclasses.field(default_factory=AlgoConfig)
    """the objective: GRPO, KL, entropy, LLDS"""
    optim: OptimConfig = dataclasses.field(default_factory=OptimConfig)
    """the optimizer"""
    logging: LoggingConfig = dataclasses.field(default_factory=LoggingConfig)
    """metrics sinks and terminal output"""
    diagnostics: DiagnosticsConfig = dataclasses.field(default_factory=DiagnosticsConfig)
    """in-loop measurements and alarms"""
    monitor: MonitorConfig = dataclasses.field(default_factory=MonitorConfig)
    """the collapse alarms' detectors and thresholds (docs/diagnostics.md)"""
    fsdp: FSDPConfig = dataclasses.field(default_factory=FSDPConfig)
    """sharding over processes"""
    make_inputs: str = ""
    """the command that makes the model, data and corpus this config names (a preset's
    `llds demo --skip-train --out runs/demo`); `llds train` says it when one of them does not
    exist inside the directory its `--out` names (not for a file of the user's own)"""

    def __post_init__(self) -> None:
        """Checks that involve several sections; one top-k (`retriever.topk`) for the run."""
        self.rollout.topk = self.retriever.topk  # what --print-config shows is what runs
        for key, why in self._problems():
            raise Invalid(key, why)

    def _problems(self) -> list[tuple[str, str]]:
        """`(dotted key, why)` of each broken cross-section rule, the most basic first."""
        out: list[tuple[str, str]] = []
        if self.model.lora is not None and self.fsdp.enabled:
            out.append(("model.lora", "LoRA with fsdp.enabled is not supported; use one"))
        if self.rollout.group_size < 2:
            out.append(
                (
                    "rollout.group_size",
                    f"must be >= 2, got {self.rollout.group_size}: GRPO's advantages are "
                    "relative to the group of a question's rollouts, so with one every "
                    "advantage is 0 and nothing learns",
                )
            )
        if self.rollout.temperature == 0:
            why = (
                "0 is greedy decoding: every rollout of a question is the same, so every "
                "advantage is 0 and nothing learns; sample (Search-R1: 1.0)"
            )
            out.append(("rollout.temperature", why))
        if not self.llds_can_act:
            why = (
                "LLDS acts only from the second optimizer step on a rollout batch (on the first, "
                "pi_theta == pi_old), and mini_batches x epochs = 1 gives it none; use "
                "optim.mini_batches >= 2 (the paper takes 10)"
            )
            if self.algo.llds.enabled and self.algo.llds.coef > 0:
                out.append(("optim.mini_batches", f"{why}, or algo.llds.enabled=false"))
            if self.diagnostics.on_alarm == "rollback":
                out.append(
                    (
                        "optim.mini_batches",
                        f"diagnostics.on_alarm=rollback turns LLDS on after a rollback: {why}",
                    )
                )
        if self.fsdp.enabled and self.model.dtype == "float16":
            why = "FSDP runs bf16 or float32 compute; use model.dtype=bfloat16"
            out.append(("fsdp.enabled", why))
        if self.rollout.dtype is not None and self.algo.old_logprobs == "rollout":
            out.append(
                (
                    "algo.old_logprobs",
                    f"'rollout' reads pi_old from the sampling logits, but rollout.dtype="
                    f"{self.rollout.dtype} samples from a copy whose numbers differ from the "
                    "policy's forward; use auto or recompute",
                )
            )
        if self.algo.rollout_correction.mode != "off" and self.rollout.dtype is None:
            out.append(
                (
                    "algo.rollout_correction.mode",
                    f"{self.algo.rollout_correction.mode} corrects for a sampler that is not the "
                    "trained policy, and without rollout.dtype the policy samples itself: every "
                    "weight would be exactly 1 (nothing corrected); set rollout.dtype (a "
                    "sampling copy) or mode=off",
                )
            )
        if self.rollout.sync_every > 1 and self.rollout.dtype is None:
            why = "lags the sampling copy, which only exists with rollout.dtype (e.g. float32)"
            out.append(("rollout.sync_every", why))
        elif self.save_every % self.rollout.sync_every:
            why = (
                f"{self.rollout.sync_every} must divide save_every={self.save_every}, so that a "
                "checkpoint's sampling copy is the saved policy and a resumed run samples as "
                "the uninterrupted one"
            )
            out.append(("rollout.sync_every", why))
        rows = self.prompts_per_step * self.rollout.group_size
        if self.optim.mini_batches > rows:
            why = f"{self.optim.mini_batches} > {rows} rollouts per step"
            out.append(("optim.mini_batches", why))
        elif self.optim.minibatch_order == "rollout" and self.optim.mini_batches > (
            self.prompts_per_step
        ):
            why = (
                f"{self.optim.mini_batches} > {self.prompts_per_step} prompts per step: "
                "optim.minibatch_order=rollout keeps groups whole, one group at least per "
                "mini-batch"
            )
            out.append(("optim.mini_batches", why))
        if self.diagnostics.reference_every > 0 and not self.data.eval:
            out.append(("diagnostics.reference_every", "needs data.eval (held-out questions)"))
        return out

    def missing(self) -> list[tuple[str, str]]:
        """`(dotted key, why)` of each required key left empty (the loader refuses them; the
        defaults alone are a valid object, e.g. for comparing a saved config against)."""
        out = []
        if not self.model.path:
            out.append(("model.path", "required (an HF model directory, hub id, or smollm2)"))
        if not self.data.train:
            out.append(("data.train", "required (a .parquet, .jsonl, or trivia:LIST spec)"))
        if not self.retriever.source and self.rollout.max_turns > 0:
            why = "required (corpus .jsonl, index directory, or URL) unless rollout.max_turns=0"
            out.append(("retriever.source", why))
        return out

    def validate(self) -> None:
        """Every check again (after fields were assigned one by one), required keys included."""
        check(self)

    @property
    def llds_can_act(self) -> bool:
        """LLDS sees d != 0 only from the second optimizer step on each rollout batch."""
        return self.optim.mini_batches * self.optim.epochs > 1

    @property
    def warmup_steps(self) -> int:
        """Warm-up length in steps, from `optim.warmup_ratio` when set."""
        if self.optim.warmup_ratio is not None:
            return round(self.optim.warmup_ratio * self.steps)
        return self.optim.warmup_steps


def load_config(path: str | Path | None = None, overrides: Overrides | None = None) -> TrainConfig:
    """`TrainConfig` from a YAML file or preset name (optional) and `key=value` overrides."""
    got = gather(TrainConfig, path, overrides or ())
    _refuse_second_topk(got.data, got.source_of("rollout.topk"))
    return build(TrainConfig, got)


def _refuse_second_topk(data: Mapping[str, object], source: str | None) -> None:
    """`rollout.topk` may only repeat `retriever.topk` (as a printed config does)."""
    rollout, retriever = data.get("rollout"), data.get("retriever")
    if not isinstance(rollout, Mapping) or "topk" not in rollout:
        return
    wanted = retriever.get("topk", 3) if isinstance(retriever, Mapping) else 3
    if rollout["topk"] != wanted:
        where = f"{source}: " if source else ""
        raise ConfigError(
            f"{where}rollout.topk: set retriever.topk instead (passages per search; one top-k)"
        )


def check_inputs(cfg: TrainConfig, *, resume: bool = True) -> None:
    """Refuse a local input (model, data, corpus) that does not exist, in one line that says
    how to make it: the config's `make_inputs`, else where relative paths start from; then the
    model (a directory's files, or a hub id cached or downloadable), the prompt template and a
    chat setting its tokenizer cannot follow, all before any model loads. A run that will
    resume (`resume`, and `run_dir` holds a checkpoint) is told why it needs its starting
    model still."""
    from llds.env.prompts import PromptTemplate
    from llds.models.hf import check_chat, check_model_source

    resumes = resume and any((Path(cfg.run_dir) / "checkpoints").glob("step_*"))
    why = (
        f"; the run in {cfg.run_dir} resumes from its checkpoint but still loads its starting "
        "model (the KL reference, and a LoRA run's base)"
        if resumes
        else ""
    )
    for key, path in _local_inputs(cfg):
        if Path(path).expanduser().exists():
            continue
        fits = any(_inside(path, out) for out in made_by(cfg.make_inputs))
        how = f"; make it with `{cfg.make_inputs}`" if fits else ""
        how += why if key == "model.path" else ""
        raise UserInputError(
            f"{key}: {path} does not exist (paths are relative to the working directory){how}"
        )
    from llds.policy.lora import adapter_dir_of, base_model_path

    model = cfg.model.path
    adapter = adapter_dir_of(model) if model != "smollm2" else None
    try:
        if adapter is None:
            check_model_source("model.path", model)  # config, tokenizer, weights whole
        else:  # an adapter (an SFT warm start, a LoRA checkpoint): its base, whose tokenizer
            model = base_model_path(adapter)
    except UserInputError as exc:
        raise UserInputError(f"{exc}{why}") from None
    PromptTemplate.from_spec(cfg.data.prompt_template, "data.prompt_template")
    check_chat("model.chat", model, cfg.model.chat)


def check_prompts_fit(cfg: TrainConfig, questions: int, source: str = "data.train") -> None:
    """Refuse fewer training questions than a step takes: every step would repeat questions
    inside its own batch (groups of one question would share their advantages' baseline)."""
    if cfg.prompts_per_step > questions:
        raise ConfigError(
            f"prompts_per_step: {cfg.prompts_per_step} questions per step, but {source} has "
            f"{questions} (data.train_limit={cfg.data.train_limit}); every step would repeat "
            "questions inside its own batch: lower prompts_per_step or add questions"
        )


def made_by(command: str) -> list[str]:
    """The directories a `make_inputs` command writes: the values of its `--out` options."""
    words = command.split()
    outs = [w.split("=", 1)[1] for w in words if w.startswith("--out=")]
    outs += [b for a, b in itertools.pairwise(words) if a == "--out"]
    return outs


def _inside(path: str, directory: str) -> bool:
    p, d = Path(path).expanduser().absolute(), Path(directory).expanduser().absolute()
    return p == d or d in p.parents


def _local_inputs(cfg: TrainConfig) -> list[tuple[str, str]]:
    """`(key, path)` of each input the run opens that names a local file or directory: not a
    URL, not a `trivia:` list, not the packaged `smollm2`, not a hub id (`org/name`)."""
    out = []
    evaluates = cfg.eval_every > 0 or cfg.diagnostics.reference_every > 0
    for key, spec in (("data.train", cfg.data.train), ("data.eval", cfg.data.eval)):
        if spec and not spec.startswith("trivia:") and (key == "data.train" or evaluates):
            out.append((key, spec))
    source = cfg.retriever.source
    if source and cfg.rollout.max_turns > 0 and not source.startswith(("http://", "https://")):
        out.append(("retriever.source", source))
    model = cfg.model.path
    if model.startswith((".", "/", "~")) or model.count("/") >= 2:
        out.append(("model.path", model))
    return out
