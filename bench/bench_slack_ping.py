"""A Slack user's ping to the bot's answer: chatbridge against a bare echo bot, one local-slack.

What a user feels: the time from posting a message to seeing the bot's
answer appear, as a Slack client sees it (local-slack's client WebSocket,
which pushes every new or changed message). Both bots are Socket Mode apps
of the same local-slack workspace, each in a channel of its own with the
user, pinged alternately, so the emulator's and the client's costs are the
same for both; chatbridge (the fake claude answering at once) differs only
by what it does itself, plus the debounce window (``coalesce_ms``).

Prints p50/p90/p99 of both, chatbridge's time above echo + window, and how
many messages chatbridge posted per run (a quick run should post one: its
answer, with no status message first). ``--breakdown``: where chatbridge's
pings spent their time, from the service's stage stamps (see ``breakdown.py``).

With ``--prestart`` chatbridge runs with ``[runner] prestart = true`` (the room's
claude started when the ping opens its batch, inside the window), as
``bench_ping.py --prestart``.

    python bench/bench_slack_ping.py [--pings 60] [--coalesce-ms 50] [--prestart] [--breakdown]

local-slack binds every interface, so the benchmark runs itself inside a
private network namespace (``unshare -n``, loopback only) when it is not in one.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

sys.path.insert(0, str(Path(__file__).parents[1]))

from breakdown import Ping, per_ping, stamps
from breakdown import report as report_breakdown
from versus import report as report_versus

from tests.config_files import merged, toml_text
from tests.service_process import base_config, run_service
from tests.transports.slack import peer

ALICE = peer.ALICE
BRIDGE_CHANNEL = "C0BRIDGE"
ECHO_CHANNEL = "C0ECHO"
ECHO_USER = "U0ECHO"
ECHO_BOT_TOKEN = "xoxb-bench-echo"  # noqa: S105 - the emulator's made-up token
ECHO_APP_TOKEN = "xapp-bench-echo"  # noqa: S105 - the emulator's made-up token


RUN_END_PAUSE_S = 0.3
"""Pause after each chatbridge ping: its run ends (claude exits, is swept) meanwhile."""


def workspace() -> dict[str, Any]:
    """Two Socket Mode apps (chatbridge and the echo bot), each with a channel of its own."""

    def app(app_id: str, user: str, name: str, bot: str, token: str) -> dict[str, Any]:
        return {
            "appId": app_id,
            "botUserId": user,
            "botName": name,
            "botToken": bot,
            "appToken": token,
            "signingSecret": f"{name}-signing-secret",
            "mode": "socket",
        }

    return {
        "workspace": {"name": "Bench", "domain": "bench", "teamId": "T0BENCH"},
        "apps": [
            app("A0BRIDGE", peer.BOT_USER, "bridge", peer.BOT_TOKEN, peer.APP_TOKEN),
            app("A0ECHO", ECHO_USER, "echo", ECHO_BOT_TOKEN, ECHO_APP_TOKEN),
        ],
        "users": [{"id": ALICE, "name": "alice", "real_name": "Alice"}],
        "channels": [
            {"id": BRIDGE_CHANNEL, "name": "bridge", "members": [ALICE, peer.BOT_USER]},
            {"id": ECHO_CHANNEL, "name": "echo", "members": [ALICE, ECHO_USER]},
        ],
    }


@dataclass
class Client:
    """The user's Slack client: local-slack's UI WebSocket, recording what it is shown."""

    ws: aiohttp.ClientWebSocketResponse
    seen: list[tuple[float, str, str, str]] = field(default_factory=list)
    """(arrival, channel, user, text) of every message posted or changed."""
    posted: set[tuple[str, str, str]] = field(default_factory=set)
    """(channel, user, ts) of every message posted (not counting changes)."""
    changed: asyncio.Event = field(default_factory=asyncio.Event)

    async def listen(self) -> None:
        async for frame in self.ws:
            now = time.monotonic()
            if frame.type is not aiohttp.WSMsgType.TEXT:
                continue
            data = json.loads(frame.data)
            if data.get("t") in ("message", "message_update"):
                message = data["message"]
                channel, user = message["channel"], message.get("user", "")
                self.seen.append((now, channel, user, message.get("text", "")))
                if data["t"] == "message":
                    self.posted.add((channel, user, message["ts"]))
                self.changed.set()

    async def post(self, channel: str, text: str) -> None:
        await self.ws.send_str(
            json.dumps({"t": "post_message", "channel": channel, "user": ALICE, "text": text})
        )

    async def first(self, channel: str, user: str, needle: str, after: int) -> float:
        while True:
            for at, where, who, text in self.seen[after:]:
                if where == channel and who == user and needle in text:
                    return at
            self.changed.clear()
            await self.changed.wait()

    def posted_by(self, user: str, channel: str) -> int:
        """Messages ``user`` posted in ``channel`` so far (edits not counted)."""
        return sum(1 for where, who, _ in self.posted if where == channel and who == user)


async def echo_bot(slack: peer.LocalSlack) -> None:
    """The baseline: a bare Socket Mode app answering each message with its own text."""
    http = slack.http

    async def call(method: str, token: str, **args: Any) -> Mapping[str, Any]:
        headers = {"Authorization": f"Bearer {token}"}
        async with http.post(f"{slack.api_url}{method}", json=args, headers=headers) as resp:
            data: Mapping[str, Any] = await resp.json()
        assert data.get("ok"), data
        return data

    opened = await call("apps.connections.open", ECHO_APP_TOKEN)
    async with http.ws_connect(str(opened["url"])) as ws:
        async for frame in ws:
            if frame.type is not aiohttp.WSMsgType.TEXT:
                continue
            envelope = json.loads(frame.data)
            if "envelope_id" not in envelope:
                continue
            await ws.send_str(json.dumps({"envelope_id": envelope["envelope_id"]}))
            event = envelope.get("payload", {}).get("event", {})
            if event.get("type") == "message" and event.get("user") == ALICE:
                await call(
                    "chat.postMessage", ECHO_BOT_TOKEN, channel=event["channel"], text=event["text"]
                )


def service_config(tmp: Path, slack: peer.LocalSlack) -> Path:
    room = {"transport": "slack", "id": BRIDGE_CHANNEL, "allowed_users": [ALICE]}
    table = {"mode": "socket", "api_url": slack.api_url}
    config = tmp / "chatbridge.toml"
    config.write_text(toml_text(merged(base_config(tmp), {"slack": table, "rooms": [room]})))
    return config


async def ping(
    client: Client,
    channel: str,
    bot: str,
    *,
    limit_s: float = 30,
    marks: list[Ping] | None = None,
) -> float:
    nonce = f"ping {uuid.uuid4().hex[:12]}"
    after = len(client.seen)
    start = time.monotonic()
    await client.post(channel, nonce)
    async with asyncio.timeout(limit_s):
        answered = await client.first(channel, bot, nonce, after)
    if marks is not None:
        marks.append(Ping(start, answered))
    return (answered - start) * 1000


async def measure(
    tmp: Path, pings: int, coalesce_ms: int, breakdown: bool, prestart: bool = False
) -> tuple[dict[str, list[float]], float, list[dict[str, float]]]:
    """Ping each bot ``pings`` times, alternating; also chatbridge's messages per run,
    and with ``breakdown`` each ping's stage stamps."""
    fake_times = tmp / "fake-claude-times.jsonl"
    async with peer.run_local_slack(tmp, "socket", workspace=workspace()) as slack:
        secrets = {
            "CHATBRIDGE_SLACK__BOT_TOKEN": peer.BOT_TOKEN,
            "CHATBRIDGE_SLACK__APP_TOKEN": peer.APP_TOKEN,
        }
        env = {
            **secrets,
            "FAKE_CLAUDE_ECHO": "1",
            "FAKE_CLAUDE_NO_TOOL": "1",
            # The environment overrides the file (as in production).
            "CHATBRIDGE_DISPATCHER__COALESCE_MS": str(coalesce_ms),
            "CHATBRIDGE_RUNNER__PRESTART": "true" if prestart else "false",
        }
        if breakdown:
            env |= {"CHATBRIDGE_LOGGING__LEVEL": "DEBUG", "FAKE_CLAUDE_TIMES": str(fake_times)}
        work = tmp / "bridge"
        work.mkdir()
        config = service_config(work, slack)
        async with (
            run_service(config, env, secrets=tuple(secrets.values())) as running,
            slack.http.ws_connect(f"ws://127.0.0.1:{slack.port}/ui") as ws,
        ):
            client = Client(ws)
            async with asyncio.TaskGroup() as tasks:
                listening = tasks.create_task(client.listen())
                echoing = tasks.create_task(echo_bot(slack))
                # Both apps connect on their own: wait until each answers once.
                await ping(client, BRIDGE_CHANNEL, peer.BOT_USER, limit_s=60)
                await ping(client, ECHO_CHANNEL, ECHO_USER, limit_s=60)
                before = client.posted_by(peer.BOT_USER, BRIDGE_CHANNEL)
                timings: dict[str, list[float]] = {"echo": [], "chatbridge": []}
                marks: list[Ping] = []
                for _ in range(pings):
                    timings["echo"].append(await ping(client, ECHO_CHANNEL, ECHO_USER))
                    # The same pause before every ping (as bench_ping.py): the peer is
                    # as idle for either bot.
                    await asyncio.sleep(RUN_END_PAUSE_S)
                    timings["chatbridge"].append(
                        await ping(client, BRIDGE_CHANNEL, peer.BOT_USER, marks=marks)
                    )
                    # The answer comes on claude's result line, before the run has ended:
                    # a ping sent while it ends would join the room's follow-up batch,
                    # which starts at the run's end without a window. Let it end first.
                    await asyncio.sleep(RUN_END_PAUSE_S)
                # A run's status message, if any, comes before its answer: all counted.
                posted = client.posted_by(peer.BOT_USER, BRIDGE_CHANNEL) - before
                listening.cancel()
                echoing.cancel()
        rows = per_ping(marks, stamps(running.log, fake_times)) if breakdown else []
    return timings, posted / pings, rows


def report(timings: dict[str, list[float]], per_run: float, coalesce_ms: int) -> None:
    report_versus("Slack Socket Mode ping → answer seen by the user", timings, coalesce_ms)
    print(f"chatbridge messages posted per run: {per_run:.2f} (1 = the answer alone)")


def in_private_network() -> None:
    """Run this script again inside a private network namespace unless already in one."""
    if peer.private_network_reason() is None:
        return
    script = 'ip link set lo up && exec "$0" "$@"'
    argv = ["unshare", "-n", "bash", "-c", script, sys.executable, *sys.argv]
    os.execvp("unshare", argv)  # noqa: S606 - a fixed command; the arguments are our own


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pings", type=int, default=60)
    parser.add_argument("--coalesce-ms", type=int, default=50)
    parser.add_argument(
        "--breakdown", action="store_true", help="log stage stamps and print where the time goes"
    )
    parser.add_argument(
        "--prestart", action="store_true", help="start claude inside the window ([runner] prestart)"
    )
    args = parser.parse_args()
    if not peer.binary().is_file():
        raise SystemExit(f"local-slack is not installed: {peer.INSTALL_HINT}")
    in_private_network()
    with tempfile.TemporaryDirectory(prefix="bench-slack-ping-") as tmp:
        timings, per_run, rows = asyncio.run(
            measure(Path(tmp), args.pings, args.coalesce_ms, args.breakdown, args.prestart)
        )
    report(timings, per_run, args.coalesce_ms)
    if args.breakdown:
        report_breakdown(rows)


if __name__ == "__main__":
    main()
