"""The training configuration: one dataclass per concern, loaded from YAML with overrides."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from llds.algo.config import AlgoConfig, LLDSConfig
from llds.algo.llds import GATES, LLDS_AGGREGATIONS
from llds.algo.masking import AGGREGATIONS
from llds.config.loader import from_dict, merge_config, parse_overrides, read_yaml
from llds.errors import ConfigError
from llds.policy.config import LoRAConfig, ModelConfig
from llds.rollout.config import RolloutConfig

__all__ = [
    "AlgoConfig",
    "LLDSConfig",
    "LoRAConfig",
    "ModelConfig",
    "TrainConfig",
    "load_config",
]


@dataclass
class DataConfig:
    train: str = ""
    """train questions: .parquet (Search-R1), .jsonl (FlashRAG), or `trivia:list1,list2`"""
    eval: str = ""
    prompt_template: str | None = None
    """a template file or inline text containing {question}; null = the default instruction"""
    train_limit: int | None = None
    eval_limit: int | None = None


@dataclass
class RetrieverConfig:
    source: str = ""
    """a corpus .jsonl (BM25 built on the fly), an index directory, or an http(s):// URL; not
    needed (and not opened) for single-turn training, `rollout.max_turns=0`"""
    topk: int = 3
    retry_seconds: float = 120.0
    """how long a retrieval service (a URL source) that stops answering is retried, with
    backoff, before the run stops; it then exits with code 2 and resumes from its last
    checkpoint when started again with the same command"""


@dataclass
class OptimConfig:
    lr: float = 1e-6
    weight_decay: float = 0.01
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    warmup_steps: int = 0
    warmup_ratio: float | None = None
    """warm-up as a share of `steps` (Search-R1's code: 0.285); replaces warmup_steps when set"""
    schedule: Literal["constant", "cosine", "linear"] = "constant"
    grad_clip: float = 1.0
    mini_batches: int = 10
    """optimizer steps per rollout batch (per epoch), as the paper's 10; LLDS acts from the
    second on, so LLDS with one step in all is a config error"""
    epochs: int = 1
    micro_batch_tokens: int = 16384
    """token budget of one forward+backward (rows x padded length)"""
    max_nonfinite_in_a_row: int = 3


@dataclass
class LoggingConfig:
    tensorboard: bool = True
    wandb: bool = False
    wandb_project: str = "llds"
    progress: bool = True


@dataclass
class DiagnosticsConfig:
    enabled: bool = True
    sample_fraction: float = 1.0
    """share of the rollout batch re-scored after the update for displacement metrics"""
    alarms: bool = True
    on_alarm: Literal["warn", "stop", "rollback"] = "warn"
    rollback_llds_coef: float = 0.2
    update_ratio: bool = True
    """log `optim/update_ratio` = ||delta theta|| / ||theta|| per step (keeps one copy of the
    trainable weights during the update; off with `enabled: false` too)"""
    probe_every: int = 0
    """every N steps, the one-step probe (the paper's Eq. 3) on a fixed set of training
    questions, on a copy of the policy: `probe/*` metrics (main process only); 0 = off"""
    probe_questions: int = 16
    """questions in the probe set (only those whose sampled group is mixed are probed)"""
    probe_lr: float = 1e-2
    """plain-SGD step of the probe update (`probe/first_order_*` need no step size)"""
    hidden_similarity_every: int = 10
    """every N steps, `lld/hidden_cos_correct_incorrect`: the mean cosine similarity of the last
    hidden states (averaged over response tokens) of correct and incorrect responses of a group
    (one extra forward over the mixed groups' rollouts); 0 = off"""
    reference_every: int = 0
    """every N steps, `lld/ref_*`: the likelihood change of fixed reference chains, the starting
    policy's greedy answers to the held-out questions (`data.eval`, `data.eval_limit`), split
    into those that were correct and wrong (one no-grad forward; main process only); 0 = off.
    Sees what the batch cannot: correct answers to questions outside it losing likelihood"""


@dataclass
class FSDPConfig:
    """Fully sharded data parallel (torch FSDP2) for policies that do not fit one device.

    The float32 master weights, gradients and optimizer state are sharded over the processes;
    compute runs in `model.dtype`. Rollouts, pi_old, the reference and the diagnostics' passes
    run on unsharded copies in the compute dtype, refreshed from the shards after every step.
    Needs a multi-process launch (torchrun / accelerate launch)."""

    enabled: bool = False
    reshard_after_forward: bool = True
    """free each block's gathered weights after its forward (less memory, one more all-gather
    in the backward)"""


@dataclass
class TrainConfig:
    run_dir: str = "runs/default"
    seed: int = 0
    steps: int = 100
    prompts_per_step: int = 8
    save_every: int = 10
    keep_checkpoints: int = 2
    eval_every: int = 0
    eval_max_turns: int = 4
    threads: int | None = None
    """torch CPU threads (null = torch's default; 1 is often fastest for tiny models)"""
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    retriever: RetrieverConfig = field(default_factory=RetrieverConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    algo: AlgoConfig = field(default_factory=AlgoConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    diagnostics: DiagnosticsConfig = field(default_factory=DiagnosticsConfig)
    fsdp: FSDPConfig = field(default_factory=FSDPConfig)

    def validate(self) -> None:
        """Cross-field checks the types alone cannot express."""

        def bad(key: str, why: str) -> ConfigError:
            return ConfigError(f"{key}: {why}")

        for key, val in _floats(self):  # nan compares false with every bound below
            if not math.isfinite(val):
                raise bad(key, f"must be a finite number, got {val}")
        lora = self.model.lora
        if lora is not None:
            if lora.r < 1:
                raise bad("model.lora.r", f"must be >= 1, got {lora.r}")
            if lora.alpha <= 0:
                raise bad("model.lora.alpha", f"must be > 0, got {lora.alpha}")
            if not 0 <= lora.dropout < 1:
                raise bad("model.lora.dropout", f"must be in [0, 1), got {lora.dropout}")
            if not lora.target_modules:
                raise bad("model.lora.target_modules", "name at least one module")
            if self.fsdp.enabled:
                raise bad("model.lora", "LoRA with fsdp.enabled is not supported; use one")
        if not self.model.path:
            raise bad("model.path", "required (an HF model directory, hub id, or smollm2)")
        if not self.data.train:
            raise bad("data.train", "required (a .parquet, .jsonl, or trivia:LIST spec)")
        if not self.retriever.source and self.rollout.max_turns > 0:
            raise bad(
                "retriever.source",
                "required (corpus .jsonl, index directory, or URL) unless rollout.max_turns=0",
            )
        if self.retriever.retry_seconds <= 0:
            raise bad("retriever.retry_seconds", f"must be > 0, got {self.retriever.retry_seconds}")
        for key, val in (
            ("steps", self.steps),
            ("prompts_per_step", self.prompts_per_step),
            ("save_every", self.save_every),
        ):
            if val < 1:
                raise bad(key, f"must be >= 1, got {val}")
        for key, limit in (
            ("data.train_limit", self.data.train_limit),
            ("data.eval_limit", self.data.eval_limit),
        ):
            if limit is not None and limit < 1:
                raise bad(key, f"must be >= 1 (null = every question), got {limit}")
        group = self.rollout.group_size
        if group < 2:
            raise bad(
                "rollout.group_size",
                f"must be >= 2, got {group}: GRPO's advantages are relative to the group of a "
                "question's rollouts, so with one every advantage is 0 and nothing learns",
            )
        if self.algo.aggregation not in AGGREGATIONS:
            raise bad("algo.aggregation", f"must be one of {list(AGGREGATIONS)}")
        if self.algo.llds.gate not in GATES:
            raise bad("algo.llds.gate", f"must be one of {list(GATES)}")
        if self.algo.llds.aggregation not in LLDS_AGGREGATIONS:
            raise bad("algo.llds.aggregation", f"must be one of {list(LLDS_AGGREGATIONS)}")
        if self.algo.llds.coef < 0:
            raise bad("algo.llds.coef", "must be >= 0")
        if self.optim.mini_batches < 1 or self.optim.epochs < 1:
            raise bad("optim.mini_batches", "mini_batches and epochs must be >= 1")
        if not self.llds_can_act:
            why = (
                "LLDS acts only from the second optimizer step on a rollout batch (on the first, "
                "pi_theta == pi_old), and mini_batches x epochs = 1 gives it none; use "
                "optim.mini_batches >= 2 (the paper takes 10)"
            )
            if self.algo.llds.enabled and self.algo.llds.coef > 0:
                raise bad("optim.mini_batches", f"{why}, or algo.llds.enabled=false")
            if self.diagnostics.on_alarm == "rollback":
                raise bad(
                    "optim.mini_batches",
                    f"diagnostics.on_alarm=rollback turns LLDS on after a rollback: {why}",
                )
        if self.fsdp.enabled and self.model.dtype == "float16":
            raise bad("fsdp.enabled", "FSDP runs bf16 or float32 compute; use model.dtype=bfloat16")
        if self.rollout.dtype is not None and self.algo.old_logprobs == "rollout":
            raise bad(
                "algo.old_logprobs",
                f"'rollout' reads pi_old from the sampling logits, but rollout.dtype="
                f"{self.rollout.dtype} samples from a copy whose numbers differ from the policy's "
                "forward; use auto or recompute",
            )
        w = self.optim.warmup_ratio
        if w is not None:
            if not 0 <= w < 1:
                raise bad("optim.warmup_ratio", f"must be in [0, 1), got {w}")
            if self.optim.warmup_steps:
                raise bad("optim.warmup_ratio", "set either warmup_ratio or warmup_steps, not both")
        rows = self.prompts_per_step * self.rollout.group_size
        if self.optim.mini_batches > rows:
            raise bad("optim.mini_batches", f"{self.optim.mini_batches} > {rows} rollouts per step")
        if not 0 < self.diagnostics.sample_fraction <= 1:
            raise bad("diagnostics.sample_fraction", "must be in (0, 1]")
        d = self.diagnostics
        for key in ("probe_every", "hidden_similarity_every", "reference_every"):
            if getattr(d, key) < 0:
                raise bad(f"diagnostics.{key}", f"must be >= 0 (0 = off), got {getattr(d, key)}")
        if d.reference_every > 0 and not self.data.eval:
            raise bad("diagnostics.reference_every", "needs data.eval (held-out questions)")
        if d.probe_every > 0 and d.probe_questions < 1:
            raise bad("diagnostics.probe_questions", f"must be >= 1, got {d.probe_questions}")
        if d.probe_every > 0 and not (d.probe_lr > 0 and math.isfinite(d.probe_lr)):
            raise bad("diagnostics.probe_lr", f"must be a positive number, got {d.probe_lr}")
        self.rollout.validate()
        if self.optim.lr <= 0:
            raise bad("optim.lr", "must be > 0")

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


def _floats(obj: object, prefix: str = "") -> Iterator[tuple[str, float]]:
    """Every float in a config tree with its dotted key (tuple items as `key[i]`)."""
    for f in dataclasses.fields(obj):  # type: ignore[arg-type]
        key, val = f"{prefix}{f.name}", getattr(obj, f.name)
        if dataclasses.is_dataclass(val):
            yield from _floats(val, f"{key}.")
        elif isinstance(val, float):
            yield key, val
        elif isinstance(val, list | tuple):
            yield from ((f"{key}[{i}]", v) for i, v in enumerate(val) if isinstance(v, float))


def load_config(path: str | Path | None = None, overrides: list[str] | None = None) -> TrainConfig:
    """Read YAML (optional), apply `key=value` overrides, build and validate the config."""
    data: dict[str, Any] = read_yaml(path, TrainConfig) if path else {}
    if overrides:
        data = merge_config(data, parse_overrides(overrides), TrainConfig)
    if isinstance(data.get("rollout"), dict) and "topk" in data["rollout"]:
        raise ConfigError("rollout.topk: set retriever.topk instead (passages per search)")
    cfg = from_dict(TrainConfig, data)
    cfg.rollout.topk = cfg.retriever.topk  # one top-k: what --print-config shows is what runs
    cfg.validate()
    return cfg
