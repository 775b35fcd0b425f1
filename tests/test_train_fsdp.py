"""FSDP2 (`llds.train.fsdp`): two sharded processes (gloo on CPU, launched by torchrun) make the
same update as one unsharded process; bf16 compute keeps fp32 master weights; sharded
checkpoints resume exactly; the full weights export as an ordinary HF model.

One torchrun launch (tests/fsdp_worker.py) measures everything; the tests below check what it
measured. The checks that need no process group run in this process.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

from llds.train import fsdp

WORKER = Path(__file__).with_name("fsdp_worker.py")


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """Launch the 2-process worker once; returns (per-rank results, output folder)."""
    out = tmp_path_factory.mktemp("fsdp")
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
    proc = subprocess.run(
        [*cmd, str(WORKER), str(out)], env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    results = json.loads((out / "results.json").read_text())
    assert [r["rank"] for r in results] == [0, 1]
    return results, out


@pytest.mark.slow
def test_two_sharded_processes_equal_one(run):
    """(a) fp32: one AdamW step of 2 FSDP ranks (unequal micro-batch counts, padded with a
    zero-weight dummy) equals the single-process step on the whole batch: gradients are summed,
    not averaged (averaging would halve every gradient and change the global norm)."""
    results, _ = run
    for r in results:
        assert r["max_over_ranks"] == 2
        assert r["sharded"] and r["local_fraction"] == pytest.approx(0.5, abs=0.02)
        assert r["tied"] and r["tied_after_shard"]  # the tiny model ties embed_tokens/lm_head
        assert r["fp32_moved"] > 5e-4  # the step really moved the weights
        assert r["fp32_step1_vs_ref"] < 1e-6
        assert r["fp32_step2_vs_ref"] < 1e-6
        assert r["fsdp_norm"] == pytest.approx(r["ref_norm"], rel=1e-5)  # global grad norm
        # a no-grad forward of the sharded model matches the plain model; it reshards after
        assert r["no_grad_forward_diff"] < 1e-5
        assert r["sharded_after_no_grad"]
        # HF activation checkpointing inside the units changes nothing
        assert r["checkpointed_norm"] == pytest.approx(r["ref_norm"], rel=1e-5)
        assert r["checkpointed_vs_full"] < 1e-6


@pytest.mark.slow
def test_bf16_compute_keeps_fp32_master_weights(run):
    """(b) compute in bf16, master weights and their update in fp32: an lr 1e-6 step (far below
    bf16 resolution at these magnitudes) still moves almost every element, by as much as the
    fp32 single-process step."""
    results, _ = run
    for r in results:
        assert r["bf16_master_dtypes_before"] == ["torch.float32"]
        assert r["bf16_master_dtypes_after"] == ["torch.float32"]
        assert r["bf16_local_dtypes_after"] == ["torch.float32"]
        assert r["bf16_changed_fraction"] >= 0.9
        ratio = r["bf16_update_norm"] / r["fp32_update_norm"]
        assert 0.5 < ratio < 2.0
        # the forward really ran in bf16: the gradient differs a little from the fp32 one
        assert r["bf16_norm"] != r["fsdp_norm"]
        assert r["bf16_norm"] == pytest.approx(r["fsdp_norm"], rel=0.05)


@pytest.mark.slow
def test_sharded_checkpoint_resumes_exactly(run):
    """(c) save_sharded -> load_sharded into a freshly initialised sharded model + optimizer,
    then one more step, equals the run that never stopped, bit for bit."""
    results, _ = run
    assert results[0]["ckpt_files"] == [".metadata", "__0_0.distcp", "__1_0.distcp"]
    for r in results:
        assert r["loaded_vs_step1"] == 0.0  # parameters restored over a different init
        assert r["resumed_lr"] == pytest.approx(1e-3)  # param-group hyperparameters restored
        assert r["resume_vs_straight"] == 0.0  # AdamW moments and step count restored too


@pytest.mark.slow
def test_full_weights_export_and_unsharded_copies(run):
    """(c) full_state_dict on rank 0 equals the 1-process weights and round-trips through
    save_pretrained / AutoModelForCausalLM.from_pretrained; sync_unsharded_copy and copy_into
    refresh unsharded (bf16 / fp32) copies on every rank."""
    from transformers import AutoModelForCausalLM

    results, out = run
    assert results[0]["rank0_only_keys"] > 0 and results[1]["rank0_only_keys"] == 0
    assert results[0]["rank0_vs_all_ranks"] == 0.0
    for r in results:
        assert r["sync_bf16_dtype_ok"]
        assert r["sync_bf16_vs_full"] == 0.0
        assert r["copy_into_vs_full"] == 0.0 and r["copy_still_tied"]

    ref = torch.load(out / "ref_step1.pt")
    loaded = AutoModelForCausalLM.from_pretrained(out / "hf")
    assert type(loaded).__name__ == "Qwen2ForCausalLM"
    assert loaded.dtype == torch.float32
    got = loaded.state_dict()
    assert set(got) == set(ref)
    for k in ref:
        assert torch.allclose(got[k], ref[k], atol=1e-6, rtol=0), k


# ---------------------------------------------------------------- no process group needed


class _Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(4, 4)


class _Toy(nn.Module):
    _no_split_modules = ("_Block",)

    def __init__(self, tie_into_block: bool) -> None:
        super().__init__()
        self.blocks = nn.ModuleList([_Block(), _Block()])
        self.head = nn.Linear(4, 4)
        if tie_into_block:
            self.head.weight = self.blocks[1].proj.weight


def test_blocks_are_found_and_ties_across_units_refused(world_tokenizer):
    from conftest import make_tiny_model

    model = make_tiny_model(world_tokenizer)
    assert fsdp.transformer_blocks(model) == list(model.model.layers)
    toy = _Toy(tie_into_block=False)
    assert fsdp.transformer_blocks(toy) == list(toy.blocks)
    with pytest.raises(ValueError, match="tied across units"):
        fsdp.shard_policy(_Toy(tie_into_block=True), compute_dtype=None)


def test_guards_without_process_group(tmp_path, monkeypatch):
    import torch.distributed as td

    monkeypatch.setattr(td, "is_initialized", lambda: False)  # whatever other tests did
    assert fsdp.max_over_ranks(3) == 3
    with pytest.raises(RuntimeError, match=r"torch\.distributed"):
        fsdp.shard_policy(_Toy(tie_into_block=False), compute_dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="compute_dtype"):
        fsdp.shard_policy(_Toy(tie_into_block=False), compute_dtype=torch.int8)
    (tmp_path / "__0_0.distcp").write_bytes(b"partial")  # a crashed save: no .metadata
    with pytest.raises(FileNotFoundError, match="not a complete"):
        fsdp.load_sharded(tmp_path, _Toy(False), torch.optim.AdamW(_Toy(False).parameters()))
