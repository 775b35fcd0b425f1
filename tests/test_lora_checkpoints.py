"""A LoRA run's state travels: its checkpoint is the adapter, its AdamW state, the RNG and the
step (no merged weights); a fresh run folder holding only that checkpoint, with the base model at
the same path, resumes and trains on bit for bit; a rollback, `llds eval` and `llds export` load
base + adapter, and a base other than the one trained on is refused in one line."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import LlamaConfig, LlamaForCausalLM

from conftest import make_tiny_model, write_run_inputs
from llds.cli import main
from llds.errors import UserInputError
from llds.models.hf import load_policy
from llds.models.tiny import save_tiny
from llds.policy.config import ModelConfig
from llds.policy.lora import (
    ADAPTER_DIR,
    ADAPTER_WEIGHTS,
    BASE_FILE,
    attach_lora,
    base_fingerprint,
    merged,
)
from llds.policy.setup import load_model
from llds.train.checkpoint import OPTIM, TRAINER_STATE, load_training_state
from llds.train.config import load_config
from llds.train.trainer import GRPOTrainer

TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
LORA = [
    "model.lora.r=4",
    "model.lora.alpha=8",
    f"model.lora.target_modules=[{','.join(TARGETS)}]",
    "algo.llds.enabled=true",
    "algo.llds.coef=0.2",
    "steps=4",
    "save_every=2",
]
MIB = 1 << 20
SMOLLM2 = LlamaConfig(
    hidden_size=576,
    intermediate_size=1536,
    num_hidden_layers=30,
    num_attention_heads=9,
    num_key_value_heads=3,
    vocab_size=49152,
    tie_word_embeddings=True,
)
"""SmolLM2-135M-Instruct's shape, as the header of the packaged GGUF states it
(llama.embedding_length 576, feed_forward_length 1536, block_count 30, attention.head_count 9,
head_count_kv 3, vocab_size 49,152): no weights are needed to size its adapter"""
PER_TENSOR = 2048
"""bytes a checkpoint spends per adapter tensor besides its values (its safetensors header
entry, the pickled AdamW state's keys and step), at most"""
FIXED = 64 * 1024
"""bytes of the rest, at most: trainer state with the config, RNG streams, adapter config and
the records (the tiny run's checkpoint, 28 adapter tensors, spends 51 KB on both together)"""
CLOCK = ("time/", "throughput/")
"""metric keys that measure the machine's speed, not what was trained"""


@pytest.fixture(scope="module")
def inputs(tmp_path_factory, small_world, world_tokenizer) -> Path:
    """A world, a tiny base model on disk (`model/`) and a train config naming both."""
    root = tmp_path_factory.mktemp("lora_inputs")
    write_run_inputs(root, small_world, world_tokenizer)
    return root


def trainer(inputs: Path, run_dir: Path, *extra: str, resume: bool = True) -> GRPOTrainer:
    """A LoRA trainer whose base is loaded from `inputs/model` (the config's model.path)."""
    cfg = load_config(inputs / "cfg.yaml", [*LORA, f"run_dir={run_dir}", *extra])
    return GRPOTrainer(cfg, resume=resume)


def adapters(model) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in model.named_parameters() if "lora_" in n}


def trained(rows: list[dict]) -> list[dict]:
    """Metric rows without the clock's readings."""
    return [{k: v for k, v in r.items() if not k.startswith(CLOCK)} for r in rows]


def metric_rows(run_dir: Path) -> list[dict]:
    lines = (run_dir / "metrics.jsonl").read_text(encoding="utf-8").splitlines()
    return trained([json.loads(line) for line in lines])


def lora_parameter_count(config, r: int, targets: list[str]) -> int:
    """Adapter parameters from a Llama-style config alone: each adapted linear map of shape
    (out, in) adds A (r x in) and B (out x r)."""
    hidden, inter = config.hidden_size, config.intermediate_size
    head_dim = getattr(config, "head_dim", None) or hidden // config.num_attention_heads
    q_out = config.num_attention_heads * head_dim
    kv_out = config.num_key_value_heads * head_dim
    shapes = {
        "q_proj": (hidden, q_out),
        "k_proj": (hidden, kv_out),
        "v_proj": (hidden, kv_out),
        "o_proj": (q_out, hidden),
        "gate_proj": (hidden, inter),
        "up_proj": (hidden, inter),
        "down_proj": (inter, hidden),
    }
    per_layer = sum(r * (shapes[t][0] + shapes[t][1]) for t in targets)
    return config.num_hidden_layers * per_layer


def test_a_lora_run_resumed_in_a_fresh_folder_trains_on_bit_identically(inputs, tmp_path):
    whole = trainer(inputs, tmp_path / "whole")
    whole.train()
    want_rows = metric_rows(tmp_path / "whole")
    assert [r["step"] for r in want_rows] == [1, 2, 3, 4]

    first = trainer(inputs, tmp_path / "first")
    first.train(steps=2)
    assert trained(metric_rows(tmp_path / "first")) == want_rows[:2]
    # a new machine: a fresh folder that holds only the step-2 checkpoint
    fresh = tmp_path / "fresh"
    ckpt = tmp_path / "first" / "checkpoints" / "step_000002"
    shutil.copytree(ckpt, fresh / "checkpoints" / ckpt.name)
    del first
    again = trainer(inputs, fresh)
    assert again.step == 2
    again.train()
    runs = (fresh, tmp_path / "whole")
    assert metric_rows(fresh) == want_rows[2:]
    got, want = adapters(again.model), adapters(whole.model)
    assert got.keys() == want.keys() and len(got) == 2 * 7 * 2  # 2 layers x 7 maps x (A, B)
    for name in want:
        assert torch.equal(got[name], want[name]), name
    # and the final checkpoints hold the same adapter, byte for byte
    final = [d / "checkpoints" / "step_000004" / ADAPTER_DIR / ADAPTER_WEIGHTS for d in runs]
    assert final[0].read_bytes() == final[1].read_bytes()


def test_the_checkpoint_is_the_adapter_its_adamw_state_the_rng_and_the_step(inputs, tmp_path):
    tr = trainer(inputs, tmp_path / "run", "steps=2")
    tr.train()
    ckpt = tmp_path / "run" / "checkpoints" / "step_000002"
    assert not (ckpt / "model").exists()  # no merged weights
    assert sorted(p.name for p in ckpt.iterdir()) == [
        ADAPTER_DIR,
        "manifest.json",
        OPTIM,
        TRAINER_STATE,
    ]
    state, blobs = load_training_state(ckpt)
    assert state["step"] == 2 and {"optimizer", "scheduler", "rng"} <= blobs.keys()
    n = sum(p.numel() for p in tr.model.parameters() if p.requires_grad)
    # the adapter's size from the model's config alone: 2 layers x 7 maps at rank 4
    assert n == lora_parameter_count(tr.model.config, 4, TARGETS)
    moments = blobs["optimizer"]["state"].values()
    assert sum(s["exp_avg"].numel() + s["exp_avg_sq"].numel() for s in moments) == 2 * n
    saved = load_file(str(ckpt / ADAPTER_DIR / ADAPTER_WEIGHTS))
    assert sum(t.numel() for t in saved.values()) == n
    assert all(t.dtype == torch.float32 for t in saved.values())
    # sizes: 4 bytes per adapter value, 8 per value of AdamW state, little else
    files = [p for p in ckpt.rglob("*") if p.is_file()]
    size = {p.relative_to(ckpt).as_posix(): p.stat().st_size for p in files}
    tensors = len(saved)
    assert 4 * n < size[f"{ADAPTER_DIR}/{ADAPTER_WEIGHTS}"] < 4 * n + 256 * tensors + 1024
    assert 8 * n < size[OPTIM] < 8 * n + PER_TENSOR * tensors + FIXED
    assert 12 * n < sum(size.values()) < 12 * n + PER_TENSOR * tensors + FIXED
    # the record of the base: the run's model.path and the base's fingerprint
    record = json.loads((ckpt / ADAPTER_DIR / BASE_FILE).read_text(encoding="utf-8"))
    base, tok = load_policy(inputs / "model")
    assert record == {"path": str(inputs / "model"), **base_fingerprint(base, tok)}
    assert record["parameters"] == sum(p.numel() for p in base.parameters())


def test_smollm2_at_the_presets_rank_travels_in_under_64_mib():
    cfg = load_config("smollm2-wiki-lora").model.lora
    assert cfg is not None
    n = lora_parameter_count(SMOLLM2, cfg.r, cfg.target_modules)
    # by hand at rank 16: per layer 16 x ((576 + 576) x 2 + (576 + 192) x 2 + (576 + 1536) x 3)
    assert cfg.r != 16 or n == 30 * 16 * (1152 * 2 + 768 * 2 + 2112 * 3) == 4_884_480
    tensors = 2 * len(cfg.target_modules) * SMOLLM2.num_hidden_layers
    # float32 adapter values, AdamW's two float32 moments per value, and the bookkeeping
    size = 4 * n + 8 * n + PER_TENSOR * tensors + FIXED
    assert size < 64 * MIB, f"{size / MIB:.1f} MiB"
    assert 55.8 * MIB < size < 57 * MIB  # at rank 16: 55.9 MiB of values
    # peft counts the same, on a model whose weights are never made (the meta device)
    with torch.device("meta"):
        model = attach_lora(LlamaForCausalLM(SMOLLM2), cfg)
    assert sum(p.numel() for p in model.parameters() if p.requires_grad) == n
    assert sum(1 for p in model.parameters() if p.requires_grad) == tensors


def test_a_rollback_restores_the_adapter_and_its_optimizer_state(inputs, tmp_path):
    tr = trainer(inputs, tmp_path / "run")
    tr.train(steps=2)
    at_two = adapters(tr.model)
    moments = {k: v["exp_avg"].clone() for k, v in tr.optimizer.state_dict()["state"].items()}
    tr.train(steps=1)
    assert any(not torch.equal(p, at_two[n]) for n, p in adapters(tr.model).items())
    before = [p for g in tr.optimizer.param_groups for p in g["params"]]
    tr._rollback(2)
    assert tr.step == 2
    for name, value in adapters(tr.model).items():
        assert torch.equal(value, at_two[name]), name
    restored = tr.optimizer.state_dict()["state"]
    assert all(torch.equal(restored[k]["exp_avg"], v) for k, v in moments.items())
    # in place: the optimizer still steps the model's own tensors
    assert [p for g in tr.optimizer.param_groups for p in g["params"]] == before
    model_params = {id(p) for p in tr.model.parameters() if p.requires_grad}
    assert {id(p) for p in before} == model_params


def test_export_writes_the_live_merged_model_and_eval_loads_base_plus_adapter(
    inputs, tmp_path, capsys
):
    tr = trainer(inputs, tmp_path / "run", "steps=2")
    tr.train()
    live = {k: v.detach() for k, v in merged(tr.model).state_dict().items()}
    base, _ = load_policy(inputs / "model")
    assert any(not torch.equal(v, live[k]) for k, v in base.state_dict().items())
    out = tmp_path / "merged"
    assert main(["export", str(tmp_path / "run"), "--out", str(out)]) == 0
    assert "exported" in capsys.readouterr().out
    assert not (out / ADAPTER_DIR).exists() and (out / "llds_protocol.json").is_file()
    exported, tok = load_policy(out)
    got = exported.state_dict()
    assert got.keys() == live.keys()
    for name, value in live.items():
        assert torch.equal(got[name], value), name
    assert len(tok) == len(tr.tokenizer)
    # the checkpoint directory itself exports the same; `out` must be new or empty
    again = tmp_path / "again"
    assert main(["export", str(tmp_path / "run/checkpoints/step_000002"), "--out", str(again)]) == 0
    assert (again / "model.safetensors").read_bytes() == (out / "model.safetensors").read_bytes()
    assert main(["export", str(tmp_path / "run"), "--out", str(out)]) == 0  # its own output
    taken = tmp_path / "taken"
    taken.mkdir()
    (taken / "notes.txt").write_text("mine")
    assert main(["export", str(tmp_path / "run"), "--out", str(taken)]) == 2
    assert "not an earlier output of llds export" in capsys.readouterr().err
    assert [p.name for p in taken.iterdir()] == ["notes.txt"]
    # what `llds eval` loads from a checkpoint: the base + adapter, merged
    ckpt = tmp_path / "run" / "checkpoints" / "step_000002"
    for given in (ckpt, ckpt / ADAPTER_DIR):
        model, _ = load_model(ModelConfig(path=str(given), device="cpu"))
        assert all(torch.equal(v, live[k]) for k, v in model.state_dict().items())
    world = inputs / "world"
    args = ["eval", "--model", str(ckpt), "--data", str(world / "test.jsonl"), "limit=2"]
    assert main([*args, "--retriever", str(world / "corpus.jsonl")]) == 0
    printed = capsys.readouterr().out
    assert f"protocol from {ckpt / ADAPTER_DIR}/llds_protocol.json" in printed
    assert "| **overall** | 2 |" in printed


def test_another_base_is_refused_in_one_line(inputs, tmp_path, world_tokenizer, capsys):
    base = tmp_path / "base"
    shutil.copytree(inputs / "model", base)
    tr = trainer(inputs, tmp_path / "run", "steps=2", f"model.path={base}")
    tr.train()
    ckpt = tmp_path / "run" / "checkpoints" / "step_000002"
    # the same path, other weights: the resume refuses before anything trains
    save_tiny(make_tiny_model(world_tokenizer, seed=5), world_tokenizer, base)
    with pytest.raises(UserInputError) as err:
        trainer(inputs, tmp_path / "run", "steps=4", f"model.path={base}")
    line = str(err.value)
    assert "\n" not in line and f"trained on the base model {str(base)!r}" in line
    assert "but the base loaded now differs" in line
    # `llds eval` too, in one line
    world = inputs / "world"
    args = ["eval", "--model", str(ckpt), "--data", str(world / "test.jsonl")]
    assert main([*args, "--retriever", str(world / "corpus.jsonl")]) == 2
    err_lines = capsys.readouterr().err.strip().splitlines()
    assert len(err_lines) == 1 and "but the base loaded now differs" in err_lines[0]
    # a base that is not there is named in one line, before any work
    shutil.rmtree(base)
    assert main([*args, "--retriever", str(world / "corpus.jsonl")]) == 2
    err_lines = capsys.readouterr().err.strip().splitlines()
    assert len(err_lines) == 1 and str(base) in err_lines[0], err_lines
    assert "its base model cannot be loaded" in err_lines[0]


def test_the_probe_runs_on_a_lora_checkpoint(inputs, tmp_path, capsys):
    """`llds probe` takes a LoRA checkpoint as `llds eval` does: its adapter on the recorded
    base, with the protocol saved beside it (it was refused: a checkpoint has no config.json)."""
    tr = trainer(inputs, tmp_path / "run", "steps=1")
    tr.train()
    ckpt = tmp_path / "run" / "checkpoints" / "step_000001"
    world = inputs / "world"
    args = ["probe", "--model", str(ckpt), "--data", str(world / "test.jsonl"), "limit=2"]
    args += ["--retriever", str(world / "corpus.jsonl"), "--out", str(tmp_path / "probe")]
    assert main([*args, "group_size=2"]) == 0
    printed = capsys.readouterr().out
    assert f"protocol from {ckpt / ADAPTER_DIR}/llds_protocol.json" in printed
    saved = json.loads((tmp_path / "probe" / "probe.json").read_text())
    assert saved["settings"]["limit"] == 2 and saved["settings"]["group_size"] == 2
