"""Mixed precision trains: float32 master weights with bf16 compute move like a float32 run at the
paper's learning rate, log their update ratio, and resume exactly."""

from __future__ import annotations

import math

import pytest
import torch
from safetensors.torch import load_file

from conftest import write_run_inputs
from llds.policy.precision import Precision, compute_dtype_of, update_ratio
from llds.runs.tracking import read_metrics
from llds.train import trainer as trainer_mod
from llds.train.config import load_config
from llds.train.trainer import GRPOTrainer


def _fixed_advantages(monkeypatch):
    """Nonzero advantages, so the update has a policy-gradient part even when no random rollout
    is correct."""
    monkeypatch.setattr(
        trainer_mod, "group_advantages", lambda r, g, **k: torch.linspace(-1.0, 1.0, len(r))
    )


def _run(cfg_path, run_dir, *overrides, resume=False, steps=None):
    cfg = load_config(cfg_path, [f"run_dir={run_dir}", *overrides])
    tr = GRPOTrainer(cfg, resume=resume)
    rows = tr.train(steps)
    return tr, rows


def test_compute_dtype_resolution(tmp_path):
    assert compute_dtype_of("float32") is None
    assert compute_dtype_of("bfloat16") is torch.bfloat16
    assert compute_dtype_of("float16") is torch.float16
    (tmp_path / "config.json").write_text('{"torch_dtype": "bfloat16"}')
    assert compute_dtype_of("auto", str(tmp_path)) is torch.bfloat16
    (tmp_path / "config.json").write_text('{"dtype": "float32"}')
    assert compute_dtype_of("auto", str(tmp_path)) is None
    assert Precision(torch.float16).grad_scaler() is not None
    assert Precision(torch.bfloat16).grad_scaler() is None


def test_update_ratio_by_hand():
    before = [torch.tensor([3.0, 0.0]), torch.tensor([[4.0]])]
    after = [torch.tensor([3.0, 1.0]), torch.tensor([[4.0 + 1.0]])]
    num, den = update_ratio(before, after)
    assert num == pytest.approx(2.0) and den == pytest.approx(25.0)


@pytest.mark.slow
def test_bf16_at_paper_lr_moves_master_weights_like_fp32(
    tmp_path, small_world, world_tokenizer, monkeypatch
):
    """lr 1e-6, 2 steps x 4 mini-batches: bf16 weights stepped directly would round most of the
    update away; float32 masters with bf16 compute must move like the float32 run."""
    _fixed_advantages(monkeypatch)
    cfg = write_run_inputs(
        tmp_path,
        small_world,
        world_tokenizer,
        steps=2,
        save_every=2,
        prompts_per_step=4,
        optim={"lr": 1e-6, "mini_batches": 4},
    )
    init = load_file(tmp_path / "model" / "model.safetensors")
    moved: dict[str, dict[str, torch.Tensor]] = {}
    ratios = {}
    for dtype in ("float32", "bfloat16"):
        tr, rows = _run(cfg, tmp_path / dtype, f"model.dtype={dtype}")
        assert all(p.dtype == torch.float32 for p in tr.model.parameters())  # masters
        if dtype == "bfloat16":
            assert tr.ref_model is not None
            assert all(p.dtype == torch.bfloat16 for p in tr.ref_model.parameters())
        saved = load_file(tmp_path / dtype / "checkpoints/step_000002/model/model.safetensors")
        assert all(t.dtype == torch.float32 for t in saved.values())  # checkpoint = masters
        moved[dtype] = {k: saved[k] - init[k] for k in init}
        ratios[dtype] = [r["optim/update_ratio"] for r in rows]
        # the logged ratio of the last step is ||delta theta|| / ||theta|| of that step
        assert all(0 < r < 1e-3 for r in ratios[dtype])

    fp32_moved = torch.cat([(d != 0).flatten() for d in moved["float32"].values()])
    bf16_moved = torch.cat([(d != 0).flatten() for d in moved["bfloat16"].values()])
    share = (bf16_moved & fp32_moved).sum() / fp32_moved.sum()
    assert fp32_moved.float().mean() > 0.5
    assert share >= 0.9, f"bf16 run moved only {share:.1%} of the weights the fp32 run moved"
    norm = {k: math.sqrt(sum(float(d.pow(2).sum()) for d in v.values())) for k, v in moved.items()}
    assert 0.5 <= norm["bfloat16"] / norm["float32"] <= 2.0
    flat = {k: torch.cat([d.flatten() for d in v.values()]) for k, v in moved.items()}
    cosine = torch.nn.functional.cosine_similarity(flat["float32"], flat["bfloat16"], dim=0)
    assert cosine > 0.5
    for a, b in zip(ratios["float32"], ratios["bfloat16"], strict=True):
        assert 0.5 <= b / a <= 2.0


@pytest.mark.slow
def test_bf16_resume_reproduces_uninterrupted_run(
    tmp_path, small_world, world_tokenizer, monkeypatch
):
    _fixed_advantages(monkeypatch)
    cfg = write_run_inputs(tmp_path, small_world, world_tokenizer, steps=4, save_every=2)
    dtype = "model.dtype=bfloat16"
    straight, rows = _run(cfg, tmp_path / "straight", dtype)
    _run(cfg, tmp_path / "resumed", dtype, steps=2)
    resumed, more = _run(cfg, tmp_path / "resumed", dtype, resume=True)
    assert [r["step"] for r in more] == [3, 4]
    for a, b in zip(rows[2:], more, strict=True):
        for key in ("reward/mean", "policy/pg_loss", "policy/kl", "optim/update_ratio"):
            assert b[key] == pytest.approx(a[key], rel=1e-6, abs=1e-9), key
    for p, q in zip(straight.model.parameters(), resumed.model.parameters(), strict=True):
        assert torch.equal(p, q)
    logged = [r["step"] for r in read_metrics(tmp_path / "resumed")]
    assert logged == [1, 2, 3, 4]
