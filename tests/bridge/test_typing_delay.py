"""Adversarial review of 37aa0f8: a run is shown running (typing, the running phase)
only once claude has worked ``typing_after_s`` without answering.

Each test here failed on that commit."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path

from bridge.config import Settings, load_settings
from bridge.core.model import ExternalMessageId, ReplyKind, RoomKey
from bridge.core.transport import RunPhase
from tests.bridge.chat_room import console_room, serving
from tests.bridge.harness import write_config
from tests.bridge.timeline import CLAUDE_LOG, WAIT_S, Timeline
from tests.config_files import Table


def _settings(tmp_path: Path, config: Table, env: dict[str, str]) -> Settings:
    base: Table = {"dispatcher": {"coalesce_ms": 0}, "progress": {"show_after_s": 60}}
    env = {"FAKE_CLAUDE_RUN_LOG": str(tmp_path / CLAUDE_LOG), **env}
    return load_settings(write_config(tmp_path, {**base, **config}, env=env))


class AnswerDuringRunningPhase(Timeline):
    """Claude answers (``go``) while the room's running phase is being set, which
    returns only once the answer was sent (a slow reaction request on Slack)."""

    def __init__(self, room: RoomKey, user: str, go: Path) -> None:
        super().__init__(room, user)
        self.go = go

    async def set_phase(
        self, room: RoomKey, message_ids: Sequence[ExternalMessageId], phase: RunPhase
    ) -> None:
        if phase is RunPhase.RUNNING:
            self.go.touch()
            async with asyncio.timeout(WAIT_S):
                await self.wait_until(lambda: ("send result", "quick") in self.events)
        await super().set_phase(room, message_ids, phase)


async def test_no_typing_is_shown_once_the_answer_came_during_the_running_phase(
    tmp_path: Path,
) -> None:
    """The opening checked ``concluding`` once, before the phase request: an answer
    read while that request was under way (now likelier, the opening starting
    ``typing_after_s`` in, where quick answers land) was followed by typing on, then
    off: the flicker around the answer the change set out to avoid (on Matrix, a
    typing request after the answer)."""
    go = tmp_path / "answer-now"
    env = {"FAKE_CLAUDE_RESULT": "quick", "FAKE_CLAUDE_WAIT_FOR": str(go)}
    given = _settings(tmp_path, {}, env)
    chat = AnswerDuringRunningPhase(console_room(given), "local", go)
    async with serving(given, chat) as (service, _):
        service.parts.executor.typing_after_s = 0.0
        await chat.say("hi")
        await chat.wait_until(lambda: ("phase", RunPhase.DONE.value) in chat.events)
        await service.parts.dispatcher.wait_idle()
    assert chat.texts(ReplyKind.RESULT) == ["quick"]
    sent = chat.events.index(("send result", "quick"))
    assert ("typing", "True") not in chat.events[sent:], chat.events


class PhasesByMessage(Timeline):
    """Each message's latest phase (Slack: the reaction it shows)."""

    def __init__(self, room: RoomKey, user: str) -> None:
        super().__init__(room, user)
        self.shown: dict[ExternalMessageId, RunPhase] = {}

    async def set_phase(
        self, room: RoomKey, message_ids: Sequence[ExternalMessageId], phase: RunPhase
    ) -> None:
        for message_id in message_ids:
            self.shown[message_id] = phase
        await super().set_phase(room, message_ids, phase)


async def test_a_message_steered_into_a_run_is_not_left_shown_running(tmp_path: Path) -> None:
    """(Before 37aa0f8 too.) A steered message is shown running as it is recorded
    into the run (``_record_steered``), but the run's end shows its outcome only on
    the run's first batch: the steered message keeps Slack's running reaction for
    good."""
    gate = tmp_path / "gate"
    read = tmp_path / "read.jsonl"
    env = {
        "FAKE_CLAUDE_ECHO": "1",
        "FAKE_CLAUDE_TOOL_WAIT_FOR": str(gate),
        "FAKE_CLAUDE_READ_LOG": str(read),
    }
    config: Table = {
        "defaults": {"during_run": "steer"},
        "dispatcher": {"coalesce_ms": 50, "max_wait_ms": 500},
    }
    given = _settings(tmp_path, config, env)
    chat = PhasesByMessage(console_room(given), "local")
    async with serving(given, chat) as (service, _):
        service.parts.executor.typing_after_s = 0.0
        first, _ = await chat.say("first")
        await chat.wait_until(lambda: chat.shown.get(first) is RunPhase.RUNNING)
        second, _ = await chat.say("second")
        # Recorded into the run, then shown running: steered, not queued.
        await chat.wait_until(lambda: chat.shown.get(second) is RunPhase.RUNNING)
        # Written into claude's stdin; the tool ends once claude has read it (else a
        # loaded machine lets the turn end first and the message become a turn of its own).
        async with asyncio.timeout(WAIT_S):
            while not (read.exists() and '"second"' in read.read_text()):
                await asyncio.sleep(0.01)
        gate.touch()
        await chat.wait_until(lambda: chat.shown.get(first) is RunPhase.DONE)
        await service.parts.dispatcher.wait_idle()
    assert chat.texts(ReplyKind.RESULT) == ["first\nsecond"]
    assert chat.shown[second] is RunPhase.DONE, chat.events
