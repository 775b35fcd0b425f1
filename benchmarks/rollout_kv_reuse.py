"""Rollout throughput with and without reusing the KV cache across turns.

Same model, prompts and per-rollout seeds in both modes, so both generate identical tokens;
without reuse every turn re-prefills the whole context (prompt + all earlier turns).

    python benchmarks/rollout_kv_reuse.py [--rows 32] [--turns 3] [--repeats 3]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import machine, median_time
from llds.data.world import WorldConfig, generate_world
from llds.env.prompts import build_prompt_ids
from llds.models.bpe import tokenizer_for_world
from llds.models.tiny import tiny_causal_lm_for
from llds.retrieval.factory import build_retriever
from llds.rollout import RolloutConfig, RolloutEngine, RolloutRequest


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=32)
    ap.add_argument("--turns", type=int, default=3)
    ap.add_argument("--turn-tokens", type=int, default=48)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()

    world = generate_world(WorldConfig.preset("organism"))
    tok = tokenizer_for_world(world, 2000)
    model = tiny_causal_lm_for(tok, hidden_size=args.hidden, num_layers=args.layers)
    retriever = build_retriever(world.corpus, show_progress=False)
    reqs = [
        RolloutRequest(build_prompt_ids(tok, q.question), q.id, q.id, q.answers, seed=i)
        for i, q in enumerate(world.train[: args.rows])
    ]
    results = {}
    for reuse in (False, True):
        cfg = RolloutConfig(
            max_turns=args.turns,
            max_turn_tokens=args.turn_tokens,
            max_obs_tokens=120,
            max_total_tokens=2048,
            kv_reuse=reuse,
            cache="dynamic",  # the eager loop in both modes: only the reuse differs
        )
        engine = RolloutEngine(model, tok, retriever, cfg)
        batch = engine.generate(reqs)
        engine.stats.update(prefill_tokens=0, decode_tokens=0, forward_calls=0)
        t = median_time(lambda e=engine: e.generate(reqs), args.repeats, warmup=0)
        runs = args.repeats
        results[reuse] = (
            t,
            int(batch.loss_mask.sum()),
            engine.stats["prefill_tokens"] // runs,
            batch.input_ids,
        )
    assert torch.equal(results[False][3], results[True][3]), "modes generated different tokens"

    print(f"machine: {machine()}")
    print(f"command: `python benchmarks/rollout_kv_reuse.py {' '.join(sys.argv[1:])}`".strip())
    print(
        f"{args.rows} rollouts, up to {args.turns + 1} turns of {args.turn_tokens} tokens, "
        f"tiny Qwen2 hidden {args.hidden} x {args.layers} layers, median of {args.repeats}\n"
    )
    print("| mode | median time | generated tokens/s | prefilled tokens per batch | speed-up |")
    print("|---|---|---|---|---|")
    base = results[False][0]
    for reuse in (False, True):
        t, gen, pre, _ = results[reuse]
        name = "KV cache reused across turns" if reuse else "re-prefill every turn (comparison)"
        print(f"| {name} | {t:.2f} s | {gen / t:,.0f} | {pre:,} | {base / t:.2f}x |")


if __name__ == "__main__":
    main()
