"""Token-level multi-turn rollouts against a search environment."""

from llds.rollout.batch import Episode, RolloutBatch
from llds.rollout.config import RolloutConfig
from llds.rollout.engine import RolloutEngine, RolloutRequest

__all__ = ["Episode", "RolloutBatch", "RolloutConfig", "RolloutEngine", "RolloutRequest"]
