"""The real service (``chatbridge run``) as a subprocess, bridged to local-slack."""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.config_files import merged, toml_text
from tests.service_process import base_config, run_service
from tests.transports.slack import peer
from tests.transports.slack.harness import require_local_slack


def config_toml(
    tmp: Path,
    slack: peer.LocalSlack,
    allowed: tuple[str, ...],
    slack_extra: Mapping[str, Any],
    *,
    room_extra: Mapping[str, Any] | None = None,
    extra: Mapping[str, Any] | None = None,
) -> str:
    table: dict[str, Any] = {"mode": slack.mode, "api_url": slack.api_url}
    if slack.events_port is not None:
        table["listen"] = f"127.0.0.1:{slack.events_port}"
    room = {
        "transport": "slack",
        "id": peer.CHANNEL,
        "reply_in_thread": True,
        "allowed_users": list(allowed),
        **(room_extra or {}),
    }
    config = merged(base_config(tmp), extra or {})
    return toml_text(merged(config, {"slack": {**table, **slack_extra}, "rooms": [room]}))


@dataclass
class Bridged:
    slack: peer.LocalSlack
    process: asyncio.subprocess.Process
    log: list[str]
    config: Path
    env: Mapping[str, str]
    secrets: tuple[str, ...]

    @contextlib.asynccontextmanager
    async def restarted(self) -> AsyncIterator[Bridged]:
        """The service started again with the same configuration, against the same local-slack
        (the previous process must have ended)."""
        async with run_service(self.config, self.env, secrets=self.secrets) as running:
            yield Bridged(
                self.slack, running.process, running.log, self.config, self.env, self.secrets
            )

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
    *,
    room_extra: Mapping[str, Any] | None = None,
    extra: Mapping[str, Any] | None = None,
) -> AsyncIterator[Bridged]:
    """local-slack plus ``chatbridge run`` configured for it; both stopped on exit.

    ``room_extra``: more settings of the room; ``extra``: tables laid over the base
    configuration (``{"defaults": {"approve_tools": True}}``)."""
    require_local_slack()
    events_port = peer.free_port() if mode == "events" else None
    async with peer.run_local_slack(tmp, mode, events_port) as slack:
        cfg = tmp / "chatbridge.toml"
        text = config_toml(
            tmp, slack, allowed, slack_extra or {}, room_extra=room_extra, extra=extra
        )
        cfg.write_text(text)
        # Secrets from the environment, as in production.
        secrets = {
            "CHATBRIDGE_SLACK__BOT_TOKEN": peer.BOT_TOKEN,
            "CHATBRIDGE_SLACK__APP_TOKEN": peer.APP_TOKEN,
            "CHATBRIDGE_SLACK__SIGNING_SECRET": peer.SIGNING_SECRET,
        }
        env = {**(claude_env or {}), **secrets}
        hidden = tuple(secrets.values())
        async with run_service(cfg, env, secrets=hidden) as running:
            yield Bridged(slack, running.process, running.log, cfg, env, hidden)


ECHO = {"FAKE_CLAUDE_ECHO": "1", "FAKE_CLAUDE_NO_TOOL": "1"}


PROGRESS = re.compile(r"^(Working…|(Done|Failed|Stopped|Timed out|Stalled|Interrupted) after )")


async def answers(b: Bridged) -> list[dict[str, object]]:
    """The bridge's results: messages in threads that are not the run's progress message."""
    return [m for m in await b.results() if "thread_ts" in m and not PROGRESS.match(str(m["text"]))]


async def wait_for_answers(b: Bridged, count: int) -> list[dict[str, object]]:
    async def enough() -> bool:
        return len(await answers(b)) >= count

    await b.wait_until(enough, f"{count} answer(s)")
    return await answers(b)
