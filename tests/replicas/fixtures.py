"""The private PostgreSQL server of a test session (import the fixture into a test module)."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from tests.replicas.postgres_server import PostgresServer, make_server, missing_reason, remove


@pytest.fixture(scope="session")
def private_postgres() -> Iterator[PostgresServer]:
    """A PostgreSQL server of this session's own: a test may stop or restart it."""
    if reason := missing_reason():
        if os.environ.get("CI"):
            pytest.fail(reason)
        pytest.skip(reason)
    server = make_server()
    try:
        yield server
    finally:
        remove(server)
