"""The real service (``chatbridge run``) as a subprocess, bridged to local-slack."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.slack import peer
from tests.slack.harness import require_local_slack

CHATBRIDGE = Path(sys.executable).parent / "chatbridge"
FAKE_CLAUDE = peer.ROOT / "tests/fakes/fake_claude.py"


def require_service() -> None:
    problem = None
    if not CHATBRIDGE.is_file():
        problem = f"no chatbridge entry point at {CHATBRIDGE}"
    elif not FAKE_CLAUDE.is_file():
        problem = f"no fake claude at {FAKE_CLAUDE}"
    if problem is None:
        return
    if os.environ.get("CI"):
        pytest.fail(problem)
    pytest.skip(problem)


def config_toml(
    tmp: Path, slack: peer.LocalSlack, allowed: tuple[str, ...], slack_extra: Mapping[str, Any]
) -> str:
    lines = [
        "[runner]",
        f'claude_bin = "{FAKE_CLAUDE}"',
        "stop_grace_s = 1",
        "[dispatcher]",
        "coalesce_ms = 300",
        "[database]",
        f'url = "sqlite+aiosqlite:///{tmp / "chatbridge.db"}"',
        "[console]",
        "enabled = false",
        "[http]",
        'listen = ""',
        "[defaults]",
        f'cwd = "{tmp}"',
        "[slack]",
        f'mode = "{slack.mode}"',
        f'api_url = "{slack.api_url}"',
    ]
    if slack.events_port is not None:
        lines.append(f'listen = "127.0.0.1:{slack.events_port}"')
    lines += [f"{key} = {value!r}" for key, value in slack_extra.items()]
    lines += [
        "[[rooms]]",
        'transport = "slack"',
        f'id = "{peer.CHANNEL}"',
        "reply_in_thread = true",
        "allowed_users = [" + ", ".join(f'"{u}"' for u in allowed) + "]",
    ]
    return "\n".join(lines) + "\n"


@dataclass
class Bridged:
    slack: peer.LocalSlack
    process: asyncio.subprocess.Process
    log: list[str]

    async def wait_until(
        self, check: Callable[[], Awaitable[bool]], what: str, timeout: float = 20
    ) -> None:
        """Re-check ``check`` until it holds: the service answers asynchronously."""
        try:
            async with asyncio.timeout(timeout):
                while not await check():
                    await asyncio.sleep(0.05)
        except TimeoutError:
            tail = "\n".join(self.log[-30:])
            raise AssertionError(f"timed out waiting for {what}; service log:\n{tail}") from None

    async def results(self) -> list[dict[str, Any]]:
        return await self.slack.bot_messages()

    async def reactions(self, ts: str) -> list[str]:
        for message in await self.slack.messages():
            if message["ts"] == ts:
                return [r["name"] for r in message.get("reactions", [])]
        return []

    async def wait_for_reaction(self, ts: str, name: str) -> None:
        async def has() -> bool:
            return name in await self.reactions(ts)

        await self.wait_until(has, f"reaction {name} on {ts}")


@contextlib.asynccontextmanager
async def bridged(
    tmp: Path,
    mode: str,
    claude_env: Mapping[str, str] | None = None,
    allowed: tuple[str, ...] = (peer.ALICE,),
    slack_extra: Mapping[str, Any] | None = None,
) -> AsyncIterator[Bridged]:
    """local-slack plus ``chatbridge run`` configured for it; both stopped on exit."""
    require_local_slack()
    require_service()
    events_port = peer.free_port() if mode == "events" else None
    async with peer.run_local_slack(tmp, mode, events_port) as slack:
        cfg = tmp / "chatbridge.toml"
        cfg.write_text(config_toml(tmp, slack, allowed, slack_extra or {}))
        env = {
            **os.environ,
            **(claude_env or {}),
            # Secrets from the environment, as in production.
            "CHATBRIDGE_SLACK__BOT_TOKEN": peer.BOT_TOKEN,
            "CHATBRIDGE_SLACK__APP_TOKEN": peer.APP_TOKEN,
            "CHATBRIDGE_SLACK__SIGNING_SECRET": peer.SIGNING_SECRET,
        }
        process = await asyncio.create_subprocess_exec(
            str(CHATBRIDGE),
            "run",
            "--config",
            str(cfg),
            env=env,
            cwd=tmp,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE,
        )
        log: list[str] = []
        ready = asyncio.Event()

        async def read_log() -> None:
            assert process.stderr is not None
            async for raw in process.stderr:
                line = raw.decode(errors="replace").rstrip()
                log.append(line)
                if "chatbridge ready" in line:
                    ready.set()

        async with asyncio.TaskGroup() as tg:
            reader = tg.create_task(read_log())
            try:
                waiter = tg.create_task(ready.wait())
                await asyncio.wait({waiter, reader}, timeout=30, return_when="FIRST_COMPLETED")
                waiter.cancel()
                if not ready.is_set():
                    raise AssertionError("service never became ready:\n" + "\n".join(log[-40:]))
                yield Bridged(slack, process, log)
            finally:
                if process.returncode is None:
                    process.send_signal(signal.SIGTERM)
                    try:
                        async with asyncio.timeout(15):
                            await process.wait()
                    except TimeoutError:
                        process.kill()
                        await process.wait()
        secrets = (peer.BOT_TOKEN, peer.APP_TOKEN, peer.SIGNING_SECRET)
        leaked = [line for line in log if any(s in line for s in secrets)]
        assert not leaked, f"secrets in the service log: {leaked}"
