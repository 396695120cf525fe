"""The Alembic revisions create exactly the schema the ORM models describe."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import inspect
from sqlalchemy.engine import Connection

from bridge.store.engine import create_engine
from bridge.store.migrate import (
    alembic_config,
    current_revision,
    downgrade,
    head_revision,
    migrate,
)
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
    assert await current_revision(empty_sql_url) == head_revision() == "0002"
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
