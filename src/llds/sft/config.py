"""The warm start's settings: one place for its options and defaults.

`llds sft` reads `SFTConfig` from `--config` files and `key=value` overrides, and the demo
passes one directly. The defaults are tuned on the organism world (see the README, "Warm start
with SFT"): enough SFT to learn the protocol and single-hop lookups, little enough that multi-hop
is left for RL.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field

from llds.config.loader import Overrides, load
from llds.config.schema import Invalid, check, section
from llds.policy.config import LoRAConfig

EXCLUSIVE = (("steps", "epochs"),)
"""Keys of which a later layer's one replaces the other from a lower layer (or the default)."""


@section
class SFTConfig:
    """`llds sft`: supervised warm start on expert search trajectories."""

    out: str = ""
    """output folder (model/ goes inside); required"""
    # data
    world: str | None = None
    """a world folder from `llds world` (train.jsonl + corpus.jsonl)"""
    data: str | None = None
    """questions: .parquet (Search-R1), .jsonl (FlashRAG) or trivia:LIST (one-hop trajectories)"""
    corpus: str | None = None
    """corpus .jsonl, index dir or retriever URL (default: the world's corpus.jsonl)"""
    # model
    model: str | None = None
    """HF model directory, cached hub id, or `smollm2`"""
    tiny: bool = False
    """a fresh tiny Qwen2 model + BPE tokenizer fitted to the world (instead of `model`)"""
    tokenizer_vocab: int = Field(default=4000, ge=1)
    """BPE vocabulary size of the tiny model's tokenizer"""
    hidden: int = Field(default=128, ge=1)
    """hidden size of the tiny model"""
    layers: int = Field(default=4, ge=1)
    """layers of the tiny model"""
    heads: int = Field(default=4, ge=1)
    """attention heads of the tiny model"""
    name_tokens: bool = False
    """tiny model: make every passage title (entity name) one token"""
    lora: LoRAConfig | None = None
    """train low-rank adapters on `model` instead of every weight: the warm start is then the
    adapter (`OUT/adapter`, a few MB with the record of its base), which `model.path` of
    `llds train` / `llds eval` takes as it is (base + adapter, merged the same on any
    machine); null = full fine-tuning (`OUT/model`)"""
    device: str = "cpu"
    """cpu, cuda, cuda:1, ..."""
    threads: int | None = Field(default=None, ge=1)
    """torch CPU threads (1 is often fastest for tiny models); null = torch's default"""
    chat: bool | None = None
    """use the tokenizer's chat template (null: when it has one)"""
    prompt_template: str | None = None
    """template file containing {question}; null = the default instruction"""
    # what the warm start teaches
    max_hops: int | None = Field(default=None, ge=1)
    """train only on questions with <= this many hops"""
    num_examples: int | None = Field(default=None, ge=1)
    """at most this many trajectories"""
    topk: int = Field(default=3, ge=1)
    """passages per search"""
    max_obs_tokens: int = Field(default=500, ge=1)
    """observation token cap"""
    think: bool = True
    """expert actions with <think> text"""
    think_bank: Literal["fixed", "paraphrase", "paraphrase-wide"] = "fixed"
    """where the <think> text comes from: `fixed`, three phrasings per reasoning step;
    `paraphrase`, several interchangeable phrasings per slot of each step drawn per trajectory,
    so the warm start's thinking has many equally likely continuations (real entropy); or
    `paraphrase-wide`, twice as many phrasings per slot (more entropy per token)"""
    think_draws: int = Field(default=1, ge=1)
    """trajectories per question, each with its own draw of the thinking text (more than one
    keeps a model trained for many epochs from memorizing a phrasing per question)"""
    relabel_copies: int = Field(default=0, ge=0)
    """with `world`: also train on K copies of the world with entity names permuted (the same
    names on other facts), so only reading pays"""
    early_answer: float = Field(default=0.0, ge=0, le=1)
    """share of chain trajectories (with `world`) where the expert stops searching early and
    answers with the last name it read (wrong), as untrained models do"""
    reading: bool = False
    """real QA (`data`): the expert answers with the answer as the retrieved passage writes it
    and names the passage it read (`llds.sft.reading`), instead of the answer list's first
    alias"""
    miss_first: float = Field(default=0.0, ge=0, le=1)
    """with `reading`: share of questions where the expert first makes a short search that
    misses (a few of the question's words), then searches the whole question"""
    loss_on: Literal["actions", "all"] = "actions"
    """tokens trained on: the expert's actions, or all (passages and questions too; grows
    copying in small models)"""
    # optimisation
    steps: int | None = Field(default=150, ge=1)
    """optimizer steps (a `steps` set over an `epochs` from a lower layer replaces it)"""
    epochs: float | None = Field(default=None, gt=0)
    """passes over the trajectories (instead of steps; replaces a lower layer's `steps`)"""
    lr: float = Field(default=3e-3, gt=0)
    """peak learning rate"""
    batch_size: int = Field(default=8, ge=1)
    """trajectories per step"""
    micro_batch_tokens: int = Field(default=8192, ge=1)
    """padded tokens per forward"""
    warmup: int = Field(default=10, ge=0)
    """warm-up steps"""
    seed: int = 0
    """seed for init, shuffling, think phrases"""
    # after training
    eval: int = Field(default=0, ge=0)
    """greedy-evaluate this many test questions of the world (0 = skip)"""
    eval_max_turns: int = Field(default=4, ge=0)
    """searches allowed in that evaluation"""
    progress: bool = True
    """progress bars"""

    def __post_init__(self) -> None:
        if self.steps is not None and self.epochs is not None:
            raise Invalid("steps", "give steps or epochs, not both")
        if self.steps is None and self.epochs is None:
            raise Invalid("steps", "give steps or epochs")
        if self.miss_first and not self.reading:
            raise Invalid("miss_first", "is a setting of the reading expert: set reading=true")
        if self.lora is not None and self.tiny:
            raise Invalid("lora", "adapts a pretrained model (model=PATH); tiny=true trains all")
        if self.reading and self.world:
            raise Invalid("reading", "is for real QA (data): a world's questions carry hop chains")

    def missing(self) -> list[tuple[str, str]]:
        """Required keys left empty (checked by the loader and `validate`)."""
        return [("out", "required (the output folder)")] if not self.out else []

    def validate(self) -> None:
        """Every check again, required keys included."""
        check(self)


def load_sft_config(path: str | Path | None = None, given: Overrides | None = None) -> SFTConfig:
    """`SFTConfig` from a YAML file (keys = field names, `base:` allowed) and overrides
    (`key=value` text or a mapping of values), which win. A `steps` set on one level replaces
    an `epochs` from a lower one and vice versa."""
    return load(SFTConfig, path, given or (), exclusive=EXCLUSIVE)
