"""`llds eval`: greedy evaluation of a model on QA data with search."""

from __future__ import annotations

import argparse

HELP = "evaluate a model (greedy) on QA data: per-source EM/F1/sub-EM and valid searches"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", required=True, help="HF model directory, hub id, or smollm2")
    p.add_argument(
        "--data", required=True, nargs="+", help=".parquet / .jsonl files or trivia:LISTS"
    )
    p.add_argument("--retriever", required=True, help="corpus .jsonl, index directory or http URL")
    p.add_argument("--max-turns", type=int, default=4)
    p.add_argument("--topk", type=int, default=3)
    p.add_argument("--limit", type=int, default=None, help="at most N examples per data file")
    p.add_argument("--max-turn-tokens", type=int, default=500)
    p.add_argument("--max-obs-tokens", type=int, default=500)
    p.add_argument("--max-total-tokens", type=int, default=4096)
    p.add_argument("--batch-rows", type=int, default=64, help="rollouts generated concurrently")
    p.add_argument("--chat", choices=["auto", "yes", "no"], default="auto")
    p.add_argument("--template", default=None, help="prompt template file containing {question}")
    p.add_argument("--out", default=None, help="write results JSON here (default: print only)")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--device", default="auto")


def run(args: argparse.Namespace) -> int:
    from llds.data.loaders import load_many
    from llds.env.prompts import PromptTemplate
    from llds.io import write_json
    from llds.retrieval.factory import open_retriever
    from llds.rollout import RolloutConfig
    from llds.train.config import ModelConfig
    from llds.train.evaluate import evaluate, results_table
    from llds.train.setup import load_model

    model, tok = load_model(ModelConfig(path=args.model, dtype=args.dtype, device=args.device))
    examples = load_many(args.data, limit=args.limit)
    retriever = open_retriever(args.retriever)
    cfg = RolloutConfig(
        max_turns=args.max_turns,
        topk=args.topk,
        max_turn_tokens=args.max_turn_tokens,
        max_obs_tokens=args.max_obs_tokens,
        max_total_tokens=args.max_total_tokens,
        max_rows=args.batch_rows,
        temperature=0.0,
    )
    chat = {"auto": None, "yes": True, "no": False}[args.chat]
    template = PromptTemplate.from_file(args.template) if args.template else None
    results = evaluate(model, tok, retriever, examples, cfg, template=template, chat=chat)
    print(results_table(results))
    if args.out:
        write_json(args.out, results)
        print(f"results written to {args.out}")
    return 0
