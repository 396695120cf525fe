from __future__ import annotations

import asyncio
from collections.abc import Callable

from bridge.core.model import ExternalMessageId, RoomId, RoomKey, TransportName
from bridge.core.transport import Duplex
from bridge.outbound.pacing import Pacing
from bridge.outbound.progress import ProgressMessage, describe_tool_use
from bridge.outbound.replies import Replier
from transports.slack.mrkdwn import to_mrkdwn


def test_tool_use_descriptions() -> None:
    assert describe_tool_use("Bash", {"command": "git status\ngit diff"}) == "Bash: git status"
    assert describe_tool_use("Edit", {"file_path": "src/app.py", "old": "x"}) == "Edit: src/app.py"
    assert describe_tool_use("TodoWrite", {"todos": []}) == "TodoWrite"
    long = describe_tool_use("Bash", {"command": "x" * 200})
    assert len(long) <= len("Bash: ") + 80
    assert long.endswith("…")


def test_an_mcp_tool_is_named_by_its_tool_and_server() -> None:
    """``mcp__chatbridge__send_file`` read as bold markup in Slack (``__x__``)."""
    line = describe_tool_use("mcp__chatbridge__send_file", {"path": "report.txt"})
    assert line == "send_file (chatbridge): report.txt"
    assert to_mrkdwn(line) == line
    assert describe_tool_use("mcp__weird", {}) == "mcp__weird"  # not server__tool: as it is


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class StatusRoom:
    """Records what a progress message posts and edits."""

    def __init__(self) -> None:
        self.posted: list[str] = []
        self.edits: list[str] = []
        self.changed = asyncio.Event()

    async def post(self, text: str) -> ExternalMessageId:
        self.posted.append(text)
        self.changed.set()
        return ExternalMessageId("status-1")

    async def edit(self, message_id: ExternalMessageId, text: str) -> bool:
        assert message_id == "status-1"
        self.edits.append(text)
        self.changed.set()
        return True

    async def until(self, done: Callable[[], bool]) -> None:
        async with asyncio.timeout(30):
            while not done():
                self.changed.clear()
                await self.changed.wait()


async def test_updates_are_folded_into_one_edit_per_interval() -> None:
    clock = FakeClock()
    room = StatusRoom()
    progress = ProgressMessage(
        post=room.post, edit=room.edit, clock=clock, min_interval_s=0.0, started_at=clock.now
    )
    pump = asyncio.create_task(progress.pump())
    await room.until(lambda: bool(room.posted))
    assert room.posted == ["Working… 0s"]
    for i in range(5):
        progress.tool_used("Bash", {"command": f"step {i}"})
    clock.now += 3
    await room.until(lambda: bool(room.edits))
    pump.cancel()
    # Five updates before the pump ran: one edit, showing the latest three tools.
    assert len(room.edits) == 1
    assert room.edits[0].splitlines() == [
        "Working… 3s · 5 tool uses",
        "- Bash: step 2",
        "- Bash: step 3",
        "- Bash: step 4",
    ]
    await progress.finish("Done")
    assert room.edits[-1].startswith("Done after 3s")


async def test_a_run_answered_before_show_after_posts_no_status_message() -> None:
    clock = FakeClock()
    room = StatusRoom()
    progress = ProgressMessage(
        post=room.post, edit=room.edit, clock=clock, show_after_s=3600, started_at=clock.now
    )
    pump = asyncio.create_task(progress.pump())
    progress.tool_used("Bash", {"command": "ls"})
    progress.close()  # the answer is there: the pump ends without posting
    async with asyncio.timeout(30):
        await pump
    await progress.finish("Done")
    assert room.posted == []
    assert room.edits == []


async def test_a_run_that_lasted_show_after_posts_its_status_message() -> None:
    clock = FakeClock()
    room = StatusRoom()
    progress = ProgressMessage(
        post=room.post, edit=room.edit, clock=clock, show_after_s=3, started_at=clock.now - 3
    )
    pump = asyncio.create_task(progress.pump())
    await room.until(lambda: bool(room.posted))
    pump.cancel()
    await progress.finish("Done")
    assert room.posted == ["Working… 3s"]
    assert room.edits == ["Done after 3s"]


# The last edit: made once the transport's shared edit budget allows it, after a
# post under way, which a caller giving up does not cancel.

CONSOLE = TransportName("console")


class Recorder(Duplex):
    """Just enough of a transport for :class:`Replier`: the last text of each message."""

    name = CONSOLE

    def __init__(self) -> None:
        self.last_text: dict[str, str] = {}

    async def edit(self, room: RoomKey, message_id: ExternalMessageId, text: str) -> None:
        self.last_text[message_id] = text


async def test_runs_ending_together_all_finish_once_the_budget_allows() -> None:
    clock = FakeClock()
    transport = Recorder()
    pacing = Pacing(60.0, clock)  # a burst of 3 edits, then one a second: for all rooms
    replier = Replier({CONSOLE: transport}, {CONSOLE: pacing}, clock)

    async def waited(seconds: float) -> None:
        clock.now += seconds  # the budget refills as time passes
        await asyncio.sleep(0)

    messages = []
    for i in range(2 * int(pacing.burst)):
        room = RoomKey(CONSOLE, RoomId(f"r{i}"))
        mid = ExternalMessageId(f"status-{i}")
        transport.last_text[mid] = "Working… 5s"

        shown = asyncio.Event()

        async def post(
            text: str, mid: ExternalMessageId = mid, shown: asyncio.Event = shown
        ) -> ExternalMessageId:
            shown.set()
            return mid

        async def edit(m: ExternalMessageId, text: str, room: RoomKey = room) -> bool:
            return await replier.edit(room, m, text)

        progress = ProgressMessage(
            post=post, edit=edit, clock=clock, sleep=waited, started_at=clock.now - 5
        )
        pump = asyncio.create_task(progress.pump())  # show_after_s 0: posts at once
        await shown.wait()
        await progress.posted()
        pump.cancel()
        await asyncio.wait({pump})
        messages.append(progress)
    # Every run ends in the same instant: the budget covers only the first three.
    await asyncio.gather(*(p.finish("Done") for p in messages))
    unfinished = {m: t for m, t in transport.last_text.items() if not t.startswith("Done after")}
    assert unfinished == {}


class SlowServer:
    """Takes a post at once but answers it only when released."""

    def __init__(self) -> None:
        self.shown: dict[str, str] = {}
        self.posting = asyncio.Event()
        self.answer = asyncio.Event()

    async def post(self, text: str) -> ExternalMessageId:
        self.shown["status-1"] = text
        self.posting.set()
        await self.answer.wait()
        return ExternalMessageId("status-1")

    async def edit(self, message_id: ExternalMessageId, text: str) -> bool:
        self.shown[message_id] = text
        return True


async def answered_while_posting(server: SlowServer) -> ProgressMessage:
    """A run that answers right as its progress message's post is under way."""
    clock = FakeClock()
    progress = ProgressMessage(
        post=server.post, edit=server.edit, clock=clock, started_at=clock.now
    )
    pump = asyncio.create_task(progress.pump())
    await server.posting.wait()
    progress.close()  # claude's result line
    pump.cancel()  # as the executor does before finishing
    await asyncio.wait({pump})
    assert progress.posting
    return progress


async def test_a_post_under_way_is_finished() -> None:
    server = SlowServer()
    progress = await answered_while_posting(server)
    finishing = asyncio.create_task(progress.finish("Done"))
    server.answer.set()
    await finishing
    assert server.shown == {"status-1": "Done after 0s"}


async def test_a_caller_giving_up_on_finish_leaves_the_post_under_way() -> None:
    server = SlowServer()
    progress = await answered_while_posting(server)
    finishing = asyncio.create_task(progress.finish("Done"))
    await asyncio.sleep(0)
    finishing.cancel()  # a time limit on the caller's side
    await asyncio.wait({finishing})
    assert progress.posting  # not cut off: its message may be on the server already
    server.answer.set()
    await progress.posted()
    await progress.finish("Done")  # a later caller can still finish it
    assert server.shown == {"status-1": "Done after 0s"}
    await progress.abandon()


async def test_abandon_cancels_a_post_under_way() -> None:
    server = SlowServer()
    progress = await answered_while_posting(server)
    await progress.abandon()
    assert not progress.posting


def test_a_tool_use_shows_hidden_characters_as_escapes() -> None:
    # Shown next to an approval request of the same command: a bidi override would make
    # the line read otherwise than the request (and than what runs).
    shown = describe_tool_use("Bash", {"command": "cat \u202etxt.exe\u200b"})
    assert shown == "Bash: cat \\u{202e}txt.exe\\u{200b}"
