"""The web console over real HTTP and a real SQLite store (docs/web.md): who gets in,
what forms need, and what the pages show. The whole path with a running chatbridge
and a browser is in test_console_browser.py."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from multidict import CIMultiDict

from bridge.core.hostport import HostPort
from bridge.core.model import (
    Batch,
    ExternalMessageId,
    InboundMessage,
    Message,
    RoomId,
    RoomKey,
    RunId,
    RunReport,
    RunStatus,
    TransportName,
    UserId,
)
from bridge.core.transport import ApprovalChoice
from bridge.host.http import serve_http
from bridge.host.http_sockets import bind_http
from bridge.store.base import Approval, ApprovalAsk, AuditAction, AuditEntry, RunEnding
from bridge.store.sql import SqlStore
from bridge.web.app import web_app
from bridge.web.auth import SESSION_COOKIE
from bridge.web.settings import WebSettings
from bridge.web.tokens import Signer, load_secret

ROOM = RoomKey(TransportName("slack"), RoomId("C1"))
SECRET_TEXT = "the deploy key is in vault/prod"


@dataclass
class Answers:
    """Records what the console asked to answer (the desk's own path is tested with a
    running chatbridge in test_console_browser.py)."""

    calls: list[tuple[tuple[str, ...], int, ApprovalChoice, str]] = field(default_factory=list)

    def shown(self, approval: Approval) -> str:
        return f"{approval.tool_name}\n{approval.input_json}"

    async def answer(
        self, chat_ids: tuple[str, ...], approval_id: int, choice: ApprovalChoice, reason: str
    ) -> str:
        self.calls.append((chat_ids, approval_id, choice, reason))
        return f"answered {choice.value}"


@dataclass
class Client:
    """A browser-like client of the console on the real listener (cookies kept)."""

    session: aiohttp.ClientSession
    base: str

    async def get(self, path: str, **kwargs: Any) -> aiohttp.ClientResponse:
        return await self.session.get(self.base + path, **kwargs)

    async def post(self, path: str, **kwargs: Any) -> aiohttp.ClientResponse:
        return await self.session.post(self.base + path, **kwargs)


@dataclass
class Console:
    client: Client
    store: SqlStore
    signer: Signer
    answers: Answers

    def bearer(self, identity: str = "alice", ttl: float = 600) -> dict[str, str]:
        token = self.signer.mint("login", identity, time.time() + ttl)
        return {"Authorization": f"Bearer {token}"}


async def _seed(store: SqlStore) -> tuple[RunId, int]:
    now = time.time()
    msgs: list[Message] = []
    for i, text in enumerate((SECRET_TEXT, "100% sure? check_it")):
        msg = await store.accept(
            InboundMessage(ROOM, UserId("U0ALICE"), text, ExternalMessageId(f"m{i}")), now
        )
        assert msg is not None
        msgs.append(msg)
    run = RunId("run-web-1")
    await store.start_run(run, Batch(ROOM, (msgs[0],)), now)
    await store.finish_run(
        RunEnding(
            run, RunReport(RunStatus.SUCCEEDED, cost_usd=1.25, result_text="done: rotated"), now + 2
        )
    )
    live = RunId("run-web-2")
    await store.start_run(live, Batch(ROOM, (msgs[1],)), now + 3)
    approval = await store.add_approval(
        ApprovalAsk(
            ROOM,
            live,
            "req-1",
            tool_name="Bash",
            input_json='{"command": "rm -rf build"}',
            asked_at=now + 4,
            expires_at=now + 900,
        )
    )
    return live, approval.id


@pytest.fixture
async def console(tmp_path: Path, request: pytest.FixtureRequest) -> AsyncIterator[Console]:
    proxies = getattr(request, "param", ("127.0.0.1", "::1"))
    store = await SqlStore.open(f"sqlite+aiosqlite:///{tmp_path / 'bridge.db'}")
    await _seed(store)
    settings = WebSettings(
        enabled=True,
        identities={"alice": ("U0ALICE",), "bob": ("U0BOB",)},
        identity_header="X-Forwarded-Email",
        trusted_proxies=proxies,
        poll_s=0.05,
    )
    signer = Signer(load_secret(tmp_path / "state" / "web-secret"))
    answers = Answers()

    async def cluster_text() -> str:
        return "replicas: none"

    sub = web_app(
        settings,
        signer,
        store.engine,
        answers,
        activity=lambda run_id: "running Bash: make test",
        cluster_text=cluster_text,
        budgets=lambda: (5.0, {"slack:C1": 2.0}),
    )
    sockets = bind_http(HostPort("127.0.0.1", 0), None)
    port = sockets.private_port

    async def ready() -> None:
        return None

    server = asyncio.create_task(
        serve_http(sockets, ready, lambda: b"", mounts={"/web": sub}), name="listener"
    )
    session = aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True))
    try:
        yield Console(Client(session, f"http://127.0.0.1:{port}"), store, signer, answers)
    finally:
        await session.close()
        server.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await server
        await store.close()


PAGES = [
    "/web/",
    "/web/approvals",
    "/web/runs",
    "/web/runs/run-web-1",
    "/web/spend",
    "/web/audit",
    "/web/cluster",
    "/web/events",
]


@pytest.mark.parametrize("path", PAGES)
async def test_nothing_is_readable_without_signing_in(console: Console, path: str) -> None:
    response = await console.client.get(path)
    body = await response.text()
    assert response.status == 401
    assert SECRET_TEXT not in body
    assert "run-web" not in body


async def test_forged_expired_and_unknown_tokens_are_refused(console: Console) -> None:
    good = console.bearer()["Authorization"]
    tampered = good[:-2] + ("AA" if not good.endswith("AA") else "BB")
    expired = console.bearer(ttl=-1)["Authorization"]
    stranger = console.bearer("mallory")["Authorization"]
    other_key = Signer(b"k" * 32).mint("login", "alice", time.time() + 600)
    for header in (tampered, expired, stranger, f"Bearer {other_key}"):
        response = await console.client.get("/web/runs", headers={"Authorization": header})
        assert response.status == 401, header
    ok = await console.client.get("/web/runs", headers={"Authorization": good})
    assert ok.status == 200
    assert SECRET_TEXT in await ok.text()


async def test_a_sign_in_link_becomes_a_session_cookie(console: Console) -> None:
    token = console.signer.mint("login", "alice", time.time() + 600)
    response = await console.client.get(f"/web/login?token={token}", allow_redirects=False)
    assert response.status == 303
    assert response.headers["Location"] == "/web/"
    assert response.headers["Referrer-Policy"] == "no-referrer"
    cookie = response.cookies[SESSION_COOKIE]
    assert cookie["httponly"]
    assert cookie["samesite"] == "Strict"
    page = await console.client.get("/web/")
    assert page.status == 200
    assert "alice" in await page.text()
    bad = await console.client.get("/web/login?token=nonsense", allow_redirects=False)
    assert bad.status == 401


async def test_a_proxys_identity_header_counts_from_a_trusted_proxy(console: Console) -> None:
    # The test client connects from 127.0.0.1, a trusted proxy by default.
    trusted = await console.client.get("/web/runs", headers={"X-Forwarded-Email": "bob"})
    assert trusted.status == 200
    unknown = await console.client.get("/web/runs", headers={"X-Forwarded-Email": "eve"})
    assert unknown.status == 401


@pytest.mark.parametrize("console", [("10.0.0.0/8",)], indirect=True)
async def test_a_proxys_identity_header_is_ignored_from_anyone_else(console: Console) -> None:
    response = await console.client.get("/web/runs", headers={"X-Forwarded-Email": "bob"})
    assert response.status == 401
    assert SECRET_TEXT not in await response.text()


async def _signed_in(console: Console) -> str:
    """Sign in as alice through a link; the CSRF token of her session's forms."""
    token = console.signer.mint("login", "alice", time.time() + 600)
    await console.client.get(f"/web/login?token={token}", allow_redirects=False)
    page = await (await console.client.get("/web/approvals")).text()
    marker = 'name="csrf" value="'
    start = page.index(marker) + len(marker)
    return page[start : page.index('"', start)]


def _digest_of(page: str) -> str:
    marker = 'name="digest" value="'
    start = page.index(marker) + len(marker)
    return page[start : page.index('"', start)]


async def test_an_answer_from_a_browser_needs_its_sessions_csrf_token(console: Console) -> None:
    csrf = await _signed_in(console)
    page = await (await console.client.get("/web/approvals")).text()
    assert "rm -rf build" in page
    approval_id = page.split('id="request-')[1].split('"')[0]
    form = {"choice": "allow", "digest": _digest_of(page)}
    forged = await console.client.post(f"/web/approvals/{approval_id}", data=form)
    assert forged.status == 403
    wrong = await console.client.post(
        f"/web/approvals/{approval_id}", data={**form, "csrf": csrf[:-1] + "x"}
    )
    assert wrong.status == 403
    cross_site = await console.client.post(
        f"/web/approvals/{approval_id}",
        data={**form, "csrf": csrf},
        headers={"Origin": "https://evil.example"},
    )
    assert cross_site.status == 403
    assert console.answers.calls == []
    ok = await console.client.post(f"/web/approvals/{approval_id}", data={**form, "csrf": csrf})
    assert ok.status == 200
    assert "answered allow" in await ok.text()
    assert console.answers.calls == [(("U0ALICE",), int(approval_id), ApprovalChoice.ALLOW, "")]


async def test_an_answer_to_a_request_other_than_the_one_shown_is_not_taken(
    console: Console,
) -> None:
    csrf = await _signed_in(console)
    page = await (await console.client.get("/web/approvals")).text()
    approval_id = page.split('id="request-')[1].split('"')[0]
    response = await console.client.post(
        f"/web/approvals/{approval_id}",
        data={"choice": "allow", "csrf": csrf, "digest": "0" * 64},
    )
    assert "not the one you saw" in await response.text()
    assert console.answers.calls == []


async def test_a_bearer_token_needs_no_csrf_token(console: Console) -> None:
    page = await (await console.client.get("/web/approvals", headers=console.bearer())).text()
    approval_id = page.split('id="request-')[1].split('"')[0]
    response = await console.client.post(
        f"/web/approvals/{approval_id}",
        data={"choice": "deny", "reason": "not now", "digest": _digest_of(page)},
        headers=console.bearer(),
    )
    assert response.status == 200
    assert console.answers.calls == [
        (("U0ALICE",), int(approval_id), ApprovalChoice.DENY, "not now")
    ]


async def test_runs_are_found_by_their_prompt_with_wildcards_taken_literally(
    console: Console,
) -> None:
    found = await (
        await console.client.get("/web/runs?q=vault/prod", headers=console.bearer())
    ).text()
    assert "run-web-1" in found
    assert "run-web-2" not in found
    literal = await (
        await console.client.get("/web/runs?q=100%25", headers=console.bearer())
    ).text()
    assert "run-web-2" in literal
    assert "run-web-1" not in literal
    # "_" is a LIKE wildcard: "check_it" must not match "checkXit" and vice versa.
    none = await (
        await console.client.get("/web/runs?q=check%25it", headers=console.bearer())
    ).text()
    assert "run-web" not in none
    failed = await (
        await console.client.get("/web/runs?status=failed", headers=console.bearer())
    ).text()
    assert "run-web" not in failed


async def test_a_run_shows_its_messages_answer_cost_and_audit(console: Console) -> None:
    page = await (await console.client.get("/web/runs/run-web-1", headers=console.bearer())).text()
    assert SECRET_TEXT in page
    assert "$1.25" in page
    assert "run_finished" in page
    missing = await console.client.get("/web/runs/nope", headers=console.bearer())
    assert missing.status == 404


async def test_now_shows_the_running_run_its_activity_and_its_open_request(
    console: Console,
) -> None:
    page = await (await console.client.get("/web/", headers=console.bearer())).text()
    assert "run-web-2" in page
    assert "running Bash: make test" in page
    assert "#1 Bash" in page
    assert "run-web-1" not in page  # it ended


async def test_spend_adds_up_per_day_against_the_budgets(console: Console) -> None:
    page = await (await console.client.get("/web/spend?days=3", headers=console.bearer())).text()
    assert "slack:C1" in page
    assert "$1.25" in page
    assert "$2.00" in page
    assert "$5.00" in page


async def test_audit_filters_by_action(console: Console) -> None:
    page = await (
        await console.client.get("/web/audit?action=approval_asked", headers=console.bearer())
    ).text()
    assert "approval_asked" in page
    assert "run_finished</td>" not in page


async def test_live_pages_hear_of_a_change_in_the_database(console: Console) -> None:
    response = await console.client.get("/web/events", headers=console.bearer())
    assert response.headers["Content-Type"] == "text/event-stream"

    async def changed() -> None:
        async for line in response.content:
            if line.startswith(b"event: changed"):
                return

    waiting = asyncio.create_task(changed())
    # The watcher polls every 50 ms: a change made once it watches is seen.
    await asyncio.sleep(0)
    await console.store.audit(
        AuditEntry(AuditAction.COMMAND, time.time(), room=ROOM, detail="!status")
    )
    async with asyncio.timeout(10):
        while not waiting.done():
            await console.store.audit(AuditEntry(AuditAction.COMMAND, time.time(), room=ROOM))
            await asyncio.wait({waiting}, timeout=0.2)
    await waiting
    response.close()


async def test_every_page_forbids_framing_and_scripts_from_elsewhere(console: Console) -> None:
    response = await console.client.get("/web/", headers=console.bearer())
    assert "frame-ancestors 'none'" in response.headers["Content-Security-Policy"]
    assert response.headers["X-Content-Type-Options"] == "nosniff"


async def test_a_repeated_identity_header_names_nobody(console: Console) -> None:
    # A proxy that adds its header after the client's would leave the client's first:
    # picking either is a guess, so two are refused (as a webhook's repeated signature).
    headers = CIMultiDict([("X-Forwarded-Email", "bob"), ("X-Forwarded-Email", "alice")])
    response = await console.client.get("/web/runs", headers=headers)
    assert response.status == 401
    assert SECRET_TEXT not in await response.text()


async def test_an_answer_through_a_tls_proxy_passes_the_origin_check(console: Console) -> None:
    # Behind TLS the browser's Origin is https://…, while the proxy talks plain HTTP to us.
    proxy = {"X-Forwarded-Email": "alice", "X-Forwarded-Proto": "https"}
    page = await (await console.client.get("/web/approvals", headers=proxy)).text()
    marker = 'name="csrf" value="'
    start = page.index(marker) + len(marker)
    csrf = page[start : page.index('"', start)]
    approval_id = page.split('id="request-')[1].split('"')[0]
    host = console.client.base.removeprefix("http://")
    form = {"choice": "allow", "digest": _digest_of(page), "csrf": csrf}
    elsewhere = await console.client.post(
        f"/web/approvals/{approval_id}",
        data=form,
        headers={**proxy, "Origin": "https://evil.example"},
    )
    assert elsewhere.status == 403
    response = await console.client.post(
        f"/web/approvals/{approval_id}", data=form, headers={**proxy, "Origin": f"https://{host}"}
    )
    assert response.status == 200
    assert console.answers.calls == [(("U0ALICE",), int(approval_id), ApprovalChoice.ALLOW, "")]


async def test_a_session_never_outlives_the_sign_in_link_that_made_it(console: Console) -> None:
    # `chatbridge web-token --hours 0.1` for someone briefly: their browser's session
    # ends when the link would have, not token_ttl_s (8 h) after they opened it.
    expires = time.time() + 360
    token = console.signer.mint("login", "alice", expires)
    response = await console.client.get(f"/web/login?token={token}", allow_redirects=False)
    assert response.status == 303
    cookie = response.cookies[SESSION_COOKIE]
    assert int(cookie["max-age"]) <= 360
    session_expiry = int(cookie.value.split(".")[2])
    assert session_expiry <= int(expires)


async def test_live_pages_closed_by_their_browsers_free_their_places(console: Console) -> None:
    # A browser that navigates away closes its stream; its place must be free again soon,
    # or a few people clicking through fill the cap and every page opened next is
    # refused (EventSource does not try again after a 503). It took 15 s.
    opened = [await console.client.get("/web/events", headers=console.bearer()) for _ in range(16)]
    assert [r.status for r in opened] == [200] * 16
    refused = await console.client.get("/web/events", headers=console.bearer())
    assert refused.status == 503
    for response in opened:
        response.close()
    async with asyncio.timeout(10):
        while True:
            again = await console.client.get("/web/events", headers=console.bearer())
            again.close()
            if again.status == 200:
                break
            await asyncio.sleep(0.1)
