"""LLDS as a veRL policy loss (veRL >= 0.9), registered through veRL's own registry.

The registered loss (default name ``"llds"``) is the base policy loss that veRL would use anyway
(its registered ``"vanilla"`` PPO clip loss unless configured otherwise) plus
`llds_coef * L_LLDS`, computed on veRL's `response_mask`. veRL's multi-turn agent loop sets the
mask to 0 on tool-response tokens, so observations are excluded and the action gate sees the
model's actions as maximal runs of mask = 1.

Configuration lives in the actor's `policy_loss` block. veRL builds that block into a strict
dataclass, so the LLDS keys need our subclass as its `_target_`:

    actor_rollout_ref.actor.policy_loss._target_=llds.integrations.verl.LLDSPolicyLossConfig
    actor_rollout_ref.actor.policy_loss.loss_mode=llds
    +actor_rollout_ref.actor.policy_loss.llds_coef=0.2
    +actor_rollout_ref.actor.policy_loss.llds_gate=action
    +actor_rollout_ref.actor.policy_loss.llds_aggregation=token-mean
    +actor_rollout_ref.actor.policy_loss.llds_base_loss_mode=vanilla

Every field of `llds.algo.LLDSConfig` is a key `llds_<field>` (generated from that one
definition, with its default and help; `llds_aggregation` defaults to `token-mean` here, see
`VERL_DEFAULTS`), plus `llds_base_loss_mode`. Building that config (veRL does it in every actor
worker) validates the keys and registers the loss, so no plugin or extra import is needed.
Elsewhere, call `register()` once.

Besides veRL's own metrics, the loss returns the monitor's (docs/integrations.md): the counts of
the LLD share measured before this mini-batch's own update against pi_old
(`actor/lld_premb_n_pos`, `actor/lld_premb_n_pos_fell`, ...; their ratio is the share, pooled
correctly by veRL's averaging) and, with veRL's decoupled rollout correction, the importance
weights' `actor/mismatch_is_weight_mean` / `actor/mismatch_is_clipped_frac`. veRL's bypass mode
replaces this loss, so it is refused when the recipe wires
`actor_rollout_ref.actor.policy_loss.rollout_correction: ${algorithm.rollout_correction}` (or
the recipe calls `check_verl_config(config)`).

This module imports veRL only inside `register()` / `LLDSPolicyLossConfig`; the pure function
`verl_llds_policy_loss` runs without veRL (then with the project's own PPO clip loss, which has
the same semantics as veRL's vanilla loss).
"""

from __future__ import annotations

import dataclasses
import importlib
import sys
from collections.abc import Callable, Mapping
from typing import Any

from torch import Tensor

from llds import metrics as keys
from llds.algo import LLDSConfig, llds_term, policy_loss
from llds.config.algo import engine_fields, from_engine
from llds.errors import ConfigError
from llds.monitor.framework_logs import VERL_NAMES, LoggedMonitor
from llds.monitor.likelihood import lld_share_metrics
from llds.monitor.mismatch import correction_metrics
from llds.monitor.replay import load_monitor_config

LOSS_NAME = "llds"
CONFIG_TARGET = "llds.integrations.verl.LLDSPolicyLossConfig"


VERL_DEFAULTS: dict[str, Any] = {"aggregation": "token-mean", "first_update": "computed"}
"""Where this adapter's defaults differ from `LLDSConfig`'s. `aggregation` defaults to
``token-mean``: the authors' implementation (itself on veRL) and exact under veRL's global-batch
normalization. ``seq-mean-token-mean`` (the paper's Eq. 4) is exact within one micro-batch; with
veRL's global batch info its denominator becomes the number of sequences of the mini-batch (veRL
does not expose the global number of non-negative-advantage sequences), which rescales the
penalty by |Y_pre| / |Y|. `first_update` is ``computed``, the only value veRL allows: its loss
is not told which optimizer step of the batch a micro-batch belongs to (`FIRST_UPDATE_REFUSAL`)."""
FIRST_UPDATE_REFUSAL = (
    "llds_first_update: 'zero' needs to know which optimizer step of the rollout batch a "
    "micro-batch belongs to, and veRL's policy loss is not told; under veRL LLDS acts from the "
    "first step on (d there is what separates veRL's old-log-prob pass from its training pass, "
    "exactly 0 where the two compute the same numbers); use 'computed'"
)
BASE_LOSS_KEY = "llds_base_loss_mode"
DEFAULT_BASE_LOSS = "vanilla"

BYPASS_KEY = "algorithm.rollout_correction.bypass_mode"
BYPASS_LOSS = "bypass_mode"
"""the loss veRL's bypass mode swaps into `policy_loss.loss_mode`"""
BYPASS_REFUSAL = (
    f"{BYPASS_KEY}=true is refused with loss_mode=llds: veRL's bypass mode replaces "
    "policy_loss.loss_mode with its own 'bypass_mode' loss, which would silently drop LLDS; "
    f"set {BYPASS_KEY}=false (decoupled mode: its importance weights reach the LLDS loss)"
)

PREMB = "actor/lld_premb_"
"""Prefix of the LLD counts the registered loss measures: `log_prob` (the policy before this
mini-batch's optimizer step, after the earlier ones) against `old_log_prob` (pi_old), on this
micro-batch's responses. Not the native post-update pass; see docs/integrations.md."""
PREMB_FELL = {  # the monitor's share -> the count of fallen responses behind it
    keys.SHARE_POS_FELL: "n_pos_fell",
    keys.SHARE_POS_FELL_FIRST_ACTION: "n_pos_fell_first_action",
    keys.SHARE_POS_FELL_LATER_ACTIONS: "n_pos_fell_later_actions",
}
PREMB_COUNTS = {keys.N_POS: "n_pos", keys.N_POS_LATER_ACTIONS: "n_pos_later_actions"}


def _get(obj: Any, key: str, default: Any = None) -> Any:
    """Read `key` from a dataclass config, an OmegaConf node or a plain dict."""
    if obj is None:
        return default
    value = obj.get(key, default) if isinstance(obj, Mapping) else getattr(obj, key, default)
    return default if value is None else value


def llds_settings(config: Any) -> LLDSConfig:
    """The LLDS settings of an actor config (`config.policy_loss.llds_*`), validated by
    `LLDSConfig`; a bad value is one line naming `policy_loss.llds_<field>`."""
    settings = from_engine(_get(config, "policy_loss", {}), where="policy_loss.", **VERL_DEFAULTS)
    if settings.first_update != "computed":
        raise ConfigError("policy_loss." + FIRST_UPDATE_REFUSAL)
    return settings


def base_loss_mode(config: Any) -> str:
    """The registered veRL loss that LLDS is added to (`policy_loss.llds_base_loss_mode`)."""
    mode = str(_get(_get(config, "policy_loss"), BASE_LOSS_KEY, DEFAULT_BASE_LOSS))
    if mode == LOSS_NAME:
        raise ConfigError(
            f"policy_loss.{BASE_LOSS_KEY} cannot be {LOSS_NAME!r} itself (use 'vanilla')"
        )
    return mode


def check_rollout_correction(rollout_correction: Any) -> None:
    """Refuse veRL's bypass mode (`rollout_correction.bypass_mode`), which would replace the LLDS
    loss; decoupled mode (the default) composes and passes."""
    if bool(_get(rollout_correction, "bypass_mode", False)):
        raise ConfigError(BYPASS_REFUSAL)


def check_verl_config(config: Any) -> None:
    """Check a whole veRL trainer config (the driver's Hydra config): when the actor's loss is
    LLDS, `algorithm.rollout_correction.bypass_mode` must be off. For entry points of your own;
    `LLDSPolicyLossConfig` runs the same check when its `rollout_correction` is wired."""
    actor = _get(_get(config, "actor_rollout_ref"), "actor")
    if str(_get(_get(actor, "policy_loss"), "loss_mode", "")) != LOSS_NAME:
        return
    check_rollout_correction(_get(_get(config, "algorithm"), "rollout_correction"))


def premb_lld_counts(
    old_log_prob: Tensor, log_prob: Tensor, response_mask: Tensor, advantages: Tensor
) -> dict[str, float]:
    """The monitor's LLD counts on what a registered loss sees, as `actor/lld_premb_*`.

    Every key is present on every call (veRL averages each key over micro-batches and ranks and
    needs the same keys everywhere), and they are counts, so that the pooled share of a step is
    a ratio of two logged means: `n_pos_fell / n_pos` (a per-micro-batch share would be
    undefined where a micro-batch has no positive response). Group accuracy is not visible to
    the loss, so the `acc_lo` / `acc_hi` split is absent."""
    adv = advantages.reshape(advantages.shape[0], -1)
    adv = adv.masked_fill(~response_mask.bool(), 0).sum(-1) / response_mask.sum(-1).clamp(min=1)
    rows = adv.shape[0]
    shares = lld_share_metrics(
        old_log_prob.detach(),
        log_prob.detach(),
        response_mask,
        adv,
        [str(i) for i in range(rows)],  # groups are not visible; the accuracy split is dropped
        adv.new_zeros(rows),
    )
    out = {PREMB + name: float(shares[key]) for key, name in PREMB_COUNTS.items()}
    for share, name in PREMB_FELL.items():
        n = out[PREMB + PREMB_COUNTS[keys.SHARE_COUNTS[share]]]
        out[PREMB + name] = float(round(shares.get(share, 0.0) * n))
    return out


def is_weight_stats(
    weights: Tensor, response_mask: Tensor, rollout_correction: Any = None
) -> dict[str, float]:
    """The monitor's correction metrics on veRL's `rollout_is_weights`, as `actor/mismatch_*`.

    The loss sees the weights after veRL's truncation or masking; a token counts as clipped when
    its weight is 0 (masked) or at the upper threshold, which is known only when the actor's
    `policy_loss.rollout_correction` is wired to `algorithm.rollout_correction` (otherwise only
    the mean weight is given)."""
    threshold = _get(rollout_correction, "rollout_is_threshold")
    # unwired, it is veRL's default dataclass instance; wired, the algorithm's mapping
    wired = threshold is not None and not dataclasses.is_dataclass(rollout_correction)
    clipped = weights <= 0
    if wired:
        upper = float(str(threshold).split("_")[-1])
        clipped = clipped | (weights >= upper * (1 - 1e-6))
    stats = correction_metrics(weights.detach(), clipped, response_mask)
    out = {"actor/" + k.replace("/", "_"): v for k, v in stats.items()}
    if not wired:
        out.pop("actor/" + keys.MISMATCH_IS_CLIPPED_FRAC.replace("/", "_"), None)
    return out


def _batch_info(config: Any) -> dict[str, Any]:
    info = _get(config, "global_batch_info", {}) or {}
    return dict(info) if isinstance(info, Mapping) else {}


def _llds_denominators(
    info: Mapping[str, Any], aggregation: str
) -> tuple[float | None, float | None]:
    """(num_sequences, num_tokens) per data-parallel rank, so that veRL's sum over micro-batches
    and mean over ranks gives the global-batch value (the same convention as veRL's agg_loss)."""
    dp = float(info.get("dp_size") or 1)
    if aggregation == "token-mean" and info.get("batch_num_tokens") is not None:
        return None, float(info["batch_num_tokens"]) / dp
    if aggregation == "seq-mean-token-mean" and info.get("global_batch_size") is not None:
        return float(info["global_batch_size"]) / dp, None
    return None, None


def _verl_loss_fn(name: str) -> Callable[..., tuple[Tensor, dict[str, Any]]] | None:
    """veRL's registered policy loss `name`, or None when veRL is not installed."""
    try:
        core_algos = importlib.import_module("verl.trainer.ppo.core_algos")
    except ImportError:
        return None
    return core_algos.get_policy_loss_fn(name)


def reference_vanilla_loss(
    old_log_prob: Tensor,
    log_prob: Tensor,
    advantages: Tensor,
    response_mask: Tensor,
    loss_agg_mode: str = "token-mean",
    config: Any = None,
    rollout_is_weights: Tensor | None = None,
) -> tuple[Tensor, dict[str, Any]]:
    """veRL's vanilla PPO semantics on the project's `policy_loss` (used when veRL is absent):
    clip range `clip_ratio[_low|_high]`, dual clip `clip_ratio_c` (default 3) on negative
    advantages, aggregation `loss_agg_mode` normalized by veRL's `global_batch_info`."""
    if rollout_is_weights is not None:
        raise ConfigError("rollout_is_weights needs veRL's own vanilla loss (install veRL)")
    clip = float(_get(config, "clip_ratio", 0.2))
    info = _batch_info(config)
    dp = float(info.get("dp_size") or 1)
    num_tokens = num_sequences = None
    if info.get("batch_num_tokens") is not None:
        num_tokens = float(info["batch_num_tokens"]) / dp
    if info.get("global_batch_size") is not None:
        num_sequences = float(info["global_batch_size"]) / dp
    scale = info.get("loss_scale_factor")
    loss, stats = policy_loss(
        log_prob,
        old_log_prob,
        advantages,
        response_mask,
        clip_low=float(_get(config, "clip_ratio_low", clip)),
        clip_high=float(_get(config, "clip_ratio_high", clip)),
        dual_clip=float(_get(config, "clip_ratio_c", 3.0)),
        aggregation=loss_agg_mode,
        num_tokens=num_tokens,
        num_sequences=num_sequences,
        norm_length=None if scale is None else float(scale),
    )
    metrics = {
        "actor/ppo_kl": float(stats["approx_kl"]),
        "actor/pg_clipfrac": float(stats["clip_frac_low"] + stats["clip_frac_high"]),
    }
    return loss, metrics


def verl_llds_policy_loss(
    old_log_prob: Tensor,
    log_prob: Tensor,
    advantages: Tensor,
    response_mask: Tensor,
    loss_agg_mode: str = "token-mean",
    config: Any = None,
    rollout_is_weights: Tensor | None = None,
) -> tuple[Tensor, dict[str, Any]]:
    """A veRL policy loss: the base loss (veRL's registered `llds_base_loss_mode`, default
    ``vanilla``) plus the objective's LLDS term (`llds_term`) on `response_mask`.

    Same signature and return convention as veRL's registered losses: tensors are
    `[batch, response_length]`, `config` is the actor config, and the result is
    `(loss, {metric_name: float})`. LLDS uses `old_log_prob` as pi_old: veRL recomputes it with
    the actor before the first update of each batch (`d = 0` on the first mini-batch, so LLDS
    acts when `ppo_mini_batch_size < train_batch_size` or `ppo_epochs > 1`).
    """
    settings = llds_settings(config)
    base_mode = base_loss_mode(config)
    base = _verl_loss_fn(base_mode)
    if base is None:
        if base_mode != DEFAULT_BASE_LOSS:
            raise ConfigError(f"policy_loss.{BASE_LOSS_KEY}={base_mode!r} needs veRL installed")
        base = reference_vanilla_loss
    pg_loss, metrics = base(
        old_log_prob=old_log_prob,
        log_prob=log_prob,
        advantages=advantages,
        response_mask=response_mask,
        loss_agg_mode=loss_agg_mode,
        config=config,
        rollout_is_weights=rollout_is_weights,
    )
    num_sequences, num_tokens = _llds_denominators(_batch_info(config), settings.aggregation)
    penalty, stats = llds_term(
        log_prob,
        old_log_prob,
        advantages,
        response_mask,
        settings,
        num_sequences=num_sequences,
        num_tokens=num_tokens,
    )
    if num_sequences is not None or num_tokens is not None:
        # veRL averages a loss's metrics over micro-batches (`Metric.from_dict(..., MEAN)` in
        # `ppo_loss`), assuming each is normalized over its own micro-batch, as its clip
        # fractions are; the term above is normalized over the mini-batch, so its statistics
        # are taken over this micro-batch alone (else the log reads 1/M of the value).
        _, stats = llds_term(log_prob.detach(), old_log_prob, advantages, response_mask, settings)
    out = dict(metrics)
    for key, value in stats.items():  # llds/gate_frac -> actor/llds_gate_frac
        out["actor/llds_" + key.removeprefix("llds/")] = float(value)
    out.update(premb_lld_counts(old_log_prob, log_prob, response_mask, advantages))
    if rollout_is_weights is not None:
        rollout_correction = _get(_get(config, "policy_loss"), "rollout_correction")
        out.update(is_weight_stats(rollout_is_weights, response_mask, rollout_correction))
    return pg_loss + penalty, out


def register(name: str = LOSS_NAME) -> Callable[..., tuple[Tensor, dict[str, Any]]]:
    """Register `verl_llds_policy_loss` in veRL's policy-loss registry under `name`.

    Idempotent. Raises `ConfigError` when veRL is not installed.
    """
    try:
        core_algos = importlib.import_module("verl.trainer.ppo.core_algos")
    except ImportError as exc:
        message = f"registering the LLDS loss needs veRL (pip install verl): {exc}"
        raise ConfigError(message) from None
    registry = getattr(core_algos, "POLICY_LOSS_REGISTRY", {})
    if registry.get(name) is not verl_llds_policy_loss:
        core_algos.register_policy_loss(name)(verl_llds_policy_loss)
    return verl_llds_policy_loss


_CONFIG_CLASS: type | None = None


def _policy_loss_config_class() -> type:
    """veRL's `PolicyLossConfig` plus the `llds_*` keys; building one registers the loss."""
    global _CONFIG_CLASS
    if _CONFIG_CLASS is not None:
        return _CONFIG_CLASS
    try:
        from verl.workers.config import PolicyLossConfig
    except ImportError as exc:
        raise ConfigError(f"LLDSPolicyLossConfig needs veRL (pip install verl): {exc}") from None

    def __post_init__(self: Any) -> None:
        parent = getattr(PolicyLossConfig, "__post_init__", None)
        if parent is not None:
            parent(self)
        holder = {"policy_loss": self}
        llds_settings(holder)  # validate the keys early, with their names
        base_loss_mode(holder)
        # veRL's own field; it holds algorithm.rollout_correction when the recipe wires it
        check_rollout_correction(getattr(self, "rollout_correction", None))
        # where veRL finally chooses the actor's loss: its bypass mode (`apply_bypass_mode`, in
        # the driver) rewrites this config's loss_mode before the workers build it, whatever the
        # YAML wires; this class is the user's choice of LLDS, so a swapped loss is refused here
        if str(getattr(self, "loss_mode", LOSS_NAME)) == BYPASS_LOSS:
            raise ConfigError(BYPASS_REFUSAL)
        register()

    base_field = dataclasses.field(
        default=DEFAULT_BASE_LOSS,
        metadata={"help": "the registered veRL policy loss that LLDS is added to"},
    )
    LLDSPolicyLossConfig = dataclasses.make_dataclass(
        "LLDSPolicyLossConfig",
        [
            *engine_fields("llds_", plain_types=True, **VERL_DEFAULTS),
            (BASE_LOSS_KEY, str, base_field),
        ],
        bases=(PolicyLossConfig,),
        namespace={"__post_init__": __post_init__},
    )

    # Importable as llds.integrations.verl.LLDSPolicyLossConfig (Hydra targets, pickling).
    LLDSPolicyLossConfig.__module__ = __name__
    LLDSPolicyLossConfig.__qualname__ = "LLDSPolicyLossConfig"
    _CONFIG_CLASS = LLDSPolicyLossConfig
    return LLDSPolicyLossConfig


def alarm_monitor(monitor_config: str | None = None) -> LoggedMonitor:
    """The collapse alarms on a veRL run, for its driver: call `.update(step, metrics)` once
    per training step with the metrics dict veRL's trainer logs (`RayPPOTrainer.fit` hands it
    to its tracker); it returns the alarms newly raised. `monitor_config`: a YAML file whose
    `monitor:` section sets them, as for the native trainer; None: the defaults. Without such
    a call the alarms are replayed afterwards with `llds monitor replay` on veRL's log."""
    return LoggedMonitor(load_monitor_config(monitor_config), VERL_NAMES)


def __getattr__(name: str) -> Any:
    if name == "LLDSPolicyLossConfig":
        return _policy_loss_config_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _register_if_verl_loaded() -> None:
    """Importing this module inside a veRL process (e.g. via VERL_USE_EXTERNAL_MODULES or
    `actor_rollout_ref.model.external_lib`) registers the loss; otherwise nothing happens."""
    if "verl.trainer.ppo.core_algos" in sys.modules:
        register()


_register_if_verl_loaded()

__all__ = [
    "BYPASS_REFUSAL",
    "CONFIG_TARGET",
    "FIRST_UPDATE_REFUSAL",
    "LOSS_NAME",
    "VERL_DEFAULTS",
    "alarm_monitor",
    "base_loss_mode",
    "check_rollout_correction",
    "check_verl_config",
    "is_weight_stats",
    "llds_settings",
    "premb_lld_counts",
    "reference_vanilla_loss",
    "register",
    "verl_llds_policy_loss",
]
