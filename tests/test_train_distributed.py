"""Two data-parallel processes (gloo on CPU, launched by torchrun) make the same update as one
process on the same global batch."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from conftest import write_run_inputs
from llds.runs.tracking import read_metrics
from llds.train.checkpoint import MANIFEST, checkpoint_problem


@pytest.mark.slow
def test_two_processes_equal_one(tmp_path, small_world, world_tokenizer):
    cfg = write_run_inputs(
        tmp_path,
        small_world,
        world_tokenizer,
        steps=1,
        save_every=1,
        seed=5,
        prompts_per_step=4,
        # the entropy bonus gives a gradient even when every reward is 0; Adam with a large eps
        # is nearly linear in the gradient, so tiny rounding differences stay tiny
        # LLDS-MA: its answer weight beta must come from the global batch, not each rank's half
        algo={
            "kl_coef": 0.01,
            "entropy_coef": 0.05,
            # a negligible LLDS: its hinge would turn rounding differences into gradient ones
            "llds": {"mask_answer": True, "coef": 1e-9},
        },
        optim={"lr": 0.05, "eps": 1.0, "mini_batches": 2},
    )
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
    train = ["-m", "llds.cli", "train", "--config", str(cfg)]
    subprocess.run(
        [sys.executable, *train, f"run_dir={tmp_path / 'one'}"],
        check=True,
        env=env,
        capture_output=True,
        timeout=600,
    )
    torchrun = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",  # rendezvous on a free local port
        "--nproc_per_node",
        "2",
    ]
    subprocess.run(
        [*torchrun, *train, f"run_dir={tmp_path / 'two'}"],
        check=True,
        env=env,
        capture_output=True,
        timeout=600,
    )

    assert read_metrics(tmp_path / "one")[0]["dist/processes"] == 1
    assert read_metrics(tmp_path / "two")[0]["dist/processes"] == 2
    weights = "checkpoints/step_000001/model/model.safetensors"
    init = load_file(tmp_path / "model" / "model.safetensors")
    one = load_file(tmp_path / "one" / weights)
    two = load_file(tmp_path / "two" / weights)
    moved = max((one[k] - init[k]).abs().max().item() for k in one)
    assert moved > 1e-4  # the step really changed the weights
    for k in one:
        assert torch.allclose(one[k], two[k], atol=1e-6 * max(1.0, moved * 1e3)), k
    m1, m2 = read_metrics(tmp_path / "one")[0], read_metrics(tmp_path / "two")[0]
    for key in (
        "reward/mean",
        "rollout/response_tokens",
        "rollout/context_capped",
        "policy/grad_norm",
        "llds/answer_weight",
        "optim/update_ratio",
    ):
        assert m2[key] == pytest.approx(m1[key], rel=1e-5, abs=1e-7), key


def _torchrun(*args: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node",
        "2",
        *args,
    ]


@pytest.mark.slow
def test_fsdp_trainer_equals_one_process_and_resumes(tmp_path, small_world, world_tokenizer):
    """`fsdp.enabled=true` on 2 processes: the same parameters after a step as 1 unsharded
    process, a checkpoint with per-rank shards plus the full float32 weights, and a resume from
    those shards that reproduces the uninterrupted sharded run."""
    cfg = write_run_inputs(
        tmp_path,
        small_world,
        world_tokenizer,
        steps=2,
        save_every=1,
        seed=5,
        prompts_per_step=4,
        algo={"kl_coef": 0.01, "entropy_coef": 0.05, "llds": {"coef": 1e-9}},
        optim={"lr": 0.05, "eps": 1.0, "mini_batches": 2},
    )
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
    train = ["-m", "llds.cli", "train", "--config", str(cfg)]

    def run(cmd: list[str]) -> None:
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]

    run([sys.executable, *train, f"run_dir={tmp_path / 'one'}"])
    run(_torchrun(*train, f"run_dir={tmp_path / 'fsdp'}", "fsdp.enabled=true"))
    # the same run stopped after step 1, then resumed from the sharded checkpoint
    run(_torchrun(*train, f"run_dir={tmp_path / 'resumed'}", "fsdp.enabled=true", "steps=1"))
    run(_torchrun(*train, f"run_dir={tmp_path / 'resumed'}", "fsdp.enabled=true"))

    step1 = tmp_path / "fsdp" / "checkpoints" / "step_000001"
    assert (step1 / "sharded" / ".metadata").is_file()
    assert len(list((step1 / "sharded").glob("*.distcp"))) == 2  # one shard file per rank
    # the manifest covers every rank's shard, and the checkpoint verifies against it
    listed = json.loads((step1 / MANIFEST).read_text())["files"]
    assert {"sharded/.metadata", "sharded/__0_0.distcp", "sharded/__1_0.distcp"} <= set(listed)
    assert checkpoint_problem(step1) is None
    one1 = load_file(tmp_path / "one/checkpoints/step_000001/model/model.safetensors")
    fsdp1 = load_file(step1 / "model" / "model.safetensors")
    init = load_file(tmp_path / "model" / "model.safetensors")
    assert all(t.dtype == torch.float32 for t in fsdp1.values())
    moved = max((one1[k] - init[k]).abs().max().item() for k in one1)
    assert moved > 1e-4
    for k in one1:
        assert torch.allclose(one1[k], fsdp1[k], atol=1e-6), k
    final = "checkpoints/step_000002/model/model.safetensors"
    straight, resumed = (
        load_file(tmp_path / "fsdp" / final),
        load_file(tmp_path / "resumed" / final),
    )
    for k in straight:
        assert torch.equal(straight[k], resumed[k]), k
    m_one, m_fsdp = read_metrics(tmp_path / "one"), read_metrics(tmp_path / "fsdp")
    assert [r["step"] for r in read_metrics(tmp_path / "resumed")] == [1, 2]
    for key in ("reward/mean", "policy/grad_norm", "optim/update_ratio"):
        assert m_fsdp[0][key] == pytest.approx(m_one[0][key], rel=1e-4), key


def _run_worker(name: str, *args: str) -> None:
    """Run `tests/NAME` on 2 ranks; fails the test with the workers' stderr if they failed."""
    worker = Path(__file__).with_name(name)
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        _torchrun(str(worker), *args), env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]


@pytest.mark.slow
def test_llds_ma_beta_is_computed_over_the_global_batch(tmp_path):
    _run_worker("beta_worker.py", str(tmp_path))
    got = [json.loads((tmp_path / f"beta{r}.json").read_text()) for r in (0, 1)]
    assert [g["world"] for g in got] == [2, 2]
    assert [g["beta"] for g in got] == [1.0, 1.0]  # per rank it would be 1.0 and 0.0


@pytest.mark.slow
def test_from_main_computes_once_and_gives_every_rank_the_answer(tmp_path):
    _run_worker("from_main_worker.py", str(tmp_path))
    got = [json.loads((tmp_path / f"from_main{r}.json").read_text()) for r in (0, 1)]
    assert [g["calls"] for g in got] == [[0], []]  # computed on rank 0 only
    want = {"computed_on": 0, "value": [1, "two", 3.0]}
    assert [g["got"] for g in got] == [want, want]


@pytest.mark.slow
def test_leaving_the_process_group_stops_its_threads(tmp_path):
    # gloo threads left running into interpreter exit can abort a process that already
    # finished (SIGABRT instead of its exit status): closing must stop them, even after a late
    # import of torch.distributed.nn.functional, which binds the group into its defaults
    _run_worker("from_main_worker.py", str(tmp_path))
    for r in (0, 1):
        before, during, after = json.loads((tmp_path / f"from_main{r}.json").read_text())["threads"]
        assert during > before  # the group's threads, so the check below can fail
        assert after == before


@pytest.mark.slow
def test_a_retriever_lost_on_one_rank_stops_every_rank(tmp_path, small_world, world_tokenizer):
    cfg = write_run_inputs(tmp_path, small_world, world_tokenizer, steps=2, prompts_per_step=4)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    # uncoordinated, rank 0 went on into the update and died in its all-reduce with gloo's
    # "Connection closed by peer" once rank 1 had left
    _run_worker("retriever_down_worker.py", str(cfg), str(run_dir))
    got = [json.loads((run_dir / f"outcome{r}.json").read_text()) for r in (0, 1)]
    for g in got:
        assert "did not answer" in g["outcome"] and "during step 1" in g["outcome"], g
    assert not (run_dir / "metrics.jsonl").is_file() or not read_metrics(run_dir)  # no step
