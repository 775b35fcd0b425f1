"""Per-token log-probs of the taken tokens and token entropy, without a full `[B, T, V]` softmax.

With 50k-150k vocabularies a float32 log-softmax over a rollout batch costs gigabytes. These
functions walk the flattened positions in chunks: the forward keeps only `[N]` results, and the
backward writes the logits gradient chunk by chunk into a single buffer (which autograd needs
anyway), so peak extra memory is one `[chunk, V]` block.
"""

from __future__ import annotations

import torch
from torch import Tensor

DEFAULT_CHUNK = 1024


def _chunk_stats(x: Tensor, y: Tensor, want_entropy: bool) -> tuple[Tensor, Tensor, Tensor | None]:
    x = x.float()
    lse = torch.logsumexp(x, dim=-1)
    logp = x.gather(-1, y.unsqueeze(-1)).squeeze(-1) - lse
    ent = None
    if want_entropy:
        p = torch.exp(x - lse.unsqueeze(-1))
        ent = lse - (p * x).sum(-1)
    return lse, logp, ent


class _LogProbEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits: Tensor, labels: Tensor, chunk: int, want_entropy: bool):  # type: ignore[override]
        n = logits.shape[0]
        logp = torch.empty(n, dtype=torch.float32, device=logits.device)
        lse = torch.empty_like(logp)
        ent = torch.empty_like(logp) if want_entropy else torch.zeros(0, device=logits.device)
        for s in range(0, n, chunk):
            c_lse, c_logp, c_ent = _chunk_stats(
                logits[s : s + chunk], labels[s : s + chunk], want_entropy
            )
            lse[s : s + chunk] = c_lse
            logp[s : s + chunk] = c_logp
            if want_entropy:
                ent[s : s + chunk] = c_ent
        ctx.save_for_backward(logits, labels, lse, ent)
        ctx.chunk = chunk
        ctx.want_entropy = want_entropy
        return logp, ent

    @staticmethod
    def backward(ctx, grad_logp: Tensor, grad_ent: Tensor):  # type: ignore[override]
        logits, labels, lse, ent = ctx.saved_tensors
        chunk = ctx.chunk
        grad = torch.empty_like(logits)
        for s in range(0, logits.shape[0], chunk):
            x = logits[s : s + chunk].float()
            logq = x - lse[s : s + chunk].unsqueeze(-1)
            p = torch.exp(logq)
            # d logp_y / dx = onehot(y) - p
            g = -p * grad_logp[s : s + chunk].unsqueeze(-1)
            g.scatter_add_(
                -1, labels[s : s + chunk].unsqueeze(-1), grad_logp[s : s + chunk].unsqueeze(-1)
            )
            if ctx.want_entropy and grad_ent is not None:
                # dH / dx = -p * (log p + H)
                g -= (
                    p
                    * (logq + ent[s : s + chunk].unsqueeze(-1))
                    * grad_ent[s : s + chunk].unsqueeze(-1)
                )
            grad[s : s + chunk] = g.to(grad.dtype)
        return grad, None, None, None


def token_log_probs_and_entropy(
    logits: Tensor,
    labels: Tensor,
    *,
    temperature: float = 1.0,
    chunk_size: int = DEFAULT_CHUNK,
    with_entropy: bool = True,
) -> tuple[Tensor, Tensor | None]:
    """`log softmax(logits / temperature)[labels]` and the entropy of each position.

    `logits` is `[..., V]` and `labels` `[...]` (already shifted so that `labels[t]` is the token
    produced from position `t`). Returns float32 tensors shaped like `labels`; the entropy is
    None when `with_entropy=False`. Differentiable in both outputs.
    """
    if logits.shape[:-1] != labels.shape:
        raise ValueError(f"logits {tuple(logits.shape)} do not match labels {tuple(labels.shape)}")
    if temperature != 1.0:
        logits = logits / temperature
    lead = labels.shape
    flat_logits = logits.reshape(-1, logits.shape[-1])
    flat_labels = labels.reshape(-1).long()
    logp, ent = _LogProbEntropy.apply(flat_logits, flat_labels, int(chunk_size), bool(with_entropy))
    return logp.view(lead), (ent.view(lead) if with_entropy else None)


def token_log_probs(
    logits: Tensor, labels: Tensor, *, temperature: float = 1.0, chunk_size: int = DEFAULT_CHUNK
) -> Tensor:
    """Per-token log-probs of `labels` under `logits` (see `token_log_probs_and_entropy`)."""
    logp, _ = token_log_probs_and_entropy(
        logits, labels, temperature=temperature, chunk_size=chunk_size, with_entropy=False
    )
    return logp


def token_entropy(
    logits: Tensor, *, temperature: float = 1.0, chunk_size: int = DEFAULT_CHUNK
) -> Tensor:
    """Entropy of the next-token distribution at every position, `[...]` float32."""
    labels = torch.zeros(logits.shape[:-1], dtype=torch.long, device=logits.device)
    _, ent = token_log_probs_and_entropy(
        logits, labels, temperature=temperature, chunk_size=chunk_size, with_entropy=True
    )
    assert ent is not None
    return ent
