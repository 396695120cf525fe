"""A scriptable stand-in for Slack's side of Socket Mode and the Web API.

Only for what local-slack cannot show: ``disconnect`` envelopes, dropped
sockets, redelivered envelopes, ``429`` answers, a post whose answer is
lost, message metadata (local-slack drops ``metadata`` from posted
messages) and an assistant thread's status line. Frames and answers follow Slack's documented
payloads.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from aiohttp import WSMsgType, web
from aiohttp.test_utils import TestServer

BOT_USER = "U0FAKEBOT"
CHANNEL = "C0FAKE"
MAX_TEXT = 40_000
"""Slack refuses a longer message text (``msg_too_long``)."""


def message_envelope(
    envelope_id: str, ts: str, text: str, user: str = "U0ALICE", retry_attempt: int = 0
) -> dict[str, Any]:
    """An ``events_api`` envelope carrying a channel message, as Slack sends it."""
    return {
        "envelope_id": envelope_id,
        "type": "events_api",
        "accepts_response_payload": False,
        "retry_attempt": retry_attempt,
        "retry_reason": "timeout" if retry_attempt else "",
        "payload": {
            "token": "t",
            "team_id": "T0FAKE",
            "api_app_id": "A0FAKE",
            "type": "event_callback",
            "event_id": f"Ev{envelope_id}",
            "event_time": 1,
            "event": {
                "type": "message",
                "channel": CHANNEL,
                "channel_type": "channel",
                "user": user,
                "text": text,
                "ts": ts,
                "event_ts": ts,
            },
        },
    }


HELLO = {"type": "hello", "num_connections": 1, "connection_info": {"app_id": "A0FAKE"}}


def disconnect(reason: str) -> dict[str, Any]:
    return {"type": "disconnect", "reason": reason, "debug_info": {"host": "fake"}}


@dataclass
class FakeSlack:
    """Web API + Socket Mode endpoint; the test drives each WebSocket it accepts."""

    server: TestServer
    sockets: asyncio.Queue[web.WebSocketResponse] = field(default_factory=asyncio.Queue)
    acks: asyncio.Queue[str] = field(default_factory=asyncio.Queue)
    calls: list[str] = field(default_factory=list)
    statuses: list[dict[str, Any]] = field(default_factory=list)
    """The arguments of each ``assistant.threads.setStatus`` call, in order (local-slack
    has no assistant threads)."""
    rate_limited: dict[str, list[int]] = field(default_factory=dict)
    """Method -> Retry-After values to answer with 429 before answering normally."""
    errors: dict[str, list[str]] = field(default_factory=dict)
    """Method -> Slack error codes to answer with (``ok: false``) before answering normally."""
    lost_answers: int = 0
    """How many ``chat.postMessage`` calls to carry out but answer with HTTP 500."""
    stall_post: int | None = None
    """Index (in ``posted``) of a ``chat.postMessage`` to carry out but never answer."""
    stalled: asyncio.Event = field(default_factory=asyncio.Event)
    """Set once the post ``stall_post`` was carried out and its answer is held back."""
    posted: list[dict[str, Any]] = field(default_factory=list)
    """Messages the bot posted, oldest first, as Slack stores them (with metadata)."""
    history: list[dict[str, Any]] = field(default_factory=list)
    """People's messages in the channel, oldest first (``conversations.history`` lists
    them, newest first, with the bot's own posts)."""
    history_spacing_s: float = 0.0
    """``conversations.*`` answers one call per this many seconds, a 429 with that
    Retry-After in between (Slack's limit for some apps is one a minute)."""
    history_answered_at: float | None = None
    display_names: dict[str, str] = field(default_factory=dict)
    """User id -> display name that ``users.info`` answers with."""
    users_info_hangs: bool = False
    """``users.info`` never answers (a Slack that is slow for that method)."""

    @property
    def api_url(self) -> str:
        return str(self.server.make_url("/api/"))

    def calls_to(self, method: str) -> int:
        return self.calls.count(method)


FAKE = web.AppKey("fake", FakeSlack)


async def _args(request: web.Request) -> dict[str, Any]:
    """A call's arguments, from the query string and a JSON or form body."""
    args: dict[str, Any] = dict(request.query)
    if request.content_type == "application/json":
        args.update(await request.json())
    elif request.can_read_body:
        args.update(await request.post())
    return args


async def _api(request: web.Request) -> web.StreamResponse:
    fake: FakeSlack = request.app[FAKE]
    method = request.match_info["method"]
    fake.calls.append(method)
    pending = fake.rate_limited.get(method)
    if pending:
        retry_after = pending.pop(0)
        return web.json_response(
            {"ok": False, "error": "ratelimited"},
            status=429,
            headers={"Retry-After": str(retry_after)},
        )
    if fake.history_spacing_s and method.startswith("conversations."):
        now = asyncio.get_running_loop().time()
        last = fake.history_answered_at
        if last is not None and now - last < fake.history_spacing_s:
            return web.json_response(
                {"ok": False, "error": "ratelimited"},
                status=429,
                headers={"Retry-After": str(fake.history_spacing_s)},
            )
        fake.history_answered_at = now
    failures = fake.errors.get(method)
    if failures:
        return web.json_response({"ok": False, "error": failures.pop(0)})
    if method == "assistant.threads.setStatus":
        fake.statuses.append(await _args(request))
        return web.json_response({"ok": True})
    if method == "auth.test":
        return web.json_response(
            {"ok": True, "user_id": BOT_USER, "bot_id": "B0FAKE", "team_id": "T0FAKE"}
        )
    if method == "apps.connections.open":
        return web.json_response({"ok": True, "url": str(fake.server.make_url("/socket"))})
    texts = ("chat.postMessage", "chat.update")
    if method in texts and len(str((await _args(request)).get("text", ""))) > MAX_TEXT:
        return web.json_response({"ok": False, "error": "msg_too_long"})
    if method == "chat.postMessage":
        args = await _args(request)
        message = {"type": "message", "user": BOT_USER, "bot_id": "B0FAKE"}
        message.update(ts=f"{len(fake.calls)}.000100", text=args.get("text", ""))
        for name in ("thread_ts", "metadata"):
            if name in args:
                message[name] = args[name]
        fake.posted.append(message)
        if fake.stall_post == len(fake.posted) - 1:
            fake.stalled.set()
            await asyncio.Event().wait()  # until the client gives up or the server closes
        if fake.lost_answers:
            fake.lost_answers -= 1
            return web.json_response({"ok": False, "error": "internal_error"}, status=500)
        return web.json_response({"ok": True, "channel": CHANNEL, "ts": message["ts"]})
    if method in ("conversations.history", "conversations.replies"):
        args = await _args(request)
        if method == "conversations.history":
            timeline = sorted([*fake.posted, *fake.history], key=lambda m: float(m["ts"]))
            found = [m for m in reversed(timeline) if m.get("thread_ts", m["ts"]) == m["ts"]]
        else:
            found = [
                m for m in [*fake.history, *fake.posted] if m.get("thread_ts") == args.get("ts")
            ]
        if not args.get("include_all_metadata"):
            found = [{k: v for k, v in m.items() if k != "metadata"} for m in found]
        return web.json_response({"ok": True, "messages": found, "has_more": False})
    if method == "users.info":
        if fake.users_info_hangs:
            await asyncio.Event().wait()  # until the client gives up or the server closes
        args = await _args(request)
        display = fake.display_names.get(str(args.get("user")))
        if display is None:
            return web.json_response({"ok": False, "error": "user_not_found"})
        user = {"id": args["user"], "name": display.lower(), "profile": {"display_name": display}}
        return web.json_response({"ok": True, "user": user})
    return web.json_response({"ok": True})


async def _socket(request: web.Request) -> web.StreamResponse:
    fake: FakeSlack = request.app[FAKE]
    ws = web.WebSocketResponse()
    await ws.prepare(request)
    await fake.sockets.put(ws)
    async for frame in ws:
        if frame.type is WSMsgType.TEXT:
            data = json.loads(frame.data)
            if "envelope_id" in data:
                await fake.acks.put(data["envelope_id"])
    return ws


@asynccontextmanager
async def fake_slack() -> AsyncIterator[FakeSlack]:
    app = web.Application()
    app.router.add_route("*", "/api/{method}", _api)  # slack_sdk GETs some (users.info)
    app.router.add_get("/socket", _socket)
    server = TestServer(app, host="127.0.0.1", port=0)
    fake = FakeSlack(server)
    app[FAKE] = fake
    async with server:
        yield fake
