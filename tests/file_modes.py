"""File modes under a chosen umask: what chatbridge writes must not depend on it."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest


@pytest.fixture(params=[0o022, 0o000], ids=["umask022", "umask000"])
def umask(request: pytest.FixtureRequest) -> Iterator[int]:
    """The process's umask for the test (restored after): the usual one, and none."""
    mask: int = request.param
    before = os.umask(mask)
    try:
        yield mask
    finally:
        os.umask(before)


def mode(path: Path) -> int:
    """``path``'s permission bits (of a link itself, never its target)."""
    return stat.S_IMODE(path.lstat().st_mode)
