"""One chatbridge per database unless they are replicas (bridge/host/database_lock.py)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy.ext.asyncio import create_async_engine

from bridge.errors import StartupError
from bridge.host.database_lock import database_lock
from tests.store.conftest import (
    create_database,
    drop_database,
    postgres_admin_url,
    unique_name,
    with_database,
)


@pytest.fixture
def pg_url() -> Iterator[str]:
    admin = postgres_admin_url()
    name = unique_name("dblock")
    asyncio.run(create_database(admin, name))
    try:
        yield with_database(admin, name)
    finally:
        asyncio.run(drop_database(admin, name))


async def test_a_second_chatbridge_on_a_sqlite_file_is_refused(tmp_path: Path) -> None:
    url = f"sqlite+aiosqlite:///{tmp_path / 'bridge.db'}"
    first, second = create_async_engine(url), create_async_engine(url)
    try:
        async with database_lock(first, shared=False):
            with pytest.raises(StartupError, match="replicas need PostgreSQL"):
                async with database_lock(second, shared=True):
                    pass
        async with database_lock(second, shared=False):  # free once the first has ended
            pass
    finally:
        await first.dispose()
        await second.dispose()


async def test_on_postgresql_replicas_share_and_a_lone_chatbridge_excludes(pg_url: str) -> None:
    engines = [create_async_engine(pg_url) for _ in range(3)]
    a, b, lone = engines
    try:
        async with database_lock(a, shared=True), database_lock(b, shared=True):
            with pytest.raises(StartupError, match="enable \\[cluster\\] on all of them"):
                async with database_lock(lone, shared=False):
                    pass
        async with database_lock(lone, shared=False):
            with pytest.raises(StartupError, match="is not a replica"):
                async with database_lock(a, shared=True):
                    pass
    finally:
        for engine in engines:
            await engine.dispose()
