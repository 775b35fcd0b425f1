"""`llds probe`: the one-step per-question likelihood-displacement probe."""

from __future__ import annotations

import argparse

from llds.commands._protocol import add_protocol_arguments, resolve_protocol

HELP = (
    "one GRPO step per question from the same weights: did its correct responses lose likelihood?"
)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", required=True, help="HF model directory, hub id, or smollm2")
    p.add_argument(
        "--data", required=True, nargs="+", help=".parquet / .jsonl files or trivia:LISTS"
    )
    p.add_argument("--retriever", required=True, help="corpus .jsonl, index directory or http URL")
    p.add_argument("--out", required=True, help="directory for probe.json and probe.png")
    p.add_argument(
        "--limit", type=int, default=64, help="questions to sample (mixed groups are probed)"
    )
    p.add_argument("--group-size", type=int, default=8)
    p.add_argument("--lr", type=float, default=1e-6)
    p.add_argument("--optimizer", choices=["adam", "sgd"], default="adam")
    p.add_argument("--temperature", type=float, default=1.0)
    add_protocol_arguments(p)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="auto")


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from llds.data.loaders import load_many
    from llds.diagnostics.probe import plot_probe, run_probe, summarize
    from llds.env.prompts import PromptTemplate
    from llds.io import write_json
    from llds.retrieval.factory import open_retriever
    from llds.rollout import RolloutConfig
    from llds.train.config import ModelConfig
    from llds.train.setup import load_model

    model, tok = load_model(ModelConfig(path=args.model, device=args.device))
    examples = load_many(args.data, limit=args.limit)
    proto = resolve_protocol(args)
    cfg = RolloutConfig(
        group_size=args.group_size,
        max_turns=proto.max_turns,
        topk=proto.topk,
        max_turn_tokens=proto.max_turn_tokens,
        max_obs_tokens=proto.max_obs_tokens,
        max_total_tokens=proto.max_total_tokens,
        temperature=args.temperature,
    )
    template = None if proto.prompt_template is None else PromptTemplate(proto.prompt_template)
    results = run_probe(
        model,
        tok,
        open_retriever(args.retriever),
        examples,
        group_size=args.group_size,
        rollout=cfg,
        lr=args.lr,
        optimizer=args.optimizer,
        seed=args.seed,
        template=template,
        chat=proto.chat,
    )
    out = Path(args.out)
    summary = summarize(results)
    write_json(out / "probe.json", summary)
    if results:
        plot_probe(results, out / "probe.png")
        print(
            f"probed {summary['probed']} questions with mixed groups; "
            f"LLD (correct likelihood fell) in {summary['lld_share']:.0%} of them"
        )
    else:
        print("no question had both correct and incorrect rollouts: nothing to probe")
    print(f"written to {out}/probe.json" + (" and probe.png" if results else ""))
    return 0
