"""The warm start's settings: one place for its options and defaults.

`llds sft` builds its flags from `SFTConfig`, `--config` files use its field names, and the demo
passes one directly. The defaults are tuned on the organism world (see the README, "Warm start
with SFT"): enough SFT to learn the protocol and single-hop lookups, little enough that multi-hop
is left for RL.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from llds.config.loader import from_dict, merge_config, read_yaml
from llds.errors import ConfigError


def _help(text: str) -> Any:
    return field(default=None, metadata={"help": text})


@dataclass
class SFTConfig:
    out: str = field(default="", metadata={"help": "output folder (model/ goes inside)"})
    # data
    world: str | None = _help("a world folder from `llds world` (train.jsonl + corpus.jsonl)")
    data: str | None = _help(
        "questions: .parquet (Search-R1), .jsonl (FlashRAG) or trivia:LIST (one-hop trajectories)"
    )
    corpus: str | None = _help(
        "corpus .jsonl, index dir or retriever URL (default: the world's corpus.jsonl)"
    )
    # model
    model: str | None = _help("HF model directory, cached hub id, or `smollm2`")
    tiny: bool = field(
        default=False,
        metadata={"help": "fresh tiny Qwen2 model + BPE tokenizer fitted to the world"},
    )
    tokenizer_vocab: int = field(default=4000, metadata={"help": "BPE size for --tiny"})
    hidden: int = field(default=128, metadata={"help": "--tiny hidden size"})
    layers: int = field(default=4, metadata={"help": "--tiny layers"})
    heads: int = field(default=4, metadata={"help": "--tiny attention heads"})
    name_tokens: bool = field(
        default=False,
        metadata={"help": "--tiny: make every passage title (entity name) one token"},
    )
    device: str = field(default="cpu", metadata={"help": "cpu, cuda, ..."})
    threads: int | None = _help("torch CPU threads (1 is often fastest for tiny models)")
    chat: bool | None = _help("use the tokenizer's chat template (None: when it has one)")
    prompt_template: str | None = _help("template file containing {question}")
    # what the warm start teaches
    max_hops: int | None = _help("train only on questions with <= this many hops")
    num_examples: int | None = _help("at most this many trajectories")
    topk: int = field(default=3, metadata={"help": "passages per search"})
    max_obs_tokens: int = field(default=500, metadata={"help": "observation token cap"})
    think: bool = field(default=True, metadata={"help": "expert actions with <think> text"})
    relabel_copies: int = field(
        default=0,
        metadata={
            "help": "--world: also train on K copies of the world with entity names permuted "
            "(the same names on other facts), so only reading pays"
        },
    )
    early_answer: float = field(
        default=0.0,
        metadata={
            "help": "share of chain trajectories (--world) where the expert stops searching "
            "early and answers with the last name it read (wrong), as untrained models do"
        },
    )
    loss_on: Literal["actions", "all"] = field(
        default="actions",
        metadata={
            "help": "tokens trained on: the expert's actions, or all (passages and questions "
            "too; grows copying in small models)"
        },
    )
    # optimisation
    steps: int | None = field(default=150, metadata={"help": "optimizer steps"})
    epochs: float | None = _help("passes over the trajectories (instead of steps)")
    lr: float = field(default=3e-3, metadata={"help": "peak learning rate"})
    batch_size: int = field(default=8, metadata={"help": "trajectories per step"})
    micro_batch_tokens: int = field(default=8192, metadata={"help": "padded tokens per forward"})
    warmup: int = field(default=10, metadata={"help": "warm-up steps"})
    seed: int = field(default=0, metadata={"help": "seed for init, shuffling, think phrases"})
    # after training
    eval: int = field(
        default=0,
        metadata={"help": "greedy-evaluate this many test questions of the world (0 = skip)"},
    )
    eval_max_turns: int = field(default=4, metadata={"help": "searches allowed in that evaluation"})
    progress: bool = field(default=True, metadata={"help": "progress bars"})

    def validate(self) -> None:
        """Cross-field checks; errors name the option."""
        if not self.out:
            raise ConfigError("out: required (the output folder)")
        if self.steps is not None and self.epochs is not None:
            raise ConfigError("steps, epochs: give steps or epochs, not both")
        if not 0.0 <= self.early_answer <= 1.0:
            raise ConfigError(f"early_answer must be in [0, 1], got {self.early_answer}")
        if self.relabel_copies < 0:
            raise ConfigError(f"relabel_copies must be >= 0, got {self.relabel_copies}")


def load_sft_config(
    path: str | Path | None = None, given: dict[str, Any] | None = None
) -> SFTConfig:
    """`SFTConfig` from a YAML file (keys = field names, `base:` allowed) and the values given on
    the command line, which win. A `steps` given on one level replaces an `epochs` from a lower
    one and vice versa."""
    data: dict[str, Any] = read_yaml(path, SFTConfig) if path else {}
    given = dict(given or {})
    if "steps" in given or "epochs" in given:  # the command line decides the training length
        data.pop("steps", None)
        data.pop("epochs", None)
        given.setdefault("steps", None)
        given.setdefault("epochs", None)
    elif "epochs" in data:  # epochs in the file replaces the default steps
        data.setdefault("steps", None)
    try:
        cfg = from_dict(SFTConfig, merge_config(data, given, SFTConfig))
    except ConfigError as exc:
        raise ConfigError(f"{exc} (config file: {path})" if path else str(exc)) from None
    cfg.validate()
    return cfg
