"""The `smollm2-wiki-lora` preset: `smollm2-wiki-rl` with LoRA on every linear layer at rank 16,
a learning rate 10x the base's, and bf16 compute where the CPU has bf16 instructions (decided
at start, logged). Its run state's size: tests/test_lora_checkpoints.py."""

from __future__ import annotations

import dataclasses
import logging

import pytest
import torch

from conftest import tiny_trainer
from llds.policy.precision import IF_SUPPORTED, compute_dtype_of, native_bfloat16
from llds.train.config import load_config


def test_the_preset_is_the_base_with_lora_everywhere_and_ten_times_the_rate():
    lora, base = load_config("smollm2-wiki-lora"), load_config("smollm2-wiki-rl")
    assert lora.model.lora is not None and lora.model.lora.r == 16
    assert lora.model.lora.alpha == 32
    mlp = {"gate_proj", "up_proj", "down_proj"}
    attention = {"q_proj", "k_proj", "v_proj", "o_proj"}
    assert set(lora.model.lora.target_modules) == attention | mlp
    assert lora.optim.lr == pytest.approx(10 * base.optim.lr)
    assert lora.model.dtype == IF_SUPPORTED
    assert lora.run_dir != base.run_dir
    # everything else is the base's: the same warm start, data, rollouts and loss
    assert lora.model.path == base.model.path and lora.make_inputs == base.make_inputs
    assert (lora.data, lora.rollout, lora.algo) == (base.data, base.rollout, base.algo)
    assert dataclasses.replace(lora.optim, lr=base.optim.lr) == base.optim
    assert (lora.steps, lora.prompts_per_step, lora.seed) == (base.steps, base.prompts_per_step, 0)


@pytest.mark.parametrize(
    ("capabilities", "native"),
    [
        ({"avx512_bf16": True, "avx512_f": True}, True),  # e.g. Zen 4, Cooper Lake and later
        ({"amx_bf16": True}, True),  # Sapphire Rapids
        ({"avx512_bf16": False, "avx512_f": True, "avx2": True}, False),  # Skylake-X
        ({"avx2": True}, False),
        ({}, False),  # a CPU torch knows no features of
    ],
)
def test_bf16_only_where_the_cpu_has_bf16_instructions(monkeypatch, caplog, capabilities, native):
    assert native_bfloat16("cpu", capabilities) is native
    monkeypatch.setattr(torch.cpu, "get_capabilities", lambda: capabilities)
    with caplog.at_level(logging.INFO, logger="llds.policy"):
        dtype = compute_dtype_of(IF_SUPPORTED, device_type="cpu")
    assert dtype == (torch.bfloat16 if native else None)
    shown = "bfloat16" if native else "float32"
    assert f"model.dtype {IF_SUPPORTED}: cpu " in caplog.text
    assert caplog.text.rstrip().endswith(f"computing in {shown}")
    assert native_bfloat16("mps", capabilities) is False


@pytest.mark.parametrize("native", [True, False])
def test_the_trainer_decides_at_start(
    monkeypatch, tmp_path, small_world, world_tokenizer, world_retriever, native
):
    monkeypatch.setattr(torch.cpu, "get_capabilities", lambda: {"avx512_bf16": native})
    tr = tiny_trainer(
        tmp_path,
        small_world,
        world_tokenizer,
        world_retriever,
        [f"model.dtype={IF_SUPPORTED}", "model.device=cpu", "model.lora.r=4"],
    )
    assert tr.precision.compute_dtype == (torch.bfloat16 if native else None)
    # the master weights stay float32 either way
    assert all(p.dtype == torch.float32 for p in tr.model.parameters())
