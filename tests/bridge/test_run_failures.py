"""How runs end when something other than claude goes wrong."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from bridge.config import load_settings
from bridge.core.model import LiveRun
from bridge.core.transport import Duplex, InboundSink, TransportError
from bridge.service import Service, open_store
from bridge.store.base import Store, StoreError
from bridge.store.sql import SqlStore
from runner.process import find_marked
from tests.bridge.harness import ConsoleSession, rows, write_config

WAIT_S = 30.0
"""Generous: each wait ends on an event long before; the bound only turns a hang into a failure."""


class FailingRegistration:
    """The real store, except that registering the first run (with its pid) fails."""

    def __init__(self, store: Store) -> None:
        self._store = store
        self.failed = False

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    async def register_live_run(self, live: LiveRun, at: float) -> None:
        if not self.failed:
            self.failed = True
            raise StoreError("database is gone")
        await self._store.register_live_run(live, at)


async def test_a_failed_registration_does_not_kill_a_healthy_run(tmp_path: Path) -> None:
    # Only a restart during that run could not reattach it.
    settings = load_settings(write_config(tmp_path))
    async with ConsoleSession(settings, wrap_store=FailingRegistration) as session:
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
    trigger = tmp_path / "answer-now"
    path = write_config(
        tmp_path,
        env={
            "FAKE_CLAUDE_WAIT_FOR": str(trigger),
            "FAKE_CLAUDE_SESSIONS_DIR": str(sessions),
            "FAKE_CLAUDE_RECORD": str(record),
        },
    )
    async with ConsoleSession(load_settings(path)) as session:
        session.send("first")
        async with asyncio.timeout(WAIT_S):
            await session.wait_for("Working…")
            assert not trigger.exists()  # claude waits for it: the run is going
            session.send("!reset")
            await session.wait_for("new Claude session")
            trigger.touch()
            await session.wait_for("· Done after")
            session.send("second")
            await session.wait_for("· Done after", count=2)
    assert json.loads(record.read_text())["prompt"] == "second"
    assert not any(a.startswith("--resume") for a in json.loads(record.read_text())["argv"])


class HeldGroup:
    """The real store; the first run's end, once handed to ``finish_run``, waits
    for ``release`` before its group commit: as behind another group in flight."""

    def __init__(self, store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
        assert isinstance(store, SqlStore)
        self.queued = asyncio.Event()
        self.release = asyncio.Event()
        finishes = store._finishes
        write = finishes._write

        async def held(group: Sequence[Any], committing: Any) -> Any:
            finishes._write = write  # the first group only
            self.queued.set()
            await self.release.wait()
            return await write(group, committing)

        monkeypatch.setattr(finishes, "_write", held)


async def test_reset_right_after_the_answer_starts_a_new_session(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The answer's end is recorded (keep_session decided) but not committed yet."""
    sessions = tmp_path / "sessions"
    sessions.mkdir()
    record = tmp_path / "record.json"
    env = {
        "FAKE_CLAUDE_RESULT": "THE-ANSWER",
        "FAKE_CLAUDE_RECORD": str(record),
        "FAKE_CLAUDE_SESSIONS_DIR": str(sessions),
    }
    held: list[HeldGroup] = []

    def wrap(store: Store) -> Store:
        held.append(HeldGroup(store, monkeypatch))
        return store

    path = write_config(tmp_path, {"dispatcher": {"coalesce_ms": 0}}, env=env)
    async with ConsoleSession(load_settings(path), wrap_store=wrap) as session:
        session.send("first")
        async with asyncio.timeout(WAIT_S):
            await held[0].queued.wait()
            session.send("!reset")
            await session.wait_for("The next run starts a new Claude session")
            held[0].release.set()
            await session.wait_for("THE-ANSWER")
            first = json.loads(record.read_text())["argv"]
            record.unlink()
            session.send("second")
            await session.wait_for("THE-ANSWER", count=2)
    argv = json.loads(record.read_text())["argv"]
    assert not [a for a in argv if a.startswith("--resume")], f"resumed: {argv} (first: {first})"


class FailsOnCue(Duplex):
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


class NeverReady(Duplex):
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
