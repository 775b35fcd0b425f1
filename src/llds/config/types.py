"""What a config class's fields are, read from its type hints: which are sections (merged key
by key and entered by dotted keys) and which take text (an override's raw text, verbatim)."""

from __future__ import annotations

import dataclasses
import functools
import types
import typing
from collections.abc import Sequence
from typing import Any


@functools.cache
def hints(cls: type) -> dict[str, Any]:
    """The resolved type of each field of dataclass `cls` (Annotated metadata stripped)."""
    return typing.get_type_hints(cls)


def without_none(tp: Any) -> Any:
    """`X | None` -> `X`; any other type as it is."""
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        return args[0] if len(args) == 1 else tp
    return tp


def section_type(cls: Any, name: str) -> type | None:
    """The config class of field `name` of `cls` when that field is a section (a dataclass,
    possibly nullable), else None."""
    if not dataclasses.is_dataclass(cls) or name not in hints(cls):
        return None
    tp = without_none(hints(cls)[name])
    return tp if isinstance(tp, type) and dataclasses.is_dataclass(tp) else None


def field_type(cls: type, path: Sequence[str]) -> Any | None:
    """The declared type of the field at `path` below `cls`; None for an unknown key."""
    here: Any = cls
    for name in path[:-1]:
        here = section_type(here, name)
        if here is None:
            return None
    if not dataclasses.is_dataclass(here) or not path or path[-1] not in hints(here):
        return None
    return hints(here)[path[-1]]


def takes_text(tp: Any) -> bool:
    """Whether a field of type `tp` holds free text (`str`, `str | None`): such a field takes
    an override's text as written (`prompt_template=Q: {question}` is not YAML)."""
    if tp is str:
        return True
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        return str in typing.get_args(tp)
    return False
