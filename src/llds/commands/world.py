"""`llds world`: generate the synthetic search world (corpus + questions) into a folder."""

from __future__ import annotations

import argparse
import json

from llds.errors import UserInputError

HELP = "Generate a synthetic world: corpus.jsonl, train.jsonl, test.jsonl and world.json."


def parse_hop_mix(text: str) -> dict[int, float]:
    """`"1:0.5,2:0.35,3:0.15"` -> {1: 0.5, 2: 0.35, 3: 0.15}."""
    mix: dict[int, float] = {}
    for part in text.split(","):
        hops, sep, weight = part.partition(":")
        try:
            if not sep:
                raise ValueError
            mix[int(hops)] = float(weight)
        except ValueError:
            raise UserInputError(
                f"--hop-mix: expected HOPS:WEIGHT pairs like 1:0.5,2:0.5, got {part!r}"
            ) from None
    return mix


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", required=True, help="output folder")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--preset", default="organism", help="organism (default) or hard")
    parser.add_argument("--entities", type=int, help="number of entities")
    parser.add_argument("--hop-mix", help="share of questions per hop count, e.g. 1:0.5,2:0.5")
    parser.add_argument("--distractors", type=int, help="distractor passages per entity")
    parser.add_argument(
        "--name-similarity",
        type=float,
        help="0..1: chance a new name is a near-duplicate of an existing one",
    )
    parser.add_argument("--train", type=int, help="number of training questions")
    parser.add_argument("--test", type=int, help="number of test questions")


def run(args: argparse.Namespace) -> int:
    from llds.data.world import WorldConfig, generate_world, write_world

    overrides = {
        "num_entities": args.entities,
        "hop_mix": parse_hop_mix(args.hop_mix) if args.hop_mix else None,
        "distractors_per_entity": args.distractors,
        "name_similarity": args.name_similarity,
        "num_train": args.train,
        "num_test": args.test,
    }
    config = WorldConfig.preset(
        args.preset, seed=args.seed, **{k: v for k, v in overrides.items() if v is not None}
    )
    world = generate_world(config)
    paths = write_world(world, args.out)
    print(json.dumps(world.stats(), indent=2))
    print(f"wrote {', '.join(str(p) for p in paths.values())}")
    return 0
