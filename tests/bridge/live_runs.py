"""Sessions, logs and waits for the tests of live runs (steering, keep-warm, tools)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bridge.config import load_settings
from bridge.core.model import RoomId, RoomKey, TransportName
from runner import Prestarted, RunRequest
from tests.bridge.harness import ConsoleSession, write_config
from tests.config_files import Table
from tests.fakes.fake_claude import tool_log

WAIT_S = 30.0
"""Each wait ends on an event long before; the bound only turns a hang into a failure."""


def session(tmp_path: Path, config: Table, **env: str) -> ConsoleSession:
    base_env = {"FAKE_CLAUDE_ECHO": "1", "FAKE_CLAUDE_TOOL_LOG": str(tmp_path / "tools.jsonl")}
    path = write_config(tmp_path, config, env={**base_env, **env})
    return ConsoleSession(load_settings(path))


APPROVING: Table = {"defaults": {"approve_tools": True}}


def gated(tmp_path: Path) -> dict[str, str]:
    """The fake's tool runs until the test opens the gate."""
    return {"FAKE_CLAUDE_TOOL_WAIT_FOR": str(tmp_path / "gate")}


async def until_tool_runs(bridge: ConsoleSession, tmp_path: Path) -> None:
    """The run's tool started (it logs its input once it runs)."""
    # The progress line of the tool use is printed when claude announces it;
    # the log follows at once: wait on output, then on the file.
    await until_output_and(bridge, lambda: bool(tool_log(tmp_path)))


async def until_output_and(bridge: ConsoleSession, check: Callable[[], bool]) -> None:
    """Until ``check`` holds, looked at on each output and at least every 0.1 s."""
    while not check():
        bridge.out.changed.clear()
        try:
            async with asyncio.timeout(0.1):
                await bridge.out.changed.wait()
        except TimeoutError:
            pass


def during_run(mode: str, **sections: Table) -> Table:
    """A room whose messages during a run ``mode`` it (steer, interrupt), batched soon;
    ``defaults`` merged into the room's, other sections added."""
    defaults = {"during_run": mode, **sections.pop("defaults", {})}
    return {
        "defaults": defaults,
        "dispatcher": {"coalesce_ms": 50, "max_wait_ms": 500},
        **sections,
    }


KEEP_WARM: Table = {
    "runner": {"prestart": True, "prestart_keep_s": 30},
    # The window counts from a message's arrival: it must outlast the first accept
    # (a loaded machine: tens of ms) for the first run to take its window's prestart.
    "dispatcher": {"coalesce_ms": 300, "max_wait_ms": 1000},
}


def run_log(path: Path) -> list[dict[str, Any]]:
    """The fake claudes' starts, prompts and ends, in the order they happened."""
    return [json.loads(line) for line in path.read_text().splitlines()]


def watch_starts(bridge: ConsoleSession) -> asyncio.Queue[RunRequest]:
    """The request of each claude the service prestarts from now on, once it is ready."""
    assert bridge.service is not None
    prestarts = bridge.service.parts.executor.prestarts
    assert prestarts is not None
    started: asyncio.Queue[RunRequest] = asyncio.Queue()
    start = prestarts.start

    async def watched(request: RunRequest) -> Prestarted:
        prestarted = await start(request)
        # Handed on once claude answered: it has logged its start, whatever comes next.
        await asyncio.wait({prestarted.ready})
        started.put_nowait(request)
        return prestarted

    prestarts.start = watched
    return started


async def kept_warm(started: asyncio.Queue[RunRequest]) -> RunRequest:
    """The next claude kept warm after a run: it resumes the run's session (a batch's
    prestart in a new room has none)."""
    while (request := await started.get()).session_id is None:
        pass
    return request


def console_room(bridge: ConsoleSession) -> RoomKey:
    return RoomKey(TransportName("console"), RoomId(bridge.settings.console.room))
