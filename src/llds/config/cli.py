"""The command line of every config-driven command, one dialect for all of them:

    llds COMMAND [--config NAME|FILE] [KEY=VALUE ...] [--print-config] [aliases] [action flags]

`--config` names a YAML file or a shipped preset; each positional `KEY=VALUE` overrides one
dotted key; `--print-config` prints the resolved config as YAML and exits. A few short flags
(`--model`, `--data`, `--retriever`, `--out`, ...) are aliases of config keys; giving an alias
and an override of the same key is an error. `--help` lists every key with its help.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import os
import re
import typing
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from llds.config import reference
from llds.config.loader import (
    COMMAND_LINE,
    Override,
    load,
    parse_override,
    split_override,
    to_yaml,
)
from llds.config.types import field_type, without_none
from llds.errors import ConfigError

OVERRIDE = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*=")
"""A positional token is an override when the text before its first `=` is a dotted name."""

Loader = Callable[[str | Path | None, Mapping[str, Any]], Any]
"""`load(config file or preset, overrides) -> config`, e.g. `llds.train.config.load_config`."""


@dataclasses.dataclass(frozen=True)
class CommandConfig:
    """How one command reads its config from the command line."""

    cls: type
    load: Loader
    aliases: Mapping[str, str]
    """`{"--model": "model.path", "--no-progress": "progress=false"}`: short flags and the key
    each sets (to the flag's value, or to the value written after `=`)"""
    rest: str | None
    """the key that takes the positional tokens that are not overrides (`llds report`'s run
    directories); None: such a token is an error"""


def add_config_arguments(
    parser: argparse.ArgumentParser,
    cls: type,
    *,
    load: Loader | None = None,
    aliases: Mapping[str, str] | None = None,
    rest: str | None = None,
    rest_help: str = "",
) -> None:
    """`--config`, `KEY=VALUE` overrides, `--print-config` and `aliases` for config class `cls`;
    `--help` lists every key of `cls` with its type, default and help."""
    aliases = dict(aliases or {})
    parser.add_argument(
        "--config",
        metavar="NAME|FILE",
        action=_OneConfig,
        help="a YAML config file, or a shipped preset by name (see docs/configuration.md); "
        "once (a file may build on another with `base:`)",
    )
    what = f"KEY=VALUE overrides of config keys{rest_help}"
    parser.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help=what)
    parser.add_argument(
        "--print-config",
        action="store_true",
        help="print the resolved config as YAML and exit (loads no model and no data)",
    )
    for flag, key in aliases.items():
        parser.add_argument(flag, dest=_dest(key), **_alias_kwargs(cls, key))
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.epilog = reference.text(cls)
    parser.set_defaults(
        _config=CommandConfig(cls, load or _plain_loader(cls), aliases, rest),
    )


class _OneConfig(argparse.Action):
    """`--config` given twice is remembered, so that `command_config` refuses it by name
    (argparse would silently keep the second)."""

    def __call__(self, parser: Any, namespace: Any, values: Any, option: Any = None) -> None:
        given = getattr(namespace, "_configs", None) or []
        namespace._configs = [*given, values]
        setattr(namespace, self.dest, values)


def command_config(args: argparse.Namespace) -> Any:
    """The config the command line describes: the `--config` file, then the overrides and
    aliases (an alias and an override of the same key: an error naming both; `--config` given
    twice: an error naming both files)."""
    spec: CommandConfig = args._config
    configs = getattr(args, "_configs", None) or []
    if len(configs) > 1:
        raise ConfigError(
            f"{COMMAND_LINE}: --config given {len(configs)} times ({', '.join(configs)}); give "
            f"one, and let it build on another with `base: {configs[0]}`"
        )
    given: dict[str, Override] = {}
    rest: list[str] = []
    for token in args.overrides:
        if OVERRIDE.match(token):
            key, raw = split_override(token)
            given[key] = parse_override(raw)
        elif spec.rest is not None:
            rest.append(token)
        else:
            raise ConfigError(
                f"{COMMAND_LINE}: {token!r} is not a KEY=VALUE override (a dotted key, `=`, "
                "its value)"
            )
    if rest:
        _set_once(given, spec.rest or "", Override(" ".join(rest), rest), "positional values")
    for flag, target in spec.aliases.items():
        value = getattr(args, _dest(target), None)
        if value is not None:
            key = target.split("=", 1)[0]
            _set_once(given, key, _alias_value(value), flag)
    return spec.load(args.config, given)


def existing_paths(cfg: Any, skip: Sequence[str] = (), prefix: str = "") -> list[tuple[str, str]]:
    """`(dotted key, value)` of each text value of a config (lists included) that names a file
    or folder on disk, but the keys in `skip` (the command's outputs): what the command may
    read, so that no output is allowed to replace it."""
    found: list[tuple[str, str]] = []
    if not dataclasses.is_dataclass(cfg):
        return found
    for f in dataclasses.fields(cfg):
        key = f"{prefix}{f.name}"
        value = getattr(cfg, f.name)
        if key in skip:
            continue
        if dataclasses.is_dataclass(value):
            found += existing_paths(value, skip, f"{key}.")
            continue
        values = value if isinstance(value, list | tuple) else [value]
        for i, item in enumerate(values):
            if isinstance(item, str) and item and "://" not in item and _exists(item):
                found.append((key if item is value else f"{key}[{i}]", item))
    return found


def threads_warning(cfg: Any) -> str | None:
    """A warning for a config's `threads` above the CPU cores this process may run on (the
    affinity mask: a container's or a batch job's share, not the machine's): threads past the
    cores make every step slower, not faster. None when it fits or is not set."""
    threads = getattr(cfg, "threads", None)
    if not isinstance(threads, int):
        return None
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    if cores is None or threads <= cores:
        return None
    return (
        f"threads={threads} is more than the {cores} CPU core(s) this process may use; threads "
        f"past the cores make each step slower, not faster (threads={cores} or fewer)"
    )


def _exists(text: str) -> bool:
    try:
        return Path(text).expanduser().exists()
    except (OSError, ValueError):  # a text too long for a path, or with a NUL byte
        return False


def print_config(cfg: Any, absent: Sequence[tuple[str, str]] = ()) -> None:
    """What `--print-config` shows: the config as YAML (a file `--config` reads back), then a
    comment for each required key still to set (`absent`: `(key, why)`)."""
    print(to_yaml(cfg), end="")
    for key, why in absent:
        print(f"# not set yet: {key}: {why}")


def _set_once(given: dict[str, Override], key: str, value: Override, flag: str) -> None:
    if key in given:
        raise ConfigError(f"{COMMAND_LINE}: {key}: given twice ({flag} and {key}=...); give one")
    given[key] = value


def _alias_value(value: Any) -> Override:
    if value is True:
        return Override("true", True)
    if isinstance(value, list):
        return Override(" ".join(value), list(value))
    return parse_override(value)


def _alias_kwargs(cls: type, target: str) -> dict[str, Any]:
    """How a flag takes its value: `KEY=VALUE` targets are switches that set that value; a
    boolean key's flag is a switch that sets true; a list key's flag may be repeated."""
    key, fixed, value = target.partition("=")
    tp = field_type(cls, key.split("."))
    if tp is None:
        raise ValueError(f"alias of {key}: not a key of {cls.__name__}")
    if fixed:
        return {
            "action": "store_const",
            "const": value,
            "default": None,
            "help": f"alias of {target}",
        }
    help_text = f"alias of {key}=VALUE"
    inner = without_none(tp)
    if inner is bool:
        return {"action": "store_true", "default": None, "help": f"alias of {key}=true"}
    if typing.get_origin(inner) is list:  # repeatable: --data a.jsonl --data b.jsonl
        return {"action": "append", "metavar": "VALUE", "help": f"{help_text} (repeatable)"}
    return {"metavar": "VALUE", "help": help_text}


def _dest(target: str) -> str:
    return "_alias_" + re.sub(r"\W", "_", target)


def _plain_loader(cls: type) -> Loader:
    def load_cls(path: str | Path | None, overrides: Mapping[str, Any]) -> Any:
        return load(cls, path, overrides)

    return load_cls


def resolve(spec: str) -> Any:
    """`"package.module:name"` -> that object."""
    module, _, name = spec.partition(":")
    return getattr(importlib.import_module(module), name)


def config_class(module: Any) -> type:
    """The config class a command module declares (`CONFIG`)."""
    return resolve(module.CONFIG)
