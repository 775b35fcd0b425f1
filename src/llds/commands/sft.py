"""`llds sft`: supervised warm start on expert search trajectories (before GRPO).

A thin adapter: the keys are `llds.sft.SFTConfig`'s fields (names, types, defaults and help come
from there), `--config` a YAML file of the same keys, and the work is `llds.sft.run`.
"""

from __future__ import annotations

import argparse
from typing import Any

HELP = "supervised warm start: teach a model the search protocol on expert trajectories"
ALIASES = {"--model": "model", "--data": "data", "--retriever": "corpus", "--out": "out"}
OUTPUT_DIRS = ("out",)
"""directories this command writes: refused up front when they exist as files"""
OUTPUT_OWNS = ("sft_report.json", "config.json")
"""what an earlier output of this command holds: such a folder may be written again"""


CONFIG = "llds.sft.config:SFTConfig"
LOAD = "llds.sft.config:load_sft_config"


def run(cfg: Any, args: argparse.Namespace) -> int:
    from llds import sft
    from llds.logs import setup_logging

    setup_logging()  # the warm start reports through the llds.sft logger
    sft.run(cfg)
    return 0
