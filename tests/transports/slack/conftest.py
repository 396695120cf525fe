"""Fixtures for the Slack transport tests."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.transports.slack.harness import Running, running


@pytest.fixture(params=["socket", "events"])
async def env(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Running]:
    """The transport connected to local-slack, in each mode."""
    async with running(tmp_path, request.param) as r:
        yield r
