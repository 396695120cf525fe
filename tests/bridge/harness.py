"""Run the real service in-process with the console transport on a pipe."""

from __future__ import annotations

import asyncio
import contextlib
import io
import os
import sqlite3
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from bridge.config import Settings, load_settings
from bridge.core.transport import Transport
from bridge.service import Service, open_store
from bridge.store.base import Store
from dispatcher import Clock
from tests.config_files import Table, merged, write_toml
from tests.fakes.fake_claude import FAKE_CLAUDE
from transports.console import ConsoleTransport

ECHO = {"FAKE_CLAUDE_ECHO": "1"}


def write_config(
    tmp_path: Path, config: Table | None = None, *, env: Mapping[str, str] = ECHO
) -> Path:
    """A configuration for the console room, with the fake claude and SQLite under tmp_path.

    ``config`` is laid over the base table by table; ``env`` is the rooms'
    environment for the fake claude.
    """
    base = {
        "runner": {
            "claude_bin": FAKE_CLAUDE,
            "stop_grace_s": 1.0,
            "state_dir": tmp_path / "state",
        },
        "dispatcher": {"coalesce_ms": 200, "max_wait_ms": 2000},
        "database": {"url": f"sqlite+aiosqlite:///{tmp_path / 'bridge.db'}"},
        "http": {"listen": ""},
        # Shown at once, as the tests that follow a run by its status message expect.
        "progress": {"show_after_s": 0},
        "defaults": {"cwd": tmp_path, "env": dict(env)},
    }
    return write_toml(tmp_path / "chatbridge.toml", merged(base, config or {}))


def rows(tmp_path: Path, sql: str, *args: Any) -> list[tuple[Any, ...]]:
    """The rows ``sql`` selects from the SQLite database ``write_config`` gives the bridge."""
    with sqlite3.connect(tmp_path / "bridge.db") as db:
        return db.execute(sql, args).fetchall()


async def run_console(settings: Settings | Path, lines: list[str]) -> str:
    """Feed ``lines`` to a console room, run the service to end of input, return its output."""
    if isinstance(settings, Path):
        settings = load_settings(settings)
    read_fd, write_fd = os.pipe()
    with os.fdopen(write_fd, "wb") as writer:
        writer.write("".join(line + "\n" for line in lines).encode())
    out = io.StringIO()
    with os.fdopen(read_fd, "rb") as reader:
        transport = ConsoleTransport(
            settings.console.room, settings.console.user, stdin=reader, stdout=out
        )
        store = await open_store(settings)
        try:
            await Service(settings, store, [transport]).serve()
        finally:
            await store.close()
    return out.getvalue()


class _Output(io.StringIO):
    """stdout that wakes waiters on every write."""

    def __init__(self) -> None:
        super().__init__()
        self.changed = asyncio.Event()

    def write(self, text: str) -> int:
        n = super().write(text)
        self.changed.set()
        return n


class ConsoleSession:
    """A service running in a task, with a console room whose input stays open."""

    def __init__(
        self,
        settings: Settings,
        *,
        extra_transports: Sequence[Transport] = (),
        wrap_store: Callable[[Store], Store] | None = None,
        console: type[ConsoleTransport] = ConsoleTransport,
        schedule_clock: Clock | None = None,
    ) -> None:
        self.settings = settings
        self._console = console
        self._extra = extra_transports
        self._wrap = wrap_store
        self._schedule_clock = schedule_clock
        self.out = _Output()
        read_fd, self._write_fd = os.pipe()
        self._reader = os.fdopen(read_fd, "rb")
        self.service: Service | None = None
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> ConsoleSession:
        store = await open_store(self.settings)
        self._store = store
        transport = self._console(
            self.settings.console.room,
            self.settings.console.user,
            stdin=self._reader,
            stdout=self.out,
        )
        used = self._wrap(store) if self._wrap else store
        transports = [transport, *self._extra]
        if self._schedule_clock is None:
            self.service = Service(self.settings, used, transports)
        else:
            self.service = Service(self.settings, used, transports, self._schedule_clock)
        self._task = asyncio.create_task(self.service.serve())
        ready = asyncio.ensure_future(self.service.ready.wait())
        await asyncio.wait({ready, self._task}, return_when=asyncio.FIRST_COMPLETED)
        if not ready.done():
            ready.cancel()
            await self._task  # raises what stopped the service
        return self

    def send(self, line: str) -> None:
        os.write(self._write_fd, (line + "\n").encode())

    async def wait_for(self, text: str, count: int = 1) -> str:
        while self.out.getvalue().count(text) < count:
            self.out.changed.clear()
            await self.out.changed.wait()
        return self.out.getvalue()

    async def finish(self) -> str:
        """End of input: the service finishes outstanding work and returns."""
        if self._write_fd >= 0:
            os.close(self._write_fd)
            self._write_fd = -1
        assert self._task is not None
        await self._task
        return self.out.getvalue()

    async def __aexit__(self, *exc: object) -> None:
        try:
            if self._task is not None and not self._task.done():
                if exc[0] is None:
                    await self.finish()
                else:
                    self._task.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await self._task
        finally:
            if self._write_fd >= 0:
                os.close(self._write_fd)
            self._reader.close()
            await self._store.close()
