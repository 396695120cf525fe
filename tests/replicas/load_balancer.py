"""HAProxy (Debian's package) on loopback in front of the replicas' Slack Events
endpoints, round robin, each replica's ``/readyz`` as its health check: as
deploy/haproxy.cfg does it, with fixed addresses and checks fast enough for tests.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from tests.transports.slack.peer import free_port

INSTALL_HINT = "apt-get install -y haproxy (scripts/install-peers.sh)"


def binary() -> str | None:
    return shutil.which("haproxy") or (
        "/usr/sbin/haproxy" if os.path.exists("/usr/sbin/haproxy") else None
    )


@dataclass(frozen=True)
class Backend:
    name: str
    events_port: int
    http_port: int


def config_text(port: int, backends: Sequence[Backend], stats: Path) -> str:
    servers = "\n".join(
        f"    server {b.name} 127.0.0.1:{b.events_port} check port {b.http_port}"
        " inter 200ms fall 2 rise 1"
        for b in backends
    )
    # retries + redispatch: a connection refused by a dead replica goes to another
    # at once (Slack itself would only retry after 3 s, and local-slack never does).
    return f"""\
global
    maxconn 1024
    stats socket {stats} level operator

defaults
    mode http
    timeout connect 1s
    timeout client 10s
    # Slack gives up on a request after 3 s (and redelivers): so does the balancer,
    # so a request to a paused replica does not hold the load up for longer.
    timeout server 3s
    retries 3
    option redispatch 1
    option http-server-close

frontend slack_events
    bind 127.0.0.1:{port}
    default_backend replicas

backend replicas
    balance roundrobin
    option httpchk GET /readyz
    http-check expect status 200
{servers}
"""


@dataclass
class LoadBalancer:
    port: int
    process: asyncio.subprocess.Process
    stats: Path

    async def checked_up(self) -> set[str]:
        """The servers whose last health check passed (the stats socket's ``show stat``)."""
        reader, writer = await asyncio.open_unix_connection(str(self.stats))
        try:
            writer.write(b"show stat\n")
            await writer.drain()
            raw = await reader.read()
        finally:
            writer.close()
        lines = raw.decode().splitlines()
        header = lines[0].lstrip("# ").split(",")
        up = set()
        for line in lines[1:]:
            row = dict(zip(header, line.split(","), strict=False))
            if row.get("pxname") == "replicas" and row.get("check_status") == "L7OK":
                up.add(row["svname"])
        return up

    async def wait_checked(self, servers: set[str], timeout: float = 15) -> None:
        """Until exactly ``servers`` passed their last check."""
        async with asyncio.timeout(timeout):
            while await self.checked_up() != servers:
                await asyncio.sleep(0.05)  # checks run every 200 ms: poll their result

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/slack/events"


@contextlib.asynccontextmanager
async def run_haproxy(
    home: Path, port: int, backends: Sequence[Backend]
) -> AsyncIterator[LoadBalancer]:
    """HAProxy in the foreground (``-db``) on ``port``; stopped on exit."""
    exe = binary()
    if exe is None:
        raise RuntimeError(f"no haproxy binary: {INSTALL_HINT}")
    cfg = home / "haproxy.cfg"
    stats = home / "haproxy.sock"
    cfg.write_text(config_text(port, backends, stats))
    check = await asyncio.create_subprocess_exec(
        exe,
        "-c",
        "-q",
        "-f",
        str(cfg),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    out, _ = await check.communicate()
    if check.returncode != 0:
        raise RuntimeError(f"haproxy refused its configuration:\n{out.decode()}")
    log = (home / "haproxy.log").open("wb")
    process = await asyncio.create_subprocess_exec(
        exe, "-db", "-f", str(cfg), stdin=asyncio.subprocess.DEVNULL, stdout=log, stderr=log
    )
    try:
        # Ready once its stats socket answers (it is made after the listeners are bound).
        async with asyncio.timeout(10):
            while True:
                if process.returncode is not None:
                    raise RuntimeError(f"haproxy exited: {(home / 'haproxy.log').read_text()}")
                try:
                    await LoadBalancer(port, process, stats).checked_up()
                except OSError:
                    await asyncio.sleep(0.05)  # no event tells when it is up
                    continue
                break
        yield LoadBalancer(port, process, stats)
    finally:
        if process.returncode is None:
            process.terminate()
            try:
                async with asyncio.timeout(5):
                    await process.wait()
            except TimeoutError:
                process.kill()
                await process.wait()
        log.close()


__all__ = ["Backend", "LoadBalancer", "free_port", "run_haproxy"]
