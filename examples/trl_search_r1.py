"""Search-R1-style GRPO + LLDS with TRL's GRPOTrainer and the llds multi-turn search rollout.

Default (no arguments): a tiny random model, a BPE tokenizer and a synthetic world generated on
the spot, BM25 over its corpus; a few CPU steps that show the `llds/*` and `lld/*` metrics.
Real run: pass your model, data and retriever, e.g.

    python examples/trl_search_r1.py --model Qwen/Qwen2.5-3B-Instruct \\
        --data nq_train.parquet --retriever http://127.0.0.1:8000/retrieve \\
        --num-generations 5 --steps-per-generation 4 --learning-rate 1e-6 --beta 0.001 \\
        --bf16 --steps 500 --output-dir runs/trl-llds

Needs the `trl` extra (`pip install "llds[trl]"`).
"""

from __future__ import annotations

import argparse
import os
import sys


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument(
        "--model", default=None, help="HF model directory or hub id (default: a tiny random model)"
    )
    p.add_argument(
        "--data",
        default=None,
        help="training questions: Search-R1 .parquet, FlashRAG .jsonl/.json or "
        "trivia:LIST (default: a generated synthetic world)",
    )
    p.add_argument(
        "--retriever",
        default=None,
        help="http://host:port/retrieve, an index directory or a corpus .jsonl "
        "(default: BM25 over the synthetic world's corpus)",
    )
    p.add_argument("--limit", type=int, default=None, help="use at most this many questions")
    p.add_argument("--output-dir", default="runs/trl-search-r1")
    p.add_argument("--steps", type=int, default=4, help="optimizer steps")
    p.add_argument("--per-device-batch", type=int, default=4)
    p.add_argument("--num-generations", type=int, default=2, help="rollouts per question (G)")
    p.add_argument("--gradient-accumulation", type=int, default=1)
    p.add_argument(
        "--steps-per-generation",
        type=int,
        default=2,
        help="optimizer micro-steps per generation batch; > gradient accumulation "
        "makes LLDS act (several updates on the same rollouts)",
    )
    p.add_argument("--num-iterations", type=int, default=1)
    p.add_argument("--learning-rate", type=float, default=1e-4)
    p.add_argument("--beta", type=float, default=0.0, help="KL coefficient (paper: 0.001)")
    p.add_argument("--llds-coef", type=float, default=0.2)
    p.add_argument("--llds-gate", default="action", choices=["action", "response", "token"])
    p.add_argument(
        "--llds-aggregation",
        default="seq-mean-token-mean",
        choices=["seq-mean-token-mean", "token-mean"],
    )
    p.add_argument("--mask-answer", action="store_true", help="LLDS-MA (answer tokens weighted)")
    p.add_argument(
        "--format-reward",
        action="store_true",
        help="Search-R1 v0.3 format-aware reward (always on for the tiny demo)",
    )
    p.add_argument("--max-turns", type=int, default=3)
    p.add_argument(
        "--max-turn-tokens",
        type=int,
        default=None,
        help="per-turn generation cap (default 500; 24 for the tiny model)",
    )
    p.add_argument("--topk", type=int, default=3)
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--bf16", action="store_true", help="bf16 autocast (GPU)")
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args(argv)


def synthetic_setup(seed: int):
    """A synthetic world, a BPE tokenizer and a tiny model fitted to it (seconds on a CPU)."""
    from llds.data.world import WorldConfig, generate_world
    from llds.models.bpe import train_bpe_tokenizer
    from llds.models.tiny import tiny_causal_lm_for

    world = generate_world(WorldConfig(seed=seed, num_entities=40, num_train=32, num_test=8))
    texts = [d["contents"] for d in world.corpus] + [q.question for q in world.train]
    tokenizer = train_bpe_tokenizer(texts, vocab_size=800)
    model = tiny_causal_lm_for(tokenizer, hidden_size=64, num_layers=2, seed=seed)
    return world, tokenizer, model


def nudge_towards_tags(model, tokenizer, bias: float = 4.0):
    """Demo only: an untrained model almost never writes the protocol tags, so every rollout
    would score 0 and GRPO would have nothing to learn from. A bias on the tag tokens gives the
    tiny model rollouts that search and answer (and so rewards that differ within a group)."""
    import torch

    from llds.env.tags import INFO_CLOSE, INFO_OPEN, PROTOCOL_TOKENS

    head = model.get_output_embeddings()
    biased = torch.nn.Linear(head.in_features, head.out_features, bias=True)
    with torch.no_grad():
        biased.weight.copy_(head.weight)
        biased.bias.zero_()
        for tag in PROTOCOL_TOKENS:
            if tag not in (INFO_OPEN, INFO_CLOSE):
                biased.bias[tokenizer.convert_tokens_to_ids(tag)] = bias
    model.config.tie_word_embeddings = False
    model.set_output_embeddings(biased)
    return model


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    import torch
    from datasets import Dataset

    from llds.data.loaders import load_examples
    from llds.env.rewards import FormatRewardConfig
    from llds.errors import UserInputError
    from llds.integrations.trl import (
        LLDSGRPOConfig,
        LLDSGRPOTrainer,
        search_r1_reward,
        search_r1_rows,
        search_rollout_func,
    )
    from llds.models.hf import load_policy
    from llds.retrieval.factory import build_retriever, open_retriever
    from llds.rollout import RolloutConfig

    tiny = args.model is None
    world = None
    if tiny:
        world, tokenizer, model = synthetic_setup(args.seed)
        model = nudge_towards_tags(model, tokenizer)
    else:
        model, tokenizer = load_policy(args.model)
    if args.data is not None:
        examples = load_examples(args.data, limit=args.limit)
    elif world is not None:
        examples = list(world.train)[: args.limit]
    else:
        raise UserInputError("--data is required with --model")
    if args.retriever is not None:
        retriever = open_retriever(args.retriever)
    elif world is not None:
        retriever = build_retriever(world.corpus, show_progress=False)
    else:
        raise UserInputError("--retriever is required with --model")

    # Instruct models get the prompt through their chat template; base models as raw text.
    chat = bool(getattr(tokenizer, "chat_template", None))
    template = "Question: {question}\nAnswer: " if tiny else None  # tiny: short prompts
    dataset = Dataset.from_list(search_r1_rows(examples, template, chat=chat))
    rollout = search_rollout_func(
        retriever,
        RolloutConfig(
            max_turns=args.max_turns,
            max_turn_tokens=args.max_turn_tokens or (24 if tiny else 500),
            max_obs_tokens=64 if tiny else 500,
            max_total_tokens=512 if tiny else 4096,
            topk=args.topk,
            temperature=args.temperature,
        ),
    )
    config = LLDSGRPOConfig(
        output_dir=args.output_dir,
        max_steps=args.steps,
        per_device_train_batch_size=args.per_device_batch,
        num_generations=args.num_generations,
        gradient_accumulation_steps=args.gradient_accumulation,
        steps_per_generation=args.steps_per_generation,
        num_iterations=args.num_iterations,
        learning_rate=args.learning_rate,
        beta=args.beta,
        temperature=args.temperature,
        bf16=args.bf16,
        use_cpu=not torch.cuda.is_available(),
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        seed=args.seed,
        llds_coef=args.llds_coef,
        llds_gate=args.llds_gate,
        llds_aggregation=args.llds_aggregation,
        llds_mask_answer=args.mask_answer,
    )
    trainer = LLDSGRPOTrainer(
        model=model,
        reward_funcs=search_r1_reward(
            "golden_answers",
            format_reward=FormatRewardConfig(enabled=True) if tiny or args.format_reward else None,
        ),
        args=config,
        train_dataset=dataset,
        processing_class=tokenizer,
        rollout_func=rollout,
    )
    trainer.train()
    # the log `llds report OUTPUT_DIR` reads (TRL writes it with every checkpoint too)
    trainer.save_state()
    trainer.save_model()
    print(f"trainer state and model written to {args.output_dir}: llds report {args.output_dir}")
    for row in trainer.state.log_history:
        if "loss" in row:
            keys = (
                "reward",
                "llds/loss",
                "llds/gate_frac",
                "lld/logp_correct",
                "lld/logp_incorrect",
                "lld/disp_correct",
            )
            print({k: row.get(k) for k in ("loss", *keys)})
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except Exception as exc:  # user-facing errors print without a traceback
        from llds.errors import ConfigError, DataFormatError, UserInputError

        if isinstance(exc, (ConfigError, DataFormatError, UserInputError)):
            print(f"error: {exc}", file=sys.stderr)
            sys.exit(2)
        raise
