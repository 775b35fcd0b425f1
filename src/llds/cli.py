"""The single `llds` command.

Subcommands live in `llds.commands.<name>` modules, each exposing `HELP` (one line),
`add_arguments(parser)` and `run(args) -> int`. They are discovered at start-up, so a new
subcommand is one new module. Modules keep heavy imports (torch, transformers) inside `run`
so that `llds --help` stays instant.
"""

from __future__ import annotations

import argparse
import importlib
import pkgutil
import sys
from collections.abc import Sequence

from llds import __version__, commands
from llds.errors import UserInputError


def _command_modules() -> dict[str, object]:
    found: dict[str, object] = {}
    for info in sorted(pkgutil.iter_modules(commands.__path__), key=lambda m: m.name):
        if info.name.startswith("_"):
            continue
        module = importlib.import_module(f"{commands.__name__}.{info.name}")
        found[info.name.replace("_", "-")] = module
    return found


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="llds",
        description="Train LLM search agents with GRPO + LLDS and watch for likelihood collapse.",
    )
    parser.add_argument("--version", action="version", version=f"llds {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, module in _command_modules().items():
        p = sub.add_parser(name, help=module.HELP, description=module.HELP)
        module.add_arguments(p)
        p.set_defaults(_run=module.run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "_run", None):
        parser.print_help()
        return 2
    try:
        return int(args._run(args) or 0)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except UserInputError as exc:  # bad input named by the raiser: no traceback for the user
        print(f"llds {args.command}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
