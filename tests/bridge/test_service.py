"""The whole service in-process: console room on a pipe, fake claude, SQLite."""

from __future__ import annotations

import asyncio
import io
import json
import os
from collections.abc import Sequence
from pathlib import Path

import aiohttp

from bridge.config import load_settings
from bridge.core.model import (
    ExternalMessageId,
    InboundMessage,
    RoomId,
    RoomKey,
    TransportName,
    UserId,
)
from bridge.core.transport import Accepted, RunPhase
from bridge.service import Service, open_store
from bridge.store.base import Store
from runner.process import find_marked
from tests.bridge.harness import ECHO, ConsoleSession, run_console, write_config
from tests.bridge.harness import rows as db_rows
from tests.fakes.flaky_store import FlakyStore
from transports.console import ConsoleTransport

ROOM = RoomKey(TransportName("console"), RoomId("console"))


async def running_run(tmp_path: Path) -> str:
    rows = db_rows(tmp_path, "select id from runs where status = 'running'")
    assert len(rows) == 1
    return str(rows[0][0])


async def test_a_burst_becomes_one_attributed_batch(tmp_path: Path) -> None:
    # A window long enough for a loaded machine to read and record three lines in it.
    window = {"dispatcher": {"coalesce_ms": 2000, "max_wait_ms": 10000}}
    out = await run_console(write_config(tmp_path, window), ["first", "second", "third"])
    assert out.count("local wrote:") == 3
    assert out.index("first") < out.index("second") < out.index("third")
    assert db_rows(tmp_path, "select count(*) from runs") == [(1,)]
    assert db_rows(tmp_path, "select distinct state from messages") == [("done",)]


async def test_progress_then_result(tmp_path: Path) -> None:
    out = (await run_console(write_config(tmp_path), ["hello"])).splitlines()
    assert out[0] == "· received"  # the sign of life, while the window is open
    progress = [line for line in out[1:] if line.startswith("· ")]
    assert progress[0].startswith("· Working")
    # The answer first; the progress message's last edit only after it.
    assert out[-2] == "hello"
    assert out[-1] == progress[-1]
    assert progress[-1].startswith("· Done after")


async def test_session_is_resumed_on_the_next_run(tmp_path: Path) -> None:
    sessions = tmp_path / "sessions"
    sessions.mkdir()
    record = tmp_path / "record.json"
    path = write_config(
        tmp_path,
        env={"FAKE_CLAUDE_SESSIONS_DIR": str(sessions), "FAKE_CLAUDE_RECORD": str(record)},
    )
    await run_console(path, ["one"])
    first = json.loads(record.read_text())
    assert not any(a.startswith("--resume") for a in first["argv"])
    session = first.get("session_id") or db_rows(tmp_path, "select session_id from rooms")[0][0]
    await run_console(path, ["two"])
    second = json.loads(record.read_text())
    assert f"--resume={session}" in second["argv"]
    assert second["prompt"] == "two"
    assert "two" not in second["argv"]


async def test_reset_starts_a_new_session(tmp_path: Path) -> None:
    record = tmp_path / "record.json"
    path = write_config(tmp_path, env={**ECHO, "FAKE_CLAUDE_RECORD": str(record)})
    await run_console(path, ["one"])
    out = await run_console(path, ["!reset"])
    assert "new Claude session" in out
    await run_console(path, ["two"])
    assert not any(a.startswith("--resume") for a in json.loads(record.read_text())["argv"])
    actions = [r[0] for r in db_rows(tmp_path, "select action from audit order by id")]
    assert "session_reset" in actions


async def test_unknown_session_falls_back_to_a_fresh_one(tmp_path: Path) -> None:
    sessions = tmp_path / "sessions"
    sessions.mkdir()
    path = write_config(tmp_path, env={"FAKE_CLAUDE_SESSIONS_DIR": str(sessions), **ECHO})
    await run_console(path, ["one"])
    for f in sessions.rglob("*"):
        if f.is_file():
            f.unlink()  # claude forgot every session
    out = await run_console(path, ["two"])
    assert "no longer has session" in out
    assert out.splitlines()[-2] == "two"  # then the progress message's last edit


async def test_missing_claude_is_reported_in_the_room(tmp_path: Path) -> None:
    path = write_config(tmp_path, {"runner": {"claude_bin": tmp_path / "no-such-dir" / "claude"}})
    out = await run_console(path, ["hello"])
    assert "run failed" in out
    assert "not found" in out
    assert db_rows(tmp_path, "select status from runs") == [("failed",)]
    assert db_rows(tmp_path, "select distinct state from messages") == [("failed",)]


async def test_help_status_and_unknown_commands(tmp_path: Path) -> None:
    out = await run_console(write_config(tmp_path), ["!help", "!status", "!bogus"])
    assert "`!stop`" in out
    assert "Idle." in out
    assert "Unknown command `!bogus`" in out
    # Commands never become part of a batch.
    assert db_rows(tmp_path, "select count(*) from runs") == [(0,)]
    assert db_rows(tmp_path, "select distinct state from messages") == [("done",)]


async def test_stop_with_nothing_running(tmp_path: Path) -> None:
    out = await run_console(write_config(tmp_path), ["!stop"])
    assert "Nothing is running and nothing is waiting." in out


async def test_unauthorized_console_user_starts_nothing(tmp_path: Path) -> None:
    out = await run_console(
        write_config(tmp_path, {"defaults": {"allowed_users": ["someone-else"]}}), ["hello"]
    )
    assert "hello" not in out
    assert db_rows(tmp_path, "select count(*) from runs") == [(0,)]
    assert db_rows(tmp_path, "select count(*) from messages") == [(0,)]
    assert db_rows(tmp_path, "select action from audit") == [("message_ignored",)]


async def test_failed_run_can_be_retried(tmp_path: Path) -> None:
    path = write_config(tmp_path, env={"FAKE_CLAUDE_EXIT": "3"})
    out = await run_console(path, ["do it"])
    assert "run failed" in out
    write_config(tmp_path)  # the same configuration, now with a claude that succeeds
    out = await run_console(path, ["!retry"])
    assert "Retrying 1 message" in out
    assert out.splitlines()[-2] == "do it"  # then the progress message's last edit
    statuses = [r[0] for r in db_rows(tmp_path, "select status from runs order by started_at")]
    assert statuses == ["failed", "succeeded"]
    out = await run_console(path, ["!retry"])
    assert "no failed or interrupted run" in out


async def test_stop_during_a_run_kills_the_tree_and_drops_the_queue(tmp_path: Path) -> None:
    path = write_config(
        tmp_path,
        env={
            "FAKE_CLAUDE_SLEEP": "60",
            "FAKE_CLAUDE_GRANDCHILD": "1",
            "FAKE_CLAUDE_BACKGROUND": "1",
        },
    )
    async with ConsoleSession(load_settings(path)) as session:
        session.send("long job")
        # The tool use shows once claude is streaming, after it started its children.
        await session.wait_for("Bash: echo hello")
        run_id = await running_run(tmp_path)
        assert find_marked(run_id), "the run's processes should be alive"
        session.send("queued one")
        session.send("queued two")
        assert session.service is not None
        while session.service.parts.dispatcher.status(ROOM).waiting < 2:
            await asyncio.sleep(0.01)
        session.send("!stop")
        await session.wait_for("· Stopped after")
        await session.wait_for("Stopping the run of 1 message; dropped 2 waiting messages.")
        assert find_marked(run_id) == []
        await session.finish()
    assert db_rows(tmp_path, "select status from runs") == [("stopped",)]
    states = db_rows(
        tmp_path, "select text, state from messages where text not like '!%' order by id"
    )
    assert states == [("long job", "dropped"), ("queued one", "dropped"), ("queued two", "dropped")]
    dropped = db_rows(tmp_path, "select count(*) from audit where action = 'message_dropped'")
    assert dropped == [(2,)]


async def test_messages_during_a_run_become_one_follow_up_batch(tmp_path: Path) -> None:
    record = tmp_path / "record.json"
    path = write_config(
        tmp_path,
        env={**ECHO, "FAKE_CLAUDE_SLEEP": "1", "FAKE_CLAUDE_RECORD": str(record)},
    )
    async with ConsoleSession(load_settings(path)) as session:
        session.send("first")
        await session.wait_for("· Working")
        session.send("second")
        session.send("third")
        out = await session.finish()
    runs = db_rows(tmp_path, "select id from runs order by started_at")
    assert len(runs) == 2
    assert out.count("local wrote:") == 2
    assert (
        json.loads(record.read_text())["prompt"]
        == "local wrote:\n> second\n\nlocal wrote:\n> third"
    )


async def test_health_readiness_and_metrics_endpoints(tmp_path: Path) -> None:
    path = write_config(tmp_path, {"http": {"listen": "127.0.0.1:0"}})
    async with ConsoleSession(load_settings(path)) as session:
        session.send("one")
        session.send("two")
        await session.wait_for("local wrote:\n> two")
        session.send("!help")
        await session.wait_for("Commands:")
        assert session.service is not None
        while session.service.parts.dispatcher.active_runs:
            await asyncio.sleep(0.01)
        port = session.service.http_port
        assert port is not None
        base = f"http://127.0.0.1:{port}"
        async with aiohttp.ClientSession() as http:
            async with http.get(f"{base}/healthz") as resp:
                assert resp.status == 200
            async with http.get(f"{base}/readyz") as resp:
                assert resp.status == 200
                assert await resp.text() == "ready\n"
            async with http.get(f"{base}/metrics") as resp:
                assert resp.status == 200
                metrics = await resp.text()
    samples = {
        line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
        for line in metrics.splitlines()
        if line and not line.startswith("#")
    }
    assert samples['chatbridge_messages_total{outcome="accepted"}'] == 2
    assert samples['chatbridge_messages_total{outcome="command"}'] == 1
    assert samples["chatbridge_messages_coalesced_total"] == 2
    assert samples["chatbridge_runs_started_total"] == 1
    assert samples['chatbridge_runs_finished_total{status="succeeded"}'] == 1
    assert samples["chatbridge_run_duration_seconds_count"] == 1
    assert samples["chatbridge_active_runs"] == 0
    assert samples['chatbridge_transport_reconnects_total{transport="console"}'] == 0


async def test_duplicate_delivery_is_stored_and_dispatched_once(tmp_path: Path) -> None:
    async with ConsoleSession(load_settings(write_config(tmp_path))) as session:
        assert session.service is not None
        message = InboundMessage(ROOM, UserId("local"), "same", ExternalMessageId("ext-1"))
        results = await asyncio.gather(
            *(session.service.parts.intake.accept(message) for _ in range(5))
        )
        assert sorted(results) == sorted([Accepted.ACCEPTED] + [Accepted.DUPLICATE] * 4)
        out = await session.finish()
    assert out.splitlines()[-2] == "same"  # then the progress message's last edit
    assert db_rows(tmp_path, "select count(*) from messages") == [(1,)]
    assert db_rows(tmp_path, "select count(*) from runs") == [(1,)]


async def test_status_answers_from_the_store_during_and_after_a_run(tmp_path: Path) -> None:
    # Cold: the tool use shows while the run sleeps (a prestarted claude's comes so
    # soon after the progress message that its edit waits for the next tick).
    cold = {"runner": {"prestart": False}}
    path = write_config(tmp_path, cold, env={"FAKE_CLAUDE_SLEEP": "2"})
    async with ConsoleSession(load_settings(path)) as session:
        session.send("job")
        await session.wait_for("Bash: echo hello")
        session.send("waiting one")
        assert session.service is not None
        while session.service.parts.dispatcher.status(ROOM).waiting < 1:
            await asyncio.sleep(0.01)
        session.send("!status")
        out = await session.wait_for("Waiting: 1 message.")
        run_id = db_rows(tmp_path, "select id from runs")[0][0]
        assert "Running for " in out
        assert f"(1 message, run `{run_id}`)." in out
        assert "Session: none" in out
        out = await session.finish()
    session_id = db_rows(tmp_path, "select session_id from rooms")[0][0]
    out = await run_console(path, ["!status"])
    assert "Idle." in out
    assert "Waiting: 0 messages." in out
    assert f"Session: `{session_id}`." in out
    assert "Last run: succeeded, took " in out
    assert "cost $0.0123" in out


class PhaseRecordingConsole(ConsoleTransport):
    """Records the phases shown; once one is shown running, creates ``running``
    (the fake claude's ``FAKE_CLAUDE_WAIT_FOR``: it answers only then)."""

    def __init__(self, *args: object, running: Path, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.phases: list[tuple[tuple[str, ...], RunPhase]] = []
        self.running = running

    async def set_phase(
        self, room: RoomKey, message_ids: Sequence[ExternalMessageId], phase: RunPhase
    ) -> None:
        self.phases.append((tuple(message_ids), phase))
        if phase is RunPhase.RUNNING:
            self.running.touch()


async def test_batches_show_received_running_and_done(tmp_path: Path) -> None:
    # Cold: a prestarted fake claude answers before the run could be shown running.
    # The answer waits for the phase (a run that ends first is never shown running).
    running = tmp_path / "shown-running"
    path = write_config(
        tmp_path,
        {"runner": {"prestart": False}},
        env={**ECHO, "FAKE_CLAUDE_WAIT_FOR": str(running)},
    )
    settings = load_settings(path)
    read_fd, write_fd = os.pipe()
    os.write(write_fd, b"one\ntwo\n")
    os.close(write_fd)
    with os.fdopen(read_fd, "rb") as reader:
        console = PhaseRecordingConsole(
            "console", "local", stdin=reader, stdout=io.StringIO(), running=running
        )
        store = await open_store(settings)
        try:
            service = Service(settings, store, [console])
            # Shown running at once: this quick run would otherwise end before
            # typing_after_s, shown received and done only.
            service.parts.executor.typing_after_s = 0.0
            await service.serve()
        finally:
            await store.close()
    received = [ids for ids, phase in console.phases if phase is RunPhase.RECEIVED]
    later = [(ids, phase) for ids, phase in console.phases if phase is not RunPhase.RECEIVED]
    assert len(received) == 2
    assert all(len(ids) == 1 for ids in received)
    batch = received[0] + received[1]
    assert later == [(batch, RunPhase.RUNNING), (batch, RunPhase.DONE)]


async def test_stop_whose_drop_cannot_be_written_keeps_the_queue(tmp_path: Path) -> None:
    """Persist, then act: a failed write leaves memory and store agreeing (pending)."""
    path = write_config(tmp_path, env={"FAKE_CLAUDE_SLEEP": "60", "FAKE_CLAUDE_GRANDCHILD": "1"})
    flaky: list[FlakyStore] = []

    def wrap(store: Store) -> Store:
        flaky.append(FlakyStore(store))
        return flaky[0].store

    async with ConsoleSession(load_settings(path), wrap_store=wrap) as session:
        assert session.service is not None
        dispatcher = session.service.parts.dispatcher
        session.send("long job")
        await session.wait_for("Bash: echo hello")
        session.send("queued one")
        session.send("queued two")
        while dispatcher.status(ROOM).waiting < 2:
            await asyncio.sleep(0.01)
        flaky[0].fail("mark_dropped")
        session.send("!stop")
        await session.wait_for("Could not drop the 2 waiting messages: the database failed.")
        queued = "select text, state from messages where text like 'queued%' order by id"
        assert all(state != "dropped" for _, state in db_rows(tmp_path, queued))
        # Kept, in order: they are the next run once the stopped one has ended.
        async with asyncio.timeout(30):
            while len(db_rows(tmp_path, "select id from runs")) < 2:
                await asyncio.sleep(0.05)
        assert db_rows(tmp_path, queued) == [
            ("queued one", "dispatched"),
            ("queued two", "dispatched"),
        ]
        session.send("!stop")
        await session.wait_for("Stopping the run of 2 messages")
        await session.finish()
    assert db_rows(tmp_path, "select status from runs") == [("stopped",), ("stopped",)]


async def test_stop_stops_the_run_even_when_the_audit_cannot_be_written(tmp_path: Path) -> None:
    """Cancelling a run needs no write: a failing audit row never blocks the stop."""
    path = write_config(tmp_path, env={"FAKE_CLAUDE_SLEEP": "60"})
    flaky: list[FlakyStore] = []

    def wrap(store: Store) -> Store:
        flaky.append(FlakyStore(store))
        return flaky[0].store

    async with ConsoleSession(load_settings(path), wrap_store=wrap) as session:
        session.send("long job")
        await session.wait_for("Bash: echo hello")
        flaky[0].fail("audit", times=None)
        session.send("!stop")
        await session.wait_for("Stopping the run of 1 message; dropped 0 waiting messages.")
        await session.wait_for("Stopped")
        flaky[0].heal()
        await session.finish()
        assert flaky[0].failures["audit"] >= 1
    assert "Could not carry out" not in session.out.getvalue()
    assert db_rows(tmp_path, "select status from runs") == [("stopped",)]
