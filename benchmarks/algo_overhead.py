"""What the GRPO + LLDS loss terms cost next to the model's forward+backward.

Times `llds_loss` + `policy_loss` + `kl_penalty` (forward and backward to the log-probs) on a
B x T rollout batch, and one forward+backward of a small Qwen2-shaped model over the same tokens
(in micro-batches, as the trainer runs it). Goal: the LLDS term costs < 1% of the step.

    python benchmarks/algo_overhead.py [--batch 64] [--seq 2048] [--repeats 3]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import machine, median_time
from llds.algo import kl_penalty, llds_loss, policy_loss, token_log_probs
from llds.algo.masking import aggregate


def make_batch(b: int, t: int, seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    mask = torch.zeros(b, t, dtype=torch.bool)
    # three actions separated by two observations per row, like a 2-search rollout
    for i in range(b):
        cuts = sorted(torch.randint(1, t, (4,), generator=g).tolist())
        mask[i, : cuts[0]] = True
        mask[i, cuts[1] : cuts[2]] = True
        mask[i, cuts[3] :] = True
    old = -torch.rand(b, t, generator=g) * 3
    return {
        "old": old,
        "logp": old + 0.05 * torch.randn(b, t, generator=g),
        "ref": old + 0.05 * torch.randn(b, t, generator=g),
        "adv": torch.randn(b, generator=g),
        "mask": mask,
    }


def loss_terms(batch: dict[str, torch.Tensor], with_llds: bool) -> None:
    logp = batch["logp"].clone().requires_grad_(True)
    loss, _ = policy_loss(logp, batch["old"], batch["adv"], batch["mask"])
    loss = loss + 0.001 * aggregate(kl_penalty(logp, batch["ref"]), batch["mask"], "token-mean")
    if with_llds:
        loss = loss + llds_loss(logp, batch["old"], batch["adv"], batch["mask"])[0]
    loss.backward()


def model_step(model, ids: torch.Tensor, micro: int) -> None:
    for s in range(0, ids.shape[0], micro):
        x = ids[s : s + micro]
        logits = model(input_ids=x).logits[:, :-1]
        token_log_probs(logits, x[:, 1:]).mean().backward()
    model.zero_grad(set_to_none=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--micro", type=int, default=4, help="rows per forward+backward")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--vocab", type=int, default=8192)
    args = ap.parse_args()

    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    cfg = Qwen2Config(
        vocab_size=args.vocab,
        hidden_size=args.hidden,
        intermediate_size=4 * args.hidden,
        num_hidden_layers=args.layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=args.seq,
        tie_word_embeddings=True,
    )
    model = Qwen2ForCausalLM(cfg)
    n_params = sum(p.numel() for p in model.parameters())
    batch = make_batch(args.batch, args.seq)
    ids = torch.randint(0, args.vocab, (args.batch, args.seq))

    t_llds_only = median_time(
        lambda: llds_loss(
            batch["logp"].clone().requires_grad_(True), batch["old"], batch["adv"], batch["mask"]
        )[0].backward(),
        args.repeats * 3,
    )
    t_terms = median_time(lambda: loss_terms(batch, with_llds=False), args.repeats * 3)
    t_terms_llds = median_time(lambda: loss_terms(batch, with_llds=True), args.repeats * 3)
    t_model = median_time(lambda: model_step(model, ids, args.micro), args.repeats, warmup=0)

    cmd = "python benchmarks/algo_overhead.py " + " ".join(sys.argv[1:])
    print(f"machine: {machine()}")
    print(f"command: `{cmd.strip()}`")
    print(
        f"model: Qwen2-shaped, {n_params / 1e6:.1f}M params, hidden {args.hidden}, "
        f"{args.layers} layers, vocab {args.vocab}; batch {args.batch} x {args.seq} tokens\n"
    )
    print("| part (forward + backward) | median time | share of model step |")
    print("|---|---|---|")
    rows = [
        ("model forward+backward (comparison)", t_model),
        ("policy loss + KL (k3)", t_terms),
        ("policy loss + KL + LLDS (action gate)", t_terms_llds),
        ("LLDS alone (action gate)", t_llds_only),
    ]
    for name, t in rows:
        print(f"| {name} | {t * 1e3:.1f} ms | {100 * t / t_model:.3f}% |")


if __name__ == "__main__":
    main()
