"""What the engine-agnostic monitor adds to a native training step.

Runs GRPO steps of the `organism` preset's size (8 questions x 5 rollouts, up to 3 searches,
48-token turns, 768-token context, 4 mini-batches, LLDS and KL on, the post-update displacement
pass on) with a randomly initialised tiny model on a generated world, and times the monitor's
added functions on the last step's real rollout batch: the turn statistics (void turns parsed
from each turn's text), the sampler-vs-trained mismatch (the sampler's log-probs stand in as
pi_old plus noise, as a bf16 copy would give) and the pooled LLD shares of the post-update pass.
Goal: the monitor costs < 3% of a step.

    python benchmarks/monitor_overhead.py [--steps 4] [--repeats 50]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import machine, median_time, world_tokenizer
from llds.data.world import WorldConfig, generate_world
from llds.models.tiny import tiny_causal_lm_for
from llds.monitor.likelihood import group_correct_share, lld_share_metrics
from llds.monitor.mismatch import mismatch_metrics
from llds.monitor.turns import turn_metrics, void_turn_count
from llds.policy.forward import batched_log_probs
from llds.retrieval.factory import build_retriever
from llds.train.config import load_config
from llds.train.trainer import GRPOTrainer


def monitor(batch, old_logp, sampler_logp, new_logp, adv) -> None:
    """The calls the monitor adds to a native step (rollout metrics and post-update pass)."""
    eps = batch.episodes
    turn_metrics(
        [e.num_turns for e in eps],
        [void_turn_count(e.action_texts) for e in eps],
        [e.num_valid_searches for e in eps],
    )
    mismatch_metrics(sampler_logp, old_logp, batch.loss_mask)
    lld_share_metrics(
        old_logp,
        new_logp,
        batch.loss_mask,
        adv,
        batch.group_ids,
        batch.rewards,
        group_accuracy=group_correct_share(batch.group_ids, batch.rewards),
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=4, help="timed training steps (after 1 warmup)")
    ap.add_argument("--repeats", type=int, default=50, help="timed monitor calls")
    ap.add_argument("--threads", type=int, default=1, help="the organism preset's threads")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    world = generate_world(WorldConfig(seed=0))
    tok = world_tokenizer(world)
    with tempfile.TemporaryDirectory() as tmp:
        cfg = load_config(
            "organism",
            [
                f"run_dir={tmp}",
                "model.path=in-memory",
                "data.train=in-memory",
                "data.eval=null",
                "retriever.source=in-memory",
                "eval_every=0",
                "save_every=1000000",
                "logging.tensorboard=false",
                "logging.progress=false",
                "diagnostics.reference_every=0",
                "diagnostics.alarms=false",
            ],
        )
        tr = GRPOTrainer(
            cfg,
            model=tiny_causal_lm_for(tok, seed=0),
            tokenizer=tok,
            retriever=build_retriever(world.corpus, show_progress=False),
            train_examples=world.train,
            resume=False,
        )
        rows = tr.train(args.steps + 1)[1:]
        step_s = statistics.median(r["time/step"] for r in rows)

        batch = tr.engine.generate(tr.step_requests(tr.step))
        with torch.no_grad():
            old_logp, _ = batched_log_probs(tr.rollout_model, batch, cfg.optim.micro_batch_tokens)
        gen = torch.Generator().manual_seed(0)
        sampler_logp = old_logp + 0.01 * torch.randn(old_logp.shape, generator=gen)
        new_logp = old_logp + 0.05 * torch.randn(old_logp.shape, generator=gen)
        adv = torch.randn(len(batch), generator=gen)
        mon_s = median_time(
            lambda: monitor(batch, old_logp, sampler_logp, new_logp, adv), args.repeats
        )

    tokens = int(batch.loss_mask.sum())
    print(machine())
    print("command: python benchmarks/monitor_overhead.py " + " ".join(sys.argv[1:]))
    print(
        f"batch: {len(batch)} rollouts x {batch.loss_mask.shape[1]} response columns, "
        f"{tokens} model tokens, {sum(e.num_turns for e in batch.episodes)} turns"
    )
    print(f"training step (median of {len(rows)}): {step_s * 1e3:,.1f} ms")
    print(f"monitor (median of {args.repeats}): {mon_s * 1e3:,.3f} ms")
    print(f"monitor / step: {100 * mon_s / step_s:.3f}%  (goal < 3%)")


if __name__ == "__main__":
    main()
