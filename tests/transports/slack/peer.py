"""The local-slack emulator as a test peer: find, start, drive, stop.

local-slack binds every interface and has no option against it, so it is
only started inside a private network namespace (nothing but loopback up);
see :func:`private_network_reason`.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import os
import socket
import struct
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

ROOT = Path(__file__).resolve().parents[3]
BINARY_ENV = "CHATBRIDGE_LOCAL_SLACK"
DEFAULT_BINARY = ROOT / ".peers/local-slack/node_modules/local-slack-linux-x64/bin/local-slack"
INSTALL_HINT = (
    "npm install --prefix .peers/local-slack --no-save local-slack-linux-x64@0.1.8; "
    "run inside: unshare -n bash -c "
    "'ip link set lo up && exec .venv/bin/python -m pytest tests/transports/slack'"
)

BOT_USER = "U0BOT"
BOT_TOKEN = "xoxb-test-bot"
APP_TOKEN = "xapp-test-app"
SIGNING_SECRET = "local-slack-signing-secret"
ALICE = "U0ALICE"
BOB = "U0BOB"
OTHER_BOT = "U0OTHERBOT"
CHANNEL = "C0GENERAL"
QUIET_CHANNEL = "C0QUIET"
DM = "D0ALICE"
IFF_UP = 0x1
SIOCGIFFLAGS = 0x8913


def binary() -> Path:
    return Path(os.environ.get(BINARY_ENV, DEFAULT_BINARY))


def interface_up(name: str) -> bool:
    """Whether interface ``name`` is up, asked of the kernel in this network namespace.

    (/sys/class/net would describe the namespace sysfs was mounted in, which
    after ``unshare -n`` is still the host's.)
    """
    request = struct.pack("16sH14x", name.encode()[:15], 0)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            answer = fcntl.ioctl(s.fileno(), SIOCGIFFLAGS, request)
        except OSError:
            return False
    flags: int = struct.unpack("16sH14x", answer)[1]
    return bool(flags & IFF_UP)


def private_network_reason() -> str | None:
    """Why this is not a private network namespace, or None if only loopback is up."""
    up = [name for _, name in socket.if_nameindex() if name != "lo" and interface_up(name)]
    if up:
        return f"network interface(s) {', '.join(up)} are up: local-slack would listen on them"
    return None


def free_port() -> int:
    """A port free on loopback now (the events endpoint must be named in local-slack's config)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def config(mode: str, request_url: str | None) -> dict[str, Any]:
    app: dict[str, Any] = {
        "appId": "A0BRIDGE",
        "botUserId": BOT_USER,
        "botName": "bridge",
        "botToken": BOT_TOKEN,
        "appToken": APP_TOKEN,
        "signingSecret": SIGNING_SECRET,
        "mode": mode,
    }
    if request_url:
        app["requestUrl"] = request_url
    members = [ALICE, BOB, OTHER_BOT, BOT_USER]
    return {
        "workspace": {"name": "Bridge Test", "domain": "bridge-test", "teamId": "T0BRIDGE"},
        "app": app,
        "users": [
            {"id": ALICE, "name": "alice", "real_name": "Alice"},
            {"id": BOB, "name": "bob", "real_name": "Bob"},
            {"id": OTHER_BOT, "name": "otherbot", "is_bot": True},
        ],
        "channels": [
            {"id": CHANNEL, "name": "general", "members": members},
            {"id": QUIET_CHANNEL, "name": "quiet", "members": members},
            {"id": DM, "name": "dm-alice", "is_im": True, "members": [ALICE, BOT_USER]},
        ],
    }


@dataclass
class LocalSlack:
    """A running local-slack and a client for its control API."""

    port: int
    http: aiohttp.ClientSession
    events_port: int | None = None
    mode: str = "socket"
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def api_url(self) -> str:
        return f"{self.base}/api/"

    async def post_message(
        self, user: str, text: str, channel: str = CHANNEL, thread_ts: str | None = None
    ) -> str:
        """Post as a person; returns once the bot acknowledged the event (or 5 s passed)."""
        body: dict[str, Any] = {"channel": channel, "user": user, "text": text}
        if thread_ts:
            body["thread_ts"] = thread_ts
        async with self.http.post(f"{self.base}/_control/message", json=body) as resp:
            data = await resp.json()
        assert data["ok"], data
        return str(data["message"]["ts"])

    async def edit_message(self, user: str, ts: str, text: str, channel: str = CHANNEL) -> None:
        """Edit as a person (Slack sends ``message_changed``); returns after the bot's ack."""
        body = {"channel": channel, "user": user, "ts": ts, "text": text}
        async with self.http.post(f"{self.base}/_control/edit-message", json=body) as resp:
            data = await resp.json()
        assert data["ok"], data

    async def delete_message(self, user: str, ts: str, channel: str = CHANNEL) -> None:
        """Delete as a person (Slack sends ``message_deleted``); returns after the bot's ack."""
        body = {"channel": channel, "user": user, "ts": ts}
        async with self.http.post(f"{self.base}/_control/delete-message", json=body) as resp:
            data = await resp.json()
        assert data["ok"], data

    async def share_file(
        self, user: str, name: str, content: bytes, text: str = "", channel: str = CHANNEL
    ) -> None:
        """Share a file as a person (a ``file_share`` message), with optional text."""
        form = aiohttp.FormData()
        form.add_field("channel", channel)
        form.add_field("user", user)
        if text:
            form.add_field("text", text)
        form.add_field("file", content, filename=name, content_type="text/plain")
        async with self.http.post(f"{self.base}/_control/upload", data=form) as resp:
            data = await resp.json()
        assert data["ok"], data

    async def click(
        self, user: str, ts: str, action: Mapping[str, Any], channel: str = CHANNEL
    ) -> None:
        """Click a button of message ``ts`` as a person (a ``block_actions`` interaction).

        Returns once the app answered (its socket ack, or its HTTP response).
        """
        body = {"channel": channel, "messageTs": ts, "user": user, "action": dict(action)}
        async with self.http.post(f"{self.base}/_control/interact", json=body) as resp:
            data = await resp.json()
        assert data["ok"], data

    async def messages(self, channel: str = CHANNEL) -> list[dict[str, Any]]:
        async with self.http.get(f"{self.base}/_control/messages/{channel}") as resp:
            data = await resp.json()
        return list(data["messages"])

    async def bot_messages(self, channel: str = CHANNEL) -> list[dict[str, Any]]:
        return [m for m in await self.messages(channel) if m.get("user") == BOT_USER]

    async def log(self) -> list[dict[str, Any]]:
        async with self.http.get(f"{self.base}/_control/log") as resp:
            data = await resp.json()
        return list(data["log"])

    async def api(self, method: str, **args: Any) -> Mapping[str, Any]:
        headers = {"Authorization": f"Bearer {BOT_TOKEN}"}
        async with self.http.post(f"{self.api_url}{method}", json=args, headers=headers) as resp:
            data: Mapping[str, Any] = await resp.json()
        return data


@contextlib.asynccontextmanager
async def run_local_slack(
    tmp: Path,
    mode: str,
    events_port: int | None = None,
    workspace: Mapping[str, Any] | None = None,
) -> AsyncIterator[LocalSlack]:
    """Start local-slack on a free loopback port; stop it (and wait for it) on exit.

    ``workspace`` replaces the configuration :func:`config` makes (apps, users, channels).
    """
    port = free_port()
    request_url = f"http://127.0.0.1:{events_port}/slack/events" if events_port else None
    cfg = tmp / "local-slack.json"
    cfg.write_text(json.dumps(workspace if workspace is not None else config(mode, request_url)))
    files = tmp / "local-slack-files"
    files.mkdir(exist_ok=True)
    proc = await asyncio.create_subprocess_exec(
        str(binary()),
        "--config",
        str(cfg),
        "--port",
        str(port),
        "--base-host",
        "127.0.0.1",
        "--files-dir",
        str(files),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    try:
        assert proc.stdout is not None
        banner: list[bytes] = []
        # Ready once it prints its banner; bounded so a broken binary fails the test.
        async with asyncio.timeout(15):
            while b"Control API" not in b"".join(banner):
                line = await proc.stdout.readline()
                if not line:
                    raise RuntimeError(f"local-slack exited: {b''.join(banner).decode()}")
                banner.append(line)
        drain = asyncio.create_task(_drain(proc.stdout))
        try:
            async with aiohttp.ClientSession() as http:
                yield LocalSlack(port=port, http=http, events_port=events_port, mode=mode)
        finally:
            drain.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await drain
    finally:
        if proc.returncode is None:
            proc.terminate()
            try:
                async with asyncio.timeout(5):
                    await proc.wait()
            except TimeoutError:
                proc.kill()
                await proc.wait()


async def _drain(stream: asyncio.StreamReader) -> None:
    """Keep reading its output so a full pipe never blocks the emulator."""
    while await stream.read(65536):
        pass


def texts(messages: Sequence[Mapping[str, Any]]) -> list[str]:
    return [str(m.get("text", "")) for m in messages]
