"""`llds export`: a run's weights as a plain Hugging Face model, a LoRA adapter merged in.

A thin adapter: the keys are `llds.train.export.ExportConfig`'s fields (the run or checkpoint
directory is the positional value), and the work is `export_model`.
"""

from __future__ import annotations

import argparse
from typing import Any

HELP = "write a run's (or checkpoint's) weights as a Hugging Face model, LoRA adapters merged"
ALIASES = {"--out": "out", "--dtype": "dtype"}
OUTPUT_DIRS = ("out",)
"""directories this command writes: refused up front when they exist as files"""
OUTPUT_OWNS = ("llds_export.json",)
"""what an earlier output of this command holds: such a folder may be written again"""


CONFIG = "llds.train.export:ExportConfig"
REST = ("source", ": the run directory or checkpoint directory to export")
"""the key that takes the positional token that is not an override, and its help"""


def run(cfg: Any, args: argparse.Namespace) -> int:
    from llds.train.export import export_model

    ckpt = export_model(cfg)
    print(f"exported {ckpt} to {cfg.out}")
    return 0
