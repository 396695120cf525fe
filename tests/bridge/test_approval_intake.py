"""The service's sink routes an approval action to the approvals hook (ignored without one)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from bridge.config import load_settings
from bridge.core.model import (
    ExternalMessageId,
    InboundMessage,
    Message,
    RoomId,
    RoomKey,
    TransportName,
    UserId,
)
from bridge.core.transport import Accepted, ApprovalAction, ApprovalChoice
from bridge.inbound.commands import CommandHandler
from bridge.inbound.intake import Intake
from bridge.metrics import Metrics
from bridge.store.memory import MemoryStore
from dispatcher import DispatchedRun, Dispatcher, DispatchLimits
from tests.bridge.harness import write_config

ROOM = RoomKey(TransportName("console"), RoomId("console"))


async def _never_runs(_run: DispatchedRun) -> None:
    raise AssertionError("no run in this test")


async def _no_answer(_message: Message, _text: str) -> None:
    raise AssertionError("no command in this test")


async def _no_reset(_room: RoomKey) -> None:
    raise AssertionError("no command in this test")


def _intake(
    tmp_path: Path,
    config: dict[str, Any] | None = None,
    answer: Callable[[Message, str], Awaitable[None]] = _no_answer,
) -> Intake:
    settings = load_settings(write_config(tmp_path, config))
    store = MemoryStore()
    dispatcher = Dispatcher(DispatchLimits(1.0, 10.0, 100, 1), _never_runs)
    commands = CommandHandler(dispatcher, store, "!", answer, _no_reset)
    return Intake(settings, store, dispatcher, commands, Metrics())


def _action(room: RoomKey = ROOM) -> ApprovalAction:
    return ApprovalAction(room, UserId("alice"), ExternalMessageId("out-1"), ApprovalChoice.DENY)


async def test_an_approval_action_without_a_handler_is_ignored(tmp_path: Path) -> None:
    assert await _intake(tmp_path).accept(_action()) is Accepted.IGNORED


async def test_an_approval_action_goes_to_the_handler(tmp_path: Path) -> None:
    intake = _intake(tmp_path)
    seen: list[ApprovalAction] = []

    async def handler(action: ApprovalAction) -> Accepted:
        seen.append(action)
        return Accepted.ACCEPTED

    intake.on_approval_action = handler
    assert await intake.accept(_action()) is Accepted.ACCEPTED
    assert seen == [_action()]
    # A room the bridge does not serve never reaches the handler.
    other = RoomKey(TransportName("console"), RoomId("elsewhere"))
    assert await intake.accept(_action(other)) is Accepted.IGNORED
    assert seen == [_action()]


async def test_an_approver_who_is_not_an_allowed_user_may_answer_claudes_questions(
    tmp_path: Path,
) -> None:
    # Approvers answer questions (docs/live-runs.md), as they answer plans with
    # `!approve`: their `!answer` must reach the command handler like `!approve` does.
    config = {"defaults": {"allowed_users": ["someone-else"], "approvers": ["local"]}}
    answered: list[str] = []

    async def answer(_message: Message, text: str) -> None:
        answered.append(text)

    intake = _intake(tmp_path, config, answer)
    inbound = InboundMessage(ROOM, UserId("local"), "!answer #1 2", ExternalMessageId("m1"))
    assert await intake.accept(inbound) is Accepted.ACCEPTED
    assert answered == ["Questions cannot be answered: no live runs here."]
