from __future__ import annotations

import asyncio
from collections.abc import Callable

from bridge.core.model import ExternalMessageId
from bridge.progress import ProgressMessage, describe_tool_use


def test_tool_use_descriptions() -> None:
    assert describe_tool_use("Bash", {"command": "git status\ngit diff"}) == "Bash: git status"
    assert describe_tool_use("Edit", {"file_path": "src/app.py", "old": "x"}) == "Edit: src/app.py"
    assert describe_tool_use("TodoWrite", {"todos": []}) == "TodoWrite"
    long = describe_tool_use("Bash", {"command": "x" * 200})
    assert len(long) <= len("Bash: ") + 80
    assert long.endswith("…")


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
