"""The console room on the real claude CLI, its model a scripted server: the
configuration that points the CLI at the server, and a bounded wait on the room."""

from __future__ import annotations

import asyncio
from pathlib import Path

from tests.bridge.harness import ConsoleSession, write_config
from tests.config_files import Table
from tests.fakes.model_server import ModelServer, claude_bin, claude_env

STEP_S = 60.0
"""Each wait ends on an event long before; the bound only turns a hang into a failure."""


def real_claude_config(
    tmp_path: Path, server: ModelServer, config: Table | None = None, home: str = "home"
) -> Path:
    """``write_config`` for the real CLI answered by ``server``; ``home``: claude's home
    directory below ``tmp_path`` (a replica's own, say)."""
    config = config or {}
    runner = {"claude_bin": str(claude_bin()), **config.get("runner", {})}
    return write_config(
        tmp_path, {**config, "runner": runner}, env=claude_env(server.url, tmp_path / home)
    )


async def see(bridge: ConsoleSession, text: str) -> str:
    """The room's output once ``text`` is in it; a failure showing the output if it never is."""
    try:
        async with asyncio.timeout(STEP_S):
            return await bridge.wait_for(text)
    except TimeoutError:
        raise AssertionError(f"never saw {text!r} in:\n{bridge.out.getvalue()[-3000:]}") from None
