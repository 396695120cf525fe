"""Adversarial review of the spare supervisors and of typing cleared after the answer
(bridge/runs/executor.py ``_cosmetics``): the service end to end, with the fake claude."""

from __future__ import annotations

import asyncio
import os
import signal
import sqlite3
from pathlib import Path

import pytest

from bridge.core.model import ExternalMessageId, Reply, ReplyKind, RoomKey
from bridge.core.transport import Delivery, RateLimited, RunPhase
from runner.process import find_marked
from tests.bridge.bridge_process import Bridge, run_pids, wait_rows
from tests.bridge.chat_room import GUARD_S, console_room, serving
from tests.bridge.detached_runs import started_run, supervisor_pid, waiting
from tests.bridge.harness import write_config
from tests.bridge.timeline import Timeline, settings
from tests.config_files import Table
from tests.runner.conftest import gone, is_alive
from tests.runner.containment import alive

RETRY_AFTER_S = 60.0
"""Longer than the wait for the answer before the cosmetics (cosmetic_timeout_s)."""
QUICK_DRAIN: Table = {"delivery": {"drain_timeout_s": 0.2}}
"""The shutdown gives up the rate-limited answer at once."""


class LimitedAnswer(Timeline):
    """A chat server that answers the first post of the answer with "too many
    requests, retry after a minute" (Matrix's M_LIMIT_EXCEEDED, Slack's 429)."""

    def __init__(self, room: RoomKey, user: str) -> None:
        super().__init__(room, user)
        self.limited = asyncio.Event()
        self.typing: bool | None = None
        """The typing indicator as the room shows it (Matrix renews it until cleared)."""

    async def send(
        self, reply: Reply, delivery: Delivery | None = None
    ) -> ExternalMessageId | None:
        if reply.kind is ReplyKind.RESULT and not self.limited.is_set():
            self.limited.set()
            raise RateLimited(self.name, RETRY_AFTER_S)
        return await super().send(reply, delivery)

    async def set_typing(self, room: RoomKey, typing: bool) -> None:
        self.typing = typing
        await super().set_typing(room, typing)


async def test_typing_goes_off_when_the_answer_is_rate_limited(tmp_path: Path) -> None:
    go = tmp_path / "answer-now"
    env = {"FAKE_CLAUDE_RESULT": "the answer", "FAKE_CLAUDE_WAIT_FOR": str(go)}
    config = settings(tmp_path, QUICK_DRAIN, env)
    chat = LimitedAnswer(console_room(config), "local")
    async with serving(config, chat) as (service, _):
        service.parts.executor.cosmetic_timeout_s = 0.2
        await chat.say("hi")
        async with asyncio.timeout(GUARD_S):
            # Shown typing before claude answers (an answer first shows none).
            await chat.wait_until(lambda: ("typing", "True") in chat.events)
            go.touch()
            await chat.limited.wait()
            # The run is over (its cosmetics given up on the answer's wait) ...
            await service.parts.dispatcher.wait_idle()
        # ... and the answer waits for the rate limit to pass: the room must not
        # show the bot typing meanwhile, nor after (Matrix renews it until cleared).
        assert chat.texts(ReplyKind.RESULT) == []
        assert chat.typing is False, chat.events


async def test_the_outcome_is_shown_when_the_answer_was_rate_limited(tmp_path: Path) -> None:
    config = settings(tmp_path, QUICK_DRAIN, {"FAKE_CLAUDE_RESULT": "the answer"})
    chat = LimitedAnswer(console_room(config), "local")
    async with serving(config, chat) as (service, _):
        service.parts.executor.cosmetic_timeout_s = 0.2
        await chat.say("hi")
        async with asyncio.timeout(GUARD_S):
            await chat.limited.wait()
            await service.parts.dispatcher.wait_idle()
        # The message still shows the run as running (Slack: its "running" reaction).
        assert ("phase", RunPhase.DONE.value) in chat.events, chat.events


def standby_children() -> list[int]:
    """Our children that are spare supervisors (``--standby``) still alive."""
    me = str(os.getpid())
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        fields = stat.rpartition(")")[2].split()
        if fields[1] == me and fields[0] != "Z" and b"--standby" in cmdline:
            found.append(int(entry.name))
    return found


async def test_a_service_that_ends_leaves_no_spare(tmp_path: Path) -> None:
    config = settings(tmp_path, {}, {"FAKE_CLAUDE_RESULT": "done"})
    async with serving(config) as (service, chat):
        await chat.say("hi")
        await chat.wait_until(lambda: chat.texts(ReplyKind.RESULT) == ["done"])
        # A spare is ready for the next run (refilled a little after this one's start:
        # here at once).
        service.parts.spares.refill()
        assert service.parts.spares._ready is not None
        assert standby_children() != []
    assert standby_children() == []


def spares_of(pid: int) -> list[int]:
    """Live spare supervisors (``--standby``, still waiting: cwd ``/``) whose parent is ``pid``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rpartition(")")[2].split()
            cmdline = (entry / "cmdline").read_bytes().split(b"\0")
            cwd = os.readlink(entry / "cwd")
        except OSError:
            continue
        if fields[1] == str(pid) and fields[0] != "Z" and b"--standby" in cmdline and cwd == "/":
            found.append(int(entry.name))
    return found


async def until_gone(pids: list[int]) -> None:
    for pid in pids:
        assert await gone(pid, GUARD_S), f"process {pid} still runs"


@pytest.mark.usefixtures("no_leftovers")
@pytest.mark.parametrize("how", ["end of input", "SIGKILL"])
async def test_chatbridge_run_leaves_no_spare_behind(tmp_path: Path, how: str) -> None:
    bridge = Bridge(write_config(tmp_path, env={"FAKE_CLAUDE_RESULT": "done"}))
    await bridge.start()
    assert bridge.proc is not None
    bridge.send("hi")
    await bridge.wait_for("done")
    # The spare for the next run (started a tenth of a second after this one's start).
    async with asyncio.timeout(GUARD_S):
        while not (spares := spares_of(bridge.proc.pid)):
            await asyncio.sleep(0.05)
    if how == "SIGKILL":
        bridge.signal(signal.SIGKILL)
        assert await bridge.exit_code() == -signal.SIGKILL
    else:
        assert await bridge.end_input() == 0
        assert not [p for p in spares if is_alive(p)]  # gone before the bridge exits
    await until_gone(spares)


@pytest.mark.usefixtures("no_leftovers")
async def test_a_spare_born_run_whose_registration_was_lost_is_stopped_at_the_restart(
    tmp_path: Path,
) -> None:
    """The bridge dies; its run's registry row is lost (a crash between the spawn and the
    registration): the restart finds the supervisor, which was a spare, by its directory."""
    config = write_config(tmp_path, env=waiting(tmp_path))
    bridge = Bridge(config)
    await bridge.start()
    run_id = await started_run(bridge, tmp_path)
    supervisor = supervisor_pid(tmp_path)
    argv = Path(f"/proc/{supervisor}/cmdline").read_bytes().split(b"\0")
    assert b"--standby" in argv  # the run's supervisor was the spare
    pids = run_pids(tmp_path)
    bridge.signal(signal.SIGKILL)
    await bridge.exit_code()
    with sqlite3.connect(tmp_path / "bridge.db") as db:
        db.execute("delete from live_runs")
    assert alive([*pids, supervisor]) == [*pids, supervisor]

    again = Bridge(config)
    await again.start()
    await wait_rows(tmp_path, "select status from runs", [("interrupted",)])
    await until_gone([*pids, supervisor])
    assert find_marked(run_id) == []
    assert await again.end_input() == 0
    assert not (tmp_path / "state" / "runs" / run_id).exists()
