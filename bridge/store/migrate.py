"""Schema migrations, driven from code: no ``alembic.ini`` needed at runtime.

:func:`alembic_config` points Alembic at the ``migrations`` package; each function opens
its own short-lived engine. Alembic is imported only when a migration really runs, and a
database migrated by a newer chatbridge is recognised by its revision's sequence number
(docs/operations.md, "The database" and "How the store writes").
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from sqlalchemy import inspect, text
from sqlalchemy.engine import Connection
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncConnection

import migrations
from bridge.store.base import StoreError
from bridge.store.engine import create_engine, redacted

if TYPE_CHECKING:
    from alembic.config import Config

VERSION_TABLE = "alembic_version"

_Step = Callable[["Config"], None]

CONNECTION_ATTRIBUTE = "connection"
"""Key under which ``env.py`` finds the connection to migrate."""


def alembic_config(url: str | None = None) -> Config:
    """An Alembic configuration for the installed ``migrations`` package."""
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(Path(migrations.__file__).parent))
    if url is not None:
        # ConfigParser interpolation would choke on a "%" in a password.
        config.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return config


def head_revision() -> str:
    """The revision the code expects the database to be at (a test checks it is Alembic's head)."""
    return migrations.HEAD


def sequence_number(revision: str) -> int | None:
    """The sequence number a revision id begins with; None for an id without one."""
    digits = revision[:4]
    return int(digits) if len(digits) == 4 and digits.isdigit() else None


def newer_schema(found: str | None) -> str | None:
    """Why a database at revision ``found`` is beyond this code; None if it is not.

    A newer chatbridge migrated it and this one was rolled back: neither
    ``run`` nor ``migrate`` can work with it (the rollback's own downgrade
    step is not in this code).
    """
    head = head_revision()
    number, head_number = sequence_number(found or ""), sequence_number(head)
    if number is None or head_number is None or number <= head_number:
        return None
    return (
        f"the schema is at revision {found}, newer than this chatbridge (head {head});"
        " upgrade chatbridge or restore a backup"
    )


def connect_failure(exc: BaseException, started: float) -> str:
    """The reason a connection failed, for one line; a timeout carries no text of its own."""
    text = str(exc).strip()
    if text:
        return text
    if isinstance(exc, TimeoutError):
        return f"no answer, timed out after {time.monotonic() - started:.0f}s"
    return type(exc).__name__


async def migrate(url: str) -> None:
    """Upgrade the database at ``url`` to the newest revision (idempotent).

    A database at a revision newer than this code's head is refused with a
    :class:`StoreError` saying so, before Alembic is loaded.
    """
    found = await current_revision(url)
    if found == head_revision():
        return
    problem = newer_schema(found)
    if problem is not None:
        raise StoreError(problem)

    def upgrade(config: Config) -> None:
        from alembic import command

        command.upgrade(config, "head")

    await _run(url, upgrade)


async def downgrade(url: str, revision: str = "base") -> None:
    """Downgrade the database at ``url`` to ``revision`` (default: empty)."""

    def step(config: Config) -> None:
        from alembic import command

        command.downgrade(config, revision)

    await _run(url, step)


async def current_revision(url: str) -> str | None:
    """The revision the database at ``url`` is at; None if never migrated."""
    engine = create_engine(url)
    started = time.monotonic()
    try:
        async with engine.connect() as conn:
            return await revision_of(conn)
    except (SQLAlchemyError, OSError) as exc:
        why = connect_failure(exc, started)
        raise StoreError(f"cannot read the schema revision of {redacted(url)}: {why}") from exc
    finally:
        await engine.dispose()


async def revision_of(conn: AsyncConnection) -> str | None:
    """The schema revision seen through an open connection."""

    def read(sync_conn: Connection) -> str | None:
        # What Alembic's MigrationContext reads, without importing Alembic.
        if not inspect(sync_conn).has_table(VERSION_TABLE):
            return None
        rows = sync_conn.execute(text("SELECT version_num FROM alembic_version")).all()
        if len(rows) > 1:
            raise StoreError(f"the database has several schema heads: {[r[0] for r in rows]}")
        return str(rows[0][0]) if rows else None

    return await conn.run_sync(read)


async def _run(url: str, step: _Step) -> None:
    # Loaded by the step anyway; its CommandError says, e.g., that the
    # database's revision is not one of this code's.
    from alembic.util import CommandError

    engine = create_engine(url)
    started = time.monotonic()
    try:
        async with engine.begin() as conn:

            def run(sync_conn: Connection) -> None:
                config = alembic_config(url)
                config.attributes[CONNECTION_ATTRIBUTE] = sync_conn
                step(config)

            await conn.run_sync(run)
    except (SQLAlchemyError, OSError, CommandError) as exc:
        why = connect_failure(exc, started)
        raise StoreError(f"migrating {redacted(url)} failed: {why}") from exc
    finally:
        await engine.dispose()
