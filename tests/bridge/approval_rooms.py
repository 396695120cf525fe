"""People, rooms and a stand-in live run for the approval commands' tests."""

from __future__ import annotations

from dataclasses import dataclass, field

from bridge.config import RoomSettings
from bridge.core.model import (
    Batch,
    ExternalMessageId,
    InboundMessage,
    Message,
    RoomId,
    RoomKey,
    RunId,
    SessionId,
    TransportName,
    UserId,
)
from bridge.core.transport import ApprovalChoice
from bridge.inbound.commands import CommandHandler, parse_command
from bridge.live.approvals import Verdict
from bridge.store.base import Approval, ApprovalAsk
from bridge.store.memory import MemoryStore
from dispatcher import DispatchedRun, Dispatcher, DispatchLimits

ROOM = RoomKey(TransportName("matrix"), RoomId("!r:x"))


ALICE, BOB, CAROL, EVE = (UserId(u) for u in ("@alice:x", "@bob:x", "@carol:x", "@eve:x"))


def room(**overrides: object) -> RoomSettings:
    return RoomSettings.model_validate(
        {"key": ROOM, "allowed_users": [ALICE, BOB, CAROL], **overrides}
    )


RUN = RunId("run-1")


@dataclass
class FakeLive:
    decisions: list[tuple[int, ApprovalChoice, UserId | None, str]] = field(default_factory=list)
    models: list[tuple[RoomKey, str]] = field(default_factory=list)
    modes: list[tuple[RoomKey, str]] = field(default_factory=list)
    session: SessionId | None = field(default_factory=lambda: SessionId("s-1"))
    rules_applied: list[RoomKey] = field(default_factory=list)
    """Rooms whose waiting requests were to be decided by a rule just kept."""
    """The Claude session the room's run writes to."""

    async def session_of(self, approval: Approval) -> SessionId | None:
        return self.session

    async def room_session(self, room: RoomKey) -> SessionId | None:
        return self.session

    async def apply_rules(self, room: RoomKey) -> None:
        self.rules_applied.append(room)

    async def decide(
        self,
        approval: Approval,
        choice: ApprovalChoice,
        sender: UserId | None,
        reason: str,
        *,
        shown: str = "",
    ) -> str:
        self.decisions.append((approval.number, choice, sender, reason))
        return ""

    async def set_model(self, room: RoomKey, name: str) -> str:
        self.models.append((room, name))
        return "The running run switched too."

    async def set_mode(self, room: RoomKey, mode: str) -> str:
        self.modes.append((room, mode))
        return ""


async def _never_runs(_run: DispatchedRun) -> None:
    raise AssertionError("no run in these tests")


@dataclass
class Room:
    store: MemoryStore
    live: FakeLive
    handler: CommandHandler
    answers: list[tuple[UserId, str]]
    refused: list[Verdict]
    now: list[float]
    seq: list[int] = field(default_factory=lambda: [0])

    async def say(self, sender: UserId, text: str) -> str | None:
        """Send a command; the handler's answer to it, if any."""
        self.seq[0] += 1
        inbound = InboundMessage(ROOM, sender, text, ExternalMessageId(f"$c{self.seq[0]}"))
        message = await self.store.accept(inbound, self.now[0])
        assert message is not None
        command = parse_command(text, "!")
        assert command is not None
        before = len(self.answers)
        await self.handler.handle(command, message)
        return self.answers[-1][1] if len(self.answers) > before else None

    async def ask(self, request_id: str, tool: str = "Bash", run_id: RunId = RUN) -> Approval:
        return await self.store.add_approval(
            ApprovalAsk(
                ROOM,
                run_id,
                request_id,
                tool_name=tool,
                input_json='{"command": "make deploy"}',
                asked_at=self.now[0],
                expires_at=self.now[0] + 900,
            )
        )


def make_room(**overrides: object) -> Room:
    settings = RoomSettings.model_validate(
        {"key": ROOM, "allowed_users": [ALICE, BOB, CAROL], "model": "sonnet", **overrides}
    )
    store = MemoryStore()
    live = FakeLive()
    answers: list[tuple[UserId, str]] = []
    refused: list[Verdict] = []
    now = [1000.0]

    async def answer(message: Message, text: str) -> None:
        answers.append((message.sender, text))

    async def reset_session(_room: RoomKey) -> None:
        pass

    handler = CommandHandler(
        Dispatcher(DispatchLimits(1.0, 10.0, 100, 1), _never_runs),
        store,
        "!",
        answer,
        reset_session,
        wall_clock=lambda: now[0],
        rooms=lambda key: settings if key == ROOM else None,
        live=live,
        refused=refused.append,
    )
    return Room(store, live, handler, answers, refused, now)


async def start_run_of(room: Room, *senders: UserId) -> None:
    messages = []
    for i, sender in enumerate(senders):
        inbound = InboundMessage(ROOM, sender, "do it", ExternalMessageId(f"$m{i}"))
        message = await room.store.accept(inbound, 900.0)
        assert message is not None
        messages.append(message)
    await room.store.start_run(RUN, Batch(ROOM, tuple(messages)), 950.0)
