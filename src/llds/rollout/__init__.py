"""Token-level multi-turn rollouts against a search environment.

The engine and its batches (torch) load on first use: `RolloutConfig` is read without them."""

from __future__ import annotations

from typing import TYPE_CHECKING

from llds.lazy import lazy_attributes
from llds.rollout.config import RolloutConfig

if TYPE_CHECKING:
    from llds.rollout.batch import Episode, RolloutBatch
    from llds.rollout.engine import RolloutEngine, RolloutRequest

_LAZY = {
    "Episode": "llds.rollout.batch",
    "RolloutBatch": "llds.rollout.batch",
    "RolloutEngine": "llds.rollout.engine",
    "RolloutRequest": "llds.rollout.engine",
}

__all__ = ["Episode", "RolloutBatch", "RolloutConfig", "RolloutEngine", "RolloutRequest"]

__getattr__ = lazy_attributes(__name__, _LAZY)
