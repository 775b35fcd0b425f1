"""The GRPO (+LLDS) objective of one micro-batch: a sum of named loss terms.

    loss = policy + kl_coef * KL(pi_theta || pi_ref) - entropy_coef * H + LLDS + extra terms

Each term is a pure function registered by name (`register_loss_term`), as veRL registers its
policy losses: it reads what it needs from `TermInputs` and its coefficient from `AlgoConfig`,
and returns its contribution to the loss (coefficient applied, or None when it adds nothing) with
its statistics. The built-in terms always run, in the order above; a term registered elsewhere
runs when `AlgoConfig.extra_terms` names it. The trainer and the one-step probe compose the loss
only through `grpo_objective`; the TRL and veRL adapters keep their framework's policy loss and
add `llds_term`. Denominators can be given (`num_sequences`, `num_tokens`, `num_preserving`) so
that micro-batches and processes add up to the loss of the whole mini-batch.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from torch import Tensor

from llds.algo.kl import kl_penalty
from llds.algo.llds import llds_loss
from llds.algo.llds_in_force import LLDSInForce
from llds.algo.masking import aggregate
from llds.algo.policy_loss import policy_loss
from llds.config.algo import AlgoConfig, LLDSConfig
from llds.errors import ConfigError

POLICY_STATS = ("clip_frac_low", "clip_frac_high", "approx_kl", "ratio_mean")
EXTRA_LOSS_PREFIX = "loss/"
"""An extra term's contribution is reported as `loss/<name>`, beside the term's own stats."""
LLDS_STATS = ("gate_frac", "penalized_token_frac", "mean_penalty")


@dataclass(frozen=True)
class TermInputs:
    """Everything a loss term may read: `[B, T]` per-token tensors of one micro-batch (`[B]` for
    advantages) and the denominators that make micro-batches add up."""

    log_probs: Tensor
    """log pi_theta of the taken tokens, with gradient"""
    old_log_probs: Tensor
    advantages: Tensor
    loss_mask: Tensor
    ref_log_probs: Tensor | None = None
    entropy: Tensor | None = None
    answer_mask: Tensor | None = None
    """`[B, T]` the final `<answer>` span, which LLDS-MA weights (`LLDSInForce.masks_answer`)"""
    llds: LLDSInForce | None = None
    """the LLDS the step applies (its settings, LLDS-MA's beta); None: `algo.llds` as it is"""
    first_update: bool = False
    """a micro-batch of the rollout batch's first optimizer step, where pi_theta == pi_old:
    LLDS then acts only as `LLDSInForce.acts` says (by default it reports statistics only)"""
    num_sequences: float | Tensor | None = None
    num_tokens: float | Tensor | None = None
    num_preserving: float | Tensor | None = None
    is_weights: Tensor | None = None
    """constant per-token weights of the policy term (importance weights for a sampler that is
    not the trained policy, `llds.algo.rollout_correction`); None = unweighted"""


Term = tuple[Tensor | None, dict[str, Tensor]]
"""A term's contribution to the loss (None: adds nothing) and its detached statistics."""

LossTerm = Callable[[TermInputs, AlgoConfig], Term]

_REGISTRY: dict[str, LossTerm] = {}
BUILT_IN_TERMS = ("policy", "kl", "entropy", "llds")


def register_loss_term(name: str) -> Callable[[LossTerm], LossTerm]:
    """Register `fn(inputs, algo) -> (contribution | None, stats)` as the loss term `name`.

    A term other than the built-ins runs when `algo.extra_terms` has its name; it reads its
    coefficient from there. Registering a taken name is an error (no silent replacement)."""

    def add(fn: LossTerm) -> LossTerm:
        if name in _REGISTRY and _REGISTRY[name] is not fn:
            raise ValueError(f"a loss term named {name!r} is already registered")
        _REGISTRY[name] = fn
        return fn

    return add


def registered_loss_terms() -> tuple[str, ...]:
    """The names of every registered term, built-ins first."""
    return tuple(_REGISTRY)


def active_terms(algo: AlgoConfig) -> list[tuple[str, LossTerm]]:
    """The terms the objective sums for `algo`: the built-ins, then `algo.extra_terms` in order."""
    missing = [n for n in algo.extra_terms if n not in _REGISTRY or n in BUILT_IN_TERMS]
    if missing:
        extra = [n for n in _REGISTRY if n not in BUILT_IN_TERMS]
        raise ConfigError(
            f"algo.extra_terms: {missing} not registered as extra loss terms "
            f"(registered: {extra or 'none'}; register with llds.algo.register_loss_term)"
        )
    return [(n, _REGISTRY[n]) for n in (*BUILT_IN_TERMS, *algo.extra_terms)]


def grpo_objective(x: TermInputs, algo: AlgoConfig) -> tuple[Tensor, dict[str, Tensor]]:
    """`(loss, stats)` of one micro-batch `x` under the `AlgoConfig` in force; stats are detached
    and named like the trainer's metrics (`policy/*`, `llds/*`).

    The KL term is added when `x.ref_log_probs` is given, the entropy bonus when `x.entropy` is
    given and `entropy_coef > 0`, LLDS as `x.llds` applies it (else as `algo.llds` says: when
    enabled with `coef > 0`). Where LLDS does not act (`x.first_update` under the default
    `first_update: zero`) it is evaluated on detached log-probs for its statistics and adds
    nothing (value and gradient 0): the first optimizer step of a rollout batch, where d is only
    rounding noise. `x.is_weights` weight the policy term's tokens (the decoupled importance
    correction).
    """
    terms = {name: term(x, algo) for name, term in active_terms(algo)}
    loss = sum(value for value, _ in terms.values() if value is not None)
    stats = {key: v for _, term_stats in terms.values() for key, v in term_stats.items()}
    for name in algo.extra_terms:
        value = terms[name][0]
        if value is not None:
            stats[EXTRA_LOSS_PREFIX + name] = value.detach()
    return loss, stats  # type: ignore[return-value]


@register_loss_term("policy")
def policy_term(x: TermInputs, algo: AlgoConfig) -> Term:
    """PPO's clipped surrogate (`policy/pg_loss` and the clip and ratio statistics), each token
    weighted by `is_weights` when given."""
    pg, st = policy_loss(
        x.log_probs,
        x.old_log_probs,
        x.advantages,
        x.loss_mask,
        clip_low=algo.clip_low,
        clip_high=algo.clip_high,
        ratio_type=algo.ratio_type,
        dual_clip=algo.dual_clip,
        aggregation=algo.aggregation,
        num_sequences=x.num_sequences,
        num_tokens=x.num_tokens,
        weights=x.is_weights,
    )
    stats = {"policy/pg_loss": pg.detach()}
    stats.update({f"policy/{k}": st[k] for k in (*POLICY_STATS, "ratio_max", "ratio_min")})
    return pg, stats


@register_loss_term("kl")
def kl_term(x: TermInputs, algo: AlgoConfig) -> Term:
    """`kl_coef * KL(pi_theta || pi_ref)` when reference log-probs are given (`policy/kl`)."""
    if x.ref_log_probs is None:
        return None, {}
    kl_tok = kl_penalty(x.log_probs, x.ref_log_probs, algo.kl_kind)
    kl = aggregate(
        kl_tok,
        x.loss_mask,
        algo.aggregation,
        num_sequences=x.num_sequences,
        num_tokens=x.num_tokens,
    )
    return algo.kl_coef * kl, {"policy/kl": kl.detach()}


@register_loss_term("entropy")
def entropy_term(x: TermInputs, algo: AlgoConfig) -> Term:
    """The entropy bonus, `-entropy_coef * H`."""
    if x.entropy is None or algo.entropy_coef <= 0:
        return None, {}
    ent = aggregate(
        x.entropy,
        x.loss_mask,
        algo.aggregation,
        num_sequences=x.num_sequences,
        num_tokens=x.num_tokens,
    )
    return -(algo.entropy_coef * ent), {}


@register_loss_term("llds")
def llds_objective_term(x: TermInputs, algo: AlgoConfig) -> Term:
    """The LLDS term (`llds/*`) as `x.llds` applies it (None: `algo.llds`); statistics only
    where it does not act."""
    llds = x.llds if x.llds is not None else LLDSInForce(algo.llds)
    if not llds.on:
        return None, {}
    acts = llds.acts(x.first_update)
    reg, lst = llds_term(
        x.log_probs,
        x.old_log_probs,
        x.advantages,
        x.loss_mask,
        llds.settings,
        answer_mask=x.answer_mask,
        answer_weight=llds.answer_weight,
        acts=acts,
        num_sequences=x.num_preserving,
        num_tokens=x.num_tokens,
    )
    stats = {"llds/loss": lst["llds/loss"]}
    stats.update({f"llds/{k}": lst[f"llds/{k}"] for k in LLDS_STATS})
    return (reg if acts else None), stats


def llds_term(
    log_probs: Tensor,
    old_log_probs: Tensor,
    advantages: Tensor,
    loss_mask: Tensor,
    settings: LLDSConfig,
    *,
    answer_mask: Tensor | None = None,
    answer_weight: float = 1.0,
    acts: bool = True,
    num_sequences: float | Tensor | None = None,
    num_tokens: float | Tensor | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """The LLDS term of the objective, `coef * L_LLDS` (Eq. 4), and its statistics (`llds/*`).

    `grpo_objective` adds it to the policy loss; the TRL and veRL adapters, which keep their
    framework's own policy loss, add it to theirs. With `acts=False` the penalty is evaluated on
    detached log-probs: the statistics describe it, the term is exactly 0 with no gradient. A
    disabled `settings` gives coefficient 0.
    """
    reg, st = llds_loss(
        log_probs if acts else log_probs.detach(),
        old_log_probs,
        advantages,
        loss_mask,
        coef=settings.active_coef,
        gate=settings.gate,
        answer_mask=answer_mask,
        answer_weight=answer_weight,
        aggregation=settings.aggregation,
        num_sequences=num_sequences,
        num_tokens=num_tokens,
    )
    stats = {f"llds/{k}": v for k, v in st.items()}
    stats["llds/loss"] = reg.detach() if acts else reg.detach() * 0
    return (reg if acts else reg.detach() * 0), stats
