"""A webhook's delivery answered in a Slack channel (the real service and local-slack).

The delivery's message is not in the chat: its answer is posted at the
channel's top level, never as a reply in a thread of an id Slack does not know.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from pathlib import Path

import aiohttp
import pytest

from tests.transports.slack import peer
from tests.transports.slack.service import bridged

pytestmark = [pytest.mark.slack, pytest.mark.slow]

SECRET = "a-secret-of-sixteen-plus"


async def test_a_delivery_is_answered_at_the_top_of_the_channel(tmp_path: Path) -> None:
    port = peer.free_port()
    extra = {
        "http": {"listen": "127.0.0.1:0", "public_listen": f"127.0.0.1:{port}"},
        "webhooks": [
            {
                "room": f"slack:{peer.CHANNEL}",
                "path": "/hooks/ci",
                "secret": SECRET,
                "signature": "generic",
                "prompt": "CI says {{ payload.status }}",
            }
        ],
    }
    body = json.dumps({"status": "green"}).encode()
    signature = "sha256=" + hmac.new(SECRET.encode(), body, hashlib.sha256).hexdigest()
    headers = {"X-Chatbridge-Signature": signature, "X-Chatbridge-Delivery": "ci-1"}
    async with (
        bridged(tmp_path, "socket", {"FAKE_CLAUDE_ECHO": "1"}, extra=extra) as b,
        aiohttp.ClientSession() as client,
    ):
        url = f"http://127.0.0.1:{port}/hooks/ci"
        async with client.post(url, data=body, headers=headers) as resp:
            assert resp.status == 202

        async def answered() -> bool:
            return any("CI says green" in m.get("text", "") for m in await b.results())

        await b.wait_until(answered, "the delivery's answer")
        answers = [m for m in await b.results() if "CI says green" in m.get("text", "")]
        assert len(answers) == 1
        assert "thread_ts" not in answers[0] or answers[0]["thread_ts"] == answers[0]["ts"]
        assert not [line for line in b.log if "could not" in line or "Traceback" in line]
