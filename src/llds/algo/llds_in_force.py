"""What LLDS applies at one step, decided once.

The LLDS settings in force (the config's, or after a rollback the same with LLDS on) and the
step's rollout batch decide everything LLDS does in that step: its coefficient, gate and
aggregation, whether it reaches the rest of the batch (`scope`), whether it weights the answer
span and by how much (LLDS-MA's beta, from the batch's searches), and whether it acts on the
batch's first optimizer step (`first_update`). `LLDSInForce` holds that answer; the trainer
builds it once per step and the update, the objective, the choice of pi_old, the rollback and
the probe read it, instead of each re-deriving it from a coefficient.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from llds.config.algo import LLDSConfig


@dataclass(frozen=True)
class LLDSInForce:
    """The LLDS a step applies: `settings` (those in force) and `answer_weight`, LLDS-MA's beta
    for the step's batch (1 when LLDS is off or does not weight the answer)."""

    settings: LLDSConfig
    answer_weight: float = 1.0

    @property
    def coef(self) -> float:
        """lambda in `L = L_GRPO + lambda * L_LLDS`: 0 when LLDS is off."""
        return self.settings.active_coef

    @property
    def on(self) -> bool:
        return self.coef > 0

    def acts(self, first_update: bool) -> bool:
        """Whether LLDS acts on an optimizer step (`first_update`: the rollout batch's first,
        where pi_theta == pi_old and d is rounding noise: LLDS is then exactly 0 unless
        `first_update: computed`, the authors' behaviour)."""
        return self.on and (not first_update or self.settings.first_update == "computed")

    @property
    def acts_on_first_update(self) -> bool:
        """LLDS acts on the first optimizer step, on d = pi_old - pi_theta's rounding: pi_old
        must then be the training forward's own numbers (recomputed, not the rollout's)."""
        return self.acts(first_update=True)

    @property
    def reaches_rest_of_batch(self) -> bool:
        """`scope: batch`: each mini-batch after the first also penalizes a sample of
        `settings.batch_rows` preserving responses from the rest of the rollout batch."""
        return self.on and self.settings.scope == "batch"

    @property
    def masks_answer(self) -> bool:
        """LLDS-MA: the final `<answer>` span is weighted by `answer_weight`."""
        return self.on and self.settings.mask_answer


def llds_in_force(
    settings: LLDSConfig, mean_valid_searches: Callable[[], float | None] | None = None
) -> LLDSInForce:
    """The LLDS a step applies under `settings`: LLDS-MA's beta from the batch's mean valid
    searches per rollout (`mean_valid_searches()`, asked only when the schedule needs it; None:
    unknown, beta 1), see `LLDSConfig.answer_weight_for`."""
    plain = LLDSInForce(settings)
    if not plain.masks_answer:
        return plain
    needs_searches = settings.answer_weight is None and mean_valid_searches is not None
    searches = mean_valid_searches() if needs_searches else None
    return LLDSInForce(settings, settings.answer_weight_for(searches))
