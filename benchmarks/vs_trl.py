"""Native GRPO trainer vs TRL's `GRPOTrainer` at equal work: step time and tokens/s.

Both trainers get the same initial weights (a tiny random Qwen2, or SmolLM2-135M with
`--model smollm2`), the same P prompts in every step, G completions per prompt of exactly N
tokens (end-of-sequence masked until N: `rollout.min_turn_tokens` here, `min_new_tokens` in
TRL), the same exact-match reward on the completion text, AdamW with the same settings and the
same fused kernel (TRL's default on torch >= 2.8, ours whenever the parameters allow it), M
optimizer steps per generation batch (so both need pi_old of every completion token), fp32,
single turn (no retrieval), no KL / reference model, no LLDS, no post-update diagnostics.

pi_old: TRL recomputes it with a no-grad forward pass over the batch. Ours runs twice: with
`algo.old_logprobs=recompute` (the same extra pass as TRL) and with its default `auto`, which
in fp32 takes pi_old from the logits the completions were sampled from (the same numbers, to
float rounding, without the extra pass).

A step is one generation batch and its M optimizer steps. Tokens counted per step: generated
completion tokens (P x G x N) plus the real (unpadded) prompt + completion tokens that go
through the optimizer forward+backward; the old-log-prob pass is not counted.

    python benchmarks/vs_trl.py [--prompts 8] [--group 4] [--tokens 64] [--mini-batches 2]
                                [--repeats 3] [--model tiny|smollm2] [--arms auto,recompute,trl]
                                [--device cpu|cuda] [--shape qwen2.5-0.5b]
                                [--dtype float32|bfloat16] [--no-cudnn-sdp] [--profile]
                                [--count-syncs]

Arms (`--arms`, comma-separated, run in this order, each from the same initial weights):
`auto` and `recompute` are the native trainer with the static decode loop, not compiled
(`rollout.cache: auto`, `rollout.compile: false`), and pi_old from sampling / recomputed;
`dynamic` is `auto` with the eager loop (`rollout.cache: dynamic`, the loop before the static
one); `compiled` and `compiled-recompute` are `auto` and `recompute` with `rollout.compile:
true` (the default on a GPU, where the decode step is captured in CUDA graphs); `trl` is TRL's
trainer. Any native arm with `-unshared` appended (`compiled-unshared`) runs the update and
log-prob passes without running each group's shared prompt once (one model call per micro-batch
instead of two, as TRL makes). Speeds are against `trl` when it runs, else against the first
arm.

`--dtype bfloat16`: the native trainer's `model.dtype: bfloat16` (float32 master weights, bf16
autocast) against TRL's `bf16=True` (the same). `--no-cudnn-sdp` switches off cuDNN's attention
for every arm. `--profile` profiles one more step of the first native arm after its timed steps
and prints its costliest operators. `--count-syncs` (on a GPU) runs one more step of every arm
(for TRL, one more generation batch in a new trainer) with CUDA's sync debug mode on and prints
how many times the host waited for the device, and from where: each wait stalls the queue of
kernels a host-bound step depends on.

`--shape qwen2.5-0.5b` gives the tiny model Qwen2.5-0.5B's body (hidden 896, 24 layers, 14/2
heads, MLP 4864) with the organism's vocabulary; on a GPU:
`python benchmarks/vs_trl.py --device cuda --shape qwen2.5-0.5b --prompts 16 --tokens 128
--mini-batches 4 --repeats 2 --arms dynamic,auto,recompute,compiled,trl`
(`benchmarks/gpu_fast_rollouts.sh` runs it with the other GPU measurements).
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import statistics
import sys
import tempfile
import time
import warnings
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import SINGLE_TURN_TEMPLATE as TEMPLATE
from _common import machine, single_turn_config, world_tokenizer
from llds.data.world import WorldConfig, generate_world
from llds.integrations.trl import search_r1_reward, search_r1_rows
from llds.train.config import AlgoConfig, LLDSConfig, OptimConfig
from llds.train.trainer import GRPOTrainer as NativeTrainer


def build_model(args: argparse.Namespace) -> tuple[Any, Any, list]:
    """(model, tokenizer, train questions); the caller deep-copies the model per trainer."""
    world = generate_world(WorldConfig.preset("organism"))
    if args.model == "smollm2":
        from llds.models import load_smollm2

        model, tok = load_smollm2(dtype="float32", device="cpu")
    else:
        from llds.models import tiny_causal_lm_for

        tok = world_tokenizer(world)
        if args.shape == "qwen2.5-0.5b":
            model = tiny_causal_lm_for(
                tok,
                hidden_size=896,
                num_layers=24,
                num_heads=14,
                num_kv_heads=2,
                intermediate_size=4864,
            )
        else:
            model = tiny_causal_lm_for(tok, hidden_size=args.hidden, num_layers=args.layers)
    # exactly P questions: both trainers then see the same prompts in every step
    return model, tok, list(world.train[: args.prompts])


NATIVE_ARMS = {
    # arm: (rollout.cache, rollout.compile, algo.old_logprobs, label)
    "dynamic": (
        "dynamic",
        False,
        "auto",
        "llds native GRPO, eager decode loop (pi_old from sampling)",
    ),
    "auto": ("auto", False, "auto", "llds native GRPO (pi_old from sampling)"),
    "recompute": ("auto", False, "recompute", "llds native GRPO (pi_old recomputed, as TRL)"),
    "compiled": (
        "static",
        True,
        "auto",
        "llds native GRPO, compiled decode (pi_old from sampling)",
    ),
    "compiled-recompute": (
        "static",
        True,
        "recompute",
        "llds native GRPO, compiled decode (pi_old recomputed)",
    ),
}


def profile_step(step, device: str, rows: int = 25) -> str:
    """One call of `step` under torch's profiler: its costliest operators, as a table, and on a
    CPU each phase's time in matrix-product kernels (the step's arithmetic) and the rest."""
    from torch.profiler import ProfilerActivity, profile

    from llds.train.phase_profile import split_by_phase

    cuda = device.startswith("cuda")
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities) as prof:
        step()
        if cuda:
            torch.cuda.synchronize()
    key = "self_device_time_total" if cuda else "self_cpu_time_total"
    table = prof.key_averages().table(sort_by=key, row_limit=rows)
    if cuda:  # the host's kernel times are launches, not arithmetic
        return table
    lines = ["| phase | time | in matrix products | rest |", "|---|---|---|---|"]
    for phase, p in split_by_phase(prof.events()).items():
        lines.append(
            f"| {phase} | {p.seconds:.3f} s | {p.matrix_seconds:.3f} s | {p.other_seconds:.3f} s |"
        )
    return table + "\n" + "\n".join(lines)


@contextlib.contextmanager
def counted_syncs(device: str) -> Iterator[list | None]:
    """The host-device synchronisations in the block, one recorded warning each (CUDA's sync
    debug mode); None on a CPU, where there is nothing to wait for."""
    if not device.startswith("cuda"):
        yield None
        return
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            yield caught
        finally:
            torch.cuda.synchronize()
            torch.cuda.set_sync_debug_mode("default")


def sync_summary(caught: list | None, rows: int = 8) -> str:
    """How many synchronisations, and the source lines that made most of them."""
    if caught is None:
        return "not counted (a CPU device: nothing to wait for)"
    waits = [w for w in caught if "synchroniz" in str(w.message)]
    where = Counter(f"{Path(w.filename).name}:{w.lineno}" for w in waits)
    top = ", ".join(f"{k} ({n})" for k, n in where.most_common(rows))
    return f"{len(waits)} host waits; most from: {top or '-'}"


UNSHARED = "-unshared"


def native_arm(arm: str) -> bool:
    return arm.removesuffix(UNSHARED) in NATIVE_ARMS


@contextlib.contextmanager
def prompts_unshared(on: bool):
    """Within: the trainer's forward passes run every row's prompt (no shared prompt pass)."""
    if not on:
        yield
        return
    import llds.policy.forward as forward
    import llds.train.policy_update as update

    original = forward.response_log_probs

    def unshared(*a: Any, **k: Any):
        return original(*a, **{**k, "share_prompts": False})

    forward.response_log_probs = update.response_log_probs = unshared
    try:
        yield
    finally:
        forward.response_log_probs = update.response_log_probs = original


def run_native(model, tok, examples, args, run_dir: str, arm: str) -> dict[str, Any]:
    with prompts_unshared(arm.endswith(UNSHARED)):
        return _run_native(model, tok, examples, args, run_dir, arm)


def _run_native(model, tok, examples, args, run_dir: str, arm: str) -> dict[str, Any]:
    cache, compiled, old_logprobs, label = NATIVE_ARMS[arm.removesuffix(UNSHARED)]
    if arm.endswith(UNSHARED):
        label += ", prompts not shared"
    cfg = single_turn_config(
        run_dir,
        prompts=args.prompts,
        group=args.group,
        tokens=args.tokens,
        algo=AlgoConfig(
            kl_coef=0.0,
            aggregation="token-mean",
            old_logprobs=old_logprobs,  # type: ignore[arg-type]
            llds=LLDSConfig(enabled=False),
        ),
        optim=OptimConfig(
            lr=args.lr, weight_decay=0.0, grad_clip=1.0, mini_batches=args.mini_batches
        ),
        dtype=args.dtype,
        device=args.device,
        cache=cache,
        compile=compiled,
    )
    trainer = NativeTrainer(cfg, model=model, tokenizer=tok, train_examples=examples, resume=False)
    times, parts, first = [], [], 0.0
    for k in range(1 + args.repeats):
        t0 = time.perf_counter()
        m = trainer.train_step()
        dt = time.perf_counter() - t0
        assert m["rollout/response_tokens"] == args.tokens, "completions are not N tokens long"
        if old_logprobs == "recompute":
            assert not m["policy/old_logprobs_from_rollout"]
        if k:  # the first step is the warm-up
            times.append(dt)
            parts.append(m["time/rollout"])
        else:
            first = dt
    if m["policy/old_logprobs_from_rollout"] != (old_logprobs == "auto"):
        label += " [pi_old recomputed: the sampling logits do not serve here]"
    profile = profile_step(trainer.train_step, args.device) if args.profile_arm == arm else None
    syncs = None
    if args.count_syncs:
        with counted_syncs(args.device) as caught:
            trainer.train_step()
        syncs = sync_summary(caught)
    prompts = [trainer.prompt_ids(ex) for ex in examples]
    return {
        "times": times,
        "gen": parts,
        "first": first,
        "prompt_ids": prompts,
        "label": label,
        "profile": profile,
        "syncs": syncs,
    }


def run_trl(model, tok, examples, args, run_dir: str) -> dict[str, Any]:
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer, __version__

    class Clock(TrainerCallback):
        """Wall clock at train start and after every optimizer step."""

        def __init__(self) -> None:
            self.marks: list[float] = []

        def on_train_begin(self, *a: Any, **k: Any) -> None:
            self.marks.append(time.perf_counter())

        def on_step_end(self, *a: Any, **k: Any) -> None:
            self.marks.append(time.perf_counter())

    class Observed(GRPOTrainer):
        """TRL's trainer, unchanged, plus a record of generation time and completion lengths."""

        def __init__(self, *a: Any, **k: Any) -> None:
            super().__init__(*a, **k)
            self.gen_times: list[float] = []
            self.lengths: list[int] = []

        def _generate_single_turn(self, *a: Any, **k: Any):
            t0 = time.perf_counter()
            completion_ids, logprobs = super()._generate_single_turn(*a, **k)
            self.gen_times.append(time.perf_counter() - t0)
            self.lengths.extend(len(c) for c in completion_ids)
            return completion_ids, logprobs

    m, g = args.mini_batches, args.group
    rows = args.prompts * g
    if rows % m:
        raise SystemExit(f"prompts x group ({rows}) must divide by --mini-batches ({m})")
    targs = GRPOConfig(
        output_dir=run_dir,
        per_device_train_batch_size=rows // m,
        steps_per_generation=m,
        gradient_accumulation_steps=1,
        num_iterations=1,
        num_generations=g,
        max_steps=m * (1 + args.repeats),
        max_completion_length=args.tokens,
        generation_kwargs={"min_new_tokens": args.tokens},
        temperature=1.0,
        top_p=1.0,
        top_k=0,
        beta=0.0,
        epsilon=0.2,
        loss_type="dapo",
        scale_rewards="group",
        learning_rate=args.lr,
        lr_scheduler_type="constant",
        warmup_steps=0,
        weight_decay=0.0,
        max_grad_norm=1.0,
        optim="adamw_torch_fused",
        use_cpu=args.device == "cpu",
        # TRL defaults to bf16 autocast and activation checkpointing; autocast follows --dtype
        # (ours: model.dtype), checkpointing is off in both for equal work
        bf16=args.dtype == "bfloat16",
        gradient_checkpointing=False,
        seed=0,
        logging_steps=10**6,
        report_to="none",
        save_strategy="no",
        disable_tqdm=True,
        dataloader_num_workers=0,
    )
    clock = Clock()
    data = search_r1_rows(examples, TEMPLATE)

    def trl_trainer(targs: GRPOConfig, callbacks: list) -> Observed:
        return Observed(
            model=model,
            reward_funcs=search_r1_reward(),
            args=targs,
            train_dataset=Dataset.from_list(data),
            processing_class=tok,
            callbacks=callbacks,
        )

    trainer = trl_trainer(targs, [clock])
    prompts = trainer._tokenize_prompts([r["prompt"] for r in data])[0]
    trainer.train()
    assert set(trainer.lengths) == {args.tokens}, "completions are not N tokens long"
    syncs = None
    if args.count_syncs:  # one more generation batch, in a trainer of its own
        once = copy.copy(targs)
        once.max_steps = m
        again = trl_trainer(once, [])
        with counted_syncs(args.device) as caught:
            again.train()
        syncs = sync_summary(caught) + ("" if caught is None else " (with the trainer's setup)")
    marks = clock.marks
    cycles = [marks[(k + 1) * m] - marks[k * m] for k in range(1 + args.repeats)]
    return {
        "times": cycles[1:],
        "gen": trainer.gen_times[1:],
        "first": cycles[0],
        "prompt_ids": prompts,
        "label": f"TRL GRPOTrainer {__version__}",
        "profile": None,
        "syncs": syncs,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", choices=("tiny", "smollm2"), default="tiny")
    ap.add_argument("--hidden", type=int, default=256, help="tiny model width")
    ap.add_argument("--layers", type=int, default=4, help="tiny model depth")
    ap.add_argument("--prompts", type=int, default=8, help="prompts per step (P)")
    ap.add_argument("--group", type=int, default=4, help="completions per prompt (G)")
    ap.add_argument("--tokens", type=int, default=64, help="completion length (N)")
    ap.add_argument("--mini-batches", type=int, default=2, help="optimizer steps per step (M)")
    ap.add_argument("--lr", type=float, default=1e-5)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    ap.add_argument("--device", default="cpu", help="cpu or cuda (both trainers)")
    ap.add_argument("--shape", choices=("tiny", "qwen2.5-0.5b"), default="tiny")
    ap.add_argument("--arms", default="auto,recompute,trl", help="comma-separated, in order")
    ap.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    ap.add_argument("--no-cudnn-sdp", action="store_true", help="no cuDNN attention (GPU)")
    ap.add_argument("--profile", action="store_true", help="profile one step of the first arm")
    ap.add_argument(
        "--count-syncs", action="store_true", help="count host-device waits in one more step"
    )
    args = ap.parse_args()
    arms = [a.strip() for a in args.arms.split(",") if a.strip()]
    unknown = sorted(a for a in arms if a != "trl" and not native_arm(a))
    if unknown or not arms:
        ap.error(f"--arms: unknown {unknown}; choose from {[*NATIVE_ARMS, 'trl']} (+{UNSHARED})")
    native = [a for a in arms if a != "trl"]
    args.profile_arm = native[0] if args.profile and native else None
    torch.set_num_threads(args.threads)
    if args.no_cudnn_sdp:
        torch.backends.cuda.enable_cudnn_sdp(False)
    warnings.filterwarnings("ignore", category=UserWarning)

    model, tok, examples = build_model(args)
    model.to(args.device)  # the native trainer keeps an in-memory model where it is
    results: dict[str, dict[str, Any]] = {}
    failed: dict[str, str] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for arm in arms:
            t0 = time.perf_counter()
            try:
                if arm == "trl":
                    results[arm] = run_trl(copy.deepcopy(model), tok, examples, args, f"{tmp}/trl")
                else:
                    results[arm] = run_native(
                        copy.deepcopy(model), tok, examples, args, f"{tmp}/{arm}", arm
                    )
            except Exception as e:  # one arm failing (a GPU-only path, say) leaves the others
                failed[arm] = f"{type(e).__name__}: {str(e).strip().splitlines()[0][:300]}"
            took = time.perf_counter() - t0
            print(f"[{arm}] {'failed' if arm in failed else 'done'} in {took:.1f} s", flush=True)
            if args.device.startswith("cuda"):
                torch.cuda.empty_cache()
    if not results:
        raise SystemExit(f"every arm failed: {failed}")
    prompt_sets = {arm: [list(p) for p in r["prompt_ids"]] for arm, r in results.items()}
    prompts = next(iter(prompt_sets.values()))
    assert all(p == prompts for p in prompt_sets.values()), "prompt tokens differ between arms"

    g, n = args.group, args.tokens
    generated = len(prompts) * g * n
    trained = sum(g * (len(p) + n) for p in prompts)
    params = sum(p.numel() for p in model.parameters())
    name = (
        "SmolLM2-135M"
        if args.model == "smollm2"
        else "Qwen2.5-0.5B-shaped Qwen2 (random init)"
        if args.shape == "qwen2.5-0.5b"
        else (f"tiny Qwen2 hidden {args.hidden} x {args.layers} layers")
    )
    cudnn = ", cuDNN attention off" if args.no_cudnn_sdp else ""
    print(f"\nmachine: {machine()}; device {args.device}; {args.dtype}{cudnn}")
    print(f"command: `python benchmarks/vs_trl.py {' '.join(sys.argv[1:])}`".strip())
    print(
        f"{name} ({params / 1e6:.1f}M params, vocab {len(tok)}), {args.prompts} prompts x "
        f"{g} completions of {n} tokens, {args.mini_batches} optimizer steps per step, "
        f"prompt {min(map(len, prompts))}-{max(map(len, prompts))} tokens; tokens per step: "
        f"{generated:,} generated + {trained:,} trained; median of {args.repeats} after 1 warm-up\n"
    )
    base_arm = "trl" if "trl" in results else next(iter(results))
    print(
        "| trainer | median step time | generation | rest (old log-probs + updates) "
        f"| tokens/s | speed vs {base_arm} | first step (warm-up) |"
    )
    print("|---|---|---|---|---|---|---|")
    base = statistics.median(results[base_arm]["times"])
    for r in results.values():
        t = statistics.median(r["times"])
        gen = statistics.median(r["gen"])
        print(
            f"| {r['label']} | {t:.2f} s | {gen:.2f} s | {t - gen:.2f} s | "
            f"{(generated + trained) / t:,.0f} | {base / t:.2f}x | {r['first']:.1f} s |"
        )
    for arm, why in failed.items():
        print(f"| {arm} | failed: {why} | | | | | |")
    for arm, r in results.items():
        steps = " / ".join(f"{t:.2f}" for t in r["times"])
        gens = " / ".join(f"{t:.2f}" for t in r["gen"])
        print(f"\n{arm}: steps {steps} s; generation {gens} s", end="")
    print()
    for arm, r in results.items():
        if r.get("syncs"):
            print(f"\nsynchronisations in one more step of `{arm}`: {r['syncs']}")
    for arm, r in results.items():
        if r["profile"]:
            print(f"\nprofile of one more step of `{arm}`:\n{r['profile']}")


if __name__ == "__main__":
    main()
