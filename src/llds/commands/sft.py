"""`llds sft`: supervised warm start on expert search trajectories (before GRPO).

A thin adapter: the flags are the fields of `llds.sft.SFTConfig` (names, types, defaults and
help come from there), `--config` a YAML file of the same keys, and the work is `llds.sft.run`.
"""

from __future__ import annotations

import argparse

HELP = "supervised warm start: teach a model the search protocol on expert trajectories"


def add_arguments(p: argparse.ArgumentParser) -> None:
    from llds.config.loader import add_dataclass_arguments
    from llds.sft import SFTConfig

    p.add_argument(
        "--config", help="YAML file (or preset name, e.g. sft-organism) of SFTConfig fields"
    )
    add_dataclass_arguments(p, SFTConfig)


def run(args: argparse.Namespace) -> int:
    from llds import sft
    from llds.config.loader import given_arguments

    cfg = sft.load_sft_config(args.config, given_arguments(args, sft.SFTConfig))
    sft.run(cfg)
    return 0
