"""LLDS as a veRL policy loss.

The first group runs without veRL: it calls `verl_llds_policy_loss` exactly the way veRL 0.9's
actor loss does (keyword call in `ppo_loss`, verl/workers/utils/losses.py; the vanilla loss it
wraps is `compute_policy_loss_vanilla` in verl/trainer/ppo/core_algos.py) and checks value and
gradient against a hand-written PPO clip loss plus `llds.algo.llds_loss`.
The second group needs the real `verl` package (a separate environment: `make test-verl`): the
loss is registered through veRL's own registry by veRL's own config loading, and veRL's own
`ppo_loss` computes the same numbers.
"""

from __future__ import annotations

import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch

from llds.algo import LLDSConfig, llds_loss
from llds.errors import ConfigError
from llds.integrations.verl import (
    CONFIG_TARGET,
    LOSS_NAME,
    base_loss_mode,
    llds_settings,
    reference_vanilla_loss,
    verl_llds_policy_loss,
)

CLIP_LOW, CLIP_HIGH, CLIP_C = 0.2, 0.28, 3.0
BATCH_INFO = {
    "dp_size": 2,
    "batch_num_tokens": 50,
    "global_batch_size": 8,
    "loss_scale_factor": None,
}


def _batch():
    """A veRL-shaped micro-batch: [B, T] tensors, token-level advantages (the row's scalar on
    its response tokens), tool-response tokens masked out in the middle of rollouts."""
    g = torch.Generator().manual_seed(5)
    b, t = 3, 8
    mask = torch.ones(b, t, dtype=torch.bool)
    mask[0, 3:5] = False  # tool response between two actions
    mask[1, 2:3] = False
    mask[2, 6:] = False  # right padding
    old = -torch.rand(b, t, generator=g) * 3
    delta = (torch.rand(b, t, generator=g) - 0.5) * 1.2  # ratios on both sides of the clip range
    delta[~mask] = -2.0  # masked tokens: big likelihood drop that must not count
    new = (old + delta).requires_grad_(True)
    adv = torch.tensor([1.2, -0.8, 0.0]).unsqueeze(1) * mask
    return old, new, adv, mask


def _hand_ppo(old, new, adv, mask, num_tokens):
    """PPO clip with asymmetric range and dual clip on negative advantages, token-mean."""
    ratio = torch.exp(new - old)
    loss = torch.maximum(-adv * ratio, -adv * torch.clamp(ratio, 1 - CLIP_LOW, 1 + CLIP_HIGH))
    loss = torch.where(adv < 0, torch.minimum(loss, -adv * CLIP_C), loss)
    return torch.where(mask, loss, torch.zeros_like(loss)).sum() / num_tokens


class _ActorConfig(SimpleNamespace):
    """Attribute and `.get` access, like veRL's dataclass configs."""

    def get(self, key, default=None):
        return getattr(self, key, default)


def _actor_config(**llds):
    """The fields veRL's ActorConfig offers the loss (clip ratios, global batch info, and the
    `policy_loss` block with our keys)."""
    return _ActorConfig(
        clip_ratio=0.2,
        clip_ratio_low=CLIP_LOW,
        clip_ratio_high=CLIP_HIGH,
        clip_ratio_c=CLIP_C,
        loss_agg_mode="token-mean",
        global_batch_info=dict(BATCH_INFO),
        loss_scale_factor=None,
        policy_loss={"loss_mode": LOSS_NAME, **llds},
    )


def _expected(old, new, adv, mask, *, coef, gate, aggregation):
    dp = BATCH_INFO["dp_size"]
    base = _hand_ppo(old, new, adv, mask, BATCH_INFO["batch_num_tokens"] / dp)
    extra = (
        {"num_tokens": BATCH_INFO["batch_num_tokens"] / dp}
        if aggregation == "token-mean"
        else {"num_sequences": BATCH_INFO["global_batch_size"] / dp}
    )
    penalty, _ = llds_loss(
        new, old, adv, mask, coef=coef, gate=gate, aggregation=aggregation, **extra
    )
    return base, penalty


@pytest.mark.parametrize(
    ("gate", "aggregation"), [("action", "token-mean"), ("response", "seq-mean-token-mean")]
)
def test_policy_loss_value_and_gradient_match_hand_ppo_plus_llds(gate, aggregation):
    old, new, adv, mask = _batch()
    config = _actor_config(llds_coef=0.3, llds_gate=gate, llds_aggregation=aggregation)
    # the exact keyword call veRL's ppo_loss makes
    loss, metrics = verl_llds_policy_loss(
        old_log_prob=old,
        log_prob=new,
        advantages=adv,
        response_mask=mask,
        loss_agg_mode="token-mean",
        config=config,
        rollout_is_weights=None,
    )
    (grad,) = torch.autograd.grad(loss, new)
    base, penalty = _expected(old, new, adv, mask, coef=0.3, gate=gate, aggregation=aggregation)
    (grad_expected,) = torch.autograd.grad(base + penalty, new)

    assert float(penalty.detach()) > 1e-3  # LLDS is active in this case
    torch.testing.assert_close(loss.detach(), (base + penalty).detach(), rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(grad, grad_expected, rtol=1e-5, atol=1e-7)
    assert torch.all(grad[~mask] == 0)  # tool tokens get no gradient at all
    assert metrics["actor/llds_loss"] == pytest.approx(float(penalty.detach()), rel=1e-5)
    assert {"actor/pg_clipfrac", "actor/ppo_kl", "actor/llds_gate_frac"} <= set(metrics)
    assert all(isinstance(v, float) for v in metrics.values())


def test_coef_zero_is_the_base_loss():
    old, new, adv, mask = _batch()
    loss, _ = verl_llds_policy_loss(
        old, new, adv, mask, "token-mean", _actor_config(llds_coef=0.0), None
    )
    base, _ = _expected(old, new, adv, mask, coef=0.0, gate="action", aggregation="token-mean")
    torch.testing.assert_close(loss.detach(), base.detach(), rtol=1e-6, atol=1e-8)


def test_reference_vanilla_matches_hand_ppo_without_batch_info():
    old, new, adv, mask = _batch()
    config = _actor_config()
    config.global_batch_info = {}
    loss, metrics = reference_vanilla_loss(old, new.detach(), adv, mask, "token-mean", config)
    expected = _hand_ppo(old, new.detach(), adv, mask, mask.sum())
    torch.testing.assert_close(loss, expected, rtol=1e-6, atol=1e-8)
    ratio = torch.exp(new.detach() - old)
    clipped = ((adv > 0) & (ratio > 1 + CLIP_HIGH)) | ((adv < 0) & (ratio < 1 - CLIP_LOW))
    assert metrics["actor/pg_clipfrac"] == pytest.approx(float(clipped[mask].float().mean()))


def test_settings_defaults_and_validation():
    config = SimpleNamespace(policy_loss={"loss_mode": "llds"})
    s = llds_settings(config)
    assert (s.coef, s.gate, s.aggregation, base_loss_mode(config)) == (
        0.2,
        "action",
        "token-mean",
        "vanilla",
    )
    assert type(s) is LLDSConfig  # the one definition, not an adapter copy
    with pytest.raises(ConfigError, match=r"policy_loss\.llds_gate"):
        llds_settings({"policy_loss": {"llds_gate": "sentence"}})
    with pytest.raises(ConfigError, match=r"policy_loss\.llds_base_loss_mode"):
        base_loss_mode({"policy_loss": {"llds_base_loss_mode": LOSS_NAME}})
    with pytest.raises(ConfigError, match=r"policy_loss\.llds_coef"):
        llds_settings({"policy_loss": {"llds_coef": -1}})


def test_module_imports_without_verl_or_trl():
    code = (
        "import sys, llds.integrations, llds.integrations.verl; "
        "assert 'verl' not in sys.modules and 'trl' not in sys.modules, sorted(sys.modules)"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


# ------------------------------------------------------------------ against the real veRL


def _verl_actor_config(**overrides):
    """veRL's own actor config, built the way veRL builds it (Hydra compose of its
    ppo_trainer.yaml + omega_conf_to_dataclass), with the recipe's LLDS overrides."""
    import os

    import verl
    from hydra import compose, initialize_config_dir
    from verl.utils.config import omega_conf_to_dataclass

    pl = "actor_rollout_ref.actor.policy_loss"
    args = [
        f"{pl}._target_={CONFIG_TARGET}",
        f"{pl}.loss_mode={LOSS_NAME}",
        *[f"+{pl}.{k}={v}" for k, v in overrides.items()],
        "actor_rollout_ref.actor.strategy=fsdp",
        "actor_rollout_ref.actor.rollout_n=5",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
        f"actor_rollout_ref.actor.clip_ratio_low={CLIP_LOW}",
        f"actor_rollout_ref.actor.clip_ratio_high={CLIP_HIGH}",
        f"actor_rollout_ref.actor.clip_ratio_c={CLIP_C}",
    ]
    config_dir = os.path.join(os.path.dirname(verl.__file__), "trainer", "config")
    with initialize_config_dir(config_dir=config_dir, version_base=None):
        cfg = compose(config_name="ppo_trainer", overrides=args)
    return omega_conf_to_dataclass(cfg.actor_rollout_ref.actor)


def test_real_verl_config_registers_the_loss():
    pytest.importorskip("verl")  # separate environment, see `make test-verl`
    from verl.trainer.ppo.core_algos import get_policy_loss_fn

    actor = _verl_actor_config(llds_coef=0.3, llds_gate="response")
    assert type(actor.policy_loss).__name__ == "LLDSPolicyLossConfig"
    assert get_policy_loss_fn(LOSS_NAME) is verl_llds_policy_loss
    s = llds_settings(actor)
    assert (s.coef, s.gate) == (0.3, "response")


def test_real_verl_vanilla_equals_reference_vanilla():
    pytest.importorskip("verl")
    from verl.trainer.ppo.core_algos import get_policy_loss_fn

    actor = _verl_actor_config()
    actor.global_batch_info.update(BATCH_INFO)
    old, new, adv, mask = _batch()
    theirs, their_metrics = get_policy_loss_fn("vanilla")(
        old_log_prob=old,
        log_prob=new.detach(),
        advantages=adv,
        response_mask=mask,
        loss_agg_mode="token-mean",
        config=actor,
        rollout_is_weights=None,
    )
    ours, our_metrics = reference_vanilla_loss(old, new.detach(), adv, mask, "token-mean", actor)
    torch.testing.assert_close(ours, theirs, rtol=1e-6, atol=1e-8)
    for key in ("actor/pg_clipfrac", "actor/ppo_kl"):
        assert our_metrics[key] == pytest.approx(their_metrics[key], rel=1e-5, abs=1e-7)


def test_real_verl_ppo_loss_adds_llds():
    pytest.importorskip("verl")
    from tensordict import TensorDict
    from verl.utils import tensordict_utils as tu
    from verl.workers.utils.losses import ppo_loss

    actor = _verl_actor_config(llds_coef=0.3, llds_aggregation="token-mean")
    old, new, adv, mask = _batch()
    b, t = mask.shape
    prompt_len = 4
    # veRL's packed layout: each sequence's prompt then its response, log-probs shifted by one
    prompts = torch.ones(b, prompt_len, dtype=torch.long)
    responses = torch.ones(b, t, dtype=torch.long)
    attention = torch.ones(b, prompt_len + t, dtype=torch.long)
    resp_len = torch.tensor([t, t, 6])
    attention[2, prompt_len + 6 :] = 0
    flat = torch.zeros(int(attention.sum()))
    offset = 0
    for i in range(b):
        n = prompt_len + int(resp_len[i])
        flat[offset + prompt_len - 1 : offset + n - 1] = new.detach()[i, : resp_len[i]]
        offset += n
    flat.requires_grad_(True)
    data = TensorDict(
        {
            "prompts": prompts,
            "responses": responses,
            "attention_mask": attention,
            "response_mask": mask.long(),
            "old_log_probs": old,
            "advantages": adv,
        },
        batch_size=[b],
    )
    tu.assign_non_tensor(
        data,
        dp_size=BATCH_INFO["dp_size"],
        batch_num_tokens=BATCH_INFO["batch_num_tokens"],
        global_batch_size=BATCH_INFO["global_batch_size"],
    )
    loss, metrics = ppo_loss(actor, {"log_probs": flat}, data)
    (grad,) = torch.autograd.grad(loss, flat)

    base, penalty = _expected(
        old, new, adv, mask, coef=0.3, gate="action", aggregation="token-mean"
    )
    (grad_expected,) = torch.autograd.grad(base + penalty, new)
    torch.testing.assert_close(loss.detach(), (base + penalty).detach(), rtol=1e-5, atol=1e-7)
    offset = 0
    for i in range(b):  # the packed gradient, unpacked, is the [B, T] gradient
        n = prompt_len + int(resp_len[i])
        got = grad[offset + prompt_len - 1 : offset + n - 1]
        torch.testing.assert_close(got, grad_expected[i, : resp_len[i]], rtol=1e-5, atol=1e-7)
        offset += n
    assert "actor/llds_loss" in metrics
