"""A click that arrives before the request's message id is recorded is not lost."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import cast

from bridge.config import load_settings
from bridge.core.model import (
    Batch,
    ExternalMessageId,
    Message,
    MessageId,
    Reply,
    RoomId,
    RoomKey,
    RunId,
    TransportName,
    UserId,
)
from bridge.core.transport import TOOL_ASKED, Accepted, ApprovalAction, ApprovalChoice, Asked
from bridge.live.approval_flow import ApprovalFlow
from bridge.live.registry import LiveRuns
from bridge.outbound.replies import Replier
from bridge.store.base import Approval, ApprovalState
from bridge.store.memory import MemoryStore
from runner.events import PermissionAsked
from tests.bridge.harness import write_config

POSTED = ExternalMessageId("req-1")
RUN = RunId("run-1")


class SlowRecording(MemoryStore):
    """Records a request's message id only once the test lets it."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = asyncio.Event()

    async def set_approval_message(self, approval: Approval, message_id: ExternalMessageId) -> None:
        await self.gate.wait()
        await super().set_approval_message(approval, message_id)


class Posting:
    """The transport's side: the request is posted (and seen by people) at once."""

    def __init__(self) -> None:
        self.posted = asyncio.Event()

    def approval_fits(self, room: RoomKey, text: str) -> bool:
        return True

    async def post_approval(
        self, request: Reply, ref: str, asked: Asked = TOOL_ASKED
    ) -> ExternalMessageId | None:
        self.posted.set()
        return POSTED

    async def close_approval(self, *args: object) -> None:
        pass


class Asking:
    """An approval flow about to ask one request in the console room."""

    def __init__(self, tmp_path: Path) -> None:
        settings = load_settings(write_config(tmp_path, {"defaults": {"approve_tools": True}}))
        self.store = SlowRecording()
        self.posting = Posting()
        replier = cast(Replier, self.posting)
        self.flow = ApprovalFlow(settings, self.store, replier, LiveRuns(), lambda _v: None)
        self.user = UserId(settings.console.user)
        self.key = RoomKey(TransportName("console"), RoomId(settings.console.room))
        message = Message(
            MessageId(1), self.key, UserId("alice"), "go", ExternalMessageId("m1"), 1.0
        )
        self.batch = Batch(self.key, (message,))
        self.asked = PermissionAsked("r1", "Bash", {"command": "ls"}, "tu1", "ls", ())

    def click(self) -> asyncio.Task[Accepted]:
        """A deny on the posted request, as a person clicks it."""
        action = ApprovalAction(self.key, self.user, POSTED, ApprovalChoice.DENY)
        return asyncio.create_task(self.flow.on_action(action))


async def test_a_click_right_after_the_post_waits_for_the_id(tmp_path: Path) -> None:
    asking = Asking(tmp_path)
    store, key = asking.store, asking.key
    ask = asyncio.create_task(asking.flow.ask(RUN, asking.batch, asking.asked))
    await asking.posting.posted.wait()
    click = asking.click()
    for _ in range(5):  # the click looks its message up while the id is not recorded
        await asyncio.sleep(0)
    assert not click.done()
    store.gate.set()
    await ask
    assert await click is Accepted.ACCEPTED
    found = await store.approval_by_message(key, POSTED)
    assert found is not None
    assert found.state is ApprovalState.DENIED


async def test_a_click_waits_for_the_post_not_for_the_task_that_posted(tmp_path: Path) -> None:
    """The request is asked from the run's own task, which lives on after the post:
    a click during the post is decided once the id is recorded, not when the run ends."""
    asking = Asking(tmp_path)
    run_ends = asyncio.Event()

    async def run() -> None:
        await asking.flow.ask(RUN, asking.batch, asking.asked)
        await run_ends.wait()  # the run goes on, waiting for the answer

    running = asyncio.create_task(run())
    await asking.posting.posted.wait()
    click = asking.click()
    asking.store.gate.set()
    async with asyncio.timeout(5):  # well under the wait's own bound (POSTING_WAIT_S)
        assert await click is Accepted.ACCEPTED
    assert not running.done()
    run_ends.set()
    await running
