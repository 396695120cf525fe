from __future__ import annotations

import asyncio
import io
import logging
import socket
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

from bridge import service as service_module
from bridge.config import load_settings
from bridge.core.hostport import HostPort
from bridge.core.http_limits import ClientLimits
from bridge.core.transport import Duplex, InboundSink
from bridge.errors import StartupError
from bridge.host.http import serve_http
from bridge.host.http_sockets import bind_http
from bridge.service import Service, open_store
from tests.bridge.harness import ConsoleSession, write_config
from tests.bridge.http_hooks import Hooks, always_ready, serving


async def get(port: int, path: str) -> tuple[int, str]:
    async with (
        aiohttp.ClientSession() as http,
        http.get(f"http://127.0.0.1:{port}{path}") as response,
    ):
        return response.status, await response.text()


async def test_readyz_is_503_with_the_reason_until_ready() -> None:
    reason: str | None = "matrix: not connected"

    async def readiness() -> str | None:
        return reason

    sockets = bind_http(HostPort("127.0.0.1", 0), None)
    server = asyncio.create_task(serve_http(sockets, readiness, lambda: b"# metrics\n"))
    try:
        port = sockets.private_port
        assert port is not None
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


class Disconnected(Duplex):
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
    """One request on its own connection; what arrives until the server closes or goes quiet."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(request)
        await writer.drain()
        answer = b""
        try:
            while chunk := await asyncio.wait_for(reader.read(65536), 1.0):
                answer += chunk
        except TimeoutError:
            pass  # kept alive: the answer is in
        return answer
    finally:
        writer.close()


async def test_unknown_paths_methods_and_malformed_heads_are_refused(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    async with serving() as port:
        assert (await get(port, "/nothing"))[0] == 404
        assert (await get(port, "/readyz?verbose=1")) == (200, "ready\n")
        post = await raw_exchange(port, b"POST /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        assert post.startswith(b"HTTP/1.1 405 ")
        head = await raw_exchange(port, b"HEAD /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200 ")
        assert head.endswith(b"\r\n\r\n")  # no body after a HEAD
        malformed = [
            b"hello\r\n\r\n",
            b"GET /healthz HTTP/1.1\r\nX: " + b"a" * 20000 + b"\r\n\r\n",
            b"GET /healthz HTTP/1.1\r\n" + b"X: y\r\n" * 2000 + b"\r\n",
            b"GET /healthz HTTP/1.1\r\nHost: x\r\nContent-Length: \xb2\r\n\r\n",
            b"GET /healthz HTTP/1.1\r\nHost: x\r\nContent-Length: \xc2\xb2\r\n\r\n",
            b"GET /healthz HTTP/1.1\r\nHost: x\r\nContent-Length: +1\r\n\r\n",
            b"GET /healthz HTTP/1.1\nHost: x\n\n",
            b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03\r\n\r\n",  # TLS spoken to plain HTTP
            b"FOO /healthz HTTP/1.1\r\nHost: x\r\n\r\n",
        ]
        for request in malformed:
            answer = await raw_exchange(port, request)
            assert answer.split(b"\r\n")[0] == b"HTTP/1.0 400 Bad Request", request[:40]
    # A client's garbage is no error of the bridge's: nothing above DEBUG, no traceback.
    ours = [r for r in caplog.records if "http" in r.name or "web_server" in r.name]
    assert ours
    assert not [r for r in ours if r.levelno > logging.DEBUG or r.exc_info]


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


async def connect(port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    return await asyncio.open_connection("127.0.0.1", port)


HEALTHZ = b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"


async def test_a_head_not_sent_in_time_is_closed_without_an_answer() -> None:
    async with serving(limits=ClientLimits(head_timeout_s=0.2)) as port:
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

    async with serving(exposition=exposition, limits=ClientLimits(head_timeout_s=0.2)) as port:
        slow = socket.socket()
        slow.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        slow.connect(("127.0.0.1", port))
        reader, writer = await asyncio.open_connection(sock=slow)
        writer.write(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
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
    async with serving(limits=ClientLimits(max_connections=2)) as port:
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

    async with serving(readiness, limits=ClientLimits(max_connections=1)) as port:
        reader, writer = await connect(port)
        writer.write(b"GET /readyz HTTP/1.1\r\nHost: x\r\n\r\n")
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
        waiting_writer.write(b"GET /readyz HTTP/1.1\r\nHost: x\r\n\r\n")
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
        bind_http(HostPort("127.0.0.1", 0), HostPort(host, 0))
    assert str(caught.value) == (
        f"http.public_listen = {host}:0: cannot listen: {resolving.value.strerror}"
    )


WEBHOOK_HEAD = b"POST /hooks/a HTTP/1.1\r\nHost: x\r\nContent-Length: 1000000\r\n\r\n"
CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"


async def held_back_bodies(port: int, count: int) -> list[socket.socket]:
    """``count`` raw connections that each send a webhook's head and hold back its body.

    Each waits for the server's 100 Continue: its head is read and its body awaited, the
    state that once counted as "being answered" and so was never closed for a newcomer.
    """
    loop = asyncio.get_running_loop()
    clients = []
    head = WEBHOOK_HEAD.replace(b"\r\n\r\n", b"\r\nExpect: 100-continue\r\n\r\n")
    for _ in range(count):
        client = socket.socket()
        client.setblocking(False)
        await loop.sock_connect(client, ("127.0.0.1", port))
        await loop.sock_sendall(client, head)
        got = b""
        while len(got) < len(CONTINUE) and (chunk := await loop.sock_recv(client, 64)):
            got += chunk
        assert got == CONTINUE
        await loop.sock_sendall(client, b"{")
        clients.append(client)
    return clients


async def head_of_answer(port: int, request: bytes) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(request)
        return (await reader.readuntil(b"\r\n\r\n")).split(b"\r\n")[0]
    finally:
        writer.close()


async def test_slow_webhook_bodies_cannot_keep_health_and_readiness_probes_out() -> None:
    # A connection waiting for its body once counted as "being answered", so a cap's worth of
    # them locked every client out for as long as the attacker renewed them.
    async with (
        asyncio.timeout(60),
        serving(webhooks=Hooks(), limits=ClientLimits(max_connections=8)) as port,
    ):
        clients = await held_back_bodies(port, 8)
        for round_ in range(3):
            # The flood renewed before each probe: the newest connections are the attacker's.
            clients += await held_back_bodies(port, 8)
            for path in (b"/healthz", b"/readyz"):
                answer = await head_of_answer(port, b"GET %s HTTP/1.1\r\nHost: x\r\n\r\n" % path)
                assert answer == b"HTTP/1.1 200 OK", (round_, path)
        for client in clients:
            client.close()


async def test_a_body_not_sent_by_its_deadline_is_answered_408_and_the_connection_closed() -> None:
    hooks = Hooks()
    limits = ClientLimits(body_timeout_s=0.2, head_timeout_s=30)
    async with serving(webhooks=hooks, limits=limits) as port:
        reader, writer = await connect(port)
        writer.write(WEBHOOK_HEAD + b"{")  # and the rest never comes
        answer = await reader.read()  # until the server closes
        writer.close()
        whole = await raw_exchange(
            port,
            b"POST /hooks/a HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n"
            b"Connection: close\r\n\r\n{}",
        )
    assert answer.startswith(b"HTTP/1.1 408 ")
    assert whole.startswith(b"HTTP/1.1 202 ")
    assert hooks.bodies == [b"{}"]


async def test_a_webhook_body_needs_a_length_within_the_limit() -> None:
    async with serving(webhooks=Hooks()) as port:
        chunked = await head_of_answer(
            port,
            b"POST /hooks/a HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
        )
        huge = await head_of_answer(
            port, b"POST /hooks/a HTTP/1.1\r\nHost: x\r\nContent-Length: 99999999\r\n\r\n"
        )
    assert chunked == b"HTTP/1.1 411 Length Required"
    assert huge == b"HTTP/1.1 413 Request Entity Too Large"


async def test_metrics_stay_off_the_public_listener_and_webhooks_off_the_private_one() -> None:
    console = web.Application()

    async def page(request: web.Request) -> web.Response:
        return web.Response(text="console\n")

    console.router.add_get("/", page)
    sockets = bind_http(HostPort("127.0.0.1", 0), HostPort("127.0.0.2", 0))
    server = asyncio.create_task(
        serve_http(
            sockets,
            always_ready,
            lambda: b"# room spend\n",
            webhooks=Hooks(),
            mounts={"/console": console},
        )
    )
    try:
        private, public = sockets.private_port, sockets.public_port
        assert private is not None
        assert public is not None
        async with aiohttp.ClientSession() as client:

            async def status(host: str, port: int, method: str, path: str) -> int:
                url = f"http://{host}:{port}{path}"
                async with client.request(method, url, data=b"{}") as response:
                    return response.status

            for path in ("/healthz", "/readyz", "/metrics", "/console/"):
                assert await status("127.0.0.1", private, "GET", path) == 200, path
                assert await status("127.0.0.2", public, "GET", path) == 404, path
            assert await status("127.0.0.2", public, "POST", "/hooks/a") == 202
            assert await status("127.0.0.1", private, "POST", "/hooks/a") == 404
    finally:
        server.cancel()
        await asyncio.wait({server})


async def test_the_service_serves_webhooks_on_public_listen_and_metrics_on_listen(
    tmp_path: Path,
) -> None:
    config = {
        "http": {"listen": "127.0.0.1:0", "public_listen": "127.0.0.2:0"},
        "webhooks": [
            {
                "room": "console:console",
                "path": "/hooks/deploy",
                "secret": "s" * 32,
                "signature": "generic",
                "prompt": "Deploy: {{ payload.status }}",
            }
        ],
    }
    settings = load_settings(write_config(tmp_path, config))
    async with ConsoleSession(settings) as session, aiohttp.ClientSession() as client:
        service = session.service
        assert service is not None
        assert service.http_port is not None
        assert service.public_http_port is not None
        private = f"http://127.0.0.1:{service.http_port}"
        public = f"http://127.0.0.2:{service.public_http_port}"
        async with client.get(private + "/metrics") as response:
            assert response.status == 200
        async with client.get(public + "/metrics") as response:
            assert response.status == 404
        async with client.post(public + "/hooks/deploy", data=b"{}") as response:
            assert response.status == 401  # reached the webhook: unsigned
        async with client.post(private + "/hooks/deploy", data=b"{}") as response:
            assert response.status == 404
        await session.finish()


def half_closed_exchange(port: int, request: bytes) -> bytes:
    """Send ``request``, shut the sending side (as some probes do), read until the end."""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as client:
        client.sendall(request)
        client.shutdown(socket.SHUT_WR)
        answer = b""
        while chunk := client.recv(65536):
            answer += chunk
        return answer


async def test_a_client_that_shuts_its_side_after_the_request_still_gets_the_answer() -> None:
    async with serving() as port:
        answers = [
            await asyncio.to_thread(half_closed_exchange, port, request)
            for request in (
                HEALTHZ,
                b"GET /healthz HTTP/1.1\r\nHost: x\r\nContent-Length: \xb2\r\n\r\n",
            )
        ]
    assert answers[0].startswith(b"HTTP/1.1 200 ")
    assert answers[0].endswith(b"\r\n\r\nok\n")
    assert answers[1].startswith(b"HTTP/1.0 400 ")


class LargeHooks(Hooks):
    """A webhook taking bodies up to 4 MiB (``max_body_bytes`` goes up to 64 MiB)."""

    def body_limit(self, path: str) -> int | None:
        return 4 << 20 if path == "/hooks/a" else None


async def test_a_webhook_takes_a_body_up_to_its_own_limit_even_past_a_mebibyte() -> None:
    hooks = LargeHooks()
    body = b"x" * (2 << 20)
    async with (
        serving(webhooks=hooks) as port,
        aiohttp.ClientSession() as client,
        client.post(f"http://127.0.0.1:{port}/hooks/a", data=io.BytesIO(body)) as response,
    ):
        assert response.status == 202
    assert hooks.bodies == [body]


async def test_a_new_connection_outlasts_fewer_newcomers_than_the_cap_whatever_the_others_do() -> (
    None
):
    # Clients that keep their connections busy (answered over and over, or never reading
    # their answers) cannot make a newcomer's connection the first to go: only a cap's worth
    # of connections opened after it can.
    cap = 4
    async with serving(limits=ClientLimits(max_connections=cap, head_timeout_s=60)) as port:
        busy = [await connect(port) for _ in range(cap - 1)]
        newcomer_reader, newcomer_writer = await connect(port)  # its head not yet sent
        for reader, writer in busy:  # answered after the newcomer opened
            writer.write(HEALTHZ)
            await reader.readuntil(b"ok\n")
        later = [await connect(port) for _ in range(cap - 2)]  # fewer than the cap
        newcomer_writer.write(HEALTHZ)
        assert (await newcomer_reader.readuntil(b"ok\n")).startswith(b"HTTP/1.1 200 ")
        for _, writer in [*busy, *later, (newcomer_reader, newcomer_writer)]:
            writer.close()
