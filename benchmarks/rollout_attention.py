"""SmolLM2-135M rollouts from a bf16 sampling copy: eager attention vs `llds_grouped`, through
the rollout engine, at equal work.

The `smollm2-wiki` preset's rollouts as its trainer makes them: zero-shot SmolLM2-135M-Instruct
on trivia questions, BM25 over the Wikipedia summaries (top 3), 2 questions x 4 rollouts of up
to 2 searches, sampled at temperature 1 with the trainer's per-row seeds, from a bf16 copy of
the policy (`rollout.dtype: bfloat16`). The two arms differ only in the copy's attention kernel
(`rollout.attn_implementation`: `eager`, or `llds_grouped` with its preallocated KV cache), on
the eager decode loop (`rollout.cache=dynamic`: the static loop runs its own attention). Each
round gives both arms the requests of one training step (step `round` of the preset's question
stream), alternating which goes first; their rollouts must be identical token for token
(checked: else the script stops), so the work is equal. Median over `--rounds` rounds.

    python benchmarks/rollout_attention.py [--rounds 3] [--threads 2]

Needs the optional packages of the README (SmolLM2, Red-Trivia, Wikipedia summaries).
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import machine
from llds.policy.sampling_copy import make_sampling_copy
from llds.retrieval.factory import build_retriever, corpus_passages
from llds.rollout import RolloutEngine
from llds.train.config import load_config
from llds.train.trainer import GRPOTrainer

KERNELS = ("eager", "llds_grouped")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    retriever = build_retriever(corpus_passages(None, wiki=True), show_progress=False)
    with tempfile.TemporaryDirectory() as tmp:
        cfg = load_config("smollm2-wiki", [f"run_dir={tmp}/run", "rollout.dtype=bfloat16"])
        trainer = GRPOTrainer(cfg, retriever=retriever)
        engines = {
            kernel: RolloutEngine(
                make_sampling_copy(trainer.model, "bfloat16", kernel),
                trainer.tokenizer,
                retriever,
                dataclasses.replace(cfg.rollout, topk=cfg.retriever.topk, cache="dynamic"),
            )
            for kernel in KERNELS
        }
        seconds: dict[str, list[float]] = {k: [] for k in KERNELS}
        decoded: list[int] = []
        for r in range(args.rounds):
            requests = trainer.step_requests(r)
            batches = {}
            for kernel in KERNELS if r % 2 == 0 else KERNELS[::-1]:
                engine = engines[kernel]
                before = engine.stats["decode_tokens"]
                t0 = time.perf_counter()
                batches[kernel] = engine.generate(requests)
                seconds[kernel].append(time.perf_counter() - t0)
                tokens = engine.stats["decode_tokens"] - before
            a, b = (batches[k] for k in KERNELS)
            if not torch.equal(a.input_ids, b.input_ids):
                sys.exit(f"round {r}: the two kernels sampled different rollouts; not equal work")
            decoded.append(tokens)
            print(
                f"round {r}: "
                + ", ".join(f"{k} {seconds[k][-1]:.1f} s" for k in KERNELS)
                + f"; {len(requests)} rollouts, {tokens} tokens decoded, "
                f"{a.loss_mask.sum().item()} model-written tokens, identical"
            )

    med = {k: statistics.median(v) for k, v in seconds.items()}
    print()
    print(f"machine: {machine()}")
    print(f"command: `python benchmarks/rollout_attention.py {' '.join(sys.argv[1:])}`".strip())
    print()
    print("| sampling copy's attention | rollout (median) | every round | vs eager |")
    print("|---|---|---|---|")
    for k in KERNELS:
        rounds = ", ".join(f"{x:.1f}" for x in seconds[k])
        print(f"| `{k}` | {med[k]:.1f} s | {rounds} s | {med['eager'] / med[k]:.2f}x |")
    print(f"decoded tokens per round: {decoded} (the same in both arms)")


if __name__ == "__main__":
    main()
