"""`llds demo`: world -> warm start -> GRPO vs GRPO+LLDS -> evaluation -> report, on a CPU."""

from __future__ import annotations

import argparse
from typing import Any

HELP = "the main job on the embedded default: GRPO vs GRPO+LLDS on the organism, with a report"
ALIASES = {"--out": "out", "--skip-train": "skip_train"}
OUTPUT_DIRS = ("out",)
"""directories this command writes: refused up front when they exist as files"""
OUTPUT_OWNS = ("world", "sft", "grpo", "report")
"""what an earlier output of this command holds: such a folder may be written again"""


CONFIG = "llds.demo:DemoConfig"


def run(cfg: Any, args: argparse.Namespace) -> int:
    from llds.demo import run_demo
    from llds.logs import setup_logging

    setup_logging()  # the warm start reports through the llds.sft logger
    run_demo(cfg)
    return 0
