"""Conversations: a room's threads as conversations of their own, or one per room
that still answers each thread where it asked, through the real service."""

from __future__ import annotations

import asyncio
import sqlite3
import time
from dataclasses import replace
from pathlib import Path

import pytest

from bridge.config import load_settings
from bridge.core.model import Batch, ExternalMessageId, InboundMessage, ReplyKind, RunId, UserId
from bridge.core.transport import Accepted, RunPhase
from bridge.errors import ConfigError
from bridge.service import open_store
from runner.rundir import make_run_dir
from tests.bridge.chat_room import GUARD_S, ChatRoom, console_room, serving
from tests.bridge.harness import ECHO, write_config

# Every message is a batch at once: the tests follow runs, not windows.
AT_ONCE = {"coalesce_ms": 600_000, "max_wait_ms": 600_000, "max_batch": 1}


def runs(tmp_path: Path) -> list[tuple[str, str, str | None]]:
    """(room column, status, session) of every run, in start order."""
    with sqlite3.connect(tmp_path / "bridge.db") as db:
        return db.execute("select room_id, status, session_id from runs order by seq").fetchall()


def results(chat: ChatRoom) -> list[tuple[str | None, str]]:
    """(thread, text) of every answer, in order."""
    return [(r.thread, r.text) for r in chat.replies if r.kind is ReplyKind.RESULT]


async def test_each_thread_is_a_conversation_with_its_own_session(tmp_path: Path) -> None:
    config = {"dispatcher": AT_ONCE, "defaults": {"conversation": "thread"}}
    settings = load_settings(write_config(tmp_path, config))
    async with serving(settings) as (service, chat):
        top, _ = await chat.say("first question")  # opens a thread of its own
        await chat.say("elsewhere", thread="t9")
        await chat.wait_until(lambda: len(results(chat)) == 2)
        await chat.say("and a follow-up", thread=top)
        await chat.wait_until(lambda: len(results(chat)) == 3)
        await chat.say("!status", thread="t9")
        await chat.wait_until(lambda: len(chat.texts(ReplyKind.NOTICE)) >= 1)
        sessions = {
            thread: await service.store.get_session(chat.room.in_thread(thread))
            for thread in (top, "t9")
        }
        assert await service.store.get_session(chat.room) is None  # the room has none

    # Each answer went to the thread it was asked in: the top-level message's own.
    assert sorted(results(chat)) == sorted(
        [(top, "first question"), ("t9", "elsewhere"), (top, "and a follow-up")]
    )
    [status] = [r for r in chat.replies if r.kind is ReplyKind.NOTICE]
    assert status.thread == "t9"
    assert "no run" in status.text.lower() or "idle" in status.text.lower(), status.text
    recorded = runs(tmp_path)
    assert {room for room, _, _ in recorded} == {f"console/{top}", "console/t9"}
    assert all(status == "succeeded" for _, status, _ in recorded)
    # The follow-up resumed its thread's session; the other thread has its own.
    by_room = {room: session for room, _, session in recorded}
    assert by_room[f"console/{top}"] == sessions[top]
    assert by_room["console/t9"] == sessions["t9"]
    assert sessions[top] != sessions["t9"]
    assert [s for room, _, s in recorded if room == f"console/{top}"] == [sessions[top]] * 2


async def test_a_stop_in_one_thread_leaves_the_others_running(tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    config = {"dispatcher": AT_ONCE, "defaults": {"conversation": "thread"}}
    env = {**ECHO, "FAKE_CLAUDE_WAIT_FOR": str(gate)}
    settings = load_settings(write_config(tmp_path, config, env=env))
    async with serving(settings) as (service, chat):
        one, _ = await chat.say("one", thread="a")
        await chat.say("two", thread="b")
        b = chat.room.in_thread("b")
        await chat.wait_until(lambda: service.parts.dispatcher.active_runs == 2)
        await chat.say("!stop", thread="a")
        await chat.wait_until(lambda: chat.phases.get(one) is RunPhase.STOPPED)
        assert service.parts.dispatcher.status(b).running is not None
        gate.touch()
        await chat.wait_until(lambda: len(results(chat)) == 1)
        async with asyncio.timeout(GUARD_S):
            await service.parts.dispatcher.wait_idle()
    assert results(chat) == [("b", "two")]
    assert sorted((room, status) for room, status, _ in runs(tmp_path)) == [
        ("console/a", "stopped"),
        ("console/b", "succeeded"),
    ]


async def test_max_runs_per_room_holds_the_rooms_other_threads(tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    config = {
        "dispatcher": AT_ONCE,
        "defaults": {"conversation": "thread", "max_runs_per_room": 1},
    }
    env = {**ECHO, "FAKE_CLAUDE_WAIT_FOR": str(gate)}
    settings = load_settings(write_config(tmp_path, config, env=env))
    async with serving(settings) as (service, chat):
        await chat.say("one", thread="a")
        await chat.say("two", thread="b")
        b = chat.room.in_thread("b")
        await chat.wait_until(lambda: service.parts.dispatcher.active_runs == 1)
        # The global cap (4 by default) has room; the room's does not.
        assert service.parts.dispatcher.status(b).waiting_for_slot
        gate.touch()
        await chat.wait_until(lambda: len(results(chat)) == 2)
    assert results(chat) == [("a", "one"), ("b", "two")]


async def test_in_one_room_conversation_a_batch_is_answered_where_it_was_asked(
    tmp_path: Path,
) -> None:
    """``conversation = "channel"``: messages from the top level and from a thread
    that arrive together are run one after the other, each answered in its place."""
    window = {"coalesce_ms": 600_000, "max_wait_ms": 600_000, "max_batch": 3}
    settings = load_settings(write_config(tmp_path, {"dispatcher": window}))
    async with serving(settings) as (service, chat):
        await chat.say("top one")
        await chat.say("in a thread", thread="t1")
        await chat.say("top two")
        await chat.wait_until(lambda: len(results(chat)) == 3)
        assert await service.store.get_session(chat.room) is not None
    assert results(chat) == [(None, "top one"), ("t1", "in a thread"), (None, "top two")]
    # One conversation: every run is the room's, and each resumed the last one's session.
    recorded = runs(tmp_path)
    assert [room for room, _, _ in recorded] == ["console"] * 3
    assert len({session for _, _, session in recorded}) == 1


def test_a_thread_conversation_keeps_its_rooms_settings(tmp_path: Path) -> None:
    settings = load_settings(write_config(tmp_path, {"defaults": {"conversation": "thread"}}))
    room = next(iter(settings.room_settings))
    thread = room.in_thread("1700000000.000100")
    assert settings.room(thread) is settings.room(room) is not None
    assert thread.channel == room
    assert str(thread) == "console:console/1700000000.000100"


async def test_top_level_status_and_stop_act_on_every_thread(tmp_path: Path) -> None:
    """In a room of thread conversations a top-level command has no conversation of
    its own to act on: ``!status`` and ``!stop`` there cover the room's threads."""
    gate = tmp_path / "gate"
    config = {"dispatcher": AT_ONCE, "defaults": {"conversation": "thread"}}
    env = {**ECHO, "FAKE_CLAUDE_WAIT_FOR": str(gate)}
    settings = load_settings(write_config(tmp_path, config, env=env))
    async with serving(settings) as (service, chat):
        await chat.say("one", thread="a")
        await chat.say("two", thread="b")
        await chat.wait_until(lambda: service.parts.dispatcher.active_runs == 2)
        await chat.say("queued behind one", thread="a")
        status, _ = await chat.say("!status")
        await chat.wait_until(lambda: len(chat.texts(ReplyKind.NOTICE)) == 1)
        stop, _ = await chat.say("!stop")
        await chat.wait_until(lambda: len(chat.texts(ReplyKind.NOTICE)) == 2)
        async with asyncio.timeout(GUARD_S):
            await service.parts.dispatcher.wait_idle()
        again, _ = await chat.say("!stop")
        await chat.wait_until(lambda: len(chat.texts(ReplyKind.NOTICE)) == 3)
    shown, stopped, nothing = [r for r in chat.replies if r.kind is ReplyKind.NOTICE]
    assert shown.text.splitlines() == [
        "Thread `a`: running; 1 message waiting.",
        "Thread `b`: running; 0 messages waiting.",
    ]
    assert stopped.text == "Stopping 2 runs in this room's threads; dropped 1 waiting message."
    assert nothing.text == "Nothing is running or waiting in this room's threads."
    # Each answer opens the command's own thread, as any top-level message's.
    assert [r.thread for r in (shown, stopped, nothing)] == [status, stop, again]
    assert results(chat) == []
    assert sorted(status for _, status, _ in runs(tmp_path)) == ["stopped", "stopped"]


async def test_with_mention_trigger_a_thread_in_conversation_needs_no_mention(
    tmp_path: Path,
) -> None:
    """``trigger = "mention"``: a new conversation starts with a mention; replies in
    the thread go on without one, and a thread the bot is not in stays ignored."""
    room = {
        "transport": "console",
        "id": "console",
        "trigger": "mention",
        "conversation": "thread",
        "allowed_users": ["local"],
    }
    settings = load_settings(write_config(tmp_path, {"dispatcher": AT_ONCE, "rooms": [room]}))
    chat = ChatRoom(next(iter(settings.room_settings)), "local")
    async with serving(settings, chat) as (_, chat):
        _, ignored = await chat.say("not for the bot", thread="other")
        assert ignored is Accepted.IGNORED
        assert chat.sink is not None
        root = InboundMessage(chat.room, chat.user, "@bot hello", ExternalMessageId("root"))
        assert await chat.sink(replace(root, mentions_bot=True)) is Accepted.ACCEPTED
        await chat.wait_until(lambda: len(results(chat)) == 1)
        _, followed = await chat.say("and then", thread="root")
        assert followed is Accepted.ACCEPTED
        await chat.wait_until(lambda: len(results(chat)) == 2)
    assert results(chat) == [("root", "@bot hello"), ("root", "and then")]


async def test_a_run_asked_in_a_thread_and_cut_by_a_crash_is_reported_in_that_thread(
    tmp_path: Path,
) -> None:
    """``conversation = "channel"``: the restart's word on a run a crash cut off
    goes where the run was asked (its answer would have), not to the top level."""
    settings = load_settings(write_config(tmp_path))
    room = console_room(settings)
    store = await open_store(settings)
    try:
        inbound = InboundMessage(
            room, UserId("local"), "long job", ExternalMessageId("in-t"), thread="t1"
        )
        message = await store.accept(inbound, time.time())
        assert message is not None
        await store.start_run(RunId("run-crashed"), Batch(room, (message,)), time.time())
        # Begun: its directory is there (see bridge/runs/stale_runs.py).
        make_run_dir(settings.runner.state_dir, RunId("run-crashed"))
    finally:
        await store.close()
    async with serving(settings) as (_, chat):
        await chat.wait_until(lambda: any("did not finish" in t for t in chat.texts()))
    [notice] = [r for r in chat.replies if "did not finish" in r.text]
    assert notice.thread == "t1"


def test_thread_conversations_need_room_ids_that_leave_room_for_a_thread(
    tmp_path: Path,
) -> None:
    config = {"defaults": {"conversation": "thread"}, "console": {"room": "r" * 230}}
    with pytest.raises(ConfigError, match='conversation = "thread" needs a room id of at most'):
        load_settings(write_config(tmp_path, config))
    # A room-wide conversation keeps no thread beside the room's id.
    load_settings(write_config(tmp_path, {"console": {"room": "r" * 230}}))


async def test_edits_and_deletions_reach_a_thread_conversations_waiting_messages(
    tmp_path: Path,
) -> None:
    """Transports name only the room in an edit or a deletion: the waiting message
    is found in whichever thread conversation holds it, and its run has the change."""
    window = {"coalesce_ms": 600_000, "max_wait_ms": 600_000, "max_batch": 3}
    config = {"dispatcher": window, "defaults": {"conversation": "thread"}}
    settings = load_settings(write_config(tmp_path, config))
    async with serving(settings) as (_, chat):
        top, _ = await chat.say("draft question")  # opens its own thread
        doomed, _ = await chat.say("never mind this", thread=top)
        assert await chat.edited(top, "final question") is Accepted.ACCEPTED
        assert await chat.deleted(doomed) is Accepted.ACCEPTED
        await chat.say("and this", thread=top)
        await chat.say("elsewhere", thread="t2")
        await chat.say("more", thread="t2")
        await chat.say("!stop", thread="t2")  # the other conversation's batch goes
        await chat.say("one", thread=top)  # the batch is full: it runs
        await chat.wait_until(lambda: len(results(chat)) == 1)
    [(thread, prompt)] = results(chat)  # the echo of the batch's prompt
    assert thread == top
    assert [line for line in prompt.splitlines() if line and "wrote:" not in line] == [
        "> final question",
        "> and this",
        "> one",
    ]
