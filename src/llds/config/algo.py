"""The algorithm's settings (the `algo` section), defined once for the math they parameterise.

They live here, apart from `llds.algo`, so that a config can be read, checked and refused
without torch: importing any module of `llds.algo` imports its tensor math (the package exports
it), and these classes are what every command parses before any work. `llds.algo.config` and
`llds.algo` export them beside the math.

The native trainer, the one-step probe and the TRL and veRL adapters all read these classes: the
adapters expose `LLDSConfig`'s fields under their framework's naming (`llds_<field>`) with
`engine_fields`, and turn them back into an `LLDSConfig` with `from_engine`, so a field, its
type, default, range and help exist once. Equation numbers are those of the paper (arXiv
2512.04220, v2) unless another source is named.
"""

from __future__ import annotations

import dataclasses
import functools
import typing
from collections.abc import Mapping
from typing import Annotated, Any, Literal

from pydantic import Field, TypeAdapter, ValidationError

from llds.config.schema import SECTION_KEY, section
from llds.errors import ConfigError

# ------------------------------------------------------------------ the named choices

KLKind = Literal["k1", "k2", "k3", "low_var_kl", "abs"]
"""the KL estimators of `llds.algo.kl`"""
Gate = Literal["token", "response", "action"]
"""the units LLDS may penalise (`llds.algo.llds`)"""
LLDSAggregation = Literal["seq-mean-token-mean", "token-mean"]
"""how LLDS's penalties become one number (`llds.algo.llds`)"""
Aggregation = Literal[
    "token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"
]
"""how per-token losses become one number (`llds.algo.masking`)"""
RatioType = Literal["token", "sequence"]
"""PPO's per-token or GSPO's sequence ratio (`llds.algo.policy_loss`)"""
CorrectionMode = Literal["off", "tis", "mis", "reject"]
"""the importance corrections of `llds.algo.rollout_correction`"""
CorrectionLevel = Literal["token", "sequence"]
"""one ratio per token, or the response's"""


@section(key="algo.llds")
class LLDSConfig:
    """LLDS: likelihood-preserving regularization (Section 3), `L = L_GRPO + coef * L_LLDS`."""

    enabled: bool = True
    """add the LLDS term; off keeps every `lld/*` measurement"""
    coef: float = Field(default=0.2, ge=0, allow_inf_nan=False)
    """lambda in `L = L_GRPO + lambda * L_LLDS` (Eq. 4): the paper's 0.2, 0.3 for
    Qwen2.5-7B-Instruct; 0 adds nothing"""
    gate: Gate = "action"
    """which units may be penalised (Section 3): `action` (g_{i,t}: an action whose summed
    d > 0; the paper's default, best in its ablation), `response` (g_i, v1's method) or `token`
    (no gate)"""
    aggregation: LLDSAggregation = "seq-mean-token-mean"
    """`seq-mean-token-mean`: Eq. 4, the mean over preserving responses of each response's penalty
    over its action-token count; `token-mean`: the authors' code, the penalty summed over the
    batch over the model-token count of all responses"""
    mask_answer: bool = False
    """LLDS-MA: weight the final `<answer>` span by beta, against premature answering"""
    answer_weight: float | None = Field(default=None, ge=0, allow_inf_nan=False)
    """fixed beta for LLDS-MA; null = the paper's schedule min(V / answer_baseline, 1), V the mean
    valid searches per rollout of the batch"""
    answer_baseline: float = Field(default=2.0, gt=0, allow_inf_nan=False)
    """the divisor of LLDS-MA's schedule (the paper's 2)"""
    scope: Literal["minibatch", "batch"] = "minibatch"
    """which responses each mini-batch's LLDS hinge reaches. `minibatch`: its own (the paper's;
    a response then meets LLDS only in its own mini-batch, against the drift of the updates
    before it). `batch`: its own plus a sample of `batch_rows` preserving responses from the rest
    of the rollout batch, a second LLDS term normalized over that sample, so that every update
    after the first is penalized for the likelihood it takes from any part of the batch (one
    extra forward/backward of the sample per mini-batch)"""
    batch_rows: int = Field(default=32, ge=1)
    """with `scope: batch`, how many preserving responses from the rest of the rollout batch
    each mini-batch draws (fewer when fewer exist); drawn afresh per mini-batch, seeded"""
    first_update: Literal["zero", "computed"] = "zero"
    """LLDS on the first optimizer step of each rollout batch, where pi_theta == pi_old and
    `d = log pi_old - log pi_theta` is only float rounding noise. `zero`: LLDS is exactly 0 there
    (value and gradient), as in exact arithmetic. `computed`: evaluate it on whatever d the
    floats give, as the authors' code does; the gate then opens on noise."""

    @property
    def active_coef(self) -> float:
        """The coefficient the objective uses: 0 when LLDS is disabled."""
        return self.coef if self.enabled else 0.0

    def answer_weight_for(self, mean_valid_searches: float | None) -> float:
        """LLDS-MA's beta for a batch whose rollouts made `mean_valid_searches` valid searches
        on average: 1 without `mask_answer`; the fixed `answer_weight` when set; else the
        paper's min(V / answer_baseline, 1). Unknown searches (None): unweighted, 1. The one
        place the native trainer and the TRL adapter take it from."""
        if not self.mask_answer:
            return 1.0
        if self.answer_weight is not None:
            return float(self.answer_weight)
        if mean_valid_searches is None:
            return 1.0
        return answer_weight_schedule(mean_valid_searches, self.answer_baseline)


def answer_weight_schedule(mean_valid_searches: float, baseline: float = 2.0) -> float:
    """LLDS-MA answer-token weight `beta = min(V / baseline, 1)` (the paper uses baseline 2).

    Few valid searches per rollout -> answer tokens are barely protected, which discourages
    answering before searching.
    """
    if baseline <= 0:
        raise ValueError(f"baseline must be > 0, got {baseline}")
    return float(min(max(mean_valid_searches, 0.0) / baseline, 1.0))


@section(key="algo.rollout_correction")
class RolloutCorrectionConfig:
    """Importance weights for rollouts sampled by another copy of the policy (`rollout.dtype`),
    multiplied into each token's surrogate (the decoupled correction); with the sampler equal to
    the trained policy nothing is applied and the weights are exactly 1."""

    mode: CorrectionMode = "off"
    """`tis`: truncated importance sampling, w = min(rho, cap) (Yao et al. 2025, "Your efficient
    RL framework secretly brings you off-policy RL training"); `mis`: masked importance sampling,
    w = rho up to the cap, else 0; `reject`: drop whole responses whose ratio lies outside
    [1/cap, cap]; rho = pi_old / pi_sampler. `off`: no weights"""
    level: CorrectionLevel = "token"
    """`token`: one ratio per token; `sequence`: the response's ratio, the product of its model
    tokens' ratios, shared by its tokens (for `reject` with `token`: a response is dropped when
    any of its tokens' ratios is outside the bounds)"""
    cap: float = Field(default=2.0, gt=1, allow_inf_nan=False)
    """the cap C on the importance weight (and [1/C, C], the band `reject` keeps)"""


@section(key="algo")
class AlgoConfig:
    """GRPO's objective (Section 1) and where its inputs come from."""

    normalize_std: bool = True
    """divide group advantages by the group's std (GRPO); false = Dr. GRPO's mean-centering"""
    clip_low: float = Field(default=0.2, gt=0, lt=1, allow_inf_nan=False)
    """PPO clip epsilon: the ratio is clipped to [1 - clip_low, 1 + clip_high]"""
    clip_high: float | None = Field(default=None, gt=0, allow_inf_nan=False)
    """upper clip epsilon; null = clip_low; larger = DAPO's clip-higher (arXiv 2503.14476)"""
    ratio_type: RatioType = "token"
    """`token`: PPO's per-token ratio; `sequence`: GSPO's length-normalised sequence ratio
    (arXiv 2507.18071)"""
    dual_clip: float | None = Field(default=None, gt=1, allow_inf_nan=False)
    """dual-clip bound c (> 1) on the loss of negative-advantage tokens (arXiv 1912.09729)"""
    aggregation: Aggregation = "token-mean"
    """how per-token losses become one number: `token-mean` (DAPO), `seq-mean-token-mean` (GRPO's
    paper), `seq-mean-token-sum`, `seq-mean-token-sum-norm` (Dr. GRPO)"""
    kl_coef: float = Field(default=0.001, ge=0, allow_inf_nan=False)
    """weight of KL(pi_theta || pi_ref) to the starting policy (Search-R1: 0.001)"""
    kl_kind: KLKind = "low_var_kl"
    """KL estimator: k1, k2, k3, low_var_kl (clamped k3, Search-R1's), abs"""
    entropy_coef: float = Field(default=0.0, ge=0, allow_inf_nan=False)
    """weight of the entropy bonus (subtracted from the loss); 0 = none"""
    old_logprobs: Literal["auto", "rollout", "recompute"] = "auto"
    """where pi_old comes from. `rollout`: the log-probs the rollout engine computed from the very
    logits it sampled from (no extra forward pass). `recompute`: a separate no-grad forward over
    the batch, as most trainers do; needed when generation numerics differ from the training
    forward's (low-precision kernels). `auto`: rollout for float32 models without LLDS (both
    agree to float rounding), recompute otherwise: LLDS's hinge max(0, pi_old - pi_theta) sits
    at exactly 0 on the first optimizer step, where rounding noise alone would open it."""
    llds: LLDSConfig = dataclasses.field(default_factory=LLDSConfig)
    """the LLDS regularizer"""
    extra_terms: dict[str, float] = dataclasses.field(default_factory=dict)
    """coefficients of loss terms registered with `llds.algo.register_loss_term`, by name; the
    objective adds each named term (see docs/architecture.md, "Where new things go")"""
    term_modules: list[str] = dataclasses.field(default_factory=list)
    """modules imported before the loss is built, so that the terms they register can be named
    in `extra_terms` from `llds train`: an importable module name or a `.py` file path"""
    format_reward: bool = False
    """Search-R1's format-aware reward instead of plain exact match"""
    rollout_correction: RolloutCorrectionConfig = dataclasses.field(
        default_factory=RolloutCorrectionConfig
    )
    """importance-sampling correction of the sampler/trainer mismatch (`rollout.dtype`)"""
    filter_void_turns: bool = False
    """leave out of the loss every rollout with a void turn, one that emitted neither a search
    nor an answer (SimpleTIR, arXiv 2509.02479); its group's advantages are computed first"""


# ------------------------------------------------------------------ the functions' arguments


def check_arguments(cls: type, where: str, **values: Any) -> None:
    """Refuse an argument of a loss function outside the bounds its config field declares
    (`clip_low` of `policy_loss` as `algo.clip_low`), so that the Python API and the command
    line take the same values: one `ConfigError` naming the function and the argument."""
    for name, value in values.items():
        try:
            _field_adapter(cls, name).validate_python(value)
        except ValidationError as exc:
            why = exc.errors()[0]["msg"]
            key = f"{getattr(cls, SECTION_KEY)}.{name}"
            raise ConfigError(f"{where}: {name}: {why}, got {value!r} (as {key})") from None


@functools.cache
def _field_adapter(cls: type, name: str) -> TypeAdapter[Any]:
    info = cls.__pydantic_fields__[name]  # type: ignore[attr-defined]
    return TypeAdapter(Annotated[info.annotation, info])


# ------------------------------------------------------------------ adapters' view of LLDSConfig


def engine_fields(
    prefix: str = "llds_", *, plain_types: bool = False, **defaults: Any
) -> list[tuple[str, Any, Any]]:
    """`LLDSConfig`'s fields for a framework's flat config dataclass: `(prefix + name, type,
    dataclasses.field)` triples for `dataclasses.make_dataclass`, each with its help text in
    `metadata["help"]` (what Hugging Face's argument parser shows). `defaults` replaces a field's
    default for that engine (veRL's adapter defaults `aggregation` to `token-mean`).
    `plain_types` declares choices as `str`, for config systems that cannot hold a `Literal`
    (OmegaConf); `from_engine` validates the values either way."""
    unknown = set(defaults) - {f.name for f in dataclasses.fields(LLDSConfig)}
    if unknown:
        raise ValueError(f"not LLDSConfig fields: {sorted(unknown)}")
    out = []
    for name, info in LLDSConfig.__pydantic_fields__.items():
        default = defaults.get(name, info.default)
        help_text = " ".join((info.description or "").split())
        spec = dataclasses.field(default=default, metadata={"help": help_text})
        kind = info.annotation
        if plain_types and typing.get_origin(kind) is Literal:
            kind = str
        out.append((prefix + name, kind, spec))
    return out


def from_engine(
    values: Any, prefix: str = "llds_", *, where: str = "", **defaults: Any
) -> LLDSConfig:
    """The `LLDSConfig` a framework config holds under `prefix + name` keys (an object with those
    attributes, or a mapping). A bad value is one `ConfigError` line naming the framework's key
    (after `where`, e.g. `policy_loss.`); a key it does not set takes `defaults`' value, else
    `LLDSConfig`'s default."""
    given: dict[str, Any] = dict(defaults)
    for f in dataclasses.fields(LLDSConfig):
        key = prefix + f.name
        value = values.get(key) if isinstance(values, Mapping) else getattr(values, key, None)
        if value is not None or (f.name == "answer_weight" and _has(values, key)):
            given[f.name] = value
    try:
        settings = LLDSConfig(**given)
    except ConfigError as exc:  # "algo.llds.gate: ..." -> "<where>llds_gate: ..."
        text = str(exc).removeprefix(getattr(LLDSConfig, SECTION_KEY) + ".")
        raise ConfigError(f"{where}{prefix}{text}") from None
    if settings.scope != "minibatch":  # the adapters' losses see one mini-batch at a time
        raise ConfigError(
            f"{where}{prefix}scope: {settings.scope!r} needs the rest of the rollout batch in "
            "each mini-batch's loss, which only the native trainer has; use 'minibatch'"
        )
    return settings


def _has(values: Any, key: str) -> bool:
    return key in values if isinstance(values, Mapping) else hasattr(values, key)
