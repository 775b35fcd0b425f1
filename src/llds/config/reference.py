"""Every key of a config class with its type, default, range and help, for `--help` and for
docs/configuration.md: generated from the classes, so the manual cannot drift from the code.

The help of a key is its attribute docstring (`use_attribute_docstrings`), the one way help is
written in this project.
"""

from __future__ import annotations

import dataclasses
import json
import textwrap
import types
import typing
from collections.abc import Iterator
from typing import Any

from llds.config.types import hints, section_type


@dataclasses.dataclass(frozen=True)
class KeyDoc:
    """One documented key of a config class."""

    key: str
    """its dotted name"""
    type: str
    """its type as a reader writes it: `int`, `float | null`, `a | b`"""
    default: str
    """its default in YAML/JSON form (`""`, `null`, `[0.9, 0.999]`)"""
    help: str
    """its docstring, on one line, with its range appended (`>= 1`, `in (0, 1]`)"""


def sections(cls: type, prefix: str = "") -> Iterator[tuple[str, type]]:
    """`(dotted name, class)` of `cls` and of every section below it, depth first."""
    yield prefix, cls
    for f in dataclasses.fields(cls):
        inner = section_type(cls, f.name)
        if inner is not None:
            yield from sections(inner, f"{prefix}{f.name}.")


def keys(cls: type, prefix: str = "") -> list[KeyDoc]:
    """The leaf keys of `cls` itself, in declaration order; a section that may be null is a
    key too (`model.lora`), its keys are listed under it."""
    infos = getattr(cls, "__pydantic_fields__", {})
    out = []
    for f in dataclasses.fields(cls):
        inner = section_type(cls, f.name)
        if inner is not None and inner is hints(cls)[f.name]:
            continue  # a section that is always there: its keys are listed under it
        info = infos.get(f.name)
        text = " ".join(_description(cls, f.name).split())
        limits = _limits(info)
        if limits:
            text = f"{text} ({limits})" if text else limits
        out.append(
            KeyDoc(f"{prefix}{f.name}", type_name(hints(cls)[f.name]), _default(f, info), text)
        )
    return out


def all_keys(cls: type) -> list[KeyDoc]:
    """Every leaf key of `cls` and its sections, by dotted name."""
    return [doc for prefix, c in sections(cls) for doc in keys(c, prefix)]


def type_name(tp: Any) -> str:
    """A type as a YAML writer reads it: `int | null`, `'a' | 'b'`, `list of str`."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if tp is type(None):
        return "null"
    if origin is typing.Literal:
        return " | ".join(str(a) for a in args)
    if origin in (typing.Union, types.UnionType):
        return " | ".join(type_name(a) for a in args)
    if origin in (list, tuple) and args:
        if origin is tuple and (len(args) != 2 or args[1] is not Ellipsis):
            return "[" + ", ".join(type_name(a) for a in args) + "]"
        return f"list of {type_name(args[0])}"
    if origin is dict and args:
        return f"{{{type_name(args[0])}: {type_name(args[1])}}}"
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        return "section"
    return getattr(tp, "__name__", str(tp))


def markdown(cls: type, title: str) -> str:
    """A reference of every key of `cls`: one table per section."""
    lines = [f"### {title}", ""]
    doc = _first_paragraph(cls)
    if doc:
        lines += [doc, ""]
    for prefix, c in sections(cls):
        rows = keys(c, prefix)
        if not rows:
            continue
        if prefix:
            lines += [f"**`{prefix.rstrip('.')}`**: {_first_paragraph(c)}", ""]
        lines += ["| key | type | default | help |", "|---|---|---|---|"]
        for r in rows:
            cells = (f"`{r.key}`", _cell(r.type), f"`{r.default}`", _cell(r.help))
            lines.append("| " + " | ".join(cells) + " |")
        lines.append("")
    return "\n".join(lines)


def text(cls: type) -> str:
    """The same reference as plain text, for `--help`."""
    lines = ["keys (set them in the --config file or as KEY=VALUE):"]
    for r in all_keys(cls):
        lines.append(f"  {r.key} ({r.type}; default {r.default})")
        if r.help:
            lines += textwrap.wrap(
                r.help,
                width=96,
                initial_indent=" " * 6,
                subsequent_indent=" " * 6,
                break_on_hyphens=False,  # "first-order" stays one word in the help
            )
    return "\n".join(lines)


def _description(cls: type, name: str) -> str:
    """A field's docstring; a subclass's copy of an inherited field has none, its base's has."""
    for klass in cls.__mro__:
        info = getattr(klass, "__pydantic_fields__", {}).get(name)
        if info is not None and info.description:
            return str(info.description)
    return ""


def _first_paragraph(cls: type) -> str:
    return " ".join((cls.__doc__ or "").strip().split("\n\n")[0].split())


def _cell(value: str) -> str:
    return value.replace("|", "\\|")


def _default(f: dataclasses.Field[Any], info: Any) -> str:
    """The default as YAML/JSON text; pydantic's `Field(default=...)` sits in `info`."""
    if info is not None:
        if info.is_required():
            return "(required)"
        value = info.get_default(call_default_factory=True)
    elif f.default is not dataclasses.MISSING:
        value = f.default
    elif f.default_factory is not dataclasses.MISSING:
        value = f.default_factory()
    else:
        return "(required)"
    return json.dumps(_plain(value))


def _plain(value: Any) -> Any:
    if isinstance(value, tuple | list):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    return value


def _limits(info: Any) -> str:
    """The range a field declares, e.g. `>= 1`, `in (0, 1]`, `at least 1 item`."""
    if info is None:
        return ""
    bounds: dict[str, Any] = {}
    for m in info.metadata:
        for name in ("gt", "ge", "lt", "le", "min_length"):
            if getattr(m, name, None) is not None:
                bounds[name] = getattr(m, name)
    low = _bound(bounds, "gt", "(", "ge", "[")
    high = _bound(bounds, "lt", ")", "le", "]")
    parts = []
    if low and high:
        parts.append(f"in {low[0]}{low[1]}, {high[1]}{high[0]}")
    elif low:
        parts.append(f"{'>' if low[0] == '(' else '>='} {low[1]}")
    elif high:
        parts.append(f"{'<' if high[0] == ')' else '<='} {high[1]}")
    if "min_length" in bounds:
        n = bounds["min_length"]
        parts.append(f"at least {n} item{'s' if n != 1 else ''}")
    return "; ".join(parts)


def _bound(bounds: dict[str, Any], strict: str, open_: str, loose: str, closed: str) -> Any:
    """`(bracket, value)` of one end of a range, or None when the field has none."""
    if strict in bounds:
        return open_, bounds[strict]
    if loose in bounds:
        return closed, bounds[loose]
    return None
