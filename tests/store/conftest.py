"""Store fixtures: one ``store`` fixture per backend, and throwaway databases.

PostgreSQL: the admin URL comes from ``CHATBRIDGE_TEST_POSTGRES_URL``. Each
test session creates its own database there and drops it at the end. Without
the variable the PostgreSQL cases skip, unless ``CI`` is set: then they fail,
so a misconfigured CI cannot pass by skipping.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import uuid
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from pathlib import Path
from typing import Protocol

import asyncpg
import pytest
from sqlalchemy.engine import make_url

from bridge.core.model import MessageId, MessageState
from bridge.store.base import Store
from bridge.store.engine import is_sqlite
from bridge.store.memory import MemoryStore
from bridge.store.migrate import migrate
from bridge.store.sql import SqlStore

POSTGRES_ENV = "CHATBRIDGE_TEST_POSTGRES_URL"

EMPTY_ALL_TABLES = (
    "DELETE FROM audit; DELETE FROM run_messages; DELETE FROM messages;"
    " DELETE FROM live_runs; DELETE FROM runs; DELETE FROM rooms; DELETE FROM outbox;"
    " DELETE FROM approvals; DELETE FROM schedule_marks; DELETE FROM spend;"
    " DELETE FROM limit_resumes; DELETE FROM session_transcripts; DELETE FROM tool_rules;"
    " DELETE FROM seen_marks"
)


class InspectableStore(Store, Protocol):
    """What the contract suite needs beyond the protocol: message states."""

    async def message_states(self, ids: Sequence[MessageId]) -> dict[MessageId, MessageState]: ...


def postgres_admin_url() -> str:
    """The admin URL, or skip (fail under CI) when it is not configured."""
    url = os.environ.get(POSTGRES_ENV)
    if not url:
        reason = f"PostgreSQL tests need {POSTGRES_ENV} (e.g. postgresql+asyncpg://postgres@127.0.0.1:5432/postgres)"
        if os.environ.get("CI"):
            pytest.fail(reason)
        pytest.skip(reason)
    return url


def _asyncpg_dsn(url: str) -> str:
    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


def with_database(url: str, name: str) -> str:
    """``url`` pointing at database ``name`` instead."""
    return make_url(url).set(database=name).render_as_string(hide_password=False)


async def create_database(admin_url: str, name: str) -> None:
    conn = await asyncpg.connect(_asyncpg_dsn(admin_url))
    try:
        await conn.execute(f'CREATE DATABASE "{name}"')
    finally:
        await conn.close()


async def drop_database(admin_url: str, name: str) -> None:
    conn = await asyncpg.connect(_asyncpg_dsn(admin_url))
    try:
        await conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        await conn.close()


def unique_name(purpose: str) -> str:
    return f"chatbridge_test_{purpose}_{uuid.uuid4().hex[:12]}"


@pytest.fixture(scope="session")
def postgres_admin() -> str:
    return postgres_admin_url()


@pytest.fixture(scope="session")
def postgres_database(postgres_admin: str) -> Iterator[Callable[[str], str]]:
    """Make fresh, empty databases on demand; all are dropped at session end.

    Sync and session-scoped, so it drives its own short event loops.
    """
    made: list[str] = []

    def make(purpose: str) -> str:
        name = unique_name(purpose)
        asyncio.run(create_database(postgres_admin, name))
        made.append(name)
        return with_database(postgres_admin, name)

    yield make

    async def drop_all() -> None:
        # Concurrently: each DROP DATABASE waits for a checkpoint.
        await asyncio.gather(*(drop_database(postgres_admin, name) for name in made))

    asyncio.run(drop_all())


@pytest.fixture(scope="session")
def postgres_url(postgres_database: Callable[[str], str]) -> str:
    """A migrated database shared by the contract suite (emptied per test)."""
    url = postgres_database("contract")
    asyncio.run(migrate(url))
    return url


@pytest.fixture(scope="session")
def sqlite_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A migrated SQLite file; each test gets a copy (cheaper than migrating)."""
    path = tmp_path_factory.mktemp("template") / "template.db"
    asyncio.run(migrate(f"sqlite+aiosqlite:///{path}"))
    return path


async def _empty_postgres(url: str) -> None:
    # A bare asyncpg connection is cheaper than an engine's first connect, and
    # DELETE on a few rows is ~100x faster than TRUNCATE (new files, fsync).
    # Ids keep counting up across tests; no test depends on their values.
    conn = await asyncpg.connect(_asyncpg_dsn(url))
    try:
        await conn.execute(EMPTY_ALL_TABLES)
    finally:
        await conn.close()


async def open_backend(target: str) -> InspectableStore:
    """A fresh, empty store: ``memory``, or an SQL URL (emptied first)."""
    if target == "memory":
        return MemoryStore()
    if not is_sqlite(target):
        await _empty_postgres(target)
    return await SqlStore.open(target, auto_migrate=False)


BACKENDS = [
    "memory",
    "sqlite",
    pytest.param("postgres", marks=pytest.mark.postgres),
]


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """``memory`` or the URL of a migrated database, per backend.

    Synchronous on purpose: the session fixtures it pulls in run their own
    event loops, which they cannot do inside a running one.
    """
    if request.param == "memory":
        return "memory"
    if request.param == "sqlite":
        template: Path = request.getfixturevalue("sqlite_template")
        path = tmp_path / "store.db"
        shutil.copy(template, path)
        return f"sqlite+aiosqlite:///{path}"
    url: str = request.getfixturevalue("postgres_url")
    return url


@pytest.fixture
async def store(backend: str) -> AsyncIterator[InspectableStore]:
    """An empty store of each backend in turn."""
    opened = await open_backend(backend)
    try:
        yield opened
    finally:
        await opened.close()


SQL_BACKENDS = ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]


@pytest.fixture(params=SQL_BACKENDS)
def empty_sql_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """The URL of a brand-new, unmigrated database of each SQL backend."""
    if request.param == "sqlite":
        return f"sqlite+aiosqlite:///{tmp_path / 'empty.db'}"
    make: Callable[[str], str] = request.getfixturevalue("postgres_database")
    return make("empty")
