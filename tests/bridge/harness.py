"""Run the real service in-process with the console transport on a pipe."""

from __future__ import annotations

import io
import os
from pathlib import Path

from bridge.config import Settings, load_settings
from bridge.service import Service, open_store
from tests.fakes.fake_claude import FAKE_CLAUDE
from transports.console import ConsoleTransport


def write_config(
    tmp_path: Path, extra: str = "", env: str = 'FAKE_CLAUDE_ECHO = "1"', top: str = ""
) -> Path:
    """A configuration for the console room, with the fake claude and SQLite under tmp_path."""
    path = tmp_path / "chatbridge.toml"
    path.write_text(
        f"""{top}
[runner]
claude_bin = "{FAKE_CLAUDE}"
stop_grace_s = 1.0

[dispatcher]
coalesce_ms = 200
max_wait_ms = 2000

[database]
url = "sqlite+aiosqlite:///{tmp_path / "bridge.db"}"

[http]
listen = ""

[defaults]
cwd = "{tmp_path}"
env = {{ {env} }}
{extra}
"""
    )
    return path


async def run_console(settings: Settings | Path, lines: list[str]) -> str:
    """Feed ``lines`` to a console room, run the service to end of input, return its output."""
    if isinstance(settings, Path):
        settings = load_settings(settings)
    read_fd, write_fd = os.pipe()
    with os.fdopen(write_fd, "wb") as writer:
        writer.write("".join(line + "\n" for line in lines).encode())
    out = io.StringIO()
    with os.fdopen(read_fd, "rb") as reader:
        transport = ConsoleTransport(
            settings.console.room, settings.console.user, stdin=reader, stdout=out
        )
        store = await open_store(settings)
        try:
            await Service(settings, store, [transport]).serve()
        finally:
            await store.close()
    return out.getvalue()
