"""Alembic environment for chatbridge.

Called from :mod:`bridge.store.migrate`, it finds an open (synchronous view of
an async) connection in ``config.attributes`` and migrates through it. Called
from the ``alembic`` command line instead, it builds an async engine from
``sqlalchemy.url`` and does the same through ``run_sync``.
"""

from __future__ import annotations

import asyncio

from alembic import context
from sqlalchemy.engine import Connection

from bridge.store.engine import create_engine
from bridge.store.migrate import CONNECTION_ATTRIBUTE
from bridge.store.tables import Base

config = context.config
target_metadata = Base.metadata


def run_with(connection: Connection) -> None:
    """Run the pending migrations through ``connection``."""
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        # SQLite cannot ALTER most things in place: copy-and-move instead.
        render_as_batch=connection.dialect.name == "sqlite",
    )
    with context.begin_transaction():
        context.run_migrations()


async def run_from_url() -> None:
    """Build an engine from the configured URL and migrate through it."""
    url = config.get_main_option("sqlalchemy.url")
    if not url:
        raise RuntimeError("set sqlalchemy.url, or call bridge.store.migrate.migrate(url)")
    engine = create_engine(url)
    try:
        async with engine.begin() as conn:
            await conn.run_sync(run_with)
    finally:
        await engine.dispose()


def run_offline() -> None:
    """Emit SQL for the configured URL instead of running it (``--sql``)."""
    context.configure(
        url=config.get_main_option("sqlalchemy.url"),
        target_metadata=target_metadata,
        literal_binds=True,
    )
    with context.begin_transaction():
        context.run_migrations()


if context.is_offline_mode():
    run_offline()
else:
    shared = config.attributes.get(CONNECTION_ATTRIBUTE)
    if shared is not None:
        run_with(shared)
    else:
        asyncio.run(run_from_url())
