from __future__ import annotations

import asyncio
import logging
import select
import socket
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import aiohttp
import pytest

from bridge import http
from bridge import service as service_module
from bridge.config import load_settings
from bridge.core.hostport import HostPort
from bridge.core.transport import InboundSink
from bridge.errors import StartupError
from bridge.http import Readiness, serve_http
from bridge.service import Service, open_store
from tests.bridge.harness import write_config
from transports.base import Transport


async def get(port: int, path: str) -> tuple[int, str]:
    async with (
        aiohttp.ClientSession() as http,
        http.get(f"http://127.0.0.1:{port}{path}") as response,
    ):
        return response.status, await response.text()


async def test_readyz_is_503_with_the_reason_until_ready() -> None:
    reason: str | None = "matrix: not connected"
    bound: asyncio.Future[int] = asyncio.get_running_loop().create_future()

    async def readiness() -> str | None:
        return reason

    server = asyncio.create_task(
        serve_http(HostPort("127.0.0.1", 0), readiness, lambda: b"# metrics\n", bound.set_result)
    )
    try:
        port = await bound
        assert await get(port, "/readyz") == (503, "not ready: matrix: not connected\n")
        assert (await get(port, "/healthz"))[0] == 200
        reason = None
        assert await get(port, "/readyz") == (200, "ready\n")
        status, text = await get(port, "/metrics")
        assert status == 200
        assert text == "# metrics\n"
    finally:
        server.cancel()
        await asyncio.wait({server})


class Disconnected(Transport):
    name = "slack"  # type: ignore[assignment]

    async def run(self, sink: InboundSink, ready: asyncio.Event) -> None:
        await asyncio.Event().wait()

    @property
    def connected(self) -> bool:
        return False


async def test_service_readiness_names_the_store_or_the_transport(tmp_path: Path) -> None:
    settings = load_settings(write_config(tmp_path))
    store = await open_store(settings)
    service = Service(settings, store, [Disconnected()])
    assert await service.readiness() == "slack: not connected"
    await store.close()
    reason = await service.readiness()
    assert reason is not None
    assert reason.startswith("store: ")


async def raw_exchange(port: int, request: bytes) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(request)
        await writer.drain()
        return await reader.read()  # the server closes after one response
    finally:
        writer.close()
        await writer.wait_closed()


async def test_unknown_paths_methods_and_oversized_heads_are_refused() -> None:
    bound: asyncio.Future[int] = asyncio.get_running_loop().create_future()

    async def readiness() -> str | None:
        return None

    server = asyncio.create_task(
        serve_http(HostPort("127.0.0.1", 0), readiness, lambda: b"", bound.set_result)
    )
    try:
        port = await bound
        assert (await get(port, "/nothing"))[0] == 404
        assert (await get(port, "/readyz?verbose=1")) == (200, "ready\n")
        post = await raw_exchange(port, b"POST /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        assert post.startswith(b"HTTP/1.1 405 ")
        head = await raw_exchange(port, b"HEAD /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200 ")
        assert head.endswith(b"\r\n\r\n")  # no body after a HEAD
        garbage = await raw_exchange(port, b"hello\r\n\r\n")
        assert garbage.startswith(b"HTTP/1.1 400 ")
        huge = await raw_exchange(
            port, b"GET /healthz HTTP/1.1\r\nX: " + b"a" * 20000 + b"\r\n\r\n"
        )
        assert huge.startswith(b"HTTP/1.1 431 ")
        many = await raw_exchange(port, b"GET /healthz HTTP/1.1\r\n" + b"X: y\r\n" * 2000 + b"\r\n")
        assert many.startswith(b"HTTP/1.1 431 ")
    finally:
        server.cancel()
        await asyncio.wait({server})


async def test_a_transport_that_never_connects_fails_the_start_naming_what_to_check(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The real limit is a minute: the start-up's own clock is what is under test, not its length.
    monkeypatch.setattr(service_module, "READY_TIMEOUT_S", 0.1)
    settings = load_settings(write_config(tmp_path))
    store = await open_store(settings)
    try:
        service = Service(settings, store, [Disconnected()])
        with pytest.raises(ExceptionGroup) as caught:
            await service.serve()
    finally:
        await store.close()
    [error] = caught.value.exceptions
    assert isinstance(error, StartupError)
    assert str(error) == "not started within 0.1s: slack (check slack.api_url)"
    assert not service.ready.is_set()


async def always_ready() -> str | None:
    return None


@asynccontextmanager
async def serving(
    readiness: Readiness = always_ready,
    exposition: Callable[[], bytes] = lambda: b"",
    *,
    connection_timeout: float = http.TIMEOUT_S,
    max_connections: int = http.MAX_CONNECTIONS,
) -> AsyncIterator[int]:
    """A server on 127.0.0.1, any port; yields the port and stops the server at the end."""
    bound: asyncio.Future[int] = asyncio.get_running_loop().create_future()
    server = asyncio.create_task(
        serve_http(
            HostPort("127.0.0.1", 0),
            readiness,
            exposition,
            bound.set_result,
            connection_timeout=connection_timeout,
            max_connections=max_connections,
        )
    )
    try:
        yield await bound
    finally:
        server.cancel()
        await asyncio.wait({server})


async def connect(port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    return await asyncio.open_connection("127.0.0.1", port)


HEALTHZ = b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"


async def test_bare_lf_heads_absolute_targets_and_pipelined_requests_are_answered() -> None:
    async with serving() as port:
        bare_lf = await raw_exchange(port, b"GET /healthz HTTP/1.1\nHost: x\n\n")
        assert bare_lf.startswith(b"HTTP/1.1 200 ")
        absolute = await raw_exchange(
            port, b"GET http://127.0.0.1:8080/healthz?x=1 HTTP/1.1\r\n\r\n"
        )
        assert absolute.startswith(b"HTTP/1.1 200 ")
        assert (await raw_exchange(port, b"GET http://h HTTP/1.1\r\n\r\n")).startswith(
            b"HTTP/1.1 404 "
        )


def wait_for_the_connection_s_end(client: socket.socket) -> int:
    """poll() events once both directions are closed or the connection is reset, unread."""
    poll = select.poll()
    poll.register(client, 0)  # only POLLHUP and POLLERR, which are always reported
    [(_, events)] = poll.poll(30_000)
    return events


async def test_what_follows_the_head_is_read_before_closing_so_the_answer_is_not_reset() -> None:
    loop = asyncio.get_running_loop()
    async with serving() as port:
        with socket.socket() as client:
            client.setblocking(False)
            await loop.sock_connect(client, ("127.0.0.1", port))
            # More than the server's transport reads at once: some stays in its socket.
            await loop.sock_sendall(client, HEALTHZ * 3 + b"y" * 600_000)
            client.shutdown(socket.SHUT_WR)
            # Closing with data unread would send a reset, and a reset discards what the server
            # had not yet sent; a clean end (no POLLERR) shows the server read it all first.
            events = await asyncio.to_thread(wait_for_the_connection_s_end, client)
            assert events & select.POLLERR == 0
            answer = await loop.sock_recv(client, 65536)
    assert answer.startswith(b"HTTP/1.1 200 ")
    assert answer.endswith(b"\r\n\r\nok\n")  # one answer: the connection is closed after it


async def test_a_head_not_sent_in_time_is_closed_without_an_answer() -> None:
    async with serving(connection_timeout=0.2) as port:
        reader, writer = await connect(port)
        writer.write(b"GET /healthz HTTP/1.1\r\n")  # and never the end of the head
        assert await reader.read() == b""
        writer.close()


async def test_a_client_that_does_not_read_its_answer_is_cut_off() -> None:
    body = b"m" * (16 << 20)  # far more than the sockets' buffers hold
    answering = asyncio.Event()

    def exposition() -> bytes:
        answering.set()
        return body

    async with serving(exposition=exposition, connection_timeout=0.2) as port:
        slow = socket.socket()
        slow.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        slow.connect(("127.0.0.1", port))
        reader, writer = await asyncio.open_connection(sock=slow)
        writer.write(b"GET /metrics HTTP/1.1\r\n\r\n")
        await answering.wait()
        # A connection accepted later, with the same time limit, is cut off after this one:
        # once it is, the first one's end has come too.
        later_reader, later_writer = await connect(port)
        assert await later_reader.read() == b""
        later_writer.close()
        answer = await reader.read()  # what the kernel had taken, then the end
        writer.close()
        assert answer.startswith(b"HTTP/1.1 200 ")
        assert len(answer) < len(body)


async def test_beyond_the_connection_cap_the_oldest_idle_one_makes_room() -> None:
    async with serving(max_connections=2) as port:
        oldest_reader, oldest_writer = await connect(port)
        idle_reader, idle_writer = await connect(port)
        # A probe behind idle connections is answered: they cannot lock it out.
        assert (await raw_exchange(port, HEALTHZ)).startswith(b"HTTP/1.1 200 ")
        assert await oldest_reader.read() == b""
        oldest_writer.close()
        idle_writer.write(HEALTHZ)  # the newer one was kept
        assert (await idle_reader.read()).startswith(b"HTTP/1.1 200 ")
        idle_writer.close()


async def test_at_the_cap_with_every_connection_answering_a_new_one_is_closed() -> None:
    entered, release = asyncio.Event(), asyncio.Event()

    async def readiness() -> str | None:
        entered.set()
        await release.wait()
        return None

    async with serving(readiness, max_connections=1) as port:
        reader, writer = await connect(port)
        writer.write(b"GET /readyz HTTP/1.1\r\n\r\n")
        await entered.wait()
        assert await raw_exchange(port, HEALTHZ) == b""
        release.set()
        assert (await reader.read()).startswith(b"HTTP/1.1 200 ")
        writer.close()


async def test_stopping_with_connections_open_ends_them_and_logs_nothing(
    caplog: pytest.LogCaptureFixture,
) -> None:
    entered = asyncio.Event()

    async def readiness() -> str | None:
        entered.set()
        await asyncio.Event().wait()  # a readiness check that never ends
        return None

    caplog.set_level(logging.DEBUG)
    async with serving(readiness) as port:
        idle_reader, idle_writer = await connect(port)
        waiting_reader, waiting_writer = await connect(port)
        waiting_writer.write(b"GET /readyz HTTP/1.1\r\n\r\n")
        await entered.wait()
    assert await idle_reader.read() == b""
    assert await waiting_reader.read() == b""
    idle_writer.close()
    waiting_writer.close()
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []


async def test_a_host_that_does_not_resolve_is_named_with_the_resolver_s_reason() -> None:
    host = "no-such-host.invalid"  # .invalid never resolves (RFC 6761)
    with pytest.raises(socket.gaierror) as resolving:
        socket.getaddrinfo(host, 0)
    with pytest.raises(StartupError) as caught:
        await serve_http(HostPort(host, 0), always_ready, lambda: b"", lambda port: None)
    assert str(caught.value) == (
        f"http.listen = {host}:0: cannot listen: {resolving.value.strerror}"
    )
