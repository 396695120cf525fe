"""The Alembic revisions create exactly the schema the ORM models describe."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import inspect, text
from sqlalchemy.engine import Connection

from bridge.store.base import StoreError
from bridge.store.engine import create_engine
from bridge.store.migrate import (
    alembic_config,
    connect_failure,
    current_revision,
    downgrade,
    head_revision,
    migrate,
    sequence_number,
)
from bridge.store.sql import SqlStore
from bridge.store.tables import Base


async def schema_diff(url: str) -> list[Any]:
    """What autogenerate would change to make the database match the models."""

    def compare(conn: Connection) -> list[Any]:
        diff: list[Any] = compare_metadata(MigrationContext.configure(conn), Base.metadata)
        return diff

    engine = create_engine(url)
    try:
        async with engine.connect() as conn:
            return await conn.run_sync(compare)
    finally:
        await engine.dispose()


async def table_names(url: str) -> set[str]:
    engine = create_engine(url)
    try:
        async with engine.connect() as conn:
            return set(await conn.run_sync(lambda c: inspect(c).get_table_names()))
    finally:
        await engine.dispose()


async def test_upgrade_matches_models_and_downgrade_empties(empty_sql_url: str) -> None:
    assert await current_revision(empty_sql_url) is None

    await migrate(empty_sql_url)
    assert await current_revision(empty_sql_url) == head_revision() == "0011"
    assert await schema_diff(empty_sql_url) == []
    assert await table_names(empty_sql_url) == set(Base.metadata.tables) | {"alembic_version"}

    await migrate(empty_sql_url)  # already at head: nothing to do, no error
    assert await current_revision(empty_sql_url) == head_revision()

    await downgrade(empty_sql_url)
    assert await current_revision(empty_sql_url) is None
    assert await table_names(empty_sql_url) == {"alembic_version"}

    # And back up again: the downgrade left nothing behind that blocks it.
    await migrate(empty_sql_url)
    assert await schema_diff(empty_sql_url) == []


def test_head_constant_is_alembics_head() -> None:
    """Start-up compares against ``migrations.HEAD`` so it need not import Alembic."""
    assert ScriptDirectory.from_config(alembic_config()).get_current_head() == head_revision()


def test_env_builds_its_own_engine_from_the_url(tmp_path: Path) -> None:
    """The path the ``alembic`` command line takes: no shared connection."""
    url = f"sqlite+aiosqlite:///{tmp_path / 'cli.db'}"
    command.upgrade(alembic_config(url), "head")
    assert asyncio.run(current_revision(url)) == head_revision()
    command.downgrade(alembic_config(url), "base")
    assert asyncio.run(current_revision(url)) is None


def test_revision_ids_begin_with_increasing_sequence_numbers() -> None:
    """What lets start-up tell a newer database from an older one without Alembic."""
    script = ScriptDirectory.from_config(alembic_config())
    chain = [rev.revision for rev in reversed(list(script.walk_revisions()))]
    numbers = [sequence_number(rev) for rev in chain]
    assert numbers == list(range(1, len(chain) + 1)), chain
    assert chain[-1] == head_revision()


async def set_revision(url: str, revision: str) -> None:
    engine = create_engine(url)
    try:
        async with engine.begin() as conn:
            await conn.execute(text("UPDATE alembic_version SET version_num = :r"), {"r": revision})
    finally:
        await engine.dispose()


async def test_a_database_newer_than_the_code_is_refused_in_one_line(empty_sql_url: str) -> None:
    """After a rollback of chatbridge: neither migrate nor open can work with it."""
    await migrate(empty_sql_url)
    newer = f"{(sequence_number(head_revision()) or 0) + 1:04d}_from_the_future"
    await set_revision(empty_sql_url, newer)
    expected = (
        f"the schema is at revision {newer}, newer than this chatbridge"
        f" (head {head_revision()}); upgrade chatbridge or restore a backup"
    )
    for attempt in (
        migrate(empty_sql_url),
        SqlStore.open(empty_sql_url),
        SqlStore.open(empty_sql_url, auto_migrate=False),
    ):
        with pytest.raises(StoreError) as info:
            await attempt
        assert str(info.value) == expected
    assert await current_revision(empty_sql_url) == newer  # nothing was touched


async def test_an_unknown_revision_fails_migrate_in_one_line(empty_sql_url: str) -> None:
    await migrate(empty_sql_url)
    await set_revision(empty_sql_url, "cafe")
    with pytest.raises(StoreError, match="Can't locate revision identified by 'cafe'") as info:
        await migrate(empty_sql_url)
    assert len(str(info.value).splitlines()) == 1


def test_a_timeout_without_text_says_how_long_it_waited() -> None:
    started = time.monotonic() - 61
    assert connect_failure(TimeoutError(), started) == "no answer, timed out after 61s"
    assert connect_failure(OSError("refused"), started) == "refused"
    assert connect_failure(ConnectionResetError(), started) == "ConnectionResetError"
