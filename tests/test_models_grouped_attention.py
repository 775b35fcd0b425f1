"""`llds_grouped` attention over a `SlabCache`: the same attention as transformers' eager path,
without repeating keys/values per query head or re-concatenating the cache every token."""

from __future__ import annotations

import pytest
import torch
from transformers.models.llama.modeling_llama import eager_attention_forward

from conftest import make_tiny_model, rollout_requests, tag_happy
from llds.errors import ConfigError
from llds.models.grouped_attention import (
    CHUNK,
    GROUPED_ATTENTION,
    SlabCache,
    decode_cache_for,
    grouped_query_attention,
)
from llds.models.kv_cache import cache_argument, returned_cache
from llds.models.tiny import tiny_causal_lm
from llds.policy.sampling_copy import make_sampling_copy
from llds.rollout import RolloutConfig, RolloutEngine
from llds.rollout.config import ATTENTION_IMPLEMENTATIONS


class _Heads(torch.nn.Module):
    """What the attention functions read from their module: the grouping and train/eval."""

    def __init__(self, groups: int):
        super().__init__()
        self.num_key_value_groups = groups
        self.eval()


def _additive_mask(keep: torch.Tensor, q_len: int) -> torch.Tensor:
    """`[B, 1, q, L]` from a `[B, L]` 0/1 padding mask, causal over the last `q_len` columns."""
    length = keep.shape[1]
    causal = torch.ones(q_len, length, dtype=torch.bool).tril(length - q_len)
    allowed = causal[None, None] & keep.bool()[:, None, None, :]
    return torch.zeros(allowed.shape).masked_fill(~allowed, torch.finfo(torch.float32).min)


@pytest.mark.parametrize("q_len", [1, 5])
@pytest.mark.parametrize("kv_heads", [1, 3, 9])
def test_equals_eager_attention(q_len, kv_heads):
    gen = torch.Generator().manual_seed(q_len + kv_heads)
    batch, heads, length, dim = 3, 9, 11, 8
    query = torch.randn(batch, heads, q_len, dim, generator=gen)
    key = torch.randn(batch, kv_heads, length, dim, generator=gen)
    value = torch.randn(batch, kv_heads, length, dim, generator=gen)
    keep = torch.ones(batch, length)
    keep[1, :4] = 0  # a left-padded row
    mask = _additive_mask(keep, q_len)
    module = _Heads(heads // kv_heads)
    want, _ = eager_attention_forward(module, query, key, value, mask, scaling=dim**-0.5)
    got, weights = grouped_query_attention(module, query, key, value, mask, scaling=dim**-0.5)
    assert weights is None
    assert got.shape == want.shape == (batch, q_len, heads, dim)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


def test_slab_columns_past_the_mask_get_no_weight():
    """The keys beyond the mask's width (a slab's unwritten part) hold anything: here huge
    values. The result equals attention over the written columns alone."""
    gen = torch.Generator().manual_seed(0)
    query = torch.randn(2, 4, 1, 8, generator=gen)
    key = torch.randn(2, 2, 10, 8, generator=gen)
    value = torch.randn(2, 2, 10, 8, generator=gen)
    key[:, :, 6:], value[:, :, 6:] = 1e4, 1e4
    mask = _additive_mask(torch.ones(2, 6), 1)
    module = _Heads(2)
    got, _ = grouped_query_attention(module, query, key, value, mask, scaling=0.35)
    want, _ = eager_attention_forward(
        module, query, key[:, :, :6], value[:, :, :6], mask, scaling=0.35
    )
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


def test_refuses_what_it_does_not_implement():
    q, kv = torch.zeros(1, 2, 1, 4), torch.zeros(1, 1, 3, 4)
    with pytest.raises(NotImplementedError, match="sliding_window"):
        grouped_query_attention(_Heads(2), q, kv, kv, None, 1.0, sliding_window=2)


def _decode(model, ids, keep, steps, cache, drop_at=None, feed_at=None):
    """Greedy decoding with a cache: the logits of every step. At `drop_at` the last row leaves
    (the engine's `batch_select_indices`); at `feed_at` every row is fed 3 tokens at once (an
    observation's prefill)."""
    name = cache_argument(model)
    extra = {} if cache is None else {name: cache}
    out = model(input_ids=ids, attention_mask=keep, use_cache=True, **extra)
    cache, logits = returned_cache(out), [out.logits[:, -1]]
    for step in range(steps):
        nxt = logits[-1].argmax(-1, keepdim=True)
        if step == drop_at:
            rows = torch.arange(len(keep) - 1)
            cache.batch_select_indices(rows)
            keep, nxt = keep[rows], nxt[rows]
        if step == feed_at:
            nxt = torch.cat([nxt, (nxt + 1) % 50, (nxt + 2) % 50], dim=1)
        keep = torch.cat([keep, torch.ones_like(nxt)], dim=1)
        positions = (keep.cumsum(-1) - 1)[:, -nxt.shape[1] :]
        out = model(input_ids=nxt, attention_mask=keep, position_ids=positions, **{name: cache})
        cache = returned_cache(out)
        logits.append(out.logits[:, -1])
    return logits, cache


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_decoding_matches_eager_with_dynamic_cache(arch):
    """Past one regrowth of the slab, with a row dropped and a multi-token feed on the way."""
    model = tiny_causal_lm(50, hidden_size=48, num_layers=2, num_heads=6, num_kv_heads=2, arch=arch)
    eager = make_sampling_copy(model, "float32", "eager")
    grouped = make_sampling_copy(model, "float32", GROUPED_ATTENTION)
    ids = torch.randint(0, 50, (3, 7), generator=torch.Generator().manual_seed(1))
    keep = torch.ones(3, 7, dtype=torch.long)
    keep[0, :3] = 0  # left padding
    steps = CHUNK + 10
    with torch.no_grad():
        want, _ = _decode(eager, ids, keep, steps, None, drop_at=20, feed_at=40)
        got, cache = _decode(grouped, ids, keep, steps, SlabCache(), drop_at=20, feed_at=40)
    assert isinstance(cache, SlabCache)
    assert cache.get_seq_length() == 7 + steps + 2
    assert cache.layers[0].keys.shape[-2] == 2 * CHUNK  # grew once, in whole chunks
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


def test_only_the_grouped_model_gets_a_slab():
    model = tiny_causal_lm(50, hidden_size=32, num_layers=1, num_heads=4, num_kv_heads=2)
    assert decode_cache_for(make_sampling_copy(model, "float32", "eager")) is None
    grouped = make_sampling_copy(model, "float32", GROUPED_ATTENTION)
    assert isinstance(decode_cache_for(grouped), SlabCache)
    assert decode_cache_for(torch.nn.Linear(2, 2)) is None


def test_config_accepts_it_and_sliding_windows_are_refused():
    assert GROUPED_ATTENTION in ATTENTION_IMPLEMENTATIONS
    RolloutConfig(dtype="bfloat16", attn_implementation=GROUPED_ATTENTION).validate()
    model = tiny_causal_lm(50, hidden_size=32, num_layers=1, num_heads=4, num_kv_heads=2)
    text = model.config
    text.use_sliding_window, text.sliding_window = True, 16
    text.layer_types = ["sliding_attention"]
    with pytest.raises(ConfigError, match=r"rollout\.attn_implementation.*sliding"):
        make_sampling_copy(model, "float32", GROUPED_ATTENTION)


def test_engine_rollouts_equal_eagers(small_world, world_tokenizer, world_retriever):
    """Sampled multi-turn rollouts from a float32 copy: the same tokens with either kernel, with
    rows longer than one slab chunk and rows that finish early."""
    tok = world_tokenizer
    model = tag_happy(make_tiny_model(tok, seed=3), tok)
    reqs = rollout_requests(small_world, tok, n=12)
    cfg = RolloutConfig(
        max_turns=2, max_turn_tokens=64, max_obs_tokens=48, max_total_tokens=320, topk=2
    )
    batches = []
    for kernel in ("eager", GROUPED_ATTENTION):
        copy = make_sampling_copy(model, "float32", kernel)
        engine = RolloutEngine(copy, tok, world_retriever, cfg)
        batches.append(engine.generate(reqs, generator=torch.Generator().manual_seed(0)))
    a, b = batches
    assert torch.equal(a.input_ids, b.input_ids)
    assert torch.equal(a.rewards, b.rewards)
    lengths = [len(e.prompt_ids) + len(e.response_ids) for e in a.episodes]
    assert max(lengths) > CHUNK
    assert len({e.num_turns for e in a.episodes}) > 1  # some rows left the cache before others
