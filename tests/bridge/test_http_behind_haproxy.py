"""The listener behind deploy/haproxy.cfg itself (Debian's HAProxy on loopback).

The file's own ``defaults`` and ``backend webhooks`` are used; only the
addresses (Docker's DNS, the container ports) are replaced by loopback ones.
"""

from __future__ import annotations

import asyncio
import random
import re
from pathlib import Path

import aiohttp
import pytest

from bridge.core.http_limits import ClientLimits
from tests.bridge.http_hooks import Hooks, serving
from tests.replicas.load_balancer import INSTALL_HINT, binary
from tests.transports.slack.peer import free_port

pytestmark = pytest.mark.slow

DEPLOYED = Path(__file__).resolve().parents[2] / "deploy" / "haproxy.cfg"


def on_loopback(front: int, public: int, private: int) -> str:
    text = DEPLOYED.read_text()
    text = re.sub(r"\nresolvers docker\n(    .*\n)+", "\n", text)
    text = text.replace("    bind :3001\n", f"    bind 127.0.0.1:{front}\n")
    # Every backend's replicas (the webhooks' and the Slack events'): this one listener.
    replicas = re.compile(r"    server-template replica \d+ chatbridge:\d+ check port 8080 .*\n")
    assert len(replicas.findall(text)) == 2
    server = f"    server r1 127.0.0.1:{public} check port {private} inter 200ms rise 1\n"
    return replicas.sub(server, text)


async def delivered(client: aiohttp.ClientSession, url: str) -> bool:
    try:
        async with client.post(url, data=b"{}") as response:
            return response.status == 202
    except aiohttp.ClientConnectorError:
        return False


async def test_deliveries_through_the_balancer_never_meet_a_connection_the_listener_closed(
    tmp_path: Path,
) -> None:
    # The listener closes a connection idle past head_timeout_s; a balancer that reuses
    # its idle connections sends some requests on one just closed (the client then sees
    # the connection dropped, no answer). Requests spaced at about that time find it.
    exe = binary()
    if exe is None:
        pytest.skip(INSTALL_HINT)
    head_timeout = 0.2
    hooks = Hooks()
    front = free_port()
    async with serving(webhooks=hooks, limits=ClientLimits(head_timeout_s=head_timeout)) as port:
        config = tmp_path / "haproxy.cfg"
        config.write_text(on_loopback(front, port, port))
        log = (tmp_path / "haproxy.log").open("wb")
        process = await asyncio.create_subprocess_exec(
            exe, "-db", "-f", str(config), stdin=asyncio.subprocess.DEVNULL, stdout=log, stderr=log
        )
        try:
            url = f"http://127.0.0.1:{front}/hooks/a"
            async with aiohttp.ClientSession() as client:
                async with asyncio.timeout(10):
                    while not await delivered(client, url):  # HAProxy up, the replica checked
                        await asyncio.sleep(0.05)
                answers = []
                for _ in range(100):
                    await asyncio.sleep(head_timeout + random.uniform(-0.005, 0.005))
                    try:
                        async with client.post(url, data=b"{}") as response:
                            answers.append(response.status)
                    except aiohttp.ServerDisconnectedError:
                        answers.append(0)
        finally:
            process.terminate()
            await process.wait()
            log.close()
    assert answers == [202] * 100
