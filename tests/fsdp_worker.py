"""Worker for tests/test_train_fsdp.py, launched as 2 processes by torchrun (gloo on CPU).

Usage: python -m torch.distributed.run --standalone --nproc_per_node 2 tests/fsdp_worker.py OUT

Every rank also runs the single-process reference (a plain model on the whole global batch),
so comparisons need no extra launch. Rank 0 writes OUT/results.json (numbers measured on every
rank, gathered) plus OUT/ref_step1.pt (the reference weights after one step) and OUT/hf (the
FSDP master weights after one step, saved with `save_pretrained`).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import torch.distributed as td
from torch.distributed.tensor import DTensor

from llds.models.bpe import train_bpe_tokenizer
from llds.models.hf import enable_activation_checkpointing
from llds.models.tiny import tiny_causal_lm_for
from llds.policy.forward import response_log_probs
from llds.rollout.batch import Episode, RolloutBatch
from llds.train import fsdp

SENTENCES = [
    "the cat sat on the mat and looked at the dog",
    "a quick brown fox jumps over the lazy dog",
    "search engines return documents for each query",
    "the answer is written between two answer tags",
]
GROUPS, GROUP_SIZE = 4, 2  # global batch: 4 questions x 2 rollouts


def make_batch(vocab: int, pad_id: int) -> RolloutBatch:
    """A fixed global batch: rollouts of a group share their prompt; lengths differ."""
    gen = torch.Generator().manual_seed(1234)
    episodes = []
    for g in range(GROUPS):
        prompt = torch.randint(3, vocab, (4 + g,), generator=gen).tolist()
        for k in range(GROUP_SIZE):
            n = 5 + (g + k) % 3
            resp = torch.randint(3, vocab, (n,), generator=gen).tolist()
            action = [1, 1, 0, 1] + [1] * (n - 4)  # one "observation" token, not in the loss
            episodes.append(
                Episode(
                    prompt,
                    f"q{g}",
                    f"q{g}",
                    ("x",),
                    response_ids=resp,
                    action_mask=action,
                    answer_mask=[0] * n,
                    logprobs=None,
                    entropies=None,
                )
            )
    return RolloutBatch.from_episodes(episodes, pad_id)


def loss_of(model, batch: RolloutBatch, rows: list[int], n_tok: float) -> torch.Tensor:
    """-sum of response-token log-probs of `rows`, over the GLOBAL token count."""
    sub = batch.select(rows)
    lp, _ = response_log_probs(model, sub)
    return -(lp * sub.loss_mask.to(lp.dtype)).sum() / n_tok


def step(model, opt, batch, micro_batches, n_tok, *, max_norm=1e9) -> float:
    """One optimizer step over `micro_batches` (lists of rows), padded to the same count on
    every rank with zero-weight dummies; returns the global gradient norm."""
    opt.zero_grad(set_to_none=True)
    n = fsdp.max_over_ranks(len(micro_batches))
    for i in range(n):
        if i < len(micro_batches):
            loss_of(model, batch, micro_batches[i], n_tok).backward()
        else:  # dummy: same collectives, nothing added to the gradient
            (loss_of(model, batch, micro_batches[0], n_tok) * 0.0).backward()
    norm = fsdp.clip_grad_norm(model.parameters(), max_norm)
    opt.step()
    return float(norm)


def max_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert set(a) == set(b), (sorted(set(a) ^ set(b)))[:5]
    return max((a[k].float() - b[k].float()).abs().max().item() for k in a)


def plain_state(model) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def main(out: Path) -> None:
    td.init_process_group("gloo")
    rank, world = td.get_rank(), td.get_world_size()
    torch.manual_seed(0)
    tok = train_bpe_tokenizer(SENTENCES * 3, vocab_size=300)
    vocab = len(tok)

    def new_model(seed: int = 0):
        return tiny_causal_lm_for(tok, hidden_size=32, num_layers=2, num_heads=4, seed=seed)

    batch = make_batch(vocab, tok.pad_token_id)
    n_tok = float(batch.loss_mask.sum())
    everything = list(range(len(batch)))
    # rank r owns groups r and r + world (2 rows each); rank 0 splits its rows into one
    # micro-batch per group, rank 1 takes both groups at once: unequal micro-batch counts
    mine = [i for i in everything if (i // GROUP_SIZE) % world == rank]
    micro = [mine[:GROUP_SIZE], mine[GROUP_SIZE:]] if rank == 0 else [mine]
    r: dict = {"rank": rank, "max_over_ranks": fsdp.max_over_ranks(rank + 1)}

    def adamw(params, lr, eps=1e-6, **kw):
        # k_proj.bias has an exactly-zero true gradient (softmax ignores a shift shared by all
        # keys), so its computed gradient is rounding noise; Adam's default eps=1e-8 would blow
        # that noise up to a full lr-sized step. eps=1e-6 keeps such elements (nearly) still.
        return torch.optim.AdamW(params, lr=lr, eps=eps, weight_decay=0.01, **kw)

    # ---------------- reference: one process, no FSDP, the whole batch in one micro-batch
    init = plain_state(new_model())
    ref = new_model()
    r["tied"] = ref.lm_head.weight is ref.model.embed_tokens.weight
    ref_opt = adamw(ref.parameters(), 1e-3)
    r["ref_norm"] = step(ref, ref_opt, batch, [everything], n_tok)
    ref1 = plain_state(ref)
    step(ref, ref_opt, batch, [everything], n_tok)
    ref2 = plain_state(ref)

    # ---------------- (a) FSDP fp32 on 2 ranks
    model = fsdp.shard_policy(new_model(), compute_dtype=None)
    r["sharded"] = fsdp.is_sharded(model)
    r["tied_after_shard"] = model.lm_head.weight is model.model.embed_tokens.weight
    local_numel = sum(p.to_local().numel() for p in model.parameters())
    r["local_fraction"] = local_numel / sum(v.numel() for v in ref.parameters())
    opt = adamw(model.parameters(), 1e-3, fused=True)  # as the trainer builds it on CPU
    r["fsdp_norm"] = step(model, opt, batch, micro, n_tok)
    full1 = fsdp.full_state_dict(model, all_ranks=True)
    r["fp32_step1_vs_ref"] = max_diff(full1, ref1)
    r["fp32_moved"] = max_diff(ref1, init)
    rank0 = fsdp.full_state_dict(model)
    r["rank0_only_keys"] = len(rank0)
    if rank == 0:
        r["rank0_vs_all_ranks"] = max_diff(rank0, full1)
        torch.save(ref1, out / "ref_step1.pt")
        model.save_pretrained(out / "hf", state_dict=rank0)

    # refresh an unsharded bf16 rollout copy (a different init, so the copy must happen)
    copy = new_model(seed=5).to(torch.bfloat16)
    fsdp.sync_unsharded_copy(model, copy)
    want = {k: v.to(torch.bfloat16) for k, v in full1.items()}
    r["sync_bf16_dtype_ok"] = all(v.dtype == torch.bfloat16 for v in copy.state_dict().values())
    r["sync_bf16_vs_full"] = max_diff(plain_state(copy), want)
    copy2 = new_model(seed=6)
    fsdp.copy_into(copy2, full1)
    r["copy_into_vs_full"] = max_diff(plain_state(copy2), full1)
    r["copy_still_tied"] = copy2.lm_head.weight is copy2.model.embed_tokens.weight

    # a no-grad forward on the sharded model (old/ref log-probs) matches the reference model
    with torch.no_grad():
        lp_sharded = loss_of(model, batch, mine, n_tok)
        ref_check = new_model(seed=6)
        fsdp.copy_into(ref_check, full1)
        lp_plain = loss_of(ref_check, batch, mine, n_tok)
    r["no_grad_forward_diff"] = abs(float(lp_sharded) - float(lp_plain))
    r["sharded_after_no_grad"] = all(isinstance(p, DTensor) for p in model.parameters())

    # HF activation checkpointing inside the FSDP units gives the same step
    gc_base = new_model()
    enable_activation_checkpointing(gc_base, use_reentrant=False)
    gc = fsdp.shard_policy(gc_base, compute_dtype=None)
    r["checkpointed_norm"] = step(gc, adamw(gc.parameters(), 1e-3, fused=True), batch, micro, n_tok)
    r["checkpointed_vs_full"] = max_diff(fsdp.full_state_dict(gc, all_ranks=True), full1)

    # ---------------- (c) sharded checkpoint, then one more step with and without resuming
    ckpt = out / "ckpt"
    fsdp.save_sharded(ckpt, model, opt)
    td.barrier()
    if rank == 0:
        r["ckpt_files"] = sorted(p.name for p in ckpt.iterdir())
    step(model, opt, batch, micro, n_tok)
    straight = fsdp.full_state_dict(model, all_ranks=True)
    resumed = fsdp.shard_policy(new_model(seed=9), compute_dtype=None)
    resumed_opt = adamw(resumed.parameters(), 5e-2, fused=True)  # lr comes from the checkpoint
    fsdp.load_sharded(ckpt, resumed, resumed_opt)
    r["resumed_lr"] = resumed_opt.param_groups[0]["lr"]
    r["loaded_vs_step1"] = max_diff(fsdp.full_state_dict(resumed, all_ranks=True), full1)
    step(resumed, resumed_opt, batch, micro, n_tok)
    r["resume_vs_straight"] = max_diff(fsdp.full_state_dict(resumed, all_ranks=True), straight)
    r["fp32_step2_vs_ref"] = max_diff(straight, ref2)

    # ---------------- (b) bf16 compute, fp32 master weights, a tiny lr
    lr = 1e-6
    ref_b = new_model()
    step(ref_b, adamw(ref_b.parameters(), lr), batch, [everything], n_tok)
    model_b = fsdp.shard_policy(new_model(), compute_dtype=torch.bfloat16)
    r["bf16_master_dtypes_before"] = sorted({str(p.dtype) for p in model_b.parameters()})
    opt_b = adamw(model_b.parameters(), lr, fused=True)
    r["bf16_norm"] = step(model_b, opt_b, batch, micro, n_tok)
    r["bf16_master_dtypes_after"] = sorted({str(p.dtype) for p in model_b.parameters()})
    r["bf16_local_dtypes_after"] = sorted({str(p.to_local().dtype) for p in model_b.parameters()})
    full_b = fsdp.full_state_dict(model_b, all_ranks=True)
    changed = sum(int((full_b[k] != init[k]).sum()) for k in init)
    r["bf16_changed_fraction"] = changed / sum(v.numel() for v in init.values())
    delta_norm = sum(float((full_b[k] - init[k]).pow(2).sum()) for k in init) ** 0.5
    ref_delta = sum(float((ref_b.state_dict()[k] - init[k]).pow(2).sum()) for k in init) ** 0.5
    r["bf16_update_norm"], r["fp32_update_norm"] = delta_norm, ref_delta

    gathered: list = [None] * world
    td.all_gather_object(gathered, r)
    if rank == 0:
        (out / "results.json").write_text(json.dumps(gathered, indent=1))
    td.barrier()
    td.destroy_process_group()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
