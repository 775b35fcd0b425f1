"""Typed configs: nested dataclasses loaded from YAML, overridden by `dotted.key=value` pairs.

Every unknown key and every badly typed value is reported with its full dotted name, so a typo
in a 60-line YAML file is one line of error, not a traceback.
"""

from __future__ import annotations

import argparse
import dataclasses
import types
import typing
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

import yaml

from llds.errors import ConfigError

T = TypeVar("T")


@dataclasses.dataclass(frozen=True)
class Override:
    """A command-line value: parsed as YAML for typed fields, kept verbatim for string fields
    (so `data.prompt_template=Question: {question}` stays text, not a YAML mapping)."""

    raw: str
    parsed: Any


def parse_overrides(pairs: Sequence[str]) -> dict[str, Any]:
    """`["algo.llds.coef=0.3", "steps=10"]` -> nested dict of `Override` leaves."""
    nested: dict[str, Any] = {}
    for pair in pairs:
        if "=" not in pair:
            raise ConfigError(f"override {pair!r} is not of the form key=value")
        key, raw = pair.split("=", 1)
        key = key.strip()
        if not key or any(not part for part in key.split(".")):
            raise ConfigError(f"override {pair!r} has an empty key")
        try:
            parsed = yaml.safe_load(raw) if raw.strip() else ""
        except yaml.YAMLError:
            parsed = raw  # not YAML: only a string field can take it
        value = Override(raw, parsed)
        node = nested
        parts = key.split(".")
        for part in parts[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ConfigError(f"override {key}: {part} is set both as a value and a section")
        node[parts[-1]] = value
    return nested


def deep_merge(base: Mapping[str, Any], update: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in update.items():
        if isinstance(v, Mapping) and isinstance(out.get(k), Mapping):
            out[k] = deep_merge(out[k], v)
        else:
            out[k] = v
    return out


def merge_config(base: Mapping[str, Any], update: Mapping[str, Any], cls: type) -> dict[str, Any]:
    """`update` over `base` for config class `cls`: sections (dataclass fields) merge key by key,
    every other value, mappings included (`hop_mix: {1: 1}`), replaces the one below it."""
    hints = typing.get_type_hints(cls)
    out = dict(base)
    for key, value in update.items():
        tp = _without_none(hints[key]) if key in hints else None
        below = out.get(key)
        if (
            dataclasses.is_dataclass(tp)
            and isinstance(value, Mapping)
            and isinstance(below, Mapping)
        ):
            out[key] = merge_config(below, value, tp)  # type: ignore[arg-type]
        else:
            out[key] = value
    return out


BASE_KEY = "base"
PRESET_PACKAGE = "llds.configs"


def preset_names() -> list[str]:
    """The presets shipped inside the package (`llds/configs/*.yaml`), by name."""
    from importlib.resources import files

    return sorted(
        p.name.removesuffix(".yaml")
        for p in files(PRESET_PACKAGE).iterdir()
        if p.name.endswith(".yaml")
    )


def resolve_config(spec: str | Path, relative_to: Path | None = None) -> Path:
    """The YAML file a `--config` value or a `base:` entry names.

    A path (relative to `relative_to`, the including file's directory, for `base:`; to the
    working directory otherwise) wins; else a bare name such as `organism` is a shipped preset.
    """
    from importlib.resources import as_file, files

    path = Path(spec).expanduser()
    if not path.is_absolute() and relative_to is not None:
        path = relative_to / path
    if path.is_file():
        return path
    name = str(spec).removesuffix(".yaml")
    if "/" not in name and name in preset_names():
        with as_file(files(PRESET_PACKAGE) / f"{name}.yaml") as packaged:
            return Path(packaged)
    where = f" (relative to {relative_to})" if relative_to is not None else ""
    raise ConfigError(
        f"config file {path} does not exist{where}, and {str(spec)!r} is not a shipped preset "
        f"({', '.join(preset_names())})"
    )


def _read_one(p: Path) -> dict[str, Any]:
    try:
        data = yaml.safe_load(p.read_text(encoding="utf-8")) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"config file {p} is not valid YAML: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigError(
            f"config file {p}: top level must be a mapping, got {type(data).__name__}"
        )
    return data


def read_yaml(
    path: str | Path, cls: type | None = None, _chain: tuple[Path, ...] = ()
) -> dict[str, Any]:
    """A config file with its `base:` chain merged in: the file's keys override its base's
    (`merge_config` for config class `cls`; a type-blind deep merge without one).

    `base:` is a path relative to the file (or a shipped preset's name); bases may have bases.
    A cycle is an error that names every file in it.
    """
    p = resolve_config(path) if not _chain else Path(path)
    if not p.is_file():
        raise ConfigError(f"config file {p} does not exist")
    key = p.resolve()
    if key in _chain:
        cycle = " -> ".join(str(c) for c in (*_chain, key))
        raise ConfigError(f"config files include each other through base: {cycle}")
    data = _read_one(p)
    base = data.pop(BASE_KEY, None)
    if base is None:
        return data
    if not isinstance(base, str) or not base.strip():
        raise ConfigError(f"config file {p}: {BASE_KEY} must be a file path or a preset name")
    parent = read_yaml(resolve_config(base, relative_to=p.parent), cls, (*_chain, key))
    return merge_config(parent, data, cls) if cls is not None else deep_merge(parent, data)


def from_dict(cls: type[T], data: Mapping[str, Any], prefix: str = "") -> T:
    """Build dataclass `cls` from `data`, checking every key and value type recursively."""
    if not isinstance(data, Mapping):
        raise ConfigError(f"{prefix or 'config'}: expected a mapping, got {data!r}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    kwargs: dict[str, Any] = {}
    for key, value in data.items():
        dotted = f"{prefix}{key}"
        if key not in fields:
            close = [n for n in fields if n.startswith(str(key)[:3])]
            hint = f" (did you mean {', '.join(close)}?)" if close else ""
            raise ConfigError(
                f"unknown config key {dotted!r}{hint}; valid keys here: {', '.join(fields)}"
            )
        kwargs[key] = _coerce(hints[key], value, dotted)
    return cls(**kwargs)


def _coerce(tp: Any, value: Any, dotted: str) -> Any:
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if isinstance(value, Override):
        wants_str = tp is str or (str in args and value.parsed is not None)
        value = value.raw if wants_str else value.parsed
    if dataclasses.is_dataclass(tp):
        return from_dict(tp, value or {}, prefix=f"{dotted}.")
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _coerce(arg, value, dotted)
            except ConfigError:
                continue
        raise ConfigError(f"{dotted}: {value!r} does not match {_name(tp)}")
    if origin is typing.Literal:
        if value not in args:
            raise ConfigError(f"{dotted}: {value!r} is not one of {list(args)}")
        return value
    if origin in (list, tuple, Sequence):
        if not isinstance(value, list | tuple):
            raise ConfigError(f"{dotted}: expected a list, got {value!r}")
        inner = args[0] if args else Any
        items = [_coerce(inner, v, f"{dotted}[{i}]") for i, v in enumerate(value)]
        return tuple(items) if origin is tuple else items
    if origin in (dict, Mapping):
        if not isinstance(value, Mapping):
            raise ConfigError(f"{dotted}: expected a mapping, got {value!r}")
        if not args:
            return dict(value)
        key_type, value_type = args
        out = {}
        for k, v in value.items():
            where = f"{dotted}[{k!r}]"
            key = _coerce(key_type, _int_key(k) if key_type is int else k, where)
            out[key] = _coerce(value_type, v, where)
        return out
    if tp is Any:
        return value
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{dotted}: expected true/false, got {value!r}")
        return value
    if tp is float:
        if isinstance(value, str):  # YAML 1.1 reads `1e-4` (no dot) as a string
            try:
                return float(value)
            except ValueError:
                pass
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ConfigError(f"{dotted}: expected a number, got {value!r}")
        return float(value)
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{dotted}: expected an integer, got {value!r}")
        return value
    if tp is str:
        if not isinstance(value, str | int | float) or isinstance(value, bool):
            raise ConfigError(f"{dotted}: expected a string, got {value!r}")
        return str(value)
    return value


def _int_key(key: Any) -> Any:
    """JSON object keys are strings: `"2"` is the integer key 2."""
    if isinstance(key, str) and key.strip().lstrip("-").isdigit():
        return int(key)
    return key


def _name(tp: Any) -> str:
    return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")


def to_dict(obj: Any) -> Any:
    """Plain-data view of a config (for YAML dumps and run metadata)."""
    if dataclasses.is_dataclass(obj):
        return {f.name: to_dict(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, list | tuple):
        return [to_dict(v) for v in obj]
    if isinstance(obj, dict):
        return {k: to_dict(v) for k, v in obj.items()}
    return obj


def config_changes(
    old: Mapping[str, Any], new: Mapping[str, Any], prefix: str = ""
) -> list[tuple[str, Any, Any]]:
    """`(dotted key, old value, new value)` for every leaf of `new` whose value differs in `old`.

    Sections present in both are compared key by key; any other value (a list, a section set
    to null on one side) is one leaf. Keys only in `old` are left out: a key no longer in the
    schema cannot be set, so it cannot have been changed."""
    out: list[tuple[str, Any, Any]] = []
    for key, value in new.items():
        dotted = f"{prefix}{key}"
        before = old.get(key)
        if isinstance(value, Mapping) and isinstance(before, Mapping):
            out.extend(config_changes(before, value, f"{dotted}."))
        elif key not in old or before != value:
            out.append((dotted, before, value))
    return out


def dotted_keys(data: Mapping[str, Any], prefix: str = "") -> set[str]:
    """Every section and leaf of a nested config dict by its dotted name."""
    keys: set[str] = set()
    for key, value in data.items():
        dotted = f"{prefix}{key}"
        keys.add(dotted)
        if isinstance(value, Mapping):
            keys |= dotted_keys(value, f"{dotted}.")
    return keys


def _without_none(tp: Any) -> Any:
    """`int | None` -> `int` (the type a command-line value must have)."""
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        return args[0] if len(args) == 1 else tp
    return tp


def add_dataclass_arguments(
    parser: argparse.ArgumentParser | argparse._ArgumentGroup,
    cls: type,
    *,
    skip: Sequence[str] = (),
    required: Sequence[str] = (),
) -> None:
    """One `--flag` per field of the flat dataclass `cls`, named, typed and documented by it.

    Flags default to None, so that only the flags a user gives override the config file and the
    dataclass defaults (see `given_arguments`); the help shows the dataclass default. Booleans
    get `--x / --no-x`, Literal fields their choices, lists and tuples several values.
    `metadata={"help": ...}` documents a field; `metadata={"parse": f}` parses its flag's text
    (for a field, such as a mapping, with a compact command-line form).
    """
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if f.name in skip:
            continue
        tp = _without_none(hints[f.name])
        default = f.default if f.default is not dataclasses.MISSING else None
        if f.default_factory is not dataclasses.MISSING:
            default = f.default_factory()
        text = f.metadata.get("help", "")
        help_text = f"{text} ({default})" if text else f"({default})"
        kwargs: dict[str, Any] = {"dest": f.name, "default": None, "help": help_text}
        if "parse" in f.metadata:
            kwargs["type"] = _flag_parser(f.metadata["parse"])
        elif tp is bool:
            kwargs["action"] = argparse.BooleanOptionalAction
        elif typing.get_origin(tp) in (list, tuple):
            kwargs["nargs"] = "+"
            kwargs["type"] = (typing.get_args(tp) or (str,))[0]
        elif typing.get_origin(tp) is typing.Literal:
            kwargs["choices"] = list(typing.get_args(tp))
        elif tp in (int, float, str):
            kwargs["type"] = tp
        if f.name in required:
            kwargs["required"] = True
        parser.add_argument("--" + f.name.replace("_", "-"), **kwargs)


def _flag_parser(parse: Any) -> Any:
    """`parse` with its error message shown by argparse as is (`argument --x: <message>`)."""

    def parse_flag(text: str) -> Any:
        try:
            return parse(text)
        except (ValueError, ConfigError) as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    return parse_flag


def given_arguments(args: argparse.Namespace, cls: type) -> dict[str, Any]:
    """The fields of `cls` that were given on the command line (not None)."""
    names = {f.name for f in dataclasses.fields(cls)}
    return {k: v for k, v in vars(args).items() if k in names and v is not None}
