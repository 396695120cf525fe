"""What a service is built of that the settings alone say: the store and the transports.

:func:`open_store` opens the database (a SQLite file checked first, so its problem is
one line naming the setting); :func:`build_transports` makes one transport per
configured chat system, importing its library only then (docs/configuration.md).
"""

from __future__ import annotations

import os
from pathlib import Path

from bridge.config import HttpSettings, Settings
from bridge.core.http_limits import ClientLimits
from bridge.core.transport import RoomBinding, SeenMarks, Transport
from bridge.errors import StartupError
from bridge.store.base import Store, StoreError
from bridge.store.sql import SqlStore

MIN_IDLE_TRANSACTION_S = 2.0
"""Replicas' PostgreSQL sessions idle in a transaction longer than this (or than the
renewal period, if longer) are ended by the server: no transaction of ours idles that
long unless its process was paused (docs/replicas.md)."""


def http_limits(http: HttpSettings) -> ClientLimits:
    """``[http]``'s bounds on each client, for its listeners and the Slack events endpoint."""
    return ClientLimits(
        head_timeout_s=http.head_timeout_s,
        body_timeout_s=http.body_timeout_s,
        max_connections=http.max_connections,
    )


def build_transports(settings: Settings, marks: SeenMarks | None = None) -> list[Transport]:
    """One transport per configured chat system; library imports stay lazy.

    ``marks`` (the store) keeps where Slack got to in each channel, for its catch-up.
    """
    transports: list[Transport] = []

    def bindings(name: str) -> list[RoomBinding]:
        return [
            RoomBinding(key.room_id, trigger=room.trigger, reply_in_thread=room.reply_in_thread)
            for key, room in settings.room_settings.items()
            if key.transport == name
        ]

    if settings.console_active:
        from transports.console import ConsoleTransport

        transports.append(
            ConsoleTransport(
                settings.console.room,
                settings.console.user,
            )
        )
    if settings.matrix is not None:
        from transports.matrix import MatrixTransport

        transports.append(MatrixTransport(settings.matrix, bindings("matrix")))
    if settings.slack is not None:
        from transports.slack import SlackTransport

        transports.append(
            SlackTransport(
                settings.slack,
                bindings("slack"),
                marks=marks,
                http_limits=http_limits(settings.http),
            )
        )
    return transports


def sqlite_file_problem(url: str) -> str | None:
    """Why a SQLite database file at ``url`` cannot be opened for writing; None if it can.

    Checked before connecting: the driver's own failure says only "unable to
    open database file", and a connection that failed to open can outlive the
    event loop (aiosqlite's worker thread) and print a traceback at exit.
    """
    from sqlalchemy.engine import make_url

    parsed = make_url(url)
    if parsed.get_backend_name() != "sqlite" or parsed.database in (None, "", ":memory:"):
        return None
    path = Path(parsed.database or "")
    if path.exists():
        if path.is_dir():
            return f"{path} is a directory"
        if not os.access(path, os.R_OK | os.W_OK):
            return f"{path} is not readable and writable by this user"
        return None
    parent = path.parent
    if not parent.is_dir():
        return f"cannot create {path}: {parent} is not a directory"
    if not os.access(parent, os.W_OK | os.X_OK):
        return f"cannot create {path}: {parent} is not writable by this user"
    return None


async def open_store(settings: Settings) -> Store:
    problem = sqlite_file_problem(settings.database.url)
    if problem is not None:
        raise StartupError(f"database.url: {problem}")
    try:
        cluster = settings.cluster
        return await SqlStore.open(
            settings.database.url,
            auto_migrate=settings.database.auto_migrate,
            # A paused replica's open transaction must not hold the others' takeovers.
            idle_transaction_timeout_s=(
                max(MIN_IDLE_TRANSACTION_S, cluster.renew_every_s) if cluster.enabled else None
            ),
        )
    except StoreError as exc:
        # SQLAlchemy appends a "Background on this error" link line: one line is enough.
        raise StartupError(f"database.url: {str(exc).splitlines()[0]}") from exc
