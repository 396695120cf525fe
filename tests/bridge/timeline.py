"""A console room that keeps the time of every post, and the runs' settings beside it."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from bridge.config import Settings, load_settings
from bridge.core.model import ExternalMessageId, Reply, RoomKey
from bridge.core.transport import Delivery, RunPhase
from runner import MARKER_ENV
from tests.bridge.chat_room import ChatRoom
from tests.bridge.harness import rows, write_config
from tests.config_files import Table
from tests.runner.conftest import is_alive

WAIT_S = 30.0
"""Generous: each wait ends on an event long before; the bound only turns a hang into a failure."""


CLAUDE_LOG = "claude-runs.jsonl"
"""The fake claudes' run log (``FAKE_CLAUDE_RUN_LOG``) in each test's directory."""


def claude_started(tmp_path: Path) -> bool:
    """The fake claude of the room's latest run was spawned: it runs now (its shell
    launcher, or the fake's Python), or its start is in the run log (a quick run's
    claude may have answered and exited before its typing is shown)."""
    latest = rows(tmp_path, "select id from runs order by started_at desc limit 1")
    if not latest:
        return False
    run_id = latest[0][0]
    log = tmp_path / CLAUDE_LOG
    if log.exists() and any(
        e["event"] == "start" and e["run"] == run_id
        for e in map(json.loads, filter(None, log.read_text().splitlines()))
    ):
        return True
    marker = f"{MARKER_ENV}={run_id}".encode()
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            marked = marker in (proc / "environ").read_bytes().split(b"\0")
            cmdline = (proc / "cmdline").read_bytes()
        except OSError:
            continue  # gone, or not ours to read
        # claude, not a supervisor started for the run (which carries the marker too).
        if marked and b"supervisor.py" not in cmdline and is_alive(int(proc.name)):
            return True
    return False


class Timeline(ChatRoom):
    """A chat room that also records, in order, every edit, typing change and phase."""

    def __init__(self, room: RoomKey, user: str) -> None:
        super().__init__(room, user)
        self.events: list[tuple[str, str]] = []
        self.on_start: list[str] = []
        """What showed the run had started (typing, phase) before claude had started."""
        self.tmp_path: Path | None = None

    async def send(
        self, reply: Reply, delivery: Delivery | None = None
    ) -> ExternalMessageId | None:
        sent = await super().send(reply, delivery)
        self.events.append((f"send {reply.kind.value}", reply.text))
        return sent

    async def edit(self, room: RoomKey, message_id: ExternalMessageId, text: str) -> None:
        self.events.append(("edit", text))
        self.changed.set()

    async def set_typing(self, room: RoomKey, typing: bool) -> None:
        if typing and self.tmp_path is not None and not claude_started(self.tmp_path):
            self.on_start.append("typing")
        self.events.append(("typing", str(typing)))
        self.changed.set()

    async def set_phase(
        self, room: RoomKey, message_ids: Sequence[ExternalMessageId], phase: RunPhase
    ) -> None:
        running = phase is RunPhase.RUNNING and self.tmp_path is not None
        if running and self.tmp_path is not None and not claude_started(self.tmp_path):
            self.on_start.append("phase")
        self.events.append(("phase", phase.value))
        self.changed.set()

    def kinds(self) -> list[str]:
        return [what for what, _ in self.events]


def settings(tmp_path: Path, config: Table, env: dict[str, str]) -> Settings:
    base: Table = {"dispatcher": {"coalesce_ms": 0}}
    env = {"FAKE_CLAUDE_RUN_LOG": str(tmp_path / CLAUDE_LOG), **env}
    return load_settings(write_config(tmp_path, {**base, **config}, env=env))
