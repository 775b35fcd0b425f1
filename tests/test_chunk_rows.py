"""Rows per rollout chunk from the key/value cache budget (`rollout.cache_memory_mb`)."""

from __future__ import annotations

import torch

from llds.models.tiny import tiny_causal_lm
from llds.rollout.chunk_rows import cache_bytes_per_row, chunk_rows


def test_bytes_per_row_counted_by_hand():
    # 2 layers x (keys + values) x 2 key/value heads x 32 dims x 100 positions x 4 bytes
    model = tiny_causal_lm(50, hidden_size=128, num_layers=2, num_heads=4, num_kv_heads=2)
    assert cache_bytes_per_row(model, 100) == 2 * 2 * 2 * 32 * 100 * 4 == 102_400
    assert cache_bytes_per_row(model.to(torch.bfloat16), 100) == 51_200


def test_rows_fit_the_budget_capped_by_max_rows():
    model = tiny_causal_lm(50, hidden_size=128, num_layers=2, num_heads=4, num_kv_heads=2)
    assert chunk_rows(model, 100, 512, 1) == 2**20 // 102_400 == 10
    assert chunk_rows(model, 100, 7, 1) == 7  # max_rows caps
    assert chunk_rows(model, 100_000, 512, 1) == 1  # one row even past the budget


def test_a_model_without_a_transformers_config_keeps_max_rows():
    assert chunk_rows(torch.nn.Linear(2, 2), 100, 64, 1) == 64


def test_the_engine_generates_in_chunks_the_budget_holds(
    small_world, world_tokenizer, world_retriever
):
    """`RolloutEngine.generate` decodes as many rows together as `rollout.cache_memory_mb`
    holds at `max_total_tokens + 1` positions, and the chunks change no rollout."""
    from conftest import make_tiny_model, rollout_requests
    from llds.rollout import RolloutConfig, RolloutEngine

    model = make_tiny_model(world_tokenizer)
    c = model.config
    kv_heads = c.num_key_value_heads or c.num_attention_heads
    head_dim = c.hidden_size // c.num_attention_heads
    total = 255  # a row: 1024 bytes a position (2 layers, 2 key/value heads of 16, float32)
    per_row = 2 * c.num_hidden_layers * kv_heads * head_dim * (total + 1) * 4  # float32
    rows = 2**20 // per_row
    reqs = rollout_requests(small_world, world_tokenizer, n=12, group=3)
    assert 1 < rows < len(reqs)  # the budget splits these requests
    settings = dict(max_turns=2, max_turn_tokens=12, max_obs_tokens=48, max_total_tokens=total)
    batches, sizes = [], []
    for budget in (1, 64):
        engine = RolloutEngine(
            model,
            world_tokenizer,
            world_retriever,
            RolloutConfig(**settings, cache_memory_mb=budget),
        )
        run_chunk = engine._run_chunk

        def counted(chunk, gen, run=run_chunk, budget=budget):
            sizes.append((budget, len(chunk)))
            return run(chunk, gen)

        engine._run_chunk = counted
        batches.append(engine.generate(reqs, generator=torch.Generator().manual_seed(0)))
    expected = [rows] * (len(reqs) // rows) + ([len(reqs) % rows] if len(reqs) % rows else [])
    assert [n for b, n in sizes if b == 1] == expected
    assert [n for b, n in sizes if b == 64] == [len(reqs)]
    small, whole = batches
    assert [e.response_ids for e in small.episodes] == [e.response_ids for e in whole.episodes]
