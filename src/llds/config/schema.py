"""The base of every config: a pydantic v2 dataclass that refuses unknown keys.

Configs stay dataclasses (`dataclasses.replace`, `fields` and `asdict` work on them), and pydantic
does what a hand-written loader would otherwise do: type coercion, `Literal` choices, ranges
declared on the field (`Field(ge=1)`), finite floats, unknown keys refused. A field's attribute
docstring is its help text. Assignments are validated too, so a config cannot be put into a
state its loader would refuse.

Checks that involve several fields go in the class's `__post_init__` (pydantic runs it after the
fields are validated) and raise `Invalid(key, why)`, `key` relative to the class; the loader and
the constructor turn every failure into one `ConfigError` line that names the dotted key.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import types
import typing
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from pydantic import ConfigDict, ValidationError
from pydantic.dataclasses import dataclass

from llds.config.reference import type_name
from llds.config.types import hints, section_type, without_none
from llds.errors import ConfigError

T = TypeVar("T", bound=type)

SECTION_CONFIG = ConfigDict(
    extra="forbid",
    validate_assignment=True,
    use_attribute_docstrings=True,
    arbitrary_types_allowed=False,
    allow_inf_nan=False,
    coerce_numbers_to_str=True,  # `run_dir: 2024` in YAML is the text "2024"
)

SECTION_KEY = "__section_key__"
"""Class attribute: the dotted key a section usually sits under (`rollout`), used to name the
keys of a section built on its own (`RolloutConfig(top_p=2)` -> `rollout.top_p: ...`)."""


class Invalid(ConfigError):
    """A failed cross-field check; `key` is relative to the section that raised it."""

    def __init__(self, key: str, why: str) -> None:
        super().__init__(f"{key}: {why}")
        self.key = key
        self.why = why


def section(cls: T | None = None, *, key: str = "") -> Any:
    """Decorate a config class: `@section class OptimConfig: lr: float = Field(1e-6, gt=0)`.

    `key` is where the section usually sits in a bigger config (`@section(key="rollout")`); it
    prefixes the keys named in the errors of a section built on its own."""

    def wrap(c: T) -> T:
        built = dataclass(c, config=SECTION_CONFIG)
        setattr(built, SECTION_KEY, key)
        validated_init = built.__init__

        @functools.wraps(validated_init)
        def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
            try:
                validated_init(self, *args, **kwargs)
            except ValidationError as exc:
                raise config_error(exc, built, prefix=key) from None
            except Invalid as exc:  # raised by a __post_init__ outside pydantic's validation
                raise ConfigError(f"{_join(key, exc.key)}: {exc.why}") from None

        built.__init__ = __init__  # type: ignore[method-assign]
        return built

    return wrap if cls is None else wrap(cls)


def check(obj: Any) -> None:
    """Run `obj`'s cross-field checks again (after fields were assigned one by one), then its
    required keys (`missing`); a failure is a `ConfigError` naming the dotted key."""
    prefix = getattr(obj, SECTION_KEY, "")
    post_init = getattr(obj, "__post_init__", None)
    try:
        if post_init is not None:
            post_init()
    except Invalid as exc:
        raise ConfigError(f"{_join(prefix, exc.key)}: {exc.why}") from None
    for key, why in missing(obj):
        raise ConfigError(f"{_join(prefix, key)}: {why}")


def missing(obj: Any) -> list[tuple[str, str]]:
    """`(key, why)` of each required key `obj` leaves empty: its `missing()` method's answer.

    Required keys are checked by the loader, not the constructor, so that a config of defaults
    (`TrainConfig()`) is a valid object to compare a saved config against."""
    method = getattr(obj, "missing", None)
    return list(method()) if callable(method) else []


# ------------------------------------------------------------------------ error messages


def config_error(
    exc: ValidationError,
    cls: type,
    *,
    prefix: str = "",
    source_of: Callable[[str], str | None] | None = None,
) -> ConfigError:
    """The first failure of `exc` as one line: `SOURCE: dotted.key: what is wrong`.

    `source_of(dotted_key)` names where the key's value came from (a file, `command line`);
    without a source the line starts with the key."""
    err = exc.errors(include_url=False)[0]
    key, why = describe(err, cls)
    key = _join(prefix, key)
    source = source_of(key) if source_of is not None else None
    return ConfigError(f"{source}: {key}: {why}" if source else f"{key}: {why}")


def describe(err: Any, cls: type) -> tuple[str, str]:
    """`(dotted key, message)` of one pydantic error dict, for config class `cls`."""
    loc, union, nullable = _field_path(cls, tuple(err.get("loc", ())))
    key = dotted(loc)
    cause = (err.get("ctx") or {}).get("error")
    if isinstance(cause, Invalid):
        return _join(key, cause.key), cause.why
    if isinstance(cause, ConfigError):
        return key, str(cause)
    kind = err.get("type", "")
    if kind in ("extra_forbidden", "unexpected_keyword_argument"):
        valid = field_names_at(cls, [p for p in loc[:-1] if isinstance(p, str)])
        close = difflib.get_close_matches(str(loc[-1]), valid, n=2, cutoff=0.6)
        hint = f" (did you mean {' or '.join(close)}?)" if close else ""
        return key, f"unknown key{hint}; valid keys here: {', '.join(valid)}"
    if kind == "missing_argument" or kind == "missing":
        return key, "required"
    message = str(err.get("msg", "invalid value"))
    if union is not None:  # each member's complaint alone misleads: name the whole type
        message = f"Input should be {type_name(union)}"
    elif nullable and kind in _RANGE_ERRORS:
        message += " (or null)"
    if kind == "value_error" and message.startswith("Value error, "):
        return key, message.removeprefix("Value error, ")
    value = err.get("input")
    if isinstance(value, str | int | float | bool) or value is None:
        return key, f"{message}, got {value!r}"
    return key, message


_RANGE_ERRORS = frozenset(
    ("greater_than", "greater_than_equal", "less_than", "less_than_equal", "finite_number")
)


def _field_path(cls: type, loc: tuple[Any, ...]) -> tuple[list[Any], Any, bool]:
    """`loc` without the member tags pydantic adds below a union field (`chat.bool`); that
    field's type when it is such a union; whether the field `loc` ends at may be null."""
    here: Any = cls
    out: list[Any] = []
    union = None
    skip = nullable = False
    for part in loc:
        if skip:
            skip = False
            continue
        out.append(part)
        nullable = False
        if isinstance(part, str) and dataclasses.is_dataclass(here) and part in hints(here):
            declared = hints(here)[part]
            nullable = without_none(declared) is not declared
            if typing.get_origin(without_none(declared)) in (typing.Union, types.UnionType):
                skip, union = True, declared
            here = section_type(here, part)
        else:
            here = None
    return out, union, nullable


def dotted(loc: Sequence[Any]) -> str:
    """`("optim", "betas", 1)` -> `optim.betas[1]`."""
    out = ""
    for part in loc:
        if part == "[key]":  # pydantic's marker of a mapping key (the key itself precedes it)
            continue
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out = f"{out}.{part}" if out else str(part)
    return out


def field_names_at(cls: type, path: Sequence[str]) -> list[str]:
    """The field names of the section reached from config class `cls` along `path`."""
    here: Any = cls
    for name in path:
        here = section_type(here, name)
        if here is None:
            return []
    return [f.name for f in dataclasses.fields(here)] if dataclasses.is_dataclass(here) else []


def _join(prefix: str, key: str) -> str:
    if not prefix:
        return key
    if not key:
        return prefix
    return f"{prefix}{key}" if key.startswith("[") else f"{prefix}.{key}"
