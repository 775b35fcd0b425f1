"""The LLDS loss inside veRL's own training code, on a CPU (the veRL environment, `make
test-verl`): veRL 0.9's engine-based actor update (`ActorRolloutRefWorker`, FSDP2 on gloo, its
micro-batching, loss aggregation and metric reduction) through `llds.integrations.verl_cpu`;
veRL's trainer for two steps with `llds.integrations.verl_hf_rollout`, both run by
tests/verl_worker.py in their own processes; and the example recipe's YAML loaded by veRL's
own config code."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from llds.algo import llds_loss

pytest.importorskip("verl")  # the veRL environment; the main one skips this file

ROOT = Path(__file__).resolve().parents[1]
WORKER = ROOT / "tests" / "verl_worker.py"
EXAMPLE = ROOT / "examples" / "verl"


def _run_worker(mode: str, out: Path) -> subprocess.CompletedProcess:
    """tests/verl_worker.py MODE OUT in its own process (veRL's platform and process group are
    per process)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "OMP_NUM_THREADS": "1"}
    command = [sys.executable, "-W", "ignore", str(WORKER), mode, str(out)]
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def engine(tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("verl_engine")
    ran = _run_worker("engine", out)
    assert ran.returncode == 0, ran.stderr[-6000:]
    return json.loads((out / "results.json").read_text())


def _tensors(call: dict) -> tuple[torch.Tensor, ...]:
    return tuple(torch.tensor(call[k], dtype=torch.float64) for k in ("old", "new", "adv", "mask"))


def test_llds_at_zero_updates_bitwise_like_vanilla_and_at_0_2_differently(engine):
    assert engine["same_start"]
    assert engine["vanilla_moved"] > 1e-3  # four optimizer steps moved the weights
    assert engine["llds0_vs_vanilla_bitwise"]
    assert engine["llds_vs_vanilla"] > 1e-4


def test_the_loss_runs_inside_verls_mini_and_micro_batches(engine):
    """2 mini-batches x 2 epochs = 4 optimizer steps of 2 micro-batches each; on the first
    step the training forward reproduces veRL's old-log-prob pass exactly on this CPU, so LLDS
    (which acts from the first step under veRL) has nothing to act on there."""
    per_step = engine["calls_per_step"]
    for name in ("vanilla", "llds0", "llds"):
        calls = engine["runs"][name]["calls"]
        assert len(calls) == 4 * per_step
        for call in calls[:per_step]:
            old, new, _, mask = _tensors(call)
            assert torch.equal(old * mask, new * mask)
    later = engine["runs"]["llds"]["calls"][per_step:]
    assert any(not torch.equal(o * m, n * m) for o, n, _, m in map(_tensors, later))


def test_verls_reduction_gives_the_pooled_lld_share_of_every_micro_batch(engine):
    """The share veRL's logged means give (`n_pos_fell / n_pos`) equals the share pooled by
    hand over every call's responses: advantage > 0, summed log-likelihood change < 0."""
    pos = fell = 0
    calls = engine["runs"]["llds"]["calls"]
    for call in calls:
        old, new, adv, mask = _tensors(call)
        row_adv = (adv * mask).sum(-1) / mask.sum(-1).clamp(min=1)
        up = (row_adv > 0) & mask.any(-1)
        pos += int(up.sum())
        fell += int((up & (((new - old) * mask).sum(-1) < 0)).sum())
    assert pos > 0 and fell > 0  # the case has fallen responses
    metrics = engine["runs"]["llds"]["metrics"]
    assert metrics["actor/lld_premb_n_pos"] == pytest.approx(pos / len(calls))
    assert metrics["actor/lld_premb_n_pos_fell"] == pytest.approx(fell / len(calls))
    share = metrics["actor/lld_premb_n_pos_fell"] / metrics["actor/lld_premb_n_pos"]
    assert share == pytest.approx(fell / pos)


def test_llds_metrics_come_out_of_verls_reduction_at_their_value(engine):
    """veRL averages a loss's metrics over micro-batches: the logged LLDS loss is the mean of
    each micro-batch's LLDS over its own tokens (not 1/M of the mini-batch's)."""
    calls = engine["runs"]["llds"]["calls"]
    local = []
    for call in calls:
        old, new, adv, mask = _tensors(call)
        value, _ = llds_loss(
            new, old, adv, mask.bool(), coef=0.2, gate="action", aggregation="token-mean"
        )
        local.append(float(value))
    metrics = engine["runs"]["llds"]["metrics"]
    assert sum(local) > 0
    assert metrics["actor/llds_loss"] == pytest.approx(sum(local) / len(local), rel=1e-5)
    zero = engine["runs"]["llds0"]["metrics"]
    assert zero["actor/llds_loss"] == 0.0 and zero["actor/llds_value"] > 0  # measured, not added
    vanilla = engine["runs"]["vanilla"]["metrics"]
    assert not any(k.startswith(("actor/llds_", "actor/lld_premb_")) for k in vanilla)
    assert "actor/pg_loss" in vanilla and "actor/pg_loss" in metrics


def test_verls_trainer_runs_two_steps_with_the_llds_loss_and_logs_it(tmp_path):
    """veRL's own trainer (Ray, the agent loop, the `hf` rollout server, the actor's update,
    its file logger) for 2 GRPO steps on a CPU: the LLDS loss acts and its metrics reach the
    log, and the server's sampling log-probs agree with the actor's recomputation."""
    ran = _run_worker("trainer", tmp_path)
    log = tmp_path / "metrics.verl.jsonl"
    assert ran.returncode == 0 and log.exists(), ran.stdout[-3000:] + ran.stderr[-3000:]
    records = [json.loads(line) for line in log.read_text().splitlines() if line.strip()]
    assert [r["step"] for r in records] == [1, 2]
    data = [r["data"] for r in records]
    # sampled rollouts: a step may draw groups of equal rewards or open no gate, the run not
    summary = [{k: d.get(k) for k in ("critic/score/mean", "actor/llds_loss")} for d in data]
    assert sum(d["actor/lld_premb_n_pos"] for d in data) > 0, summary
    assert any(d["actor/llds_loss"] > 0 for d in data), summary  # 4 optimizer steps a batch
    assert all(d["training/rollout_probs_diff_max"] < 1e-5 for d in data)


def _example(*overrides: str):
    """The example recipe as veRL's driver reads it (Hydra, veRL's config search path)."""
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=str(EXAMPLE), version_base=None):
        return compose(config_name="search_r1_llds", overrides=list(overrides))


def test_the_example_yaml_loads_through_verls_own_config_code():
    """Every key of the recipe is one veRL 0.9.1 knows (its strict dataclasses reject others);
    building the actor's config registers the loss with its settings; bypass mode is refused
    whether or not the YAML wires `rollout_correction`."""
    from verl.trainer.ppo.core_algos import get_policy_loss_fn
    from verl.utils.config import omega_conf_to_dataclass
    from verl.workers.config import ActorConfig, RolloutConfig

    from llds.integrations.verl import LOSS_NAME, llds_settings, verl_llds_policy_loss

    cfg = _example()
    actor = omega_conf_to_dataclass(cfg.actor_rollout_ref.actor)
    assert isinstance(actor, ActorConfig)
    assert get_policy_loss_fn(LOSS_NAME) is verl_llds_policy_loss
    settings = llds_settings(actor)
    assert (settings.coef, settings.gate, settings.first_update) == (0.2, "action", "computed")
    assert isinstance(omega_conf_to_dataclass(cfg.actor_rollout_ref.rollout), RolloutConfig)
    assert "file" in cfg.trainer.logger  # the log `llds report` reads
    with pytest.raises(Exception, match=r"algorithm\.rollout_correction\.bypass_mode=true"):
        omega_conf_to_dataclass(
            _example("algorithm.rollout_correction.bypass_mode=true").actor_rollout_ref.actor
        )
    unwired = _example("~actor_rollout_ref.actor.policy_loss.rollout_correction")
    unwired.actor_rollout_ref.actor.policy_loss.loss_mode = "bypass_mode"  # apply_bypass_mode
    with pytest.raises(Exception, match=r"bypass_mode=true is refused"):
        omega_conf_to_dataclass(unwired.actor_rollout_ref.actor)
    first_zero = _example("+actor_rollout_ref.actor.policy_loss.llds_first_update=zero")
    with pytest.raises(Exception, match=r"policy_loss\.llds_first_update: 'zero'"):
        omega_conf_to_dataclass(first_zero.actor_rollout_ref.actor)
