"""Native GRPO(+LLDS) step on a GPU: update-phase MFU and rollout tokens/s.

A randomly initialized Qwen2.5-0.5B-shaped Qwen2 (hidden 896, 24 layers, 14 heads / 2 KV heads,
MLP 4864, tied embeddings; the vocabulary is the organism tokenizer's, so the LM head is small),
bf16 weights, SDPA attention, single-turn prompts from the organism world, G completions of
exactly N tokens, 4 optimizer steps per rollout batch, LLDS on.

Update MFU = 6 x (non-embedding parameters) x (tokens through forward+backward) / update time /
peak; the attention score FLOPs are left out, so this slightly understates the real MFU.

    python benchmarks/gpu_step.py [--prompts 32] [--group 5] [--tokens 256] [--steps 4]
                                  [--peak-tflops 989]    # H100 SXM dense bf16
                                  [--compare-cudnn] [--compare-rollout-copy] [--profile]

Arms alternate step by step in one process: `--compare-cudnn` adds the same trainer without
cuDNN's attention; `--compare-rollout-copy` a second trainer from the same initial weights
whose rollouts sample from a bf16 copy (`rollout.dtype: bfloat16`).

Runs on a CPU too (slowly, fp32) with `--device cpu --dtype float32 --layers 2` as a smoke test.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import statistics
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import machine, single_turn_config, world_tokenizer
from llds.data.world import WorldConfig, generate_world
from llds.models.tiny import tiny_causal_lm_for
from llds.train.config import AlgoConfig, LLDSConfig, OptimConfig
from llds.train.trainer import GRPOTrainer


def profile_update(trainer: GRPOTrainer, device: str) -> None:
    """One more step with its update under torch.profiler: host (Python, dispatch, launches)
    time against device kernel time says whether the update is bound by the GPU or by the CPU
    feeding it. Prints the top operators by device time and by host time."""
    from torch.profiler import ProfilerActivity, profile

    on_gpu = device.startswith("cuda")
    activities = [ProfilerActivity.CPU, *([ProfilerActivity.CUDA] if on_gpu else [])]
    run = trainer.updater.run

    def profiled(*args, **kwargs):
        with profile(activities=activities) as prof:
            out = run(*args, **kwargs)
            if on_gpu:
                torch.cuda.synchronize()
        ops = prof.key_averages()
        host = sum(e.self_cpu_time_total for e in ops) / 1e6
        kernels = sum(e.self_device_time_total for e in ops) / 1e6
        print(f"profiled update: host (self CPU) {host:.2f} s, device kernels {kernels:.2f} s")
        sort = "self_device_time_total" if on_gpu else "self_cpu_time_total"
        print(ops.table(sort_by=sort, row_limit=15, max_name_column_width=60))
        print(ops.table(sort_by="self_cpu_time_total", row_limit=10, max_name_column_width=60))
        return out

    trainer.updater.run = profiled
    try:
        trainer.train_step()
    finally:
        trainer.updater.run = run


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--prompts", type=int, default=32)
    ap.add_argument("--group", type=int, default=5)
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--steps", type=int, default=4, help="measured steps after 1 warm-up step")
    ap.add_argument("--layers", type=int, default=24)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    ap.add_argument("--peak-tflops", type=float, default=989.0)
    ap.add_argument(
        "--compare-cudnn",
        action="store_true",
        help="alternate steps with and without cuDNN's SDPA attention kernels",
    )
    ap.add_argument(
        "--compare-rollout-copy",
        action="store_true",
        help="alternate steps with a second trainer whose rollouts sample from a bf16 copy "
        "(rollout.dtype: bfloat16)",
    )
    ap.add_argument(
        "--profile",
        action="store_true",
        help="after the timed steps, profile one more step's update (torch.profiler)",
    )
    args = ap.parse_args()

    world = generate_world(WorldConfig.preset("organism"))
    tok = world_tokenizer(world)
    model = tiny_causal_lm_for(
        tok,
        hidden_size=896,
        num_layers=args.layers,
        num_heads=14,
        num_kv_heads=2,
        intermediate_size=4864,
        max_position_embeddings=4096,
    )
    model.config._attn_implementation = "sdpa"
    model.to(device=args.device, dtype=getattr(torch, args.dtype))
    n_body = sum(p.numel() for n, p in model.named_parameters() if "embed_tokens" not in n)
    cfg = single_turn_config(
        tempfile.mkdtemp(prefix="gpu_step."),
        prompts=args.prompts,
        group=args.group,
        tokens=args.tokens,
        algo=AlgoConfig(kl_coef=0.0, llds=LLDSConfig(enabled=True, coef=0.2)),
        optim=OptimConfig(lr=1e-6, mini_batches=4, micro_batch_tokens=65536),
        dtype=args.dtype,
    )
    copy_model = copy.deepcopy(model) if args.compare_rollout_copy else None
    trainer = GRPOTrainer(cfg, model=model, tokenizer=tok, train_examples=world.train, resume=False)
    # arms (name -> trainer, cuDNN attention allowed): SDPA with every backend torch may pick
    # (cuDNN included); with --compare-cudnn the same trainer without cuDNN's attention; with
    # --compare-rollout-copy a second trainer, from the same initial weights, sampling from a
    # bf16 copy. The arms alternate step by step after one warm-up step each, so they see the
    # same stream of batches and the same machine state
    arms = {"SDPA (cuDNN allowed)": (trainer, True)}
    if args.compare_cudnn:
        arms["SDPA without cuDNN"] = (trainer, False)
    if copy_model is not None:
        copy_cfg = dataclasses.replace(
            cfg,
            run_dir=tempfile.mkdtemp(prefix="gpu_step_copy."),
            rollout=dataclasses.replace(cfg.rollout, dtype="bfloat16"),
        )
        arms["bf16 sampling copy"] = (
            GRPOTrainer(
                copy_cfg, model=copy_model, tokenizer=tok, train_examples=world.train, resume=False
            ),
            True,
        )
    rows: dict[str, list[dict]] = {arm: [] for arm in arms}
    for i in range(1 + args.steps):
        for arm, (arm_trainer, cudnn) in arms.items():
            torch.backends.cuda.enable_cudnn_sdp(cudnn)
            row = arm_trainer.train_step()
            if i:
                rows[arm].append(row)
    torch.backends.cuda.enable_cudnn_sdp(True)
    if args.profile:
        profile_update(trainer, args.device)
    # tokens the update's forward+backward really processes per optimizer epoch: every
    # response token, and each group's shared prompt once (one forward per distinct prompt)
    responses = args.prompts * args.group * args.tokens
    prompt_tokens = statistics.fmean(len(trainer.prompt_ids(q)) for q in world.train[:64])
    tokens = responses + args.prompts * prompt_tokens
    print(f"machine: {machine()}")
    print(f"command: `python benchmarks/gpu_step.py {' '.join(sys.argv[1:])}`".strip())
    print(
        f"model: {n_body / 1e6:.0f}M non-embedding parameters, {args.dtype}; median of {args.steps}"
    )
    print("| arm | step | rollout | old log-probs | update | rollout tokens/s | update MFU |")
    print("|---|---|---|---|---|---|---|")
    upd: dict[str, float] = {}
    for arm in arms:
        r = rows[arm]
        upd[arm] = statistics.median(x["time/update"] for x in r)
        mfu = 6 * n_body * tokens / upd[arm] / (args.peak_tflops * 1e12)
        print(
            f"| {arm} | {statistics.median(x['time/step'] for x in r):.2f} s "
            f"| {statistics.median(x['time/rollout'] for x in r):.2f} s "
            f"| {statistics.median(x['time/old_logprob'] for x in r):.2f} s | {upd[arm]:.2f} s "
            f"| {statistics.median(x['throughput/rollout_tokens_per_s'] for x in r):,.0f} "
            f"| {100 * mfu:.1f}% |"
        )
    base = next(iter(arms))
    for arm in list(arms)[1:]:  # each other arm against the first, on the phase it changes
        phase = "rollout" if arm == "bf16 sampling copy" else "update"
        mine, theirs = (statistics.median(r[f"time/{phase}"] for r in rows[a]) for a in (base, arm))
        every = ", ".join(
            f"{x[f'time/{phase}']:.2f}/{y[f'time/{phase}']:.2f}"
            for x, y in zip(rows[base], rows[arm], strict=True)
        )
        print(f"{phase}, {arm} vs {base}: {mine / theirs:.2f}x; every step's {phase}: {every} s")


if __name__ == "__main__":
    main()
