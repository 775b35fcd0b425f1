"""The algorithm's settings, exported beside its math: defined in `llds.config.algo`, which
torch-free code (every command's config check) imports directly."""

from llds.config.algo import (
    AlgoConfig,
    LLDSConfig,
    RolloutCorrectionConfig,
    check_arguments,
    engine_fields,
    from_engine,
)

__all__ = [
    "AlgoConfig",
    "LLDSConfig",
    "RolloutCorrectionConfig",
    "check_arguments",
    "engine_fields",
    "from_engine",
]
