"""Counter-based sampling noise: Gumbel noise as a pure function of (seed, position, token).

Why: a rollout must depend only on its own seed, not on its batch-mates, the chunk it was
generated in or the number of processes. One `torch.Generator` per row gives that, but costs
one generator call per row and token, on the host. Hashing the counter (seed, position, token
id) gives the same guarantee in a handful of element-wise integer ops over the whole batch, on
the model's device, and needs no state: the noise at a position does not depend on how many
draws came before it, so a row that decodes a few tokens past its stop and is rolled back
draws the same noise again.

The hash is a 32-bit integer mixer (xor-shift and multiply rounds, as in Wellons' `lowbias32`)
evaluated in int64 with multipliers below 2^31, so no product overflows on any backend; the
top 24 bits of the result give a uniform on (0, 1) with no endpoint.
"""

from __future__ import annotations

import torch
from torch import Tensor

_MASK32 = 0xFFFFFFFF
# odd multipliers below 2^31: x < 2^32 times m < 2^31 stays below 2^63 (no int64 overflow)
_M1 = 0x7FEB352D
_M2 = 0x646CA68B
_GOLDEN = 0x1E3779B9  # spreads consecutive counters before mixing


def mix32(x: Tensor) -> Tensor:
    """A bijective 32-bit mixer on int64 values in [0, 2^32)."""
    x = x ^ (x >> 16)
    x = (x * _M1) & _MASK32
    x = x ^ (x >> 15)
    x = (x * _M2) & _MASK32
    return x ^ (x >> 16)


def row_keys(seeds: Tensor, positions: Tensor) -> Tensor:
    """One 32-bit key per row from its 62-bit seed and the position it samples at (int64)."""
    lo = seeds & _MASK32
    hi = (seeds >> 32) & _MASK32
    key = mix32(lo ^ mix32(hi + _GOLDEN))
    return mix32(key ^ ((positions * _GOLDEN) & _MASK32))


def uniform_noise(seeds: Tensor, positions: Tensor, vocab: int) -> Tensor:
    """`[N, vocab]` float32 uniforms in (0, 1): entry (r, v) is a function of
    (seeds[r], positions[r], v) alone."""
    keys = row_keys(seeds.long(), positions.long())
    tokens = torch.arange(vocab, device=keys.device, dtype=torch.long)
    bits = mix32(mix32(keys[:, None] ^ ((tokens * _M1) & _MASK32)[None, :]) ^ keys[:, None])
    return ((bits >> 8).float() + 0.5) * (1.0 / (1 << 24))


def gumbel_noise(seeds: Tensor, positions: Tensor, vocab: int) -> Tensor:
    """Standard Gumbel noise `-log(-log U)` with `U = uniform_noise(...)`:
    `argmax(logits / T + noise)` is an exact sample of `softmax(logits / T)`."""
    return -torch.log(-torch.log(uniform_noise(seeds, positions, vocab)))
