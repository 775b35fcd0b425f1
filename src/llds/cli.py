"""The single `llds` command.

Subcommands live in `llds.commands.<name>` modules, discovered at start-up, so a new subcommand
is one new module. Each exposes `HELP` (one line) and declares its settings:

    CONFIG = "llds.evaluation.evaluate:EvalConfig"   # the config class
    ALIASES = {"--model": "model"}                    # short flags of config keys
    LOAD = "module:function"                          # optional: its loader (default: plain)
    REST = ("runs", "...")                            # optional: the key of positional tokens
    def add_arguments(parser): ...                    # optional: flags that are actions
    def run(cfg, args) -> int: ...                    # the one library call

This module gives every such command `--config NAME|FILE`, `KEY=VALUE` overrides and
`--print-config` (which prints the resolved config and returns before `run`). Only the chosen
command's arguments are built (its config class may import torch), and modules keep heavy work
inside `run`, so `llds --help` stays instant.
"""

from __future__ import annotations

import argparse
import importlib
import pkgutil
import signal
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

from llds import __version__, commands
from llds.config.cli import (
    add_config_arguments,
    command_config,
    config_class,
    existing_paths,
    print_config,
    resolve,
    threads_warning,
)
from llds.config.loader import collecting_missing
from llds.errors import UserInputError
from llds.io import NO_SPACE, check_directory_target, check_output, write_failure


def _command_modules() -> dict[str, ModuleType]:
    found: dict[str, ModuleType] = {}
    for info in sorted(pkgutil.iter_modules(commands.__path__), key=lambda m: m.name):
        if info.name.startswith("_"):
            continue
        module = importlib.import_module(f"{commands.__name__}.{info.name}")
        found[info.name.replace("_", "-")] = module
    return found


def build_parser() -> argparse.ArgumentParser:
    """The top-level `llds` parser: `--version`, `--help` and the commands' one-line help (a
    command's own arguments are built by `command_parser`, for that command only, so no command
    imports another's config)."""
    parser = argparse.ArgumentParser(
        prog="llds",
        description="Train LLM search agents with GRPO + LLDS and watch for likelihood collapse.",
    )
    parser.add_argument("--version", action="version", version=f"llds {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, module in _command_modules().items():
        sub.add_parser(name, help=module.HELP, description=module.HELP)
    return parser


def command_parser(name: str, module: ModuleType) -> argparse.ArgumentParser:
    """One subcommand's parser on its own."""
    p = argparse.ArgumentParser(prog=f"llds {name}", description=module.HELP)
    rest, rest_help = getattr(module, "REST", (None, ""))
    add_config_arguments(
        p,
        config_class(module),
        load=resolve(module.LOAD) if hasattr(module, "LOAD") else None,
        aliases=getattr(module, "ALIASES", {}),
        rest=rest,
        rest_help=rest_help,
    )
    if hasattr(module, "add_arguments"):
        module.add_arguments(p)
    if _outputs(module):
        p.add_argument(
            "--overwrite",
            action="store_true",
            help="write into an output folder that holds other files, or is the working "
            "directory (an output that holds an input the command reads is always refused)",
        )
    p.set_defaults(_module=module, command=name)
    return p


def run_command(args: argparse.Namespace) -> int:
    """The config the command line describes, printed (`--print-config`) or run."""
    if args.print_config:  # what it has: required keys not set yet are shown, not refused
        with collecting_missing() as absent:
            cfg = command_config(args)
        print_config(cfg, absent)
        return 0
    cfg = command_config(args)
    module = args._module
    keys = getattr(module, "OUTPUT_DIRS", ())
    outputs = [_field(cfg, key) for key in keys]
    for key, path in zip(keys, outputs, strict=True):
        check_directory_target(key, path)  # before any work starts
    read = existing_paths(cfg, _outputs(module))
    if args.config and Path(args.config).is_file():
        read.append(("--config", args.config))
    for key in _outputs(module):
        check_output(
            key,
            _field(cfg, key),
            inputs=read,
            owns=getattr(module, "OUTPUT_OWNS", ()),
            overwrite=getattr(args, "overwrite", False),
            command=f"llds {args.command}",
            folder=key in keys,
        )
    warning = threads_warning(cfg)
    if warning:
        print(f"llds {args.command}: warning: {warning}", file=sys.stderr)
    new = [Path(p) for p in outputs if p not in (None, "") and not Path(p).exists()]
    try:
        return int(args._module.run(cfg, args) or 0)
    except BaseException:
        for path in new:  # an output directory this command made and left empty goes
            if path.is_dir() and not any(path.iterdir()):
                path.rmdir()
        raise


def _outputs(module: ModuleType) -> tuple[str, ...]:
    """The keys of what a command writes: its folders (`OUTPUT_DIRS`) and files
    (`OUTPUT_FILES`), each claimed by `check_output` before the command runs."""
    return (*getattr(module, "OUTPUT_DIRS", ()), *getattr(module, "OUTPUT_FILES", ()))


def _subcommand(name: str, module: ModuleType, rest: list[str]) -> tuple[str, Any, list[str]]:
    """`llds monitor replay ...`: a command module with `SUBCOMMANDS` (word -> a namespace
    declared like a command module) dispatches on its first word; without one, its words are
    listed and the module is None."""
    subs = getattr(module, "SUBCOMMANDS", None)
    if subs is None:
        return name, module, rest
    if rest and rest[0] in subs:
        return f"{name} {rest[0]}", subs[rest[0]], rest[1:]
    words = "\n".join(f"  {word:<8} {sub.HELP}" for word, sub in subs.items())
    help_asked = rest[:1] in (["-h"], ["--help"])
    print(
        f"usage: llds {name} {{{','.join(subs)}}} ...\n\n{module.HELP}\n\n{words}",
        file=sys.stdout if help_asked else sys.stderr,
    )
    return name, None, rest


def _field(cfg: object, key: str) -> object:
    """The value of a dotted key of a config (`out`, `run_dir`)."""
    for part in key.split("."):
        cfg = getattr(cfg, part)
    return cfg


class Terminated(KeyboardInterrupt):
    """SIGTERM (Slurm's preemption, `docker stop`, `kill`): the command stops the way Ctrl-C
    stops it, every `finally` and lock release run, and the run resumes from its last
    checkpoint."""


def _terminate(signum: int, frame: object) -> None:
    raise Terminated


def main(argv: Sequence[str] | None = None) -> int:
    if threading.current_thread() is not threading.main_thread():
        return _main(argv)
    previous = signal.signal(signal.SIGTERM, _terminate)
    try:
        return _main(argv)
    finally:
        signal.signal(signal.SIGTERM, previous)


def _main(argv: Sequence[str] | None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    modules = _command_modules()
    if argv and argv[0] in modules:
        name, module, rest = _subcommand(argv[0], modules[argv[0]], argv[1:])
        if module is None:  # `llds monitor` without one of its words: they were listed
            return 0 if rest[:1] in (["-h"], ["--help"]) else 2
        # options and KEY=VALUE overrides may come in any order: `llds report a b --out o c=d`
        args = command_parser(name, module).parse_intermixed_args(rest)
    else:  # no command first: --version, --help, a misspelt command, or nothing
        parser = build_parser()
        parser.parse_args(argv)
        parser.print_help()
        return 2
    try:
        return run_command(args)
    except KeyboardInterrupt as exc:
        terminated = isinstance(exc, Terminated)
        print("terminated (SIGTERM)" if terminated else "interrupted", file=sys.stderr)
        return 143 if terminated else 130
    except UserInputError as exc:  # bad input named by the raiser: no traceback for the user
        print(f"llds {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except Exception as exc:  # a write that failed where no writer of ours named it
        why = write_failure(exc)
        if why is None:
            raise
        where = getattr(exc, "filename", None)
        fix = "free space" if why == NO_SPACE else "make it writable (or choose another folder)"
        print(
            f"llds {args.command}: error: a write failed ({why}{f': {where}' if where else ''}); "
            f"{fix}, then run the same command",
            file=sys.stderr,
        )
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
