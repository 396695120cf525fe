"""A webhook's delivery answered in a Matrix room (``chatbridge run`` and the test Synapse).

The delivery's message is not an event of the room: the answer relates to no
event (no ``m.in_reply_to`` naming a made-up id).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import socket
from pathlib import Path

import aiohttp
import pytest

from tests.transports.matrix.matrix_helpers import Human, joined
from tests.transports.matrix.matrix_service import service
from tests.transports.matrix.seen import ECHO, answer_in
from tests.transports.matrix.synapse_peer import MatrixUser, SynapseServer

pytestmark = [pytest.mark.synapse, pytest.mark.slow]

SECRET = "a-secret-of-sixteen-plus"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


async def test_a_delivery_is_answered_with_no_relation(
    tmp_path: Path, synapse: SynapseServer, bot: MatrixUser, alice: Human
) -> None:
    room = await alice.create_room([bot.user_id])
    port = free_port()
    extra = {
        "http": {"listen": "127.0.0.1:0", "public_listen": f"127.0.0.1:{port}"},
        "webhooks": [
            {
                "room": f"matrix:{room}",
                "path": "/hooks/gh",
                "secret": SECRET,
                "prompt": "PR opened: {{ payload.pull_request.title }}",
            }
        ],
    }
    body = json.dumps({"pull_request": {"title": "Faster sync"}}).encode()
    headers = {
        "X-Hub-Signature-256": "sha256="
        + hmac.new(SECRET.encode(), body, hashlib.sha256).hexdigest(),
        "X-GitHub-Delivery": "72d3162e-cc78-11e3-81ab-4c9367dc0958",
        "X-GitHub-Event": "pull_request",
    }
    async with (
        service(
            tmp_path,
            synapse,
            bot,
            room,
            allowed=("@alice:localhost",),
            claude_env=ECHO,
            extra=extra,
        ),
        aiohttp.ClientSession() as client,
    ):
        await alice.wait_for(joined(bot.user_id, room))
        async with client.post(
            f"http://127.0.0.1:{port}/hooks/gh", data=body, headers=headers
        ) as resp:
            assert resp.status == 202
        answer = await alice.wait_for(answer_in(bot, room))
    assert "PR opened: Faster sync" in answer.content["body"]
    assert "webhook:/hooks/gh wrote:" in answer.content["body"]
    assert "m.relates_to" not in answer.content
