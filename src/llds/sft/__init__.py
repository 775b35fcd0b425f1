"""Supervised warm start as a library call: `llds.sft.run(SFTConfig(...))`.

The package: `config` (its settings), `data` (expert trajectories laid out like rollouts),
`trainer` (the teacher-forced loop); `run` ties them to a model, a world and a retriever.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from llds.config.loader import to_dict
from llds.errors import UserInputError
from llds.sft.config import SFTConfig, load_sft_config

__all__ = ["SFTConfig", "load_sft_config", "run"]


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


def _tokenizer_texts(template: Any, think_bank: Any = "fixed", reading: bool = False) -> list[str]:
    """Text the tiny model will read besides the corpus: the prompt and the expert phrasing."""
    from llds.env.prompts import DEFAULT_INSTRUCTION
    from llds.sft.data import tokenizer_phrases

    prompt = DEFAULT_INSTRUCTION if template is None else template.text
    phrases = tokenizer_phrases(think_bank, reading=reading)
    return [prompt] * 5 + phrases


def tiny_tokenizer(
    corpus: str,
    train: list[Any],
    vocab_size: int,
    *,
    template: Any = None,
    name_tokens: bool = True,
    think_bank: Any = "fixed",
    reading: bool = False,
) -> Any:
    """BPE fitted to the corpus, the training questions, the prompt and the expert phrasing.

    With `name_tokens`, every passage title becomes one added token. In the synthetic world the
    titles are the entity names, so a tiny model copies a name (question -> query, passage ->
    next query or answer) as one token instead of a run of syllable pieces; without this, copying
    is what a CPU-sized model fails to learn in minutes.
    """
    from llds.models.bpe import tokenizer_for_world
    from llds.retrieval.base import Hit
    from llds.retrieval.corpus import read_corpus

    passages = [p.contents for p in read_corpus(corpus)]
    texts = (
        passages + [ex.question for ex in train] + _tokenizer_texts(template, think_bank, reading)
    )
    names: list[str] = []
    if name_tokens:
        titles = (Hit("", text, 0.0).title.strip() for text in passages)
        names = sorted({t for t in titles if t and " " not in t})
    return tokenizer_for_world(texts, vocab_size, extra_tokens=names)


def tiny_model_and_tokenizer(
    cfg: SFTConfig, corpus: str, train: list[Any], template: Any = None
) -> tuple[Any, Any]:
    """`tiny=true`'s fresh model and the BPE tokenizer fitted to `corpus` and the questions, as
    `cfg` sets them (vocabulary, name tokens, think bank, size, seed), on the CPU."""
    from llds.models import tiny_causal_lm_for

    tok = tiny_tokenizer(
        corpus,
        train,
        cfg.tokenizer_vocab,
        template=template,
        name_tokens=cfg.name_tokens,
        think_bank=cfg.think_bank,
        reading=cfg.reading,
    )
    model = tiny_causal_lm_for(
        tok,
        hidden_size=cfg.hidden,
        num_layers=cfg.layers,
        num_heads=cfg.heads,
        num_kv_heads=max(1, cfg.heads // 2),
        seed=cfg.seed,
    )
    return model, tok


def _model_and_tokenizer(cfg: SFTConfig, corpus: str | None, template: Any, train: list[Any]):
    from llds.policy.setup import resolve_device

    if bool(cfg.tiny) == bool(cfg.model):
        raise UserInputError("give exactly one of tiny=true or model=PATH")
    device = str(resolve_device(cfg.device, "device"))
    if cfg.tiny:
        if not (corpus and Path(corpus).is_file()):
            raise UserInputError(
                "tiny=true fits its tokenizer to a corpus: give world=DIR or a corpus=FILE .jsonl"
            )
        model, tok = tiny_model_and_tokenizer(cfg, corpus, train, template)
        return model.to(device), tok
    if cfg.model == "smollm2":
        from llds.models import load_smollm2

        return load_smollm2(device=device)
    from llds.models import load_policy

    return load_policy(cfg.model, device=device)


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


def run(cfg: SFTConfig) -> dict[str, Any]:
    """Build the expert trajectories, train, save the model with its protocol, evaluate; returns
    the report that is also written to `OUT/sft_report.json`."""
    import json

    cfg.validate()
    if cfg.model:  # before the data is prepared: a broken model directory is named at once
        from llds.models.hf import check_model_source

        check_model_source("model", cfg.model)
    if cfg.threads:
        import torch

        torch.set_num_threads(cfg.threads)
    started = time.perf_counter()
    train, test, world_corpus = _load_examples(cfg)
    corpus = cfg.corpus or world_corpus
    if corpus is None:
        raise UserInputError("data needs corpus (a corpus .jsonl, index dir or URL)")

    from llds.env.prompts import PromptTemplate
    from llds.io import write_json
    from llds.retrieval.factory import open_answering_retriever
    from llds.sft.data import build_expert_episodes
    from llds.sft.trainer import sft_train

    template = PromptTemplate.from_file(cfg.prompt_template) if cfg.prompt_template else None
    # before the model: a dead retrieval service is one line, at once
    retriever = open_answering_retriever(corpus, key="corpus")
    model, tok = _model_and_tokenizer(cfg, corpus, template, train)
    expert = {
        "template": template,
        "chat": cfg.chat,
        "topk": cfg.topk,
        "max_obs_tokens": cfg.max_obs_tokens,
        "think": cfg.think,
        "max_hops": cfg.max_hops,
        "num_examples": cfg.num_examples,
        "early_answer": cfg.early_answer,
        "seed": cfg.seed,
        "think_bank": cfg.think_bank,
        "think_draws": cfg.think_draws,
        "reading": cfg.reading,
        "miss_first": cfg.miss_first,
    }
    episodes, stats = build_expert_episodes(train, retriever, tok, **expert)
    for copy_train, copy_retriever in _relabeled_copies(cfg):
        more, more_stats = build_expert_episodes(copy_train, copy_retriever, tok, **expert)
        episodes += more
        stats = stats.merged(more_stats)
    n_params = sum(p.numel() for p in model.parameters())
    mean_len = sum(len(e) for e in episodes) / max(len(episodes), 1)
    print(
        f"{len(episodes)} trajectories of {stats.kept} questions "
        f"({stats.to_dict()['kept_by_hops']} by hops; "
        f"{stats.early_answers} stopping early, {stats.searched_twice} searching twice, "
        f"{stats.skipped_hops} skipped by max_hops, {stats.skipped_no_gold_in_retrieval} "
        f"without the answer in retrieval), {mean_len:.0f} tokens each on average; "
        f"model {n_params / 1e6:.2f}M parameters"
    )
    out = Path(cfg.out)
    result = sft_train(
        model,
        tok,
        episodes,
        lr=cfg.lr,
        steps=cfg.steps,
        epochs=cfg.epochs,
        batch_size=cfg.batch_size,
        micro_batch_tokens=cfg.micro_batch_tokens,
        warmup=cfg.warmup,
        seed=cfg.seed,
        out_dir=out,
        progress=cfg.progress,
        loss_on=cfg.loss_on,
    )
    report: dict[str, Any] = {
        "options": to_dict(cfg),
        "data": stats.to_dict(),
        "parameters": n_params,
        "mean_tokens_per_trajectory": mean_len,
        "initial_loss": result.initial_loss,
        "final_loss": result.final_loss,
        "sft_wall_s": round(result.wall_s, 2),
    }
    from llds.env.protocol import Protocol

    # what `llds eval` / `llds train` need to talk to this model as SFT taught it
    Protocol(
        prompt_template=None if template is None else template.text,
        chat=cfg.chat,
        topk=cfg.topk,
        max_turns=cfg.eval_max_turns,
        max_obs_tokens=cfg.max_obs_tokens,
    ).write(result.model_dir)
    print(
        f"SFT loss {result.initial_loss:.3f} -> {result.final_loss:.3f} in {result.steps} "
        f"steps ({result.wall_s:.0f} s)"
    )
    if cfg.eval and test:
        from llds.evaluation.evaluate import evaluate, results_table
        from llds.rollout import RolloutConfig

        res = evaluate(
            model,
            tok,
            retriever,
            test[: cfg.eval],
            RolloutConfig(
                max_turns=cfg.eval_max_turns,
                temperature=0.0,
                topk=cfg.topk,
                max_obs_tokens=cfg.max_obs_tokens,
            ),
            template=template,
            chat=cfg.chat,
            progress=cfg.progress,
        )
        scores = res.to_dict()
        report["eval"] = {k: scores[k] for k in ("overall", "by_hops")}
        print(results_table(res))
    report["total_wall_s"] = round(time.perf_counter() - started, 2)
    write_json(out / "sft_report.json", json.loads(json.dumps(report, default=str)))
    print(f"model written to {result.model_dir}")
    return report
