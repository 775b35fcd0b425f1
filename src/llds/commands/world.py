"""`llds world`: generate the synthetic search world (corpus + questions) into a folder.

A thin adapter: the flags are the fields of `llds.data.world.WorldConfig`, `--config` a YAML
file (or preset: world-organism, world-hard) of the same keys, and the work is `generate_world`.
"""

from __future__ import annotations

import argparse
import json

HELP = "Generate a synthetic world: corpus.jsonl, train.jsonl, test.jsonl and world.json."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from llds.config.loader import add_dataclass_arguments
    from llds.data.world import WorldConfig

    parser.add_argument("--out", required=True, help="output folder")
    parser.add_argument(
        "--config", help="YAML file of WorldConfig fields, or a preset (world-organism, world-hard)"
    )
    parser.add_argument("--print-config", action="store_true", help="print the config and exit")
    add_dataclass_arguments(parser, WorldConfig)


def run(args: argparse.Namespace) -> int:
    import yaml

    from llds.config.loader import given_arguments
    from llds.data.world import WorldConfig, generate_world, load_world_config, write_world

    config = load_world_config(args.config, given_arguments(args, WorldConfig))
    if args.print_config:
        print(yaml.safe_dump(config.to_dict(), sort_keys=False))
        return 0
    world = generate_world(config)
    paths = write_world(world, args.out)
    print(json.dumps(world.stats(), indent=2))
    print(f"wrote {', '.join(str(p) for p in paths.values())}")
    return 0
