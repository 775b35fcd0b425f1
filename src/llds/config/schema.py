"""The base of every config: a pydantic v2 dataclass that refuses unknown keys.

Configs stay dataclasses (`dataclasses.replace`, `fields` and `asdict` work on them), and pydantic
does what a hand-written loader would otherwise do: type coercion, `Literal` choices, ranges
declared on the field (`Field(ge=1)`), unknown keys refused. A field's docstring is its help text.
Assignments are validated too, so a config cannot be put into a state its loader would refuse.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from pydantic import ConfigDict
from pydantic.dataclasses import dataclass

T = TypeVar("T", bound=type)

SECTION_CONFIG = ConfigDict(
    extra="forbid",
    validate_assignment=True,
    use_attribute_docstrings=True,
    arbitrary_types_allowed=False,
)


def section(cls: T | None = None) -> T | Callable[[T], T]:
    """Decorate a config class: `@section class OptimConfig: lr: float = Field(1e-6, gt=0)`."""

    def wrap(c: T) -> T:
        return dataclass(c, config=SECTION_CONFIG)  # type: ignore[return-value]

    return wrap if cls is None else wrap(cls)
