"""What `llds probe` reads: `ProbeConfig`, and an earlier probe's questions (`questions_from`),
apart from the probe itself so that a command line is read and checked without torch."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field

from llds.config.schema import section
from llds.errors import UserInputError
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


# where and how far a probe runs: no question's outcome depends on these
RUN_ONLY = ("out", "device", "limit", "max_probed")
# what a probe's questions' rollouts do not depend on; every other setting must match for
# questions_from (the model, data, retriever, seed, group size, temperature, protocol)
NOT_SAMPLING = (
    *RUN_ONLY,
    "questions_from",
    "lr",
    "optimizer",
    "betas",
    "eps",
    "weight_decay",
    "updates",
    "llds_coef",
)


def _same_path(a: Any, b: Any) -> bool:
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same_path(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, str) and isinstance(b, str):
        return Path(a).resolve() == Path(b).resolve()
    return a == b


def probed_questions(
    path: str | Path, cfg: ProbeConfig, protocol: dict[str, Any] | None = None
) -> set[str]:
    """The example ids an earlier probe (`path`: its probe.json or its folder) probed, checked
    to have sampled its rollouts as `cfg` will; a setting that differs is named. Read before
    any model loads (`llds probe` reads it before torch): a missing or foreign file is one line."""
    path = Path(path)
    if path.is_dir():
        path = path / "probe.json"
    try:
        earlier = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as e:
        raise UserInputError(f"questions_from: {path}: not a readable probe.json ({e})") from None
    settings = earlier.get("settings") if isinstance(earlier, dict) else None
    if not isinstance(settings, dict) or not isinstance(earlier.get("results", []), list):
        raise UserInputError(f"questions_from: {path}: no 'settings' and 'results' of a probe")
    ours = asdict(cfg)
    ours.pop("protocol")  # the overrides; the protocol they resolve to is compared below
    if protocol is not None and "protocol" in settings:  # older probes did not record it
        ours["protocol"] = protocol
    for key in (k for k in ours if k not in NOT_SAMPLING):
        if not _same_path(settings.get(key), ours[key]):
            raise UserInputError(
                f"questions_from: {path}: its {key} is {settings.get(key)!r}, this probe's is "
                f"{ours[key]!r}; the questions would not get the same rollouts"
            )
    return {r["example_id"] for r in earlier.get("results", [])}
