"""A package's attribute imported on first use (a transport's class, whose chat library
takes seconds to import, while the configuration needs only the package's settings)."""

from __future__ import annotations

import importlib
from collections.abc import Callable


def on_first_use(module: str, name: str) -> Callable[[str], object]:
    """A module ``__getattr__`` that imports ``name`` from ``module`` when first asked."""

    def __getattr__(attribute: str) -> object:
        if attribute == name:
            return getattr(importlib.import_module(module), name)
        raise AttributeError(attribute)

    return __getattr__
