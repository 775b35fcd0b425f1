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

from llds import metrics as keys
from llds.algo import LLDSConfig, llds_loss
from llds.errors import ConfigError
from llds.integrations.verl import (
    CONFIG_TARGET,
    LOSS_NAME,
    base_loss_mode,
    check_rollout_correction,
    check_verl_config,
    is_weight_stats,
    llds_settings,
    premb_lld_counts,
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
    # the metric is this micro-batch's penalty over its own tokens / sequences: veRL averages a
    # loss's metrics over micro-batches, so a mini-batch-normalized value would read 1/M of it
    local, _ = llds_loss(new, old, adv, mask, coef=0.3, gate=gate, aggregation=aggregation)
    assert float(local) != pytest.approx(float(penalty.detach()), rel=1e-3)  # the case tells
    assert metrics["actor/llds_loss"] == pytest.approx(float(local.detach()), rel=1e-5)
    assert {"actor/pg_clipfrac", "actor/ppo_kl", "actor/llds_gate_frac"} <= set(metrics)
    assert all(isinstance(v, float) for v in metrics.values())


def test_first_update_zero_is_refused_by_its_key():
    """veRL's loss is not told which optimizer step a micro-batch belongs to: 'computed' is the
    default and the only value; 'zero' is one line naming the key."""
    assert llds_settings(_actor_config()).first_update == "computed"
    with pytest.raises(ConfigError, match=r"^policy_loss\.llds_first_update: 'zero'"):
        llds_settings(_actor_config(llds_first_update="zero"))


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


def _verl_actor_config(extra=None, **overrides):
    """veRL's own actor config, built the way veRL builds it (Hydra compose of its
    ppo_trainer.yaml + omega_conf_to_dataclass), with the recipe's LLDS overrides."""
    from verl.utils.config import omega_conf_to_dataclass

    cfg = _verl_config(extra, **overrides)
    return omega_conf_to_dataclass(cfg.actor_rollout_ref.actor)


def _verl_config(extra=None, **overrides):
    """veRL's whole trainer config (Hydra compose of ppo_trainer.yaml) with the LLDS loss;
    `extra`: more `key=value` overrides."""
    import os

    import verl
    from hydra import compose, initialize_config_dir

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
        *[f"{k}={v}" for k, v in (extra or {}).items()],
    ]
    config_dir = os.path.join(os.path.dirname(verl.__file__), "trainer", "config")
    with initialize_config_dir(config_dir=config_dir, version_base=None):
        return compose(config_name="ppo_trainer", overrides=args)


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


# ------------------------------------------------ what the registered loss measures (issue 37)


def test_premb_counts_by_hand():
    old = torch.zeros(3, 4)
    new = torch.tensor([[-0.1, -0.1, 0.5, 0.5], [0.1, 0.0, 0.0, -0.3], [-1.0, 0.0, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 0, 1], [1, 1, 1, 1], [1, 1, 1, 1]]).bool()
    adv = torch.tensor([1.0, 1.0, -1.0]).unsqueeze(1) * mask  # veRL's token-level advantages
    counts = premb_lld_counts(old, new, mask, adv)
    # row 0: sum +0.3 (rose); first action [0,1] -0.2 fell, later action [3] +0.5 rose.
    # row 1: one action, sum -0.2 (fell). Row 2 has a negative advantage: not counted.
    assert counts == {
        "actor/lld_premb_n_pos": 2.0,
        "actor/lld_premb_n_pos_fell": 1.0,
        "actor/lld_premb_n_pos_fell_first_action": 2.0,
        "actor/lld_premb_n_pos_later_actions": 1.0,
        "actor/lld_premb_n_pos_fell_later_actions": 0.0,
    }
    # a micro-batch without positive responses still gives every key (veRL averages per key)
    none = premb_lld_counts(old, new, mask, -adv.abs())
    assert set(none) == set(counts) and all(v == 0.0 for v in none.values())


def _table_logps(table, ids):
    """log pi(token) for a policy that is one logit table per position: `[B, T]`."""
    logp = torch.log_softmax(table, -1)  # [T, V]
    return logp.gather(-1, ids.T).T


def test_premb_metric_against_the_native_post_update_pass():
    """One tiny step with two mini-batches, each through `verl_llds_policy_loss`, then the native
    post-update pass (`lld_share_metrics` on pi_old vs the policy after every update)."""
    from llds.monitor.likelihood import lld_share_metrics

    torch.manual_seed(0)
    t, v = 4, 5
    table = torch.nn.Parameter(torch.zeros(t, v))
    ids = torch.tensor([[1, 2, 3, 4], [0, 0, 0, 0], [1, 2, 3, 4], [3, 3, 3, 3]])
    mask = torch.ones(4, t, dtype=torch.bool)
    # mini-batch 1 (rows 0, 1) pushes row 0 down; mini-batch 2's positive row 2 is the same
    # response, so the first update lowers it and its own update raises it again
    row_adv = torch.tensor([-1.0, 1.0, 2.0, -1.0])
    adv = row_adv.unsqueeze(1) * mask
    config = _actor_config(llds_coef=0.0)
    config.global_batch_info = {}
    opt = torch.optim.SGD([table], lr=1.0)
    old = _table_logps(table, ids).detach()
    seen = []
    for rows in (slice(0, 2), slice(2, 4)):
        current = _table_logps(table, ids)[rows]
        before = current.detach().clone()  # the policy before this mini-batch's step
        loss, metrics = verl_llds_policy_loss(
            old[rows], current, adv[rows], mask[rows], "token-mean", config, None
        )
        opt.zero_grad()
        loss.backward()
        opt.step()
        seen.append((rows, before, metrics))
    after = _table_logps(table, ids).detach()

    # relation 1: the loss's key is the native metric with "after" = the policy before this
    # mini-batch's step, on its rows (equal when computed on the same tensors)
    for rows, before, metrics in seen:
        same = lld_share_metrics(
            old[rows], before, mask[rows], row_adv[rows], ["0", "1"], torch.zeros(2)
        )
        fell = same.get(keys.SHARE_POS_FELL, 0.0) * same[keys.N_POS]
        assert metrics["actor/lld_premb_n_pos"] == same[keys.N_POS]
        assert metrics["actor/lld_premb_n_pos_fell"] == fell
    first, second = seen[0][2], seen[1][2]
    assert first["actor/lld_premb_n_pos_fell"] == 0.0  # pi == pi_old: nothing moved yet
    assert second["actor/lld_premb_n_pos"] == 1.0
    assert second["actor/lld_premb_n_pos_fell"] == 1.0  # row 2 fell under mini-batch 1's step
    # relation 2: the native post-update pass also includes mini-batch 2's own step, which
    # raised row 2 again: it did not fall there (different numbers on the same responses)
    post = lld_share_metrics(old[2:], after[2:], mask[2:], row_adv[2:], ["0", "1"], torch.zeros(2))
    assert post[keys.N_POS] == 1.0 and post[keys.SHARE_POS_FELL] == 0.0
    assert float((after[2] - old[2]).sum()) > 0 > float((seen[1][1][0] - old[2]).sum())


def test_is_weight_stats_by_hand():
    w = torch.tensor([[0.5, 2.0, 1.0, 0.0], [1.5, 1.5, 1.5, 1.5]])
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0]]).bool()
    wired = is_weight_stats(w, mask, {"rollout_is_threshold": 2.0, "bypass_mode": False})
    # masked tokens: 0.5, 2.0, 1.0, 0.0, 1.5, 1.5 -> mean 6.5 / 6; clipped: 2.0 (cap), 0.0 (masked)
    assert wired["actor/mismatch_is_weight_mean"] == pytest.approx(6.5 / 6)
    assert wired["actor/mismatch_is_clipped_frac"] == pytest.approx(2 / 6)
    icepop = is_weight_stats(w, mask, {"rollout_is_threshold": "0.5_1.5"})
    assert icepop["actor/mismatch_is_clipped_frac"] == pytest.approx(4 / 6)
    unwired = is_weight_stats(w, mask, None)  # the threshold is unknown: only the mean
    assert set(unwired) == {"actor/mismatch_is_weight_mean"}


def test_bypass_mode_is_refused_in_one_line_naming_the_key():
    with pytest.raises(ConfigError, match=r"algorithm\.rollout_correction\.bypass_mode") as err:
        check_rollout_correction({"bypass_mode": True})
    assert "\n" not in str(err.value)
    check_rollout_correction({"bypass_mode": False})  # decoupled mode composes
    check_rollout_correction(None)
    full = {
        "algorithm": {"rollout_correction": {"bypass_mode": True}},
        "actor_rollout_ref": {"actor": {"policy_loss": {"loss_mode": LOSS_NAME}}},
    }
    with pytest.raises(ConfigError, match=r"algorithm\.rollout_correction\.bypass_mode"):
        check_verl_config(full)
    full["actor_rollout_ref"]["actor"]["policy_loss"]["loss_mode"] = "vanilla"
    check_verl_config(full)  # not our loss: not our business


def test_real_verl_decoupled_weights_reach_the_base_loss_like_vanilla():
    pytest.importorskip("verl")
    from verl.trainer.ppo.core_algos import get_policy_loss_fn

    actor = _verl_actor_config(llds_coef=0.3)
    actor.global_batch_info.update(BATCH_INFO)
    old, new, adv, mask = _batch()
    weights = torch.linspace(0.4, 1.8, mask.numel()).reshape(mask.shape)
    vanilla = get_policy_loss_fn("vanilla")

    def both(w):
        theirs, _ = vanilla(
            old_log_prob=old,
            log_prob=new,
            advantages=adv,
            response_mask=mask,
            loss_agg_mode="token-mean",
            config=actor,
            rollout_is_weights=w,
        )
        ours, metrics = verl_llds_policy_loss(
            old_log_prob=old,
            log_prob=new,
            advantages=adv,
            response_mask=mask,
            loss_agg_mode="token-mean",
            config=actor,
            rollout_is_weights=w,
        )
        return theirs, ours, metrics

    v1, o1, m1 = both(None)
    vw, ow, mw = both(weights)
    assert not torch.isclose(vw, v1)  # the weights matter to veRL's own loss
    # the weights change our loss exactly as they change veRL's vanilla loss (LLDS unaffected)
    torch.testing.assert_close(ow - o1, vw - v1, rtol=1e-5, atol=1e-7)
    (g_ours,) = torch.autograd.grad(ow - o1, new)
    (g_theirs,) = torch.autograd.grad(vw - v1, new)
    torch.testing.assert_close(g_ours, g_theirs, rtol=1e-5, atol=1e-7)
    assert "actor/mismatch_is_weight_mean" in mw and "actor/mismatch_is_weight_mean" not in m1
    assert mw["actor/mismatch_is_weight_mean"] == pytest.approx(float(weights[mask].mean()))
    assert mw["actor/lld_premb_n_pos"] == m1["actor/lld_premb_n_pos"] == 1.0


def test_real_verl_bypass_mode_is_refused_when_the_config_is_built():
    pytest.importorskip("verl")
    pl = "actor_rollout_ref.actor.policy_loss"
    wire = {f"+{pl}.rollout_correction": "${algorithm.rollout_correction}"}
    # decoupled mode (veRL's default) builds, and the wired settings reach the loss config
    actor = _verl_actor_config(extra=wire)
    assert actor.policy_loss.rollout_correction["bypass_mode"] is False
    # bypass mode: building the actor config (veRL's validate_config does it first, in the
    # driver, before any worker starts) fails with our line
    with pytest.raises(Exception, match=r"algorithm\.rollout_correction\.bypass_mode=true"):
        _verl_actor_config(extra={**wire, "algorithm.rollout_correction.bypass_mode": "true"})
    # the whole-config check sees it without the wiring
    full = _verl_config(extra={"algorithm.rollout_correction.bypass_mode": "true"})
    with pytest.raises(ConfigError, match=r"algorithm\.rollout_correction\.bypass_mode"):
        check_verl_config(full)


def test_real_verl_bypass_mode_is_refused_without_the_yaml_wiring():
    """veRL's own `apply_bypass_mode` (the driver's switch) rewrites the actor's loss config to
    its bypass loss; with no `rollout_correction: ${algorithm.rollout_correction}` line in the
    YAML, building the LLDS config the workers get still fails with our line."""
    pytest.importorskip("verl")
    from verl.trainer.ppo.rollout_corr_helper import apply_bypass_mode
    from verl.utils.config import omega_conf_to_dataclass

    cfg = _verl_config(extra={"algorithm.rollout_correction.bypass_mode": "true"})
    batch = SimpleNamespace(batch={"rollout_log_probs": torch.zeros(2, 3)})
    apply_bypass_mode(
        batch,
        rollout_corr_config=cfg.algorithm.rollout_correction,
        policy_loss_config=cfg.actor_rollout_ref.actor.policy_loss,
    )
    assert cfg.actor_rollout_ref.actor.policy_loss.loss_mode == "bypass_mode"
    with pytest.raises(Exception, match=r"algorithm\.rollout_correction\.bypass_mode=true"):
        omega_conf_to_dataclass(cfg.actor_rollout_ref.actor)


def test_llds_scope_batch_is_refused_in_verl():
    """veRL's loss sees one micro-batch at a time: the native trainer's scope=batch is refused
    by its veRL key."""
    from llds.config.algo import from_engine

    with pytest.raises(ConfigError, match=r"^policy_loss\.llds_scope: 'batch' needs the rest"):
        from_engine({"llds_scope": "batch"}, where="policy_loss.")
