"""Test configurations as data: tables laid over each other, written as TOML.

Never formatted text: a path with a quote in it, or a ``.replace()`` that no
longer matches after a default changed, would silently test something else.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import tomli_w

Table = Mapping[str, Any]


def merged(base: Table, override: Table) -> dict[str, Any]:
    """``base`` with ``override`` laid over it: tables merge key by key, other values replace."""
    out = dict(base)
    for key, value in override.items():
        old = out.get(key)
        if isinstance(old, Mapping) and isinstance(value, Mapping):
            out[key] = merged(old, value)
        else:
            out[key] = value
    return out


def toml_text(data: Table) -> str:
    """``data`` as TOML (paths become strings)."""
    return tomli_w.dumps(_plain(data))


def write_toml(path: Path, data: Table) -> Path:
    """Write ``data`` as TOML to ``path``; returns ``path``."""
    path.write_text(toml_text(data))
    return path


def _plain(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, Path):
        return str(value)
    return value
