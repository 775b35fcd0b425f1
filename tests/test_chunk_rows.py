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
