"""Logging in against a stand-in homeserver: how long the bridge waits after a rate limit."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from aiohttp import web
from pydantic import SecretStr

from tests.file_modes import mode
from transports.backoff import Backoff
from transports.matrix.client import new_client
from transports.matrix.login import log_in
from transports.matrix.settings import MatrixSettings

USER = "@bot:hs"


@pytest.fixture
async def homeserver() -> AsyncIterator[tuple[str, list[str]]]:
    """whoami answers M_LIMIT_EXCEEDED (retry after 7.5 s) once, then the bot's identity."""
    calls: list[str] = []

    async def whoami(request: web.Request) -> web.Response:
        calls.append("whoami")
        if len(calls) == 1:
            body = {"errcode": "M_LIMIT_EXCEEDED", "error": "slow", "retry_after_ms": 7500}
            return web.json_response(body, status=429)
        return web.json_response({"user_id": USER, "device_id": "DEV"})

    app = web.Application()
    app.router.add_get("/_matrix/client/v3/account/whoami", whoami)
    runner = web.AppRunner(app, shutdown_timeout=0.1)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        yield f"http://127.0.0.1:{port}", calls
    finally:
        await runner.cleanup()


async def test_login_waits_as_long_as_the_server_asks(
    homeserver: tuple[str, list[str]], tmp_path: Path
) -> None:
    url, calls = homeserver
    settings = MatrixSettings(
        homeserver=url, user_id=USER, access_token=SecretStr("t"), store_path=tmp_path
    )
    client = new_client(settings)
    waits: list[float] = []

    async def sleep(seconds: float) -> None:
        waits.append(seconds)

    try:
        await log_in(client, settings, Backoff(base=0.5, cap=1.0), sleep)
    finally:
        await client.close()
    assert calls == ["whoami", "whoami"]
    assert waits == [7.5]  # not the backoff's 0.5 s
    assert client.user_id == USER


async def test_the_key_store_is_private_whatever_the_umask(tmp_path: Path, umask: int) -> None:
    earlier = tmp_path / "earlier"
    earlier.mkdir()
    earlier.chmod(0o755)  # as an earlier version left it under umask 022
    for store in (tmp_path / "new" / "store", earlier):
        settings = MatrixSettings(
            homeserver="http://127.0.0.1:9",
            user_id=USER,
            access_token=SecretStr("t"),
            store_path=store,
        )
        await new_client(settings).close()
        assert mode(store) == 0o700
    assert mode(tmp_path / "new") == 0o700  # a folder it made on the way too
