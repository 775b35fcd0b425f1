"""The trainer's post-update measurement pass: the hidden-state similarity pooled in the
displacement's own forward (one pass) against a forward of its own over the mixed groups'
rollouts (two passes, as before).

One step's rollouts of the theorem-world study (40 questions x 8, `experiments/theorem_world/
base.yaml`, the trainer's step-0 seeds) from the given warm start, then, alternating, `--repeats`
times each: (two passes) `batched_log_probs` over every rollout and `pooled_response_hidden`
over the mixed groups' rollouts; (one pass) `batched_log_probs_and_hidden` over every rollout.
Both give the same log-probs and similarity (`identical` checks them to 1e-5).

    python benchmarks/diagnostics_pass.py --model runs/theorem_world/model [--repeats 5]

The last two lines are `speedup: X.XXx` and `identical: yes|no`.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import machine, step_zero_requests
from llds.data.world import WorldConfig, generate_world
from llds.models.hf import load_policy
from llds.monitor.likelihood import group_hidden_similarity, mixed_group_rows
from llds.policy.forward import (
    batched_log_probs,
    batched_log_probs_and_hidden,
    pooled_response_hidden,
)
from llds.retrieval.factory import build_retriever
from llds.rollout import RolloutEngine
from llds.train.config import load_config

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "experiments" / "theorem_world" / "base.yaml"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True, help="the theorem world's warm start")
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    torch.set_num_threads(1)
    world = generate_world(WorldConfig.preset("theorem"))
    cfg = load_config(CONFIG, [f"model.path={args.model}"])  # its rollout and pass settings
    model, tok = load_policy(args.model)
    model.eval()
    retriever = build_retriever(world.corpus, show_progress=False)
    rollout = dataclasses.replace(cfg.rollout, topk=cfg.retriever.topk)
    group = rollout.group_size
    requests = step_zero_requests(cfg, tok, world.train[: cfg.prompts_per_step], group)
    t0 = time.perf_counter()
    batch = RolloutEngine(model, tok, retriever, rollout).generate(requests)
    print(f"rollouts: {len(batch)} in {time.perf_counter() - t0:.1f} s", flush=True)
    mixed = mixed_group_rows(batch.group_ids, [e.em > 0 for e in batch.episodes])
    groups = [batch.group_ids[r] for r in mixed]
    correct = [batch.episodes[r].em > 0 for r in mixed]
    budget, temp = cfg.optim.micro_batch_tokens, cfg.rollout.temperature

    def two_passes():
        lp, _ = batched_log_probs(model, batch, budget, temperature=temp)
        pooled = pooled_response_hidden(model, batch.select(mixed), budget)
        return lp, group_hidden_similarity(pooled, groups, correct)

    def one_pass():
        both = batched_log_probs_and_hidden(model, batch, budget, temperature=temp)
        assert both is not None, "this model's head cannot be split off"
        lp, pooled = both
        return lp, group_hidden_similarity(pooled[mixed], groups, correct)

    arms = {"two passes": two_passes, "one pass": one_pass}
    times: dict[str, list[float]] = {name: [] for name in arms}
    out = {}
    for _ in range(args.repeats):
        for name, fn in arms.items():
            t0 = time.perf_counter()
            out[name] = fn()
            times[name].append(time.perf_counter() - t0)
    (lp2, cos2), (lp1, cos1) = out["two passes"], out["one pass"]
    written = batch.loss_mask.bool()
    identical = (
        bool(torch.allclose(lp1[written], lp2[written], atol=1e-5)) and abs(cos1 - cos2) <= 1e-5
    )
    med = {name: statistics.median(t) for name, t in times.items()}
    print(f"\nmachine: {machine()}; torch threads 1")
    print(f"command: `python benchmarks/diagnostics_pass.py {' '.join(sys.argv[1:])}`")
    print(
        f"{len(batch)} rollouts ({len(mixed)} in mixed groups), "
        f"{batch.attention_mask.sum().item() / len(batch):.0f} tokens per rollout; "
        f"median of {args.repeats}, alternating\n"
    )
    print("| pass | median | all |")
    print("|---|---|---|")
    for name, t in times.items():
        print(f"| {name} | {med[name]:.2f} s | {', '.join(f'{x:.2f}' for x in t)} |")
    print(f"\nsimilarity: {cos2:.6f} (two passes) / {cos1:.6f} (one pass)")
    print(f"speedup: {med['two passes'] / med['one pass']:.2f}x")
    print(f"identical: {'yes' if identical else 'no'}")


if __name__ == "__main__":
    main()
