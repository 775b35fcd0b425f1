"""SmolLM2-135M-Instruct on trivia with Wikipedia search: held-out EM zero-shot and after SFT.

The trivia lists (world capitals and chemical elements by default) are shuffled with a fixed
seed and split into held-out test questions and training questions. The packaged model is
evaluated greedily on the test questions as it comes (zero-shot, the default search instruction
and its chat template), then warm-started with SFT on expert one-search trajectories of the
training questions (BM25 over the Wikipedia summaries; a question is kept only when its top
passages contain a gold answer) and evaluated again on the same test questions.

    python experiments/smollm2/trivia.py [--lists worldcapitals,elements] [--test 100]
                                         [--sft-steps 60] [--lr 2e-5] [--batch-size 8]

Needs the optional packages of the README (SmolLM2, Red-Trivia, Wikipedia summaries).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

import torch

from llds.analysis.machine import machine
from llds.data.loaders import load_trivia_lists
from llds.evaluation.evaluate import evaluate
from llds.models import load_smollm2
from llds.retrieval.factory import build_retriever, corpus_passages
from llds.rollout import RolloutConfig
from llds.runs.eval_result import EvalResult
from llds.sft.data import build_expert_episodes
from llds.sft.trainer import sft_train


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lists", default="worldcapitals,elements")
    ap.add_argument("--test", type=int, default=100, help="held-out questions")
    ap.add_argument("--sft-steps", type=int, default=60)
    ap.add_argument("--sft-examples", type=int, default=None, help="cap on SFT trajectories")
    ap.add_argument("--lr", type=float, default=2e-5)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--max-turns", type=int, default=2)
    ap.add_argument("--topk", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=None, help="write the results as JSON here")
    args = ap.parse_args()

    examples = load_trivia_lists(args.lists.split(","))
    random.Random(args.seed).shuffle(examples)
    test, train = examples[: args.test], examples[args.test :]
    t0 = time.perf_counter()
    retriever = build_retriever(corpus_passages(None, wiki=True), show_progress=False)
    index_s = time.perf_counter() - t0
    model, tok = load_smollm2(dtype="float32", device="cpu")
    rollout = RolloutConfig(
        max_turns=args.max_turns,
        max_turn_tokens=96,
        max_obs_tokens=256,
        max_total_tokens=1536,
        topk=args.topk,
        max_rows=32,
    )

    def held_out() -> tuple[EvalResult, float]:
        start = time.perf_counter()
        res = evaluate(model, tok, retriever, test, rollout, progress=False)
        return res, time.perf_counter() - start

    zero, zero_s = held_out()
    t1 = time.perf_counter()
    episodes, stats = build_expert_episodes(
        train,
        retriever,
        tok,
        topk=args.topk,
        max_obs_tokens=256,
        num_examples=args.sft_examples,
        seed=args.seed,
    )
    sft = sft_train(
        model,
        tok,
        episodes,
        lr=args.lr,
        steps=args.sft_steps,
        batch_size=args.batch_size,
        warmup=5,
        seed=args.seed,
        progress=False,
    )
    sft_s = time.perf_counter() - t1
    after, after_s = held_out()

    print(f"machine: {machine()}")
    print(f"command: `python experiments/smollm2/trivia.py {' '.join(sys.argv[1:])}`".strip())
    print(
        f"lists {args.lists}: {len(examples)} questions, {len(test)} held out; BM25 over the "
        f"Wikipedia summaries built in {index_s:.1f} s; SFT on {stats.kept} trajectories "
        f"({stats.skipped_no_gold_in_retrieval} of {stats.considered} skipped: no gold answer "
        f"in the top-{args.topk}), {args.sft_steps} steps x {args.batch_size}, lr {args.lr}, "
        f"loss {sft.initial_loss:.3f} -> {sft.final_loss:.3f}, {sft_s:.0f} s"
    )
    print()
    print("| model | held-out EM | F1 | sub-EM | valid searches / question | answered | eval s |")
    print("|---|---|---|---|---|---|---|")
    for name, res, secs in (("zero-shot", zero, zero_s), ("after SFT", after, after_s)):
        o = res.overall
        print(
            f"| SmolLM2-135M-Instruct {name} | {o.em:.3f} | {o.f1:.3f} | "
            f"{o.sub_em:.3f} | {o.valid_searches:.2f} | {o.answered:.2f} | {secs:.0f} |"
        )
    for name, res in (("zero-shot", zero), ("after SFT", after)):
        print(f"\n{name}, first answers:")
        for r in res.records[:4]:
            print(f"  {r.question[:60]!r} gold {r.golds[0]!r} -> {r.prediction!r}")
    if args.out:
        Path(args.out).write_text(
            json.dumps(
                {
                    "zero_shot": zero.to_dict(),
                    "after_sft": after.to_dict(),
                    "sft_losses": sft.losses,
                },
                indent=1,
            )
        )


if __name__ == "__main__":
    torch.manual_seed(0)
    main()
