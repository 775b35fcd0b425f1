"""What `diagnostics.reference_every` costs: re-reading the reference chains (one no-grad
forward pass over fixed token ids) against a greedy held-out evaluation of the same questions
(what `eval_every` runs), on the organism's warm start, in one process.

    llds demo --out runs/demo --skip-train
    python benchmarks/reference_chains_cost.py --demo runs/demo --repeats 3
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import machine, median_time


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--demo", type=Path, default=Path("runs/demo"))
    ap.add_argument("--questions", type=int, default=120)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    from llds.data.loaders import load_examples
    from llds.demo import TEMPLATE, organism_rollout
    from llds.env.prompts import build_prompt_ids
    from llds.models.hf import load_policy
    from llds.probe.reference import ReferenceChains
    from llds.retrieval.factory import open_retriever
    from llds.rollout import RolloutEngine, RolloutRequest

    model, tok = load_policy(args.demo / "sft" / "model")
    model.eval()
    examples = load_examples(args.demo / "world" / "test.jsonl", limit=args.questions)
    retriever = open_retriever(args.demo / "world" / "corpus.jsonl")
    greedy = dataclasses.replace(organism_rollout(), temperature=0.0, group_size=1)
    engine = RolloutEngine(model, tok, retriever, greedy)
    prompts = [(build_prompt_ids(tok, ex.question, TEMPLATE), ex) for ex in examples]
    budget = 16384
    chains = ReferenceChains.build(model, engine, prompts, engine.pad_id, budget)

    requests = [RolloutRequest(ids, ex.id, ex.id, tuple(ex.answers)) for ids, ex in prompts]

    def evaluate() -> None:  # what a greedy evaluation costs: generating the answers
        engine.generate(requests)

    def reread() -> None:
        chains.metrics(model, engine.pad_id, budget)

    t_eval = median_time(evaluate, args.repeats)
    t_read = median_time(reread, args.repeats)
    tokens = int(chains.batch(engine.pad_id).loss_mask.sum())
    print(f"machine: {machine()}")
    print(f"{len(examples)} held-out questions, {tokens} model-written tokens in the chains")
    print(f"| work | median of {args.repeats} | time / the evaluation's |")
    print("|---|---|---|")
    print(f"| greedy evaluation (generating the answers) | {t_eval:.2f} s | 1.00x |")
    print(f"| re-reading the reference chains | {t_read:.2f} s | {t_read / t_eval:.2f}x |")


if __name__ == "__main__":
    main()
