"""Fixtures the bridge's tests take by name; each is defined beside the helpers it serves."""

from __future__ import annotations

from tests.bridge.bridge_process import no_leftovers  # noqa: F401 (fixtures)
from tests.bridge.git_repos import repo  # noqa: F401
from tests.bridge.paused_holders import db, holder  # noqa: F401
