"""`llds world`: generate the synthetic search world (corpus + questions) into a folder.

A thin adapter: the keys are the fields of `llds.data.world.WorldConfig` plus `out`, `--config`
a YAML file (or preset: world-organism, world-hard) of the same keys, and the work is
`generate_world`.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

HELP = "Generate a synthetic world: corpus.jsonl, train.jsonl, test.jsonl and world.json."
ALIASES = {"--out": "out"}
OUTPUT_DIRS = ("out",)
"""directories this command writes: refused up front when they exist as files"""
OUTPUT_OWNS = ("world.json",)
"""what an earlier output of this command holds: such a folder may be written again"""


CONFIG = "llds.data.world:MakeWorldConfig"


def run(cfg: Any, args: argparse.Namespace) -> int:
    from llds.data.world import generate_world, write_world

    world = generate_world(cfg.world())
    paths = write_world(world, cfg.out)
    print(json.dumps(world.stats(), indent=2))
    print(f"wrote {', '.join(str(p) for p in paths.values())}")
    return 0
