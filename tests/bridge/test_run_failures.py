"""How runs end when something other than claude goes wrong."""

from __future__ import annotations

import asyncio
import json
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from bridge.config import load_settings
from bridge.core.model import RunId
from bridge.core.transport import InboundSink, TransportError
from bridge.service import Service, open_store
from bridge.store.base import Store, StoreError
from runner.process import find_marked
from tests.bridge.harness import ConsoleSession, write_config
from transports.base import Transport


def rows(tmp_path: Path, sql: str) -> list[tuple[Any, ...]]:
    with sqlite3.connect(tmp_path / "bridge.db") as db:
        return db.execute(sql).fetchall()


class FailingPid:
    """The real store, except that recording the first run's pid fails."""

    def __init__(self, store: Store) -> None:
        self._store = store
        self.failed = False

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    async def set_run_pid(self, run_id: RunId, pid: int) -> None:
        if not self.failed:
            self.failed = True
            raise StoreError("database is gone")
        await self._store.set_run_pid(run_id, pid)


async def test_a_failed_pid_write_does_not_kill_a_healthy_run(tmp_path: Path) -> None:
    settings = load_settings(write_config(tmp_path))
    async with ConsoleSession(settings, wrap_store=FailingPid) as session:
        session.send("first")
        await session.wait_for("· Done after")
        session.send("second")
        await session.wait_for("· Done after", count=2)
        out = await session.finish()
    assert "first" in out.splitlines()
    assert "second" in out.splitlines()
    assert "The run failed" not in out
    assert rows(tmp_path, "select status, pid is null from runs order by started_at") == [
        ("succeeded", 1),
        ("succeeded", 0),
    ]
    assert find_marked(rows(tmp_path, "select id from runs")[0][0]) == []


async def test_reset_during_a_run_is_not_undone_when_the_run_ends(tmp_path: Path) -> None:
    sessions = tmp_path / "sessions"
    sessions.mkdir()
    record = tmp_path / "record.json"
    path = write_config(
        tmp_path,
        env={
            "FAKE_CLAUDE_SLEEP": "1",
            "FAKE_CLAUDE_SESSIONS_DIR": str(sessions),
            "FAKE_CLAUDE_RECORD": str(record),
        },
    )
    async with ConsoleSession(load_settings(path)) as session:
        session.send("first")
        await session.wait_for("Bash: echo hello")
        session.send("!reset")
        await session.wait_for("new Claude session")
        await session.wait_for("· Done after")
        session.send("second")
        await session.wait_for("· Done after", count=2)
    assert json.loads(record.read_text())["prompt"] == "second"
    assert not any(a.startswith("--resume") for a in json.loads(record.read_text())["argv"])


class FailsOnCue(Transport):
    """A transport that connects, then loses its server for good when told to."""

    name = "matrix"  # type: ignore[assignment]

    def __init__(self) -> None:
        self.cue = asyncio.Event()

    async def run(self, sink: InboundSink, ready: asyncio.Event) -> None:
        ready.set()
        await self.cue.wait()
        raise TransportError("matrix", "the homeserver refused our token")


async def test_a_run_cut_short_by_a_failing_service_is_interrupted_not_stopped(
    tmp_path: Path,
) -> None:
    path = write_config(tmp_path, env={"FAKE_CLAUDE_SLEEP": "60", "FAKE_CLAUDE_GRANDCHILD": "1"})
    failing = FailsOnCue()
    session = ConsoleSession(load_settings(path), extra_transports=[failing])

    async def lose_the_server_mid_run() -> None:
        async with session:
            session.send("long job")
            await session.wait_for("Bash: echo hello")
            failing.cue.set()
            await session.finish()

    with pytest.raises(ExceptionGroup) as info:
        await lose_the_server_mid_run()
    assert info.group_contains(TransportError)
    [(run_id, status)] = rows(tmp_path, "select id, status from runs")
    assert status == "interrupted"  # so that !retry can run it again
    assert find_marked(run_id) == []
    assert rows(tmp_path, "select state from messages") == [("failed",)]


class NeverReady(Transport):
    name = "slack"  # type: ignore[assignment]

    async def run(self, sink: InboundSink, ready: asyncio.Event) -> None:
        await asyncio.Event().wait()


async def test_a_stop_while_transports_connect_ends_the_service(tmp_path: Path) -> None:
    settings = load_settings(write_config(tmp_path))
    store = await open_store(settings)
    try:
        service = Service(settings, store, [NeverReady()])
        task = asyncio.create_task(service.serve())
        await asyncio.sleep(0)
        service.request_stop()
        async with asyncio.timeout(10):
            await task
        assert not service.ready.is_set()
    finally:
        await store.close()
