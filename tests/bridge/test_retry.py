"""``!retry`` keeps its word: an offer holds until that run is retried or superseded."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from bridge.config import Settings, load_settings
from bridge.core.model import (
    Batch,
    ExternalMessageId,
    InboundMessage,
    Message,
    ReplyKind,
    RoomId,
    RoomKey,
    RunId,
    TransportName,
    UserId,
)
from bridge.core.transport import InboundSink
from bridge.service import Service, open_store
from runner.rundir import make_run_dir
from tests.bridge.chat_room import GUARD_S, ChatRoom, serving
from tests.bridge.harness import ConsoleSession, rows, run_console, write_config


def console_room(settings: Settings) -> RoomKey:
    return RoomKey(TransportName("console"), RoomId(settings.console.room))


async def left_by_a_crash(settings: Settings, run_id: RunId, *, begun: bool = True) -> None:
    """What a kill -9 during a run leaves: the run still 'running', a message waiting;
    not ``begun``: killed between recording the start and making the run's directory."""
    room = console_room(settings)
    user = UserId(settings.console.user)
    store = await open_store(settings)
    try:
        accepted: list[Message] = []
        for n, text in enumerate(["long job", "queued one"]):
            inbound = InboundMessage(room, user, text, ExternalMessageId(f"before-{n}"))
            message = await store.accept(inbound, time.time())
            assert message is not None
            accepted.append(message)
        await store.start_run(run_id, Batch(room, (accepted[0],)), time.time())
        # The run had begun: its directory is there (a run with none never started,
        # and its messages would simply run again).
        if begun:
            make_run_dir(settings.runner.state_dir, run_id)
    finally:
        await store.close()


async def test_the_offer_after_a_restart_survives_the_requeued_messages(tmp_path: Path) -> None:
    settings = load_settings(write_config(tmp_path))
    crashed = RunId("run-crashed")
    await left_by_a_crash(settings, crashed)

    async with ConsoleSession(settings) as session:
        offer = f"The last run (`{crashed}`) did not finish before chatbridge restarted"
        await session.wait_for(f"{offer}")
        await session.wait_for(f"`!retry {crashed}` runs it again.")
        # The message that waited before the restart runs first, and succeeds.
        await session.wait_for("· Done after")
        await session.wait_for("queued one\n")
        session.send("!status")
        await session.wait_for("Can be retried")
        session.send("!retry")
        await session.wait_for(f"Retrying 1 message of run `{crashed}`.")
        await session.wait_for("· Done after", count=2)
        session.send("!retry")
        await session.wait_for("There is no failed or interrupted run to retry.")
        out = await session.finish()

    assert f"- run `{crashed}`: interrupted " in out
    assert out.rstrip().endswith("There is no failed or interrupted run to retry.")
    runs = rows(tmp_path, "select id, status from runs order by seq")
    assert [r[1] for r in runs] == ["interrupted", "succeeded", "succeeded"]
    retried = rows(
        tmp_path,
        "select rm.run_id, m.text from run_messages rm join messages m on m.id = rm.message_id",
    )
    assert (runs[2][0], "long job") in retried
    audit = rows(tmp_path, "select run_id from audit where action = 'retry_requested'")
    assert audit == [(crashed,)]


async def test_retry_names_an_earlier_run_and_queues_behind_an_active_one(
    tmp_path: Path,
) -> None:
    path = write_config(tmp_path, env={"FAKE_CLAUDE_EXIT": "3"})
    await run_console(path, ["first"])
    await run_console(path, ["second"])
    first, second = (str(r[0]) for r in rows(tmp_path, "select id from runs order by seq"))

    write_config(tmp_path, env={"FAKE_CLAUDE_ECHO": "1", "FAKE_CLAUDE_SLEEP": "1"})
    async with ConsoleSession(load_settings(path)) as session:
        session.send("!retry no-such-run")
        await session.wait_for("Run `no-such-run` cannot be retried here")
        session.send(f"!retry {first}")
        await session.wait_for(f"Retrying 1 message of run `{first}`.")
        await session.wait_for("· Working")
        # Not refused while a run is active: the retried messages queue behind it.
        session.send("!retry")
        await session.wait_for(f"Retrying 1 message of run `{second}`.")
        session.send(f"!retry {first}")
        await session.wait_for(f"Run `{first}` cannot be retried here")
        await session.finish()

    statuses = rows(tmp_path, "select status from runs order by seq")
    assert [s[0] for s in statuses] == ["failed", "failed", "succeeded", "succeeded"]
    assert rows(tmp_path, "select text, state from messages where text not like '!%'") == [
        ("first", "done"),
        ("second", "done"),
    ]


class NeverConnects(ChatRoom):
    """A chat server that cannot be reached: ``connecting`` is set once the service tries."""

    def __init__(self, room: RoomKey, user: str) -> None:
        super().__init__(room, user)
        self.connecting = asyncio.Event()

    async def run(self, sink: InboundSink, ready: asyncio.Event) -> None:
        self.connecting.set()
        await asyncio.Event().wait()


async def test_the_interrupted_notice_survives_a_start_that_stops_after_recovery(
    tmp_path: Path,
) -> None:
    """Recovery records the notice with the outcome; a later start sends it, once."""
    settings = load_settings(write_config(tmp_path))
    crashed = RunId("run-crashed")
    await left_by_a_crash(settings, crashed)

    # A start stopped (SIGTERM) after recovery, before its transport connected.
    store = await open_store(settings)
    try:
        unreachable = NeverConnects(console_room(settings), settings.console.user)
        service = Service(settings, store, [unreachable])
        serving_task = asyncio.create_task(service.serve())
        async with asyncio.timeout(GUARD_S):
            await unreachable.connecting.wait()
            service.request_stop()
            await serving_task
    finally:
        await store.close()
    assert rows(tmp_path, "select status from runs") == [("interrupted",)]
    assert unreachable.replies == []

    offer = f"The last run (`{crashed}`) did not finish before chatbridge restarted"
    async with serving(settings) as (_, chat):
        await chat.wait_until(lambda: any(offer in text for text in chat.texts()))
    assert sum(offer in text for text in chat.texts()) == 1
    notices = "select state from outbox where text like '%did not finish before chatbridge%'"
    assert rows(tmp_path, notices) == [("delivered",)]


async def test_a_run_killed_before_it_began_runs_its_messages_again(tmp_path: Path) -> None:
    """Killed between its recorded start and its supervisor: nothing of it ran, so its
    message runs (once) after the restart, with no interrupted run to offer."""
    settings = load_settings(write_config(tmp_path))
    crashed = RunId("run-crashed")
    await left_by_a_crash(settings, crashed, begun=False)
    async with serving(settings) as (_, chat):
        await chat.wait_until(lambda: len(chat.texts(ReplyKind.RESULT)) == 1)
    # Both waiting messages, in order, in one batch: as if the crashed run never began.
    [answer] = chat.texts(ReplyKind.RESULT)
    assert answer.index("long job") < answer.index("queued one")
    assert not any("did not finish" in text for text in chat.texts())
    runs = rows(tmp_path, "select id, status, error_excerpt from runs order by seq")
    assert runs[0] == (crashed, "interrupted", "stopped before claude was started")
    assert [status for _, status, _ in runs[1:]] == ["succeeded"]
