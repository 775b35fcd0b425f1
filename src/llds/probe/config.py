"""What `llds probe` reads: `ProbeConfig`, apart from the probe itself so that a command line
is read and checked without torch."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from llds.config.schema import section
from llds.evaluation.config import ModelOnData

Beta = Annotated[float, Field(ge=0, lt=1)]


@section
class ProbeConfig(ModelOnData):
    """`llds probe`: one GRPO step per question from the same weights (the paper's Eq. 3)."""

    out: str = ""
    """directory for probe.json and probe.png; required"""
    limit: int = Field(default=64, ge=1)
    """questions to sample (mixed groups are probed)"""
    group_size: int = Field(default=8, ge=2)
    """rollouts per question"""
    lr: float = Field(default=1e-2, gt=0)
    """step size of the probe update (the first-order change needs none); with `adamw`, the
    run's `optim.lr`"""
    optimizer: Literal["sgd", "adamw"] = "sgd"
    """the probe update: plain SGD (Eq. 3) or, as the paper's probe, a fresh AdamW per question
    with a run's settings (`lr`, `betas`, `eps`, `weight_decay` as its `optim.*`); the
    first-order terms stay the SGD direction's"""
    betas: tuple[Beta, Beta] = (0.9, 0.999)
    """AdamW's (beta1, beta2) for `optimizer: adamw` (the trainer's default)"""
    eps: float = Field(default=1e-8, gt=0)
    """AdamW's epsilon for `optimizer: adamw` (the trainer's default)"""
    weight_decay: float = Field(default=0.01, ge=0)
    """AdamW's decoupled weight decay for `optimizer: adamw` (the trainer's default)"""
    temperature: float = Field(default=1.0, ge=0)
    """sampling temperature; the probe scores and updates at it too (0: greedy, scored at 1)"""
    seed: int = 0
    """sampling seed"""
    updates: int = Field(default=1, ge=1)
    """updates on each group (1: Eq. 3; more: a rollout batch's optimizer steps, where LLDS can
    act from the second on)"""
    llds_coef: float = Field(default=0.0, ge=0)
    """LLDS lambda in the probe updates (0: GRPO alone)"""
    max_probed: int | None = Field(default=None, ge=1)
    """stop once this many questions were probed (null: all of `limit`)"""
    questions_from: str = ""
    """probe.json of an earlier probe with the same sampling settings (model, data, retriever,
    seed, group size, temperature, protocol): probe only the questions it probed, on the same
    rollouts (to compare updates or LLDS question by question)"""
    device: str = "auto"
    """cpu, cuda, cuda:1, auto"""

    def missing(self) -> list[tuple[str, str]]:
        """Required keys left empty."""
        out = super().missing()
        return [*out, ("out", "required (the output directory)")] if not self.out else out
