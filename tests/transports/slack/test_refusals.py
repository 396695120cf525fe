"""Settings no retry can fix: a token Slack refuses, an events port that cannot be bound.

The transport raises :class:`SettingRefused` naming the setting instead of
reconnecting with backoff; ``chatbridge run`` then fails at once with one
line naming it (exit status 1), where it used to retry until the 60 s
start-up limit and blame ``slack.api_url``. "At once" is shown without a
clock: the refused call is made exactly once and no reconnect is logged.

Against :mod:`tests.transports.slack.fake_slack` (local-slack accepts any token).
"""

from __future__ import annotations

import asyncio
import os
import socket
from collections.abc import Awaitable, Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from bridge.core.model import RoomId
from bridge.core.transport import RoomBinding
from tests.config_files import merged, toml_text
from tests.service_process import CHATBRIDGE, base_config, require_service
from tests.transports.slack.fake_slack import CHANNEL, HELLO, FakeSlack, fake_slack
from tests.transports.slack.harness import RecordingSink
from transports.backoff import Backoff
from transports.slack.settings import SlackSettings
from transports.slack.transport import SlackTransport
from transports.slack.web import SettingRefused

BOT_TOKEN = "xoxb-refused-SECRET"
APP_TOKEN = "xapp-refused-SECRET"
SIGNING_SECRET = "signing-SECRET"


@pytest.fixture
def taken_port() -> Iterator[int]:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock.getsockname()[1]


def settings(fake: FakeSlack, mode: str, **overrides: Any) -> SlackSettings:
    values: dict[str, Any] = {
        "mode": mode,
        "bot_token": BOT_TOKEN,
        "app_token": APP_TOKEN,
        "signing_secret": SIGNING_SECRET,
        "api_url": fake.api_url,
        "listen": "127.0.0.1:0",
    }
    return SlackSettings.model_validate({**values, **overrides})


async def refusal(transport: SlackTransport) -> SettingRefused:
    """What ``run`` raises; it must raise without ever being ready."""
    ready = asyncio.Event()
    with pytest.raises(SettingRefused) as raised:
        async with asyncio.timeout(10):
            await transport.run(RecordingSink(), ready)
    assert not ready.is_set()
    return raised.value


def transport_for(slack: SlackSettings) -> SlackTransport:
    # A backoff that would retry quickly: the test shows no retry happens at all.
    return SlackTransport(slack, [RoomBinding(RoomId(CHANNEL))], backoff=Backoff(0.01, 0.05))


@pytest.mark.parametrize("mode", ["socket", "events"])
@pytest.mark.parametrize("code", ["invalid_auth", "token_revoked", "account_inactive"])
async def test_a_refused_bot_token_ends_run_naming_it(mode: str, code: str) -> None:
    async with fake_slack() as fake:
        fake.errors["auth.test"] = [code]
        error = await refusal(transport_for(settings(fake, mode)))
        assert str(error) == f"slack: slack.bot_token refused by Slack (auth.test: {code})"
        assert fake.calls == ["auth.test"]  # once, and nothing after it


async def test_a_refused_app_token_ends_run_naming_it() -> None:
    async with fake_slack() as fake:
        fake.errors["apps.connections.open"] = ["not_allowed_token_type"]
        error = await refusal(transport_for(settings(fake, "socket")))
        assert str(error) == (
            "slack: slack.app_token refused by Slack"
            " (apps.connections.open: not_allowed_token_type)"
        )
        assert fake.calls == ["auth.test", "apps.connections.open"]


async def test_an_events_port_taken_ends_run_naming_slack_listen(taken_port: int) -> None:
    async with fake_slack() as fake:
        slack = settings(fake, "events", listen=f"127.0.0.1:{taken_port}")
        error = await refusal(transport_for(slack))
        assert str(error) == (
            f"slack: slack.listen = 127.0.0.1:{taken_port}: cannot listen: Address already in use"
        )
        assert fake.calls == ["auth.test"]


async def test_other_answers_are_still_retried() -> None:
    """Only a refusal is final: an error Slack may get over is retried as before."""
    async with fake_slack() as fake:
        fake.errors["auth.test"] = ["internal_error", "ratelimited"]
        fake.errors["apps.connections.open"] = ["service_unavailable"]
        transport = transport_for(settings(fake, "socket"))
        ready = asyncio.Event()
        async with asyncio.TaskGroup() as tg:
            task = tg.create_task(transport.run(RecordingSink(), ready))
            async with asyncio.timeout(10):
                ws = await fake.sockets.get()
                await ws.send_json(HELLO)
                await ready.wait()
            task.cancel()
        assert fake.calls_to("auth.test") == 4


async def test_a_token_revoked_while_serving_ends_run() -> None:
    """As the Matrix transport does: no reconnect can work until the token is replaced."""
    async with fake_slack() as fake:
        transport = transport_for(settings(fake, "socket"))
        ready = asyncio.Event()

        async def revoke_after_hello() -> None:
            ws = await fake.sockets.get()
            await ws.send_json(HELLO)
            await ready.wait()
            fake.errors["auth.test"] = ["token_revoked"]
            await ws.close()  # the reconnect's auth.test is refused

        revoking = asyncio.create_task(revoke_after_hello())
        try:
            with pytest.raises(SettingRefused, match=r"slack\.bot_token .*token_revoked"):
                async with asyncio.timeout(10):
                    await transport.run(RecordingSink(), ready)
            await revoking
        finally:
            revoking.cancel()
        assert fake.calls == ["auth.test", "apps.connections.open", "auth.test"]


# The real service: one line, exit status 1, no traceback, no secret.


def clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("CHATBRIDGE_")}


def service_config(tmp: Path, slack: Mapping[str, Any]) -> Path:
    """A Slack-only configuration; the tokens come from the environment, as in production."""
    config = tmp / "chatbridge.toml"
    room = {"transport": "slack", "id": CHANNEL}
    config.write_text(toml_text(merged(base_config(tmp), {"slack": dict(slack), "rooms": [room]})))
    return config


async def failed_service(
    config: Path, when_ready: Callable[[], Awaitable[None]] | None = None
) -> list[str]:
    """Run ``chatbridge run`` until it ends, which it must do with exit status 1; its log.

    Without ``when_ready`` it must never be ready; with it, it must be, and
    ``when_ready`` is awaited then.
    """
    require_service()
    secrets = {
        "CHATBRIDGE_SLACK__BOT_TOKEN": BOT_TOKEN,
        "CHATBRIDGE_SLACK__APP_TOKEN": APP_TOKEN,
        "CHATBRIDGE_SLACK__SIGNING_SECRET": SIGNING_SECRET,
    }
    process = await asyncio.create_subprocess_exec(
        str(CHATBRIDGE), "run", "--config", str(config),
        env={**clean_env(), **secrets},
        cwd=config.parent,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    log: list[str] = []
    try:
        # A safety net only: well within the 60 s the old retrying took.
        async with asyncio.timeout(50):
            assert process.stderr is not None
            async for raw in process.stderr:
                log.append(raw.decode(errors="replace").rstrip())
                if "chatbridge ready" in log[-1] and when_ready is not None:
                    await when_ready()
            await process.wait()
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    text = "\n".join(log)
    assert process.returncode == 1, text
    assert "Traceback" not in text
    assert ("chatbridge ready" in text) == (when_ready is not None)
    if when_ready is None:
        assert "reconnecting" not in text  # refused on the first attempt, not retried
    assert not any(secret in text for secret in secrets.values())
    return log


def one_error(log: list[str]) -> str:
    errors = [line for line in log if " ERROR " in line]
    assert len(errors) == 1, "\n".join(log)
    return errors[0]


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["socket", "events"])
async def test_service_with_a_refused_bot_token_fails_at_once(tmp_path: Path, mode: str) -> None:
    async with fake_slack() as fake:
        fake.errors["auth.test"] = ["invalid_auth"]
        slack = {"mode": mode, "api_url": fake.api_url, "listen": "127.0.0.1:0"}
        line = one_error(await failed_service(service_config(tmp_path, slack)))
        assert line.endswith("slack: slack.bot_token refused by Slack (auth.test: invalid_auth)")
        assert fake.calls == ["auth.test"]


@pytest.mark.slow
async def test_service_with_a_refused_app_token_fails_at_once(tmp_path: Path) -> None:
    async with fake_slack() as fake:
        fake.errors["apps.connections.open"] = ["invalid_auth"]
        slack = {"mode": "socket", "api_url": fake.api_url}
        line = one_error(await failed_service(service_config(tmp_path, slack)))
        assert "slack.app_token refused by Slack (apps.connections.open: invalid_auth)" in line
        assert fake.calls_to("apps.connections.open") == 1


@pytest.mark.slow
async def test_service_with_its_events_port_taken_fails_at_once(
    tmp_path: Path, taken_port: int
) -> None:
    async with fake_slack() as fake:
        slack = {"mode": "events", "api_url": fake.api_url, "listen": f"127.0.0.1:{taken_port}"}
        line = one_error(await failed_service(service_config(tmp_path, slack)))
        assert line.endswith(
            f"slack.listen = 127.0.0.1:{taken_port}: cannot listen: Address already in use"
        )


@pytest.mark.slow
async def test_service_ends_when_its_token_is_revoked_while_serving(tmp_path: Path) -> None:
    async with fake_slack() as fake:
        socket: list[web.WebSocketResponse] = []

        async def greet() -> None:
            socket.append(await fake.sockets.get())
            await socket[0].send_json(HELLO)

        async def revoke() -> None:
            fake.errors["auth.test"] = ["token_revoked"]
            await socket[0].close()

        greeting = asyncio.create_task(greet())
        try:
            config = service_config(tmp_path, {"mode": "socket", "api_url": fake.api_url})
            line = one_error(await failed_service(config, when_ready=revoke))
        finally:
            greeting.cancel()
        assert line.endswith("slack: slack.bot_token refused by Slack (auth.test: token_revoked)")
        assert fake.calls_to("auth.test") == 2
