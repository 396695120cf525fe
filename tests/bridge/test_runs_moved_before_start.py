"""Review 3: a run that never (re)starts here because its conversation moved to another
replica (docs/replicas.md) leaves nothing behind on this one and records nothing: the
new owner finds the run "never started" (bridge/runs/stale_runs.py) and runs its messages.

- A run whose claude lost its session is tried again in a new one; when that second
  try is refused (``may_start``: the room moved meanwhile), the first try's binding,
  registry row, tasks and typing must all go, without a recorded end.
- A run cancelled by the loss of its room (``Dispatcher.release``) before claude got
  its prompt (here: with a prestarted or kept-warm claude) must not be recorded as
  interrupted nor offer ``!retry``; a ``!stop`` (or a loss after claude got the prompt)
  keeps being recorded as before.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from bridge.config import Settings, load_settings
from bridge.core.model import RoomKey, RunId, SessionId
from bridge.runs.executor import RunExecutor
from bridge.runs.stale_runs import never_started
from bridge.store.base import RoomOverrides, Store
from runner import Prestarted, RunRequest
from runner.supervision import Supervised
from tests.bridge.harness import ConsoleSession, rows, write_config
from tests.bridge.live_runs import KEEP_WARM, console_room, kept_warm, run_log, watch_starts
from tests.runner.conftest import gone
from transports.console import ConsoleTransport

pytestmark = pytest.mark.slow

WAIT_S = 30.0
"""Each wait ends on an event long before; the bound only turns a hang into a failure."""


class Typing(ConsoleTransport):
    """The console, recording the typing indicator as it is set (in order)."""

    shown: list[bool]

    async def set_typing(self, room: RoomKey, typing: bool) -> None:
        self.shown.append(typing)


@pytest.fixture
def typing() -> list[bool]:
    shown: list[bool] = []
    Typing.shown = shown
    return shown


class Holds:
    """The executor's ``holds``: True until :meth:`lose` (the conversation moved)."""

    def __init__(self) -> None:
        self.held = True

    def lose(self) -> None:
        self.held = False

    def __call__(self, room: RoomKey) -> bool:
        return self.held


def executions(monkeypatch: pytest.MonkeyPatch) -> asyncio.Queue[RunId]:
    """The id of each run the executor is done with (returned or raised), from now on."""
    ended: asyncio.Queue[RunId] = asyncio.Queue()
    execute = RunExecutor._execute

    async def watched(self: RunExecutor, run_id: RunId, *args: Any) -> None:
        try:
            await execute(self, run_id, *args)
        finally:
            ended.put_nowait(run_id)

    monkeypatch.setattr(RunExecutor, "_execute", watched)
    return ended


class SessionClearedLoses:
    """The real store; when the run drops the room's lost session (just before its second
    try), the conversation moves to another replica."""

    def __init__(self, store: Store, lose: Callable[[], None]) -> None:
        self._store = store
        self._lose = lose

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    async def set_session(self, room: RoomKey, session_id: SessionId | None) -> None:
        await self._store.set_session(room, session_id)
        if session_id is None:
            self._lose()


class HangingSession:
    """The real store; after :meth:`hang_reads`, reading a session waits (a database that
    does not answer) until cancelled, after setting :attr:`reading` once the run's start
    is recorded (the run reads beside that record: the read is still under way)."""

    def __init__(self, store: Store) -> None:
        self._store = store
        self.hang = False
        self.reading = asyncio.Event()
        self._started = asyncio.Event()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    def hang_reads(self) -> None:
        self.hang = True
        self._started.clear()

    async def start_run(self, *args: Any, **kwargs: Any) -> None:
        await self._store.start_run(*args, **kwargs)
        self._started.set()

    async def room_state(self, room: RoomKey) -> tuple[SessionId | None, RoomOverrides]:
        if self.hang:
            await self._started.wait()
            self.reading.set()
            await asyncio.Event().wait()
        return await self._store.room_state(room)


async def assert_dropped_here(
    executor: RunExecutor, room: RoomKey, run_id: RunId, typing: list[bool]
) -> None:
    """Nothing of the run is left on this replica (its binding, its tasks, typing on), and
    nothing of its end recorded: the new owner takes it for one that never began."""
    assert executor.live_runs.control(room) is None
    assert tasks_of(run_id) == []
    assert not typing or typing[-1] is False
    record = await executor.store.get_run(run_id)
    assert record is not None
    assert never_started(record, None, executor.settings.runner.state_dir)


def started_pid(log: Path, run_id: RunId) -> int:
    [pid] = [e["pid"] for e in run_log(log) if e["event"] == "start" and e["run"] == run_id]
    return int(pid)


def tasks_of(run_id: RunId) -> list[asyncio.Task[Any]]:
    """The run's own tasks still going (opening, progress, offsets, registration...)."""
    return [t for t in asyncio.all_tasks() if t.get_name().endswith(run_id) and not t.done()]


async def settled(bridge: ConsoleSession) -> None:
    """The progress messages' last edits are over (they run beside the room)."""
    assert bridge.service is not None
    await bridge.service.parts.executor.drain(WAIT_S)


def assert_left_for_the_new_owner(tmp_path: Path, run_id: RunId, state_dir: Path) -> None:
    """Nothing of the run's end recorded, and it looks never started to the new owner."""
    [(status, pid)] = rows(tmp_path, "select status, pid from runs where id = ?", run_id)
    assert (status, pid) == ("running", None)
    assert rows(tmp_path, "select run_id from live_runs") == []
    states = {s for (s,) in rows(tmp_path, "select state from messages where run_id = ?", run_id)}
    assert states == {"dispatched"}
    notices = [t for (t,) in rows(tmp_path, "select text from outbox")]
    assert not [t for t in notices if "retry" in t or "interrupted" in t or "failed" in t]
    assert not (state_dir / "runs" / run_id).exists()


def sessions_kept(tmp_path: Path) -> Settings:
    """Settings whose fake claude keeps its sessions in a folder: one it never made is lost."""
    sessions = tmp_path / "sessions"
    sessions.mkdir()
    path = write_config(
        tmp_path,
        env={"FAKE_CLAUDE_ECHO": "1", "FAKE_CLAUDE_SESSIONS_DIR": str(sessions)},
    )
    return load_settings(path)


async def send_in_a_lost_session(
    bridge: ConsoleSession, holds: Holds
) -> tuple[RunExecutor, RoomKey]:
    """A message sent to a room whose session claude no longer has (its run retries in a
    new one); the executor asks ``holds`` whether the room is still this replica's."""
    assert bridge.service is not None
    executor = bridge.service.parts.executor
    executor.holds = holds
    room = console_room(bridge)
    await executor.store.set_session(room, SessionId("gone-1234"))  # claude lost it
    bridge.send("hello")
    return executor, room


async def test_a_retry_in_a_new_session_refused_leaves_nothing_and_records_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, typing: list[bool]
) -> None:
    settings = sessions_kept(tmp_path)
    holds = Holds()
    ended = executions(monkeypatch)
    async with (
        asyncio.timeout(WAIT_S),
        ConsoleSession(
            settings, console=Typing, wrap_store=lambda s: SessionClearedLoses(s, holds.lose)
        ) as bridge,
    ):
        executor, room = await send_in_a_lost_session(bridge, holds)
        run_id = await ended.get()
        await settled(bridge)
        assert not holds.held  # (the second try was refused)
        # Nothing of the run is left here...
        assert executor.live_runs.control(room) is None
        assert tasks_of(run_id) == []
        assert not typing or typing[-1] is False
        # ... and nothing recorded: the new owner takes it for one that never began.
        record = await executor.store.get_run(run_id)
        assert record is not None
        assert never_started(record, None, settings.runner.state_dir)
        out = bridge.out.getvalue()
    assert_left_for_the_new_owner(tmp_path, run_id, settings.runner.state_dir)
    assert "continuing in a new session" in out
    # The first try's status message says where the run went (no "Interrupted").
    assert "Working" not in out or "· Moved to another replica after" in out
    assert "hello\n" not in out.split("continuing in a new session")[-1]  # no answer here


async def test_a_run_cancelled_by_the_lost_room_before_it_gave_the_warm_claude_the_prompt(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, typing: list[bool]
) -> None:
    # The run took the claude kept warm and reads the room's session (a slow database)
    # when the cluster finds the conversation lost and drops the room (cancelling the run).
    log = tmp_path / "runs.jsonl"
    path = write_config(
        tmp_path, KEEP_WARM, env={"FAKE_CLAUDE_ECHO": "1", "FAKE_CLAUDE_RUN_LOG": str(log)}
    )
    settings = load_settings(path)
    holds = Holds()
    ended = executions(monkeypatch)
    hanging: list[HangingSession] = []

    def wrap(store: Store) -> Any:
        hanging.append(HangingSession(store))
        return hanging[0]

    pid = None
    try:
        async with (
            asyncio.timeout(WAIT_S),
            ConsoleSession(settings, console=Typing, wrap_store=wrap) as bridge,
        ):
            assert bridge.service is not None
            executor = bridge.service.parts.executor
            executor.holds = holds
            room = console_room(bridge)
            started = watch_starts(bridge)
            bridge.send("first")
            await ended.get()
            warm = await kept_warm(started)
            pid = started_pid(log, warm.run_id)
            hanging[0].hang_reads()
            bridge.send("second")
            await hanging[0].reading.wait()  # the run took the warm claude
            holds.lose()
            bridge.service.parts.dispatcher.release(room)  # as the cluster's give_up does
            run_id = await ended.get()
            hanging[0].hang = False
            assert run_id == warm.run_id
            await settled(bridge)
            await assert_dropped_here(executor, room, run_id, typing)
            assert await gone(pid, 5.0)  # the warm claude went with the run
        assert_left_for_the_new_owner(tmp_path, run_id, settings.runner.state_dir)
        prompts = [e for e in run_log(log) if e["event"] == "prompt"]
        assert [e["text"] for e in prompts] == ["first"]
    finally:
        if pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


async def test_a_lost_room_cancelling_the_run_while_it_stops_the_warm_claude_records_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, typing: list[bool]
) -> None:
    # run_claude's may_start says no (the room moved) and stops the prestarted claude;
    # the cluster's drop of the room cancels the run during that stop.
    log = tmp_path / "runs.jsonl"
    path = write_config(
        tmp_path, KEEP_WARM, env={"FAKE_CLAUDE_ECHO": "1", "FAKE_CLAUDE_RUN_LOG": str(log)}
    )
    settings = load_settings(path)
    holds = Holds()
    ended = executions(monkeypatch)
    stopping = asyncio.Event()
    cancel = Prestarted.cancel

    async def watched_cancel(self: Prestarted) -> None:
        if not holds.held:
            stopping.set()
        await cancel(self)

    monkeypatch.setattr(Prestarted, "cancel", watched_cancel)
    pid = None
    try:
        async with (
            asyncio.timeout(WAIT_S),
            ConsoleSession(settings, console=Typing) as bridge,
        ):
            assert bridge.service is not None
            executor = bridge.service.parts.executor
            executor.holds = holds
            room = console_room(bridge)
            started = watch_starts(bridge)
            bridge.send("first")
            await ended.get()
            warm = await kept_warm(started)
            pid = started_pid(log, warm.run_id)
            holds.lose()  # (after the warm claude was kept: _keep_warm asks too)
            bridge.send("second")
            await stopping.wait()
            bridge.service.parts.dispatcher.release(room)
            run_id = await ended.get()
            assert run_id == warm.run_id
            await settled(bridge)
            await assert_dropped_here(executor, room, run_id, typing)
            assert await gone(pid, 5.0)
        assert_left_for_the_new_owner(tmp_path, run_id, settings.runner.state_dir)
        assert [e["text"] for e in run_log(log) if e["event"] == "prompt"] == ["first"]
    finally:
        if pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


@pytest.mark.parametrize(("cancel", "recorded"), [("stop", "stopped"), ("release", "interrupted")])
async def test_a_run_cancelled_before_the_warm_claude_got_the_prompt_is_recorded_while_held(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cancel: str, recorded: str
) -> None:
    # The room is still held: a !stop (or a cancel as interrupted, a shutdown's reason)
    # keeps today's behaviour: the run is recorded stopped (interrupted: its messages
    # kept for `!retry`).
    path = write_config(tmp_path, KEEP_WARM)
    settings = load_settings(path)
    ended = executions(monkeypatch)
    hanging: list[HangingSession] = []

    def wrap(store: Store) -> Any:
        hanging.append(HangingSession(store))
        return hanging[0]

    async with asyncio.timeout(WAIT_S), ConsoleSession(settings, wrap_store=wrap) as bridge:
        assert bridge.service is not None
        started = watch_starts(bridge)
        bridge.send("first")
        await ended.get()
        await kept_warm(started)
        hanging[0].hang_reads()
        bridge.send("second")
        await hanging[0].reading.wait()
        if cancel == "stop":
            bridge.send("!stop")
        else:
            bridge.service.parts.dispatcher.release(console_room(bridge))
        run_id = await ended.get()
        hanging[0].hang = False
    [(status,)] = rows(tmp_path, "select status from runs where id = ?", run_id)
    assert status == recorded


async def test_a_run_whose_claude_got_the_prompt_is_recorded_interrupted_when_the_room_is_lost(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # claude has the prompt (it may have acted): the loss is recorded as before.
    path = write_config(tmp_path, env={"FAKE_CLAUDE_ECHO": "1", "FAKE_CLAUDE_SLEEP": "30"})
    settings = load_settings(path)
    holds = Holds()
    ended = executions(monkeypatch)
    async with asyncio.timeout(WAIT_S), ConsoleSession(settings) as bridge:
        assert bridge.service is not None
        bridge.service.parts.executor.holds = holds
        bridge.send("slow")
        await bridge.wait_for("Working")  # the progress message: claude runs
        holds.lose()
        bridge.service.parts.dispatcher.release(console_room(bridge))
        run_id = await ended.get()
    [(status,)] = rows(tmp_path, "select status from runs where id = ?", run_id)
    assert status == "interrupted"


async def test_a_stop_while_the_run_takes_the_warm_claude_stops_that_claude(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Cancelled inside Prestarted.take (its wait for ``ready``), before the run owns the
    # claude: nothing else would stop it (run_claude stops only what it took).
    log = tmp_path / "runs.jsonl"
    path = write_config(
        tmp_path, KEEP_WARM, env={"FAKE_CLAUDE_ECHO": "1", "FAKE_CLAUDE_RUN_LOG": str(log)}
    )
    settings = load_settings(path)
    ended = executions(monkeypatch)
    taking = asyncio.Event()
    take = Prestarted.take

    async def watched_take(self: Prestarted, request: RunRequest) -> Supervised | None:
        taking.set()
        return await take(self, request)

    monkeypatch.setattr(Prestarted, "take", watched_take)
    pid = None
    try:
        async with asyncio.timeout(WAIT_S), ConsoleSession(settings) as bridge:
            assert bridge.service is not None
            started = watch_starts(bridge)
            bridge.send("first")
            await ended.get()
            warm = await kept_warm(started)
            pid = started_pid(log, warm.run_id)
            taking.clear()
            bridge.send("second")
            await taking.wait()
            bridge.service.parts.dispatcher.stop(console_room(bridge))
            run_id = await ended.get()
            assert run_id == warm.run_id
            assert await gone(pid, 5.0)
        [(status,)] = rows(tmp_path, "select status from runs where id = ?", run_id)
        assert status == "stopped"
        assert [e["text"] for e in run_log(log) if e["event"] == "prompt"] == ["first"]
    finally:
        if pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


class UnregisterWaits(SessionClearedLoses):
    """As :class:`SessionClearedLoses`; taking the first try out of the registry of live
    runs then waits for :attr:`proceed` (a slow database), after setting
    :attr:`unregistering`."""

    def __init__(self, store: Store, lose: Callable[[], None]) -> None:
        super().__init__(store, lose)
        self.unregistering = asyncio.Event()
        self.proceed = asyncio.Event()

    async def unregister_live_run(self, run_id: RunId) -> None:
        self.unregistering.set()
        await self.proceed.wait()
        await self._store.unregister_live_run(run_id)


async def test_a_lost_room_cancelling_the_run_while_its_first_try_is_undone_records_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, typing: list[bool]
) -> None:
    # claude lost the session: the first try's journal is gone and its registration being
    # undone when the cluster drops the moved room (cancelling the run). No claude has the
    # prompt any more: the new owner runs the messages, so nothing is recorded here.
    settings = sessions_kept(tmp_path)
    holds = Holds()
    ended = executions(monkeypatch)
    wrapped: list[UnregisterWaits] = []

    def wrap(store: Store) -> Any:
        wrapped.append(UnregisterWaits(store, holds.lose))
        return wrapped[0]

    async with (
        asyncio.timeout(WAIT_S),
        ConsoleSession(settings, console=Typing, wrap_store=wrap) as bridge,
    ):
        executor, room = await send_in_a_lost_session(bridge, holds)
        await wrapped[0].unregistering.wait()
        assert not holds.held  # the lost session was cleared: the room moved meanwhile
        assert bridge.service is not None
        bridge.service.parts.dispatcher.release(room)  # as the cluster's give_up does
        wrapped[0].proceed.set()
        run_id = await ended.get()
        await settled(bridge)
        await assert_dropped_here(executor, room, run_id, typing)
    assert_left_for_the_new_owner(tmp_path, run_id, settings.runner.state_dir)
