"""Console rooms that post approval requests slowly or record what they were asked."""

from __future__ import annotations

import asyncio
import json
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
from bridge.store.base import Approval
from bridge.store.memory import MemoryStore
from runner.control import RunControl
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


class Told(Posting):
    """Posts at once, and keeps what people were told of their actions."""

    def __init__(self) -> None:
        super().__init__()
        self.told: list[tuple[ApprovalAction, str]] = []

    async def answer_action(self, action: ApprovalAction, text: str) -> None:
        self.told.append((action, text))

    async def send(self, reply: Reply) -> None:
        pass


class Bound(Asking):
    """The flow of :class:`Asking` with a live run whose stdin the test reads."""

    def __init__(self, tmp_path: Path) -> None:
        super().__init__(tmp_path)
        self.store.gate.set()
        self.told = Told()
        self.runs = LiveRuns()
        self.flow = ApprovalFlow(
            self.flow.settings, self.store, cast(Replier, self.told), self.runs, lambda _v: None
        )
        self.written: list[dict[str, object]] = []
        self.control = RunControl()
        self.control.bind(self._write, lambda: None)
        self.runs.bind(self.key, RUN, self.control)

    def _write(self, line: bytes) -> bool:
        self.written.append(json.loads(line))
        return True

    async def asks(self, event: PermissionAsked) -> None:
        self.control.note(event)
        await self.flow.ask(RUN, self.batch, event)

    def act(self, choice: ApprovalChoice) -> ApprovalAction:
        return ApprovalAction(self.key, self.user, POSTED, choice)

    def answers(self) -> list[object]:
        """claude's stdin: the ``response`` of each answer to a permission request."""
        found = []
        for line in self.written:
            if line["type"] == "control_response":
                outer = cast(dict[str, object], line["response"])
                found.append(outer["response"])
        return found
