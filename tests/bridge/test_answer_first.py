"""The answer goes out on claude's result line: before claude exits, ahead of every
cosmetic update, in one message when the run was quick; claude is spawned before
the room is shown that it runs."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import pytest

from bridge.config import Settings, load_settings
from bridge.core.model import (
    ExternalMessageId,
    Reply,
    ReplyKind,
    RoomKey,
    RunStatus,
)
from bridge.core.transport import Delivery, RunPhase
from bridge.store.base import RunEnding, Store
from tests.bridge.chat_room import console_room, serving
from tests.bridge.harness import ConsoleSession, rows, write_config
from tests.bridge.log_seen import LogSeen
from tests.bridge.timeline import WAIT_S, Timeline, settings
from tests.config_files import Table
from tests.runner.conftest import is_alive


async def test_the_answer_goes_out_while_claude_still_runs(tmp_path: Path) -> None:
    record = tmp_path / "claude.json"
    env = {
        "FAKE_CLAUDE_RESULT": "THE-ANSWER",
        "FAKE_CLAUDE_LINGER": "300",
        "FAKE_CLAUDE_RECORD": str(record),
    }
    # The runner would give the lingering claude a minute before stopping it;
    # the service's stop at the end of the block does not wait for it.
    config: Table = {"runner": {"stop_grace_s": 60.0, "shutdown_grace_s": 0}}
    async with serving(settings(tmp_path, config, env)) as (_, chat):
        await chat.say("compute it")
        await chat.wait_until(lambda: "THE-ANSWER" in chat.texts(ReplyKind.RESULT))
        pid = json.loads(record.read_text())["pid"]
        assert is_alive(pid)
        # Recorded with the answer, before claude ended.
        assert rows(tmp_path, "select status from runs") == [("succeeded",)]
        assert rows(tmp_path, "select state from messages") == [("done",)]
    assert not is_alive(pid)
    # The stop that ended the lingering process did not change the outcome.
    assert rows(tmp_path, "select status from runs") == [("succeeded",)]
    assert chat.texts(ReplyKind.RESULT) == ["THE-ANSWER"]


async def test_a_quick_run_posts_only_its_answer(tmp_path: Path) -> None:
    config: Table = {"progress": {"show_after_s": 60}}
    chat = Timeline(console_room(settings(tmp_path, config, {})), "local")
    chat.tmp_path = tmp_path
    async with serving(settings(tmp_path, config, {"FAKE_CLAUDE_RESULT": "quick"}), chat):
        await chat.say("hi")
        await chat.wait_until(lambda: ("phase", RunPhase.DONE.value) in chat.events)
    assert [(r.kind, r.text) for r in chat.replies] == [(ReplyKind.RESULT, "quick")]
    assert "edit" not in chat.kinds()
    # Shown running only once claude ran (or not at all, when the answer came before
    # the run was registered); the answer before typing went off.
    assert chat.on_start == []
    typing = [e for e in chat.events if e[0] == "typing"]
    assert typing in ([], [("typing", "True"), ("typing", "False")])
    if typing:
        assert chat.kinds().index("send result") < chat.events.index(("typing", "False"))


@pytest.mark.parametrize("is_error", [False, True], ids=["answer", "error"])
async def test_a_run_ending_within_the_typing_delay_shows_no_typing(
    tmp_path: Path, is_error: bool
) -> None:
    """Ended before claude had worked ``typing_after_s``: neither typing on and off nor
    the running phase, only the outcome; and the delay holds up no end (an error
    result has no answer to cut it short: the run's end does)."""
    config: Table = {"progress": {"show_after_s": 60}}
    chat = Timeline(console_room(settings(tmp_path, config, {})), "local")
    env = {"FAKE_CLAUDE_RESULT": "quick", **({"FAKE_CLAUDE_IS_ERROR": "1"} if is_error else {})}
    async with serving(settings(tmp_path, config, env), chat) as (service, _):
        service.parts.executor.typing_after_s = 3600.0
        await chat.say("hi")
        ended = RunPhase.FAILED if is_error else RunPhase.DONE
        await chat.wait_until(lambda: ("phase", ended.value) in chat.events)
        await service.parts.dispatcher.wait_idle()
    assert [e for e in chat.events if e[0] == "typing"] == []
    assert ("phase", RunPhase.RUNNING.value) not in chat.events


class SlowRegistration:
    """The real store, holding a run's registration until ``go`` is set."""

    def __init__(self, store: Store) -> None:
        self._store = store
        self.go = asyncio.Event()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    async def register_live_run(self, *args: Any, **kw: Any) -> Any:
        await self.go.wait()
        return await self._store.register_live_run(*args, **kw)


class InputAtFinish:
    """The real store, noting at each ``finish_run`` whether claude's input was closed
    already (the room's run control, once :attr:`service` is set)."""

    def __init__(self, store: Store) -> None:
        self._store = store
        self.service: Any = None
        self.closed_at_finish: list[bool] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    async def finish_run(self, ending: RunEnding) -> Any:
        executor = self.service.parts.executor
        control = executor.live_runs.control(console_room(executor.settings), ending.run_id)
        assert control is not None  # bound until the run's end is shown
        self.closed_at_finish.append(control.closed)
        return await self._store.finish_run(ending)


async def test_claudes_input_is_closed_before_the_answer_is_recorded(tmp_path: Path) -> None:
    # Not after the record (tried, reverted): a replica stalled in between (a pause)
    # kept its answered claude alive past its lease, beside the new owner's run of the
    # conversation (the replicas' chaos test).
    record = tmp_path / "claude.json"
    given = settings(
        tmp_path, {}, {"FAKE_CLAUDE_RESULT": "quick", "FAKE_CLAUDE_RECORD": str(record)}
    )
    held: list[InputAtFinish] = []

    def wrap(store: Store) -> Store:
        held.append(InputAtFinish(store))
        return cast(Store, held[0])

    chat = Timeline(console_room(given), "local")
    async with serving(given, chat, wrap) as (service, _):
        held[0].service = service
        await chat.say("hi")
        # The run's end is shown once claude has exited.
        await chat.wait_until(lambda: ("phase", RunPhase.DONE.value) in chat.events)
    assert not is_alive(json.loads(record.read_text())["pid"])
    assert held[0].closed_at_finish == [True]
    assert chat.texts(ReplyKind.RESULT) == ["quick"]
    assert rows(tmp_path, "select status from runs") == [("succeeded",)]


class StartAfterRead:
    """The real store, whose ``start_run`` commits only once the run's read of its
    room's session has begun (a deadlock, bounded by the test, if that read waited for
    the start)."""

    def __init__(self, store: Store) -> None:
        self._store = store
        self.reading = asyncio.Event()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    async def room_state(self, *args: Any, **kw: Any) -> Any:
        self.reading.set()
        return await self._store.room_state(*args, **kw)

    async def start_run(self, *args: Any, **kw: Any) -> Any:
        async with asyncio.timeout(WAIT_S):
            await self.reading.wait()
        return await self._store.start_run(*args, **kw)


async def test_a_run_reads_its_rooms_session_beside_its_starts_record(tmp_path: Path) -> None:
    given = settings(tmp_path, {}, {"FAKE_CLAUDE_RESULT": "quick"})
    held: list[StartAfterRead] = []

    def wrap(store: Store) -> Store:
        held.append(StartAfterRead(store))
        return cast(Store, held[0])

    async with serving(given, None, wrap) as (_, chat):
        await chat.say("hi")
        await chat.wait_until(lambda: chat.texts(ReplyKind.RESULT) == ["quick"])
    assert rows(tmp_path, "select status from runs") == [("succeeded",)]


async def test_an_answer_before_the_run_is_registered_shows_no_typing(tmp_path: Path) -> None:
    config: Table = {"progress": {"show_after_s": 60}}
    given = settings(tmp_path, config, {"FAKE_CLAUDE_RESULT": "quick"})
    chat = Timeline(console_room(given), "local")
    held: list[SlowRegistration] = []

    def wrap(store: Store) -> Store:
        held.append(SlowRegistration(store))
        return cast(Store, held[0])

    answered = asyncio.Event()

    class AnswerRead(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if record.getMessage() == "claude printed its answer":
                answered.set()  # the executor has taken the answer (its task runs)

    runs_log = logging.getLogger("bridge.runs.executor")
    handler = AnswerRead(logging.INFO)
    runs_log.addHandler(handler)
    level = runs_log.level
    runs_log.setLevel(logging.INFO)
    try:
        async with serving(given, chat, wrap):
            await chat.say("hi")
            async with asyncio.timeout(WAIT_S):
                await answered.wait()
            held[0].go.set()
            await chat.wait_until(lambda: ("phase", RunPhase.DONE.value) in chat.events)
    finally:
        runs_log.removeHandler(handler)
        runs_log.setLevel(level)
        await chat.wait_until(lambda: ("phase", RunPhase.DONE.value) in chat.events)
    assert chat.texts(ReplyKind.RESULT) == ["quick"]
    # Neither typing on nor off, nor the running phase: the answer was on its way.
    assert [e for e in chat.events if e[0] == "typing"] == []
    assert ("phase", RunPhase.RUNNING.value) not in chat.events
    assert rows(tmp_path, "select status from runs") == [("succeeded",)]


async def test_a_long_run_posts_progress_then_the_answer_then_finishes_progress(
    tmp_path: Path,
) -> None:
    trigger = tmp_path / "answer-now"
    env = {"FAKE_CLAUDE_RESULT": "slow", "FAKE_CLAUDE_WAIT_FOR": str(trigger)}
    config: Table = {"progress": {"show_after_s": 0.05}}
    chat = Timeline(console_room(settings(tmp_path, config, env)), "local")
    chat.tmp_path = tmp_path
    async with serving(settings(tmp_path, config, env), chat):
        await chat.say("take your time")
        await chat.wait_until(lambda: bool(chat.texts(ReplyKind.PROGRESS)))
        trigger.touch()
        await chat.wait_until(lambda: ("phase", RunPhase.DONE.value) in chat.events)
        # The last edit is made beside the room, once the edit budget allows.
        await chat.wait_until(lambda: any(text.startswith("Done after") for _, text in chat.events))
    assert [r.kind for r in chat.replies] == [ReplyKind.PROGRESS, ReplyKind.RESULT]
    assert chat.on_start == []
    answer = chat.kinds().index("send result")
    finished = [i for i, (_, text) in enumerate(chat.events) if text.startswith("Done after")]
    assert finished
    assert finished[0] > answer
    assert chat.kinds().index("send progress") < answer


class SlowProgressPosts(Timeline):
    """A chat server that takes the progress message's post slowly (until ``posts`` is set)."""

    def __init__(self, room: RoomKey, user: str) -> None:
        super().__init__(room, user)
        self.progress_posting = asyncio.Event()
        self.posts = asyncio.Event()

    async def send(
        self, reply: Reply, delivery: Delivery | None = None
    ) -> ExternalMessageId | None:
        if reply.kind is ReplyKind.PROGRESS:
            self.progress_posting.set()
            await self.posts.wait()
        return await super().send(reply, delivery)

    def finished(self) -> bool:
        return any(what == "edit" and text.startswith("Done after") for what, text in self.events)


class EndRecorded:
    """The real store, telling when a run's end is committed."""

    def __init__(self, store: Store) -> None:
        self._store = store
        self.recorded = asyncio.Event()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    async def finish_run(self, ending: RunEnding) -> Any:
        entries = await self._store.finish_run(ending)
        self.recorded.set()
        return entries


async def test_a_progress_post_under_way_at_the_answer_lands_above_it(tmp_path: Path) -> None:
    env = {"FAKE_CLAUDE_RESULT": "THE-ANSWER"}
    given = settings(tmp_path, {}, env)  # show_after_s 0: posted as claude starts
    chat = SlowProgressPosts(console_room(given), "local")
    ends: list[EndRecorded] = []

    def wrap(store: Store) -> Store:
        ends.append(EndRecorded(store))
        return cast(Store, ends[0])

    async with serving(given, chat, wrap):
        await chat.say("quick")
        async with asyncio.timeout(WAIT_S):
            await chat.progress_posting.wait()
            await ends[0].recorded.wait()  # the answer is recorded, its post under way
            chat.posts.set()
        await chat.wait_until(chat.finished)
    kinds = chat.kinds()
    done = next(i for i, (what, text) in enumerate(chat.events) if text.startswith("Done after"))
    assert kinds.index("send progress") < kinds.index("send result") < done


async def test_a_progress_post_slower_than_the_cosmetic_bound_is_still_finished(
    tmp_path: Path,
) -> None:
    env = {"FAKE_CLAUDE_RESULT": "THE-ANSWER"}
    given = settings(tmp_path, {}, env)
    chat = SlowProgressPosts(console_room(given), "local")
    async with serving(given, chat) as (service, _):
        service.parts.executor.cosmetic_timeout_s = 0.2  # the answer waits this long for the post
        await chat.say("quick")
        async with asyncio.timeout(WAIT_S):
            await chat.progress_posting.wait()
            await chat.wait_until(lambda: bool(chat.texts(ReplyKind.RESULT)))
            await chat.wait_until(lambda: ("phase", RunPhase.DONE.value) in chat.events)
            chat.posts.set()  # long after the bound: the post must not have been cut off
        await chat.wait_until(chat.finished)
    kinds = chat.kinds()
    assert kinds.index("send result") < kinds.index("send progress") < kinds.index("edit")


class CountedFinishes:
    """The real store, counting the calls that record a run's end."""

    def __init__(self, store: Store) -> None:
        self._store = store
        self.finishes: list[RunStatus] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    async def finish_run(self, ending: RunEnding) -> Any:
        self.finishes.append(ending.report.status)
        return await self._store.finish_run(ending)


async def finished(session: ConsoleSession) -> None:
    """Until the run's progress message says how it ended."""
    while not any(end in session.out.getvalue() for end in ("· Done after", "· Stopped after")):
        session.out.changed.clear()
        await session.out.changed.wait()


async def stop_at_the_end(
    settings: Settings,
    wrap: Callable[[Store], Store],
    initialised: LogSeen,
    trigger: Path,
    order: str,
) -> str:
    """Run one message; once claude waits for ``trigger``, touch it and send !stop."""
    async with ConsoleSession(settings, wrap_store=wrap) as session:
        session.send("compute it")
        async with asyncio.timeout(WAIT_S):
            await initialised.seen.wait()  # claude printed its first line: it waits now
            # The fake polls for the trigger every 2 ms; the stop takes a few ms
            # through the console and the dispatcher. Either outcome is right.
            if order == "stop, then result":
                session.send("!stop")
                await session.wait_for("Stopping the run")
                trigger.touch()
            elif order == "stop and result at once":
                session.send("!stop")
                trigger.touch()
            else:
                trigger.touch()
                session.send("!stop")
            await finished(session)
        return await session.finish()


@pytest.mark.parametrize(
    "order", ["stop, then result", "stop and result at once", "result and stop at once"]
)
async def test_a_stop_racing_the_result_line_records_one_consistent_outcome(
    tmp_path: Path, order: str
) -> None:
    """claude prints its result while a !stop arrives: whichever wins, the run is
    recorded once, and the answer goes out exactly when the outcome is succeeded."""
    trigger = tmp_path / "answer-now"
    env = {"FAKE_CLAUDE_RESULT": "THE-ANSWER", "FAKE_CLAUDE_WAIT_FOR": str(trigger)}
    counted: list[CountedFinishes] = []

    def wrap(store: Store) -> Store:
        counted.append(CountedFinishes(store))
        return cast(Store, counted[0])

    path = write_config(tmp_path, {"dispatcher": {"coalesce_ms": 0}}, env=env)
    initialised = LogSeen("the run writes to session")  # logged at DEBUG
    initialised.setLevel(logging.DEBUG)
    runs_log = logging.getLogger("bridge.runs.executor")
    level = runs_log.level
    runs_log.setLevel(logging.DEBUG)
    runs_log.addHandler(initialised)
    try:
        out = await stop_at_the_end(load_settings(path), wrap, initialised, trigger, order)
    finally:
        runs_log.removeHandler(initialised)
        runs_log.setLevel(level)
    status = rows(tmp_path, "select status from runs")
    assert len(counted[0].finishes) == 1
    answers = rows(tmp_path, "select state from outbox where text = 'THE-ANSWER'")
    if status == [("succeeded",)]:
        assert answers == [("delivered",)]
        assert "\nTHE-ANSWER\n" in out
    else:
        assert status == [("stopped",)]
        assert answers == []
        assert "THE-ANSWER" not in out
