"""Attributes of a package that import their module on first use (PEP 562), so that importing
the package, or a light module inside it, does not import its heavy ones (torch): every
command's config is read and checked before any of them is needed."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def lazy_attributes(package: str, modules: Mapping[str, str]) -> Callable[[str], Any]:
    """The package's `__getattr__`: `name` is taken from the module `modules[name]`, imported
    then; any other name is an AttributeError, as without it."""

    def __getattr__(name: str) -> Any:
        module = modules.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(module), name)

    return __getattr__
