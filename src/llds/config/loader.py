"""Loading a config: YAML files with `base:` inheritance, then `dotted.key=value` overrides, then
pydantic's validation of the merged mapping against the config class.

The loader only reads and merges; types, choices, ranges and unknown keys are the config class's
business (`llds.config.schema`). It remembers which file or command line set each key, so an
error is one line naming both: `my.yaml: optim.lr: Input should be greater than 0, got -1.0`.
"""

from __future__ import annotations

import dataclasses
import functools
import json
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import TypeAdapter, ValidationError

from llds.config.schema import config_error, missing
from llds.config.types import field_type, section_type, takes_text, without_none
from llds.errors import ConfigError

T = TypeVar("T")

BASE_KEY = "base"
PRESET_PACKAGE = "llds.configs"
COMMAND_LINE = "command line"
"""The source named in errors about overrides given as `key=value` text."""
ARGUMENTS = "arguments"
"""The source named in errors about overrides given as a Python mapping."""

Overrides = Sequence[str] | Mapping[str, Any]
"""`["optim.lr=1e-5", "steps=10"]` (command-line text), `{"optim.lr": 1e-5}` (values), or
`{"optim.lr": Override(...)}` (command-line text already split, as `llds.config.cli` passes)."""


# ------------------------------------------------------------------------------ overrides


@dataclasses.dataclass(frozen=True)
class Override:
    """A command-line value: parsed as YAML for typed fields, kept verbatim for text fields
    (so `data.prompt_template=Question: {question}` stays text, not a YAML mapping)."""

    raw: str
    parsed: Any


class Sexagesimal(str):
    """A plain scalar such as `3:1` that YAML 1.1 reads as a base-60 number (181): kept as its
    text, so that a text key takes it as written and any other key names the trap."""

    def reading(self) -> int | float:
        """What YAML 1.1 makes of it."""
        digits = [float(part) for part in self.lstrip("+-").replace("_", "").split(":")]
        value: float = 0.0
        for digit in digits:
            value = value * 60 + digit
        sign = -1 if self.startswith("-") else 1
        return sign * (int(value) if value.is_integer() and "." not in self else value)


class _Yaml11Loader(yaml.SafeLoader):
    """YAML's safe loader, but base-60 numbers stay text (`Sexagesimal`)."""


def _number(loader: yaml.SafeLoader, node: yaml.ScalarNode) -> Any:
    text = loader.construct_scalar(node)
    if ":" in str(text):
        return Sexagesimal(text)
    if node.tag.endswith(":int"):
        return yaml.SafeLoader.construct_yaml_int(loader, node)
    return yaml.SafeLoader.construct_yaml_float(loader, node)


_Yaml11Loader.add_constructor("tag:yaml.org,2002:int", _number)
_Yaml11Loader.add_constructor("tag:yaml.org,2002:float", _number)


def _sexagesimal(data: Any, prefix: str = "") -> tuple[str, Sexagesimal] | None:
    """The dotted key and text of the first base-60 scalar in `data` (a key or a value)."""
    items = data.items() if isinstance(data, Mapping) else enumerate(data)
    for key, value in items:
        where = f"{prefix}[{key}]" if not isinstance(data, Mapping) else f"{prefix}{key}"
        if isinstance(key, Sexagesimal):
            return prefix.rstrip("."), key
        if isinstance(value, Sexagesimal):
            return where, value
        if isinstance(value, Mapping | list):
            inner = _sexagesimal(value, f"{where}." if isinstance(value, Mapping) else where)
            if inner is not None:
                return inner
    return None


def parse_override(raw: str) -> Override:
    """The text after `=`, with its YAML reading (the text itself when it is not YAML)."""
    try:
        parsed = yaml.load(raw, Loader=_Yaml11Loader) if raw.strip() else ""
    except yaml.YAMLError:
        parsed = raw  # not YAML: only a text field can take it
    return Override(raw, parsed)


def split_override(pair: str) -> tuple[str, str]:
    """`"algo.llds.coef=0.3"` -> `("algo.llds.coef", "0.3")`; the key must be dotted names."""
    if "=" not in pair:
        raise ConfigError(f"override {pair!r} is not of the form key=value")
    key, raw = pair.split("=", 1)
    key = key.strip()
    if not key or any(not part for part in key.split(".")):
        raise ConfigError(f"override {pair!r} has an empty key")
    return key, raw


def parse_overrides(pairs: Sequence[str]) -> dict[str, Any]:
    """`["algo.llds.coef=0.3", "steps=10"]` -> nested dict of `Override` leaves (a key given
    twice: the later wins)."""
    return nest({key: parse_override(raw) for key, raw in map(split_override, pairs)})


def nest(flat: Mapping[str, Any]) -> dict[str, Any]:
    """`{"a.b": 1, "c": 2}` -> `{"a": {"b": 1}, "c": 2}`."""
    nested: dict[str, Any] = {}
    for key, value in flat.items():
        node = nested
        parts = key.split(".")
        for part in parts[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ConfigError(f"override {key}: {part} is set both as a value and a section")
        if isinstance(node.get(parts[-1]), dict):
            raise ConfigError(f"override {key}: set both as a value and a section")
        node[parts[-1]] = value
    return nested


def plain_overrides(nested: Mapping[str, Any], cls: type, path: tuple[str, ...] = ()) -> dict:
    """`Override` leaves replaced by the value their field takes: the raw text for a text field
    (`null` still means None where None is allowed), the YAML reading otherwise."""
    out: dict[str, Any] = {}
    for key, value in nested.items():
        where = (*path, key)
        if isinstance(value, Override):
            tp = field_type(cls, where)
            text = tp is str or (takes_text(tp) and value.parsed is not None)
            out[key] = value.raw if text else value.parsed
        elif isinstance(value, Mapping):
            out[key] = plain_overrides(value, cls, where)
        else:
            out[key] = value
    return out


# ------------------------------------------------------------------------------ merging


def deep_merge(base: Mapping[str, Any], update: Mapping[str, Any]) -> dict[str, Any]:
    """`update` over `base`, every mapping merged key by key."""
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
    out = dict(base)
    for key, value in update.items():
        below = out.get(key)
        inner = section_type(cls, key)
        if inner is not None and isinstance(value, Mapping) and isinstance(below, Mapping):
            out[key] = merge_config(below, value, inner)
        else:
            out[key] = value
    return out


def leaf_keys(data: Mapping[str, Any], cls: type, prefix: str = "") -> list[str]:
    """The dotted keys a layer sets: into sections, not into other mappings."""
    keys: list[str] = []
    for key, value in data.items():
        inner = section_type(cls, str(key))
        if inner is not None and isinstance(value, Mapping) and value:
            keys += leaf_keys(value, inner, f"{prefix}{key}.")
        else:
            keys.append(f"{prefix}{key}")
    return keys


@dataclasses.dataclass
class Gathered:
    """A config's merged data and, for each key set, the file or command line that set it."""

    data: dict[str, Any] = dataclasses.field(default_factory=dict)
    origin: dict[str, str] = dataclasses.field(default_factory=dict)
    top: str | None = None
    """the `--config` file, named for keys no layer set (a required key left out)"""

    def source_of(self, key: str) -> str | None:
        """The source of `key`, else of the nearest section above it that a layer set, else of
        the last key set below it (`model.lora` named for `model.lora.r=4`)."""
        below = [src for k, src in self.origin.items() if k.startswith((f"{key}.", f"{key}["))]
        while key:
            if key in self.origin:
                return self.origin[key]
            cut = max(key.rfind("."), key.rfind("["))
            key = key[:cut] if cut > 0 else ""
        return below[-1] if below else self.top

    def add(
        self, source: str, layer: Mapping[str, Any], cls: type, exclusive: Sequence[Sequence[str]]
    ) -> None:
        """Merge `layer` over what is there. Of each group of `exclusive` top-level keys, one
        set by this layer unsets the others set below (`steps` replaces `epochs`)."""
        layer = dict(layer)
        for group in exclusive:
            if any(k in layer for k in group):
                layer.update({k: None for k in group if k not in layer})
        self.data = merge_config(self.data, layer, cls)
        for key in leaf_keys(layer, cls):
            below = (f"{key}.", f"{key}[")
            self.origin = {k: v for k, v in self.origin.items() if not k.startswith(below)}
            self.origin[key] = source


# ------------------------------------------------------------------------------ files


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
    if path.is_dir():
        raise ConfigError(f"config file {path} is a directory; give a YAML file or a preset name")
    name = str(spec).removesuffix(".yaml")
    if "/" not in name and name in preset_names():
        with as_file(files(PRESET_PACKAGE) / f"{name}.yaml") as packaged:
            return Path(packaged)
    where = f" (relative to {relative_to})" if relative_to is not None else ""
    raise ConfigError(
        f"config file {path} does not exist{where}, and {str(spec)!r} is not a shipped preset "
        f"({', '.join(preset_names())})"
    )


def source_name(path: Path) -> str:
    """How errors name a config file: a shipped preset as `llds/configs/NAME.yaml`."""
    if path.parent.name == "configs" and path.parent.parent.name == "llds":
        return f"llds/configs/{path.name}"
    return str(path)


class _DuplicateKey(Exception):
    def __init__(self, key: Any, line: int) -> None:
        super().__init__(f"line {line}: key {key!r} appears twice in one mapping")


class _UniqueKeyLoader(_Yaml11Loader):
    """YAML's safe loader, refusing a mapping that repeats a key (plain YAML keeps the last)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=True)
            try:
                repeated = key in seen
            except TypeError:  # an unhashable key: YAML itself refuses it below
                continue
            if repeated:
                raise _DuplicateKey(key, key_node.start_mark.line + 1)
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def _read_one(p: Path) -> dict[str, Any]:
    name = source_name(p)
    try:
        data = yaml.load(p.read_text(encoding="utf-8"), Loader=_UniqueKeyLoader) or {}
    except _DuplicateKey as exc:
        raise ConfigError(f"{name}: {exc}") from None
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark else ""
        raise ConfigError(f"{name}: not valid YAML: {exc.problem}{where}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{name}: not valid YAML: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{name}: the top level must be a mapping, got {type(data).__name__}")
    return data


def read_layers(path: str | Path, _chain: tuple[Path, ...] = ()) -> list[tuple[str, dict]]:
    """`(file name, its keys)` of a config file and its `base:` chain, deepest base first.

    `base:` is a path relative to the file (or a shipped preset's name); bases may have bases.
    A cycle is an error that names every file in it."""
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
        return [(source_name(p), data)]
    if not isinstance(base, str) or not base.strip():
        raise ConfigError(f"{source_name(p)}: {BASE_KEY} must be a file path or a preset name")
    below = read_layers(resolve_config(base, relative_to=p.parent), (*_chain, key))
    return [*below, (source_name(p), data)]


def read_yaml(path: str | Path, cls: type | None = None) -> dict[str, Any]:
    """A config file with its `base:` chain merged in: the file's keys override its base's
    (`merge_config` for config class `cls`; a type-blind deep merge without one)."""
    out: dict[str, Any] = {}
    for _, data in read_layers(path):
        out = merge_config(out, data, cls) if cls is not None else deep_merge(out, data)
    return out


# ------------------------------------------------------------------------------ loading


def gather(
    cls: type,
    config: str | Path | None = None,
    overrides: Overrides = (),
    *,
    exclusive: Sequence[Sequence[str]] = (),
) -> Gathered:
    """The config file's layers, then the overrides, merged for `cls` with each key's source."""
    got = Gathered()
    if config:
        layers = read_layers(config)
        got.top = layers[-1][0]
        for source, data in layers:
            got.add(source, data, cls, exclusive)
    if isinstance(overrides, Mapping):
        typed = any(isinstance(v, Override) for v in overrides.values())
        source = COMMAND_LINE if typed else ARGUMENTS
        got.add(source, plain_overrides(nest(overrides), cls), cls, exclusive)
    elif overrides:
        if isinstance(overrides, str):
            raise TypeError("overrides: a list of key=value strings, not one string")
        got.add(COMMAND_LINE, plain_overrides(parse_overrides(overrides), cls), cls, exclusive)
    return got


_COLLECT_MISSING: ContextVar[list[tuple[str, str]] | None] = ContextVar(
    "collect_missing", default=None
)


@contextmanager
def collecting_missing() -> Iterator[list[tuple[str, str]]]:
    """Inside, a config with required keys left empty is built anyway and those keys are
    collected (`--print-config` shows what it has, the empty keys marked) instead of refused."""
    found: list[tuple[str, str]] = []
    token = _COLLECT_MISSING.set(found)
    try:
        yield found
    finally:
        _COLLECT_MISSING.reset(token)


def mixed_scalars(cls: type, data: Any, prefix: str = "") -> list[tuple[str, str]]:
    """`(dotted key, why)` of each value that pydantic's lax mode would take for the wrong kind
    of scalar: `true` for a number (`steps=true` would be 1), a number for a switch
    (`algo.llds.enabled=1`). Strings are left to the types' own parsing."""
    out: list[tuple[str, str]] = []
    if not isinstance(data, Mapping) or not dataclasses.is_dataclass(cls):
        return out
    for name, value in data.items():
        key = f"{prefix}{name}"
        section = section_type(cls, name)
        if section is not None:
            out += mixed_scalars(section, value, key + ".")
            continue
        tp = field_type(cls, [name])
        if tp is None:
            continue
        tp = without_none(tp)
        if tp in (int, float) and isinstance(value, bool):
            out.append((key, f"Input should be a number, got {str(value).lower()}"))
        elif tp is bool and isinstance(value, int | float) and not isinstance(value, bool):
            out.append((key, f"Input should be true or false, got {value}"))
    return out


def build(cls: type[T], got: Gathered) -> T:
    """Validate gathered data into `cls` and refuse a required key left empty; the first
    failure is one line naming the key and the file or command line that set it."""
    for key, why in mixed_scalars(cls, got.data):
        source = got.source_of(key)
        raise ConfigError(f"{source}: {key}: {why}" if source else f"{key}: {why}")
    try:
        cfg = _adapter(cls).validate_python(got.data)
    except ValidationError as exc:
        trap = _sexagesimal(got.data)
        if trap is not None:  # YAML 1.1 would have read it as a number: name why it fails
            key, text = trap
            source = got.source_of(key)
            raise ConfigError(
                f"{f'{source}: ' if source else ''}{key}: {text!r} is what YAML 1.1 reads as "
                f"the base-60 number {text.reading()}; for a mapping write a space after the "
                f"colon ({{{text.replace(':', ': ')}}}), for text quote it"
            ) from None
        raise config_error(exc, cls, source_of=got.source_of) from None
    collected = _COLLECT_MISSING.get()
    for key, why in missing(cfg):
        if collected is not None:
            collected.append((key, why))
            continue
        source = got.source_of(key)
        raise ConfigError(f"{source}: {key}: {why}" if source else f"{key}: {why}")
    return cfg


def load(
    cls: type[T],
    config: str | Path | None = None,
    overrides: Overrides = (),
    *,
    exclusive: Sequence[Sequence[str]] = (),
) -> T:
    """`cls` from a YAML file or preset name (`base:` allowed) and overrides, which win."""
    return build(cls, gather(cls, config, overrides, exclusive=exclusive))


def validate(cls: type[T], data: Any, source: str | None = None) -> T:
    """`cls` from a plain mapping (a saved config), errors naming `source` and the key."""
    if not isinstance(data, Mapping):
        where = f"{source}: " if source else ""
        raise ConfigError(f"{where}expected a mapping of config keys, got {type(data).__name__}")
    return build(cls, Gathered(data=dict(data), top=source))


@functools.cache
def _adapter(cls: type) -> TypeAdapter[Any]:
    return TypeAdapter(cls)


# ------------------------------------------------------------------------------ views


def to_dict(obj: Any) -> Any:
    """Plain-data view of a config (for YAML dumps and run metadata)."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: to_dict(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, list | tuple):
        return [to_dict(v) for v in obj]
    if isinstance(obj, dict):
        return {k: to_dict(v) for k, v in obj.items()}
    return obj


def to_yaml(obj: Any) -> str:
    """A config as YAML, in the form JSON would store it (mapping keys as text): what
    `--print-config` prints, and a file `--config` reads back to the same config."""
    return yaml.safe_dump(json.loads(json.dumps(to_dict(obj))), sort_keys=False)


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
