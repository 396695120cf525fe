"""Schema migrations, driven from code: no ``alembic.ini`` needed at runtime.

The Alembic environment lives in the ``migrations`` package (shipped in the
wheel); :func:`alembic_config` points Alembic at it. Each function here opens
its own short-lived engine and hands Alembic that connection, so ``env.py``
never builds an engine of its own when called from the service.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy.engine import Connection
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncConnection

import migrations
from bridge.store.base import StoreError
from bridge.store.engine import create_engine, redacted

_Step = Callable[[Config], None]

CONNECTION_ATTRIBUTE = "connection"
"""Key under which ``env.py`` finds the connection to migrate."""


def alembic_config(url: str | None = None) -> Config:
    """An Alembic configuration for the installed ``migrations`` package."""
    config = Config()
    config.set_main_option("script_location", str(Path(migrations.__file__).parent))
    if url is not None:
        # ConfigParser interpolation would choke on a "%" in a password.
        config.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return config


def head_revision() -> str:
    """The revision the code expects the database to be at."""
    head = ScriptDirectory.from_config(alembic_config()).get_current_head()
    if head is None:  # pragma: no cover - the package always ships revisions
        raise StoreError("the migrations package has no revisions")
    return head


async def migrate(url: str) -> None:
    """Upgrade the database at ``url`` to the newest revision (idempotent)."""
    await _run(url, lambda config: command.upgrade(config, "head"))


async def downgrade(url: str, revision: str = "base") -> None:
    """Downgrade the database at ``url`` to ``revision`` (default: empty)."""
    await _run(url, lambda config: command.downgrade(config, revision))


async def current_revision(url: str) -> str | None:
    """The revision the database at ``url`` is at; None if never migrated."""
    engine = create_engine(url)
    try:
        async with engine.connect() as conn:
            return await revision_of(conn)
    except (SQLAlchemyError, OSError) as exc:
        raise StoreError(f"cannot read the schema revision of {redacted(url)}: {exc}") from exc
    finally:
        await engine.dispose()


async def revision_of(conn: AsyncConnection) -> str | None:
    """The schema revision seen through an open connection."""

    def read(sync_conn: Connection) -> str | None:
        return MigrationContext.configure(sync_conn).get_current_revision()

    return await conn.run_sync(read)


async def _run(url: str, step: _Step) -> None:
    engine = create_engine(url)
    try:
        async with engine.begin() as conn:

            def run(sync_conn: Connection) -> None:
                config = alembic_config(url)
                config.attributes[CONNECTION_ATTRIBUTE] = sync_conn
                step(config)

            await conn.run_sync(run)
    except (SQLAlchemyError, OSError) as exc:
        raise StoreError(f"migrating {redacted(url)} failed: {exc}") from exc
    finally:
        await engine.dispose()
