"""What a warm start reads, and the expert trajectories made from it.

`read_inputs` checks and opens everything an `SFTConfig` names (questions, corpus, retriever,
prompt template) before any model is made, so a wrong path or a dead retrieval service is one
line at once; `expert_episodes` lays out the expert's trajectories for the model's tokenizer.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from llds.errors import UserInputError
from llds.sft.config import SFTConfig
from llds.sft.data import ExpertDataStats, ExpertEpisode

EXPERT_KEYS = (
    "chat",
    "topk",
    "max_obs_tokens",
    "think",
    "max_hops",
    "num_examples",
    "early_answer",
    "seed",
    "think_bank",
    "think_draws",
    "reading",
    "miss_first",
)
"""`SFTConfig` fields that `build_expert_episodes` takes as they are, under the same names."""


@dataclass
class SFTInputs:
    """The questions a warm start learns from and evaluates on, and where it searches."""

    train: list[Any]
    test: list[Any]
    corpus: str
    retriever: Any
    template: Any
    """the `PromptTemplate` of `prompt_template`, or None for the default instruction"""


def read_inputs(cfg: SFTConfig) -> SFTInputs:
    """The inputs `cfg` names, checked and opened (the retriever answers one search)."""
    from llds.env.prompts import PromptTemplate
    from llds.retrieval.factory import open_answering_retriever

    train, test, world_corpus = _load_examples(cfg)
    corpus = cfg.corpus or world_corpus
    if corpus is None:
        raise UserInputError("data needs corpus (a corpus .jsonl, index dir or URL)")
    template = PromptTemplate.from_file(cfg.prompt_template) if cfg.prompt_template else None
    retriever = open_answering_retriever(corpus, key="corpus")
    return SFTInputs(train, test, corpus, retriever, template)


def _load_examples(cfg: SFTConfig) -> tuple[list[Any], list[Any], str | None]:
    """(train examples, test examples, default corpus path)."""
    from llds.data.loaders import load_examples, load_flashrag_jsonl

    if bool(cfg.world) == bool(cfg.data):
        raise UserInputError("give exactly one of world=DIR or data=FILE")
    if cfg.world:
        world = Path(cfg.world)
        train_file, test_file, corpus = (
            world / n for n in ("train.jsonl", "test.jsonl", "corpus.jsonl")
        )
        if not train_file.is_file() or not corpus.is_file():
            raise UserInputError(
                f"{world}: not a world folder (needs train.jsonl and "
                "corpus.jsonl; create one with `llds world --out DIR`)"
            )
        test = load_flashrag_jsonl(test_file) if test_file.is_file() else []
        return load_flashrag_jsonl(train_file), test, str(corpus)
    return load_examples(cfg.data), [], None


def expert_episodes(
    cfg: SFTConfig, inputs: SFTInputs, tokenizer: Any
) -> tuple[list[ExpertEpisode], ExpertDataStats]:
    """The expert's trajectories on the training questions, then on each relabeled copy of the
    world (`relabel_copies`), with the statistics of all of them."""
    from llds.sft.data import build_expert_episodes

    expert = {key: getattr(cfg, key) for key in EXPERT_KEYS}
    episodes, stats = build_expert_episodes(
        inputs.train, inputs.retriever, tokenizer, template=inputs.template, **expert
    )
    for copy_train, copy_retriever in _relabeled_copies(cfg):
        more, more_stats = build_expert_episodes(
            copy_train, copy_retriever, tokenizer, template=inputs.template, **expert
        )
        episodes += more
        stats = stats.merged(more_stats)
    return episodes, stats


def _relabeled_copies(cfg: SFTConfig) -> list[tuple[list[Any], Any]]:
    """(train questions, retriever) of each `relabel_copies` copy of the `world`."""
    k = cfg.relabel_copies
    if not k:
        return []
    if not cfg.world:
        raise UserInputError("relabel_copies needs world=DIR (it permutes the world's names)")
    from llds.data.world import read_world, relabel_world
    from llds.retrieval.bm25 import BM25Retriever

    world = read_world(cfg.world)
    copies = [relabel_world(world, seed=cfg.seed * 1000 + 1 + i) for i in range(k)]
    return [(c.train, BM25Retriever.build(c.corpus, show_progress=False)) for c in copies]
