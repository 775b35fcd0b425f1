"""SmolLM2-135M GRPO step on CPU: where the time goes, the LM head on written tokens only, bf16
compute, and LoRA next to full fine-tuning, at equal work.

The batch is what a warm-started agent produces on the `smollm2-wiki` preset: `--questions`
trivia questions x `--group` rollouts, each an expert one-search trajectory (think + search,
3 Wikipedia passages of BM25, answer), so the share of model-written tokens is realistic. On
that fixed batch every arm does the same work: the preset's update (`--mini-batches` AdamW
steps, each a forward and backward over its rows) and the displacement pass (one no-grad
log-prob pass). Arms:

- `full head`: the LM head over every response column (`actions_only=False`, the former path);
- `written only`: the LM head over the model-written tokens only (the default now);
- `written only, bf16`: `written only` with `model.dtype: bfloat16`, i.e. float32 master weights
  and optimizer state, the matrix multiplications in bfloat16 through autocast (CPUs with
  AVX512-BF16 or AMX run them natively; on others they are slower than float32);
- `written only, bf16, bf16 sampling copy`: `written only, bf16` whose rollouts sample from a
  bf16 copy of the policy with eager attention (`rollout.dtype: bfloat16`,
  `rollout.attn_implementation: eager`), refreshed after the update: its decode and the refresh
  are timed, its passes and update are the bf16 arm's of the same round (the same code);
- `written only, bf16, bf16 copy, grouped attention`: the same with
  `rollout.attn_implementation: llds_grouped` (grouped-query attention over a preallocated KV
  cache, `llds.models.grouped_attention`);
- `LoRA`: `written only` with peft adapters (r 16 on the attention and MLP projections), the
  base frozen: fewer optimizer states and no base-weight gradients.

Time: the `full head`, `written only` and `written only, bf16` arms alternate in one process
(`--repeats` rounds, median). Memory: each arm once more in its own process, after a warm-up
update: the resident memory before an update (weights, gradients of the last one, optimizer
state) and the peak during it (Linux: the peak is reset after loading).
Rollout generation does not depend on the head; each round also times, per arm, a greedy decode
of `--decode-tokens` tokens from the batch's prompts (KV cache) in the arm's precision. The
round's step at equal work is that decode + the log-prob passes the trainer runs (2 in float32,
3 under mixed precision, where pi_old is recomputed) + the update.

    python benchmarks/smollm2_step.py [--questions 2] [--group 4] [--repeats 3] [--threads 2]
                                      [--decode-tokens 256] [--no-memory]

Needs the optional packages of the README (SmolLM2, Red-Trivia, Wikipedia summaries).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import machine
from llds.policy.sampling_copy import make_sampling_copy, refresh_sampling_copy

ARMS = ("full head", "written only", "written only, bf16", "LoRA")
TIMED = ARMS[:3]  # alternate in one process; LoRA is timed once in its own
COPY_ARM = "written only, bf16, bf16 sampling copy"
GROUPED_ARM = "written only, bf16, bf16 copy, grouped attention"
COPY_KERNELS = {COPY_ARM: "eager", GROUPED_ARM: "llds_grouped"}
"""`written only, bf16` sampling from a bf16 copy (`rollout.dtype`) with this attention kernel
(`rollout.attn_implementation`): its decode and the copy's refresh are timed; its passes and
update are the `written only, bf16` arm's of the same round (the same code on the same policy)"""


def precision(arm: str):
    """The arm's compute precision (the trainer's `model.dtype`)."""
    from llds.policy.precision import Precision

    return Precision(torch.bfloat16 if "bf16" in arm else None)


def build_batch(questions: int, group: int):
    """`questions` x `group` expert trajectories (the first questions of the trivia lists whose
    top-3 passages hold a gold answer), as a RolloutBatch with one group per question."""
    from llds.data.loaders import load_trivia_lists
    from llds.models import load_smollm2
    from llds.retrieval.factory import build_retriever, corpus_passages
    from llds.rollout.batch import Episode, RolloutBatch
    from llds.sft.data import build_expert_episodes

    model, tok = load_smollm2(dtype="float32", device="cpu")
    retriever = build_retriever(corpus_passages(None, wiki=True), show_progress=False)
    examples = load_trivia_lists(["worldcapitals", "elements"])
    experts, _ = build_expert_episodes(
        examples[: 8 * questions],
        retriever,
        tok,
        topk=3,
        max_obs_tokens=256,
        num_examples=questions,
    )
    episodes = []
    for k, ex in enumerate(experts):
        for _ in range(group):
            ep = Episode(
                prompt_ids=ex.prompt_ids, example_id=ex.example_id, group_id=str(k), golds=()
            )
            resp, mask = ex.response_ids, ex.loss_mask[ex.prompt_len :]
            start = 0
            for i in range(1, len(resp) + 1):  # consecutive runs of action / context tokens
                if i == len(resp) or mask[i] != mask[start]:
                    ep.append(resp[start:i], action=bool(mask[start]))
                    start = i
            episodes.append(ep)
    return model, tok, RolloutBatch.from_episodes(episodes, tok.pad_token_id)


def update(model, optimizer, batch, mini_batches: int, actions_only: bool, arm: str = "") -> float:
    """The preset's update on `batch`: per mini-batch a policy-gradient loss over the written
    tokens (advantage +1 / -1 alternating in each group), backward, one AdamW step, in the arm's
    compute precision (forward under autocast, backward outside it, as the trainer does).
    Seconds."""
    from llds.policy.forward import response_log_probs

    model.train()
    adv = torch.tensor([1.0 if i % 2 == 0 else -1.0 for i in range(len(batch))])
    rows = list(range(len(batch)))
    t0 = time.perf_counter()
    for m in range(mini_batches):
        part = rows[m::mini_batches]
        sub = batch.select(part)
        optimizer.zero_grad(set_to_none=True)
        with precision(arm).autocast():
            lp, _ = response_log_probs(model, sub, actions_only=actions_only)
            mask = sub.loss_mask.float()
            loss = -(adv[part, None] * lp.float() * mask).sum() / mask.sum()
        loss.backward()
        optimizer.step()
    return time.perf_counter() - t0


def log_prob_pass(model, batch, actions_only: bool, arm: str = "") -> float:
    from llds.policy.forward import batched_log_probs

    model.eval()
    t0 = time.perf_counter()
    with precision(arm).autocast():
        batched_log_probs(model, batch, 8192, actions_only=actions_only)
    return time.perf_counter() - t0


def prepare(arm: str, model):
    if arm == "LoRA":
        from llds.policy.lora import attach_lora
        from llds.train.config import LoRAConfig

        model = attach_lora(model, LoRAConfig())
    params = [p for p in model.parameters() if p.requires_grad]
    return model, torch.optim.AdamW(params, lr=1e-6, fused=True), sum(p.numel() for p in params)


def _status_gb(field: str) -> float:
    """A memory field of /proc/self/status (VmRSS: now, VmHWM: peak since the last reset)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 2**20
    raise RuntimeError(f"no {field} in /proc/self/status")


def one_arm(args: argparse.Namespace) -> dict[str, Any]:
    """Child process: one arm once, after a warm-up update (so the optimizer state exists):
    its time, the resident memory before the update and the peak during it. The peak is reset
    (`clear_refs` 5) after loading, whose own peak says nothing about training."""
    model, _, batch = build_batch(args.questions, args.group)
    model, opt, trainable = prepare(args.arm, model)
    actions_only = args.arm != "full head"
    update(model, opt, batch, args.mini_batches, actions_only, args.arm)
    before = _status_gb("VmRSS")
    Path("/proc/self/clear_refs").write_text("5")
    update_s = update(model, opt, batch, args.mini_batches, actions_only, args.arm)
    return {
        "update_s": update_s,
        "log_prob_pass_s": log_prob_pass(model, batch, actions_only, args.arm),
        "trainable": trainable,
        "rss_before_gb": before,
        "peak_rss_gb": _status_gb("VmHWM"),
    }


def decode_seconds(model, batch, tokens: int = 64, arm: str = "") -> float:
    """Seconds for `tokens` steps of greedy decoding with a KV cache, all rows at once (the
    engine's decode loop without sampling), from the batch's prompts, in the arm's compute
    precision (one autocast region around the whole loop, as the engine's rollout has; none
    for a sampling copy, which computes in its stored dtype)."""
    import contextlib

    from llds.models.grouped_attention import decode_cache_for
    from llds.models.kv_cache import cache_argument, returned_cache

    model.eval()
    p = batch.prompt_len
    ids, mask = batch.input_ids[:, :p], batch.attention_mask[:, :p]
    region = contextlib.nullcontext() if arm in COPY_KERNELS else precision(arm).autocast()
    name = cache_argument(model)
    with torch.no_grad(), region:
        own = decode_cache_for(model)  # the engine's choice: a slab for grouped attention
        first = {} if own is None else {name: own}
        out = model(input_ids=ids, attention_mask=mask, use_cache=True, logits_to_keep=1, **first)
        cache, nxt = returned_cache(out), out.logits[:, -1:].argmax(-1)
        t0 = time.perf_counter()
        for _ in range(tokens):
            mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)
            out = model(input_ids=nxt, attention_mask=mask, logits_to_keep=1, **{name: cache})
            cache, nxt = returned_cache(out), out.logits[:, -1:].argmax(-1)
        return time.perf_counter() - t0


def passes_per_step(arm: str) -> int:
    """Log-prob passes the trainer runs per step besides the update: the KL reference and the
    displacement pass, plus pi_old under mixed precision (float32 takes pi_old from the
    sampling logits; bf16 compute recomputes it, `AlgoConfig.old_logprobs: auto`)."""
    return 3 if precision(arm).mixed else 2


def _child(arm: str, args: argparse.Namespace) -> dict[str, Any]:
    cmd = [sys.executable, __file__, "--arm", arm, "--threads", str(args.threads)]
    cmd += ["--questions", str(args.questions), "--group", str(args.group)]
    cmd += ["--mini-batches", str(args.mini_batches)]
    res = subprocess.run(cmd, capture_output=True, text=True, check=True)
    return json.loads(res.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--questions", type=int, default=2)
    ap.add_argument("--group", type=int, default=4)
    ap.add_argument("--mini-batches", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument(
        "--decode-tokens",
        type=int,
        default=256,
        help="decode steps in the step at equal work (the preset's rollout decodes ~250-290)",
    )
    ap.add_argument("--arm", choices=ARMS, help=argparse.SUPPRESS)  # child process
    ap.add_argument("--no-memory", action="store_true", help="skip the per-arm memory processes")
    ap.add_argument("--memory-only", action="store_true", help="only the per-arm processes")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    if args.arm:
        print(json.dumps(one_arm(args)))
        return

    if args.memory_only:
        for arm in ARMS:
            print(arm, json.dumps(_child(arm, args)))
        return
    model, _, batch = build_batch(args.questions, args.group)
    written = int(batch.loss_mask.sum())
    columns = int(batch.attention_mask[:, batch.prompt_len :].sum())
    opt = torch.optim.AdamW(model.parameters(), lr=1e-6, fused=True)  # as the trainer's
    times: dict[str, dict[str, list[float]]] = {
        a: {"update": [], "log_prob_pass": [], "decode": [], "step": []} for a in TIMED
    }
    for arm in COPY_KERNELS:
        times[arm] = {"update": [], "log_prob_pass": [], "decode": [], "step": [], "refresh": []}
    update(model, opt, batch, args.mini_batches, True)  # warm-up: allocator, optimizer state
    clones = {a: make_sampling_copy(model, "bfloat16", k) for a, k in COPY_KERNELS.items()}
    for _ in range(args.repeats):
        for arm in TIMED:
            only = arm != "full head"
            t = times[arm]
            t["update"].append(update(model, opt, batch, args.mini_batches, only, arm))
            t["log_prob_pass"].append(log_prob_pass(model, batch, only, arm))
            t["decode"].append(decode_seconds(model, batch, args.decode_tokens, arm))
            # the round's step at equal work: the same decode, passes and update in every arm
            passes = passes_per_step(arm) * t["log_prob_pass"][-1]
            t["step"].append(t["decode"][-1] + passes + t["update"][-1])
        bf16 = times["written only, bf16"]
        for arm, clone in clones.items():
            t = times[arm]
            t0 = time.perf_counter()
            refresh_sampling_copy(model, clone)  # after the round's updates, as the trainer does
            t["refresh"].append(time.perf_counter() - t0)
            t["decode"].append(decode_seconds(clone, batch, args.decode_tokens, arm))
            t["update"].append(bf16["update"][-1])
            t["log_prob_pass"].append(bf16["log_prob_pass"][-1])
            passes = passes_per_step(arm) * t["log_prob_pass"][-1]
            t["step"].append(t["refresh"][-1] + t["decode"][-1] + passes + t["update"][-1])

    memory: dict[str, dict[str, Any]] = {}
    if not args.no_memory:
        memory = {arm: _child(arm, args) for arm in ARMS}

    med = {a: {k: statistics.median(v) for k, v in t.items()} for a, t in times.items()}
    print(f"machine: {machine()}")
    print(f"command: `python benchmarks/smollm2_step.py {' '.join(sys.argv[1:])}`".strip())
    print(
        f"batch: {len(batch)} rows ({args.questions} questions x {args.group}), prompt "
        f"{batch.prompt_len} + response {batch.response_len} columns; {written} of {columns} "
        f"response tokens model-written ({written / columns:.0%}); {args.mini_batches} "
        f"mini-batches; {args.threads} threads; median of {args.repeats}"
    )
    print()
    print(
        "| arm | update (s) | log-prob pass (s) | trainable params | RSS before / peak in update |"
    )
    print("|---|---|---|---|---|")
    for arm in ARMS:
        m = med.get(arm)
        own = memory.get(arm, {})
        upd = f"{m['update']:.1f}" if m else f"{own.get('update_s', float('nan')):.1f} (once)"
        lpp = (
            f"{m['log_prob_pass']:.1f}"
            if m
            else f"{own.get('log_prob_pass_s', float('nan')):.1f} (once)"
        )
        rss = f"{own['rss_before_gb']:.2f} / {own['peak_rss_gb']:.2f} GB" if own else "-"
        trainable = f"{own['trainable'] / 1e6:.2f}M" if own else "-"
        print(f"| {arm} | {upd} | {lpp} | {trainable} | {rss} |")
    print()
    for a, b in (("full head", "written only"), ("written only", "written only, bf16")):
        rounds = zip(times[a]["update"], times[b]["update"], strict=True)
        print(
            f"{b} vs {a}: update {med[a]['update'] / med[b]['update']:.2f}x, log-prob pass "
            f"{med[a]['log_prob_pass'] / med[b]['log_prob_pass']:.2f}x; every round's update: "
            + ", ".join(f"{x:.1f}/{y:.1f}" for x, y in rounds)
        )
    rows = len(batch)
    print()
    print(
        f"Step at equal work: decode {args.decode_tokens} tokens x {rows} rows (greedy, KV "
        "cache) + the trainer's log-prob passes (the round's pass x 2 in float32, x 3 in bf16) "
        "+ the update, summed per round; median of the rounds"
    )
    print("| arm | decode | tokens/s | passes | update | step | vs full head |")
    print("|---|---|---|---|---|---|---|")
    base = med["full head"]["step"]
    for arm in (*TIMED, *COPY_KERNELS):
        m = med[arm]
        refresh = f" + refresh {m['refresh']:.2f} s" if "refresh" in m else ""
        print(
            f"| {arm} | {m['decode']:.1f} s{refresh} "
            f"| {rows * args.decode_tokens / m['decode']:.0f} "
            f"| {passes_per_step(arm)} x {m['log_prob_pass']:.1f} s | {m['update']:.1f} s "
            f"| {m['step']:.1f} s | {base / m['step']:.2f}x |"
        )
    for arm in ("written only, bf16", *COPY_KERNELS):
        rounds = zip(times["full head"]["step"], times[arm]["step"], strict=True)
        print(
            f"every round's step, full head / {arm}: "
            + ", ".join(f"{x:.1f}/{y:.1f}" for x, y in rounds)
        )


if __name__ == "__main__":
    main()
