"""Supervised warm start as a library call: `llds.sft.run(SFTConfig(...))`.

The package: `config` (its settings), `inputs` (the questions, corpus and retriever a config
names), `data` and `reading` (expert trajectories laid out like rollouts), `tiny` (a fresh tiny
model with a tokenizer fitted to its world), `trainer` (the teacher-forced loop) and
`warm_start` (what `run` does: data, model, loop, save). Progress and results go to the
`llds.sft` logger.
"""

from __future__ import annotations

from typing import Any

from llds.sft.config import SFTConfig, load_sft_config
from llds.sft.tiny import tiny_model_and_tokenizer, tiny_tokenizer

__all__ = ["SFTConfig", "load_sft_config", "run", "tiny_model_and_tokenizer", "tiny_tokenizer"]


def run(cfg: SFTConfig) -> dict[str, Any]:
    """Build the expert trajectories, train, save the model with its protocol, evaluate; returns
    the report that is also written to `OUT/sft_report.json`."""
    from llds.sft.warm_start import warm_start

    return warm_start(cfg)
