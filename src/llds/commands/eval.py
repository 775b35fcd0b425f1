"""`llds eval`: greedy evaluation of a model on QA data with search."""

from __future__ import annotations

import argparse

from llds.commands._protocol import add_protocol_arguments, resolve_protocol

HELP = "evaluate a model (greedy) on QA data: per-source EM/F1/sub-EM and valid searches"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", required=True, help="HF model directory, hub id, or smollm2")
    p.add_argument(
        "--data", required=True, nargs="+", help=".parquet / .jsonl files or trivia:LISTS"
    )
    p.add_argument("--retriever", required=True, help="corpus .jsonl, index directory or http URL")
    p.add_argument("--limit", type=int, default=None, help="at most N examples per data file")
    p.add_argument("--batch-rows", type=int, default=64, help="rollouts generated concurrently")
    add_protocol_arguments(p)
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
    proto = resolve_protocol(args)
    cfg = RolloutConfig(
        max_turns=proto.max_turns,
        topk=proto.topk,
        max_turn_tokens=proto.max_turn_tokens,
        max_obs_tokens=proto.max_obs_tokens,
        max_total_tokens=proto.max_total_tokens,
        max_rows=args.batch_rows,
        temperature=0.0,
    )
    template = None if proto.prompt_template is None else PromptTemplate(proto.prompt_template)
    results = evaluate(model, tok, retriever, examples, cfg, template=template, chat=proto.chat)
    print(results_table(results))
    if args.out:
        write_json(args.out, results)
        print(f"results written to {args.out}")
    return 0
