"""A scripted Anthropic Messages API server, so the real ``claude`` runs offline.

It answers ``POST /v1/messages`` with the streaming format (SSE events
``message_start``, ``content_block_start|delta|stop``, ``message_delta``,
``message_stop``) or plain JSON when ``stream`` is false, taking each answer
from a script of turns, and records every request so a test can look at what
claude sent (e.g. that ``--resume`` replayed the earlier conversation).

Only requests of the main agent loop (those that offer tools) consume the
script; side requests claude makes on its own (titles, summaries, checks)
get ``side_reply``. When the script is used up, ``default`` answers.

Usage::

    async with ModelServer([Turn(tools=(ToolCall("Bash", {"command": "ls"}),)),
                            Turn(text="done")]) as server:
        env = claude_env(server.url, home=tmp_path)   # for RunRequest.env
        ...
        assert server.agent_requests[1].body["messages"]
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiohttp import web

MODEL = "claude-sonnet-4-5"


@dataclass(frozen=True)
class ToolCall:
    """One ``tool_use`` block the scripted model emits."""

    name: str
    input: dict[str, Any]


@dataclass(frozen=True)
class Turn:
    """One scripted answer: optional text, then tool calls (``stop_reason`` tool_use)."""

    text: str = ""
    tools: tuple[ToolCall, ...] = ()


@dataclass
class RecordedRequest:
    """A request as the server received it."""

    method: str
    path: str
    headers: dict[str, str]
    body: Any
    """Decoded JSON, or None."""
    at: float = 0.0
    """``time.monotonic()`` when it arrived (for latency measurements)."""

    @property
    def messages(self) -> list[dict[str, Any]]:
        """The ``messages`` of a Messages API request (empty otherwise)."""
        if isinstance(self.body, dict) and isinstance(self.body.get("messages"), list):
            return list(self.body["messages"])
        return []

    def texts(self) -> list[str]:
        """Every text in the request's messages, tool results included, in order."""
        found: list[str] = []
        for message in self.messages:
            content = message.get("content")
            if isinstance(content, str):
                found.append(content)
                continue
            for block in content or []:
                if block.get("type") == "text":
                    found.append(block.get("text", ""))
                elif block.get("type") == "tool_result":
                    inner = block.get("content")
                    if isinstance(inner, str):
                        found.append(inner)
                    else:
                        found += [b.get("text", "") for b in inner or [] if b.get("type") == "text"]
        return found


class ModelServer:
    """The server; use as ``async with`` (binds 127.0.0.1 on a free port)."""

    def __init__(
        self,
        script: Sequence[Turn],
        *,
        default: Turn = Turn(text="Nothing more to do."),
        side_reply: str = "ok",
        refuse: int | None = None,
    ) -> None:
        """``refuse``: answer every Messages request with this HTTP status (401: a bad key)."""
        self._refuse = refuse
        self._script = list(script)
        self._default = default
        self._side_reply = side_reply
        self.requests: list[RecordedRequest] = []
        self._changed = asyncio.Condition()
        self._runner: web.AppRunner | None = None
        self.url = ""

    @property
    def agent_requests(self) -> list[RecordedRequest]:
        """Requests of the main agent loop (they offer tools), in order."""
        return [r for r in self.requests if _is_agent(r)]

    async def wait_agent_requests(self, count: int) -> None:
        """Return once at least ``count`` agent requests arrived."""
        async with self._changed:
            await self._changed.wait_for(lambda: len(self.agent_requests) >= count)

    async def __aenter__(self) -> ModelServer:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        # Port 0: the kernel picks a free port, read back from the bound socket.
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        host, port = self._runner.addresses[0][:2]
        self.url = f"http://{host}:{port}"
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        raw = await request.read()
        try:
            body = json.loads(raw) if raw else None
        except json.JSONDecodeError:
            body = None
        recorded = RecordedRequest(
            request.method, request.path, dict(request.headers), body, at=time.monotonic()
        )
        self.requests.append(recorded)
        async with self._changed:
            self._changed.notify_all()
        if request.method == "HEAD" or request.path in ("/", ""):
            return web.Response(status=200)
        if request.path.endswith("/messages/count_tokens"):
            return web.json_response({"input_tokens": 100})
        if request.path.endswith("/v1/messages") and request.method == "POST":
            if self._refuse is not None:
                return _api_error(self._refuse)
            if _is_agent(recorded):
                turn = self._script.pop(0) if self._script else self._default
            else:
                turn = Turn(text=self._side_reply)
            model = body.get("model", MODEL) if isinstance(body, dict) else MODEL
            if isinstance(body, dict) and body.get("stream"):
                return await self._stream(request, turn, model)
            return web.json_response(_message(turn, model))
        return web.json_response(
            {"type": "error", "error": {"type": "not_found_error", "message": "no route"}},
            status=404,
        )

    async def _stream(self, request: web.Request, turn: Turn, model: str) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        message = _message(turn, model)
        blocks = message.pop("content")
        start = dict(message, content=[], stop_reason=None)
        await _sse(response, "message_start", {"type": "message_start", "message": start})
        for index, block in enumerate(blocks):
            opening: dict[str, Any]
            if block["type"] == "text":
                opening = {"type": "text", "text": ""}
                delta = {"type": "text_delta", "text": block["text"]}
            else:
                opening = {**block, "input": {}}
                delta = {"type": "input_json_delta", "partial_json": json.dumps(block["input"])}
            await _sse(
                response,
                "content_block_start",
                {"type": "content_block_start", "index": index, "content_block": opening},
            )
            await _sse(
                response,
                "content_block_delta",
                {"type": "content_block_delta", "index": index, "delta": delta},
            )
            await _sse(
                response, "content_block_stop", {"type": "content_block_stop", "index": index}
            )
        await _sse(
            response,
            "message_delta",
            {
                "type": "message_delta",
                "delta": {"stop_reason": message["stop_reason"], "stop_sequence": None},
                "usage": {"output_tokens": 10},
            },
        )
        await _sse(response, "message_stop", {"type": "message_stop"})
        await response.write_eof()
        return response


def _is_agent(request: RecordedRequest) -> bool:
    return (
        request.path.endswith("/v1/messages")
        and isinstance(request.body, dict)
        and bool(request.body.get("tools"))
    )


def _message(turn: Turn, model: str) -> dict[str, Any]:
    content: list[dict[str, Any]] = []
    if turn.text or not turn.tools:
        content.append({"type": "text", "text": turn.text})
    for call in turn.tools:
        content.append(
            {
                "type": "tool_use",
                "id": "toolu_" + uuid.uuid4().hex[:24],
                "name": call.name,
                "input": call.input,
            }
        )
    return {
        "id": "msg_" + uuid.uuid4().hex[:24],
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": "tool_use" if turn.tools else "end_turn",
        "stop_sequence": None,
        "usage": {
            "input_tokens": 100,
            "output_tokens": 10,
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": 0,
        },
    }


_ERROR_TYPES = {
    401: ("authentication_error", "invalid x-api-key"),
    403: ("permission_error", "your API key does not have permission to use this resource"),
    429: ("rate_limit_error", "rate limited"),
    529: ("overloaded_error", "Overloaded"),
}


def _api_error(status: int) -> web.Response:
    """An error as the Messages API sends it."""
    kind, message = _ERROR_TYPES.get(status, ("api_error", "internal server error"))
    body = {"type": "error", "error": {"type": kind, "message": message}}
    return web.json_response(body, status=status)


async def _sse(response: web.StreamResponse, event: str, data: dict[str, Any]) -> None:
    await response.write(f"event: {event}\ndata: {json.dumps(data)}\n\n".encode())


def claude_env(base_url: str, home: Path) -> dict[str, str]:
    """Environment that points the real claude at ``base_url``, isolated under ``home``."""
    return {
        "ANTHROPIC_BASE_URL": base_url,
        "ANTHROPIC_API_KEY": "test",
        "HOME": str(home),
        "CLAUDE_CONFIG_DIR": str(home / ".claude"),
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        "CLAUDE_CODE_MAX_RETRIES": "0",
        "DISABLE_AUTOUPDATER": "1",
        # We run as root: bypassPermissions refuses to start without it.
        "IS_SANDBOX": "1",
    }


def claude_bin() -> Path:
    """The real claude binary bundled in the claude-agent-sdk wheel."""
    import claude_agent_sdk

    return Path(claude_agent_sdk.__file__).parent / "_bundled" / "claude"
