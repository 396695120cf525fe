"""Approval requests with buttons, and their clicks, against local-slack in both modes.

local-slack stores a message's blocks and delivers a click
(``/_control/interact``) as Slack does: a ``block_actions`` interaction in a
Socket Mode envelope, or a signed form POST (``payload=...``) to the events endpoint.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from slack_sdk.signature import SignatureVerifier

from bridge.core.model import ExternalMessageId, Reply, RoomId, RoomKey, TransportName, UserId
from bridge.core.transport import ApprovalAction, ApprovalChoice
from tests.transports.slack import peer
from tests.transports.slack.harness import Running, running

pytestmark = pytest.mark.slack

ROOM = RoomKey(TransportName("slack"), RoomId(peer.CHANNEL))
TEXT = "Claude wants to run **Bash**: `rm -rf build` <!channel> & @here"


def button(message: dict[str, Any], choice: ApprovalChoice) -> dict[str, Any]:
    """The button of ``choice`` as the message carries it."""
    [actions] = [b for b in message["blocks"] if b["type"] == "actions"]
    [found] = [e for e in actions["elements"] if e["action_id"].endswith("_" + choice.value)]
    return {**found, "block_id": actions.get("block_id")}


async def posted(env: Running, ts: str) -> dict[str, Any]:
    [message] = [m for m in await env.slack.messages() if m["ts"] == ts]
    return message


async def test_a_request_has_safe_text_and_three_buttons_carrying_its_ref(env: Running) -> None:
    ts = await env.transport.outbound.post_approval(Reply(ROOM, TEXT), "#3")
    assert ts is not None
    message = await posted(env, ts)
    section, actions = message["blocks"]
    assert section["text"]["type"] == "mrkdwn"
    assert section["text"]["verbatim"] is True
    shown = section["text"]["text"]
    assert shown == message["text"]
    assert "<!channel>" not in shown
    assert "&lt;!channel&gt; &amp; @here" in shown
    assert "*Bash*" in shown
    assert [(e["action_id"], e["text"]["text"], e["value"]) for e in actions["elements"]] == [
        ("chatbridge_approval_allow", "Allow once", "#3"),
        ("chatbridge_approval_allow_session", "Allow for this session", "#3"),
        ("chatbridge_approval_deny", "Deny", "#3"),
    ]


async def test_a_click_reaches_the_sink_as_an_approval_action(env: Running) -> None:
    ts = await env.transport.outbound.post_approval(Reply(ROOM, TEXT), "#3")
    assert ts is not None
    message = await posted(env, ts)
    await env.slack.click(peer.ALICE, ts, button(message, ApprovalChoice.ALLOW_SESSION))
    await env.slack.click(peer.BOB, ts, button(message, ApprovalChoice.DENY))
    received = await env.sink.wait_for(2)
    assert received == [
        ApprovalAction(
            ROOM, UserId(peer.ALICE), ExternalMessageId(ts), ApprovalChoice.ALLOW_SESSION
        ),
        ApprovalAction(ROOM, UserId(peer.BOB), ExternalMessageId(ts), ApprovalChoice.DENY),
    ]
    # Acknowledged (events mode: local-slack logs the HTTP status of each answer).
    answers = [e for e in await env.slack.log() if e["kind"] == "interactive"]
    assert all(e["summary"] == "HTTP 200" for e in answers if e["direction"] == "from_bot")


async def test_clicks_of_the_bot_other_buttons_and_other_rooms_are_not_handed_over(
    env: Running,
) -> None:
    ts = await env.transport.outbound.post_approval(Reply(ROOM, TEXT), "#4")
    assert ts is not None
    message = await posted(env, ts)
    allow = button(message, ApprovalChoice.ALLOW)
    await env.slack.click(peer.BOT_USER, ts, allow)
    await env.slack.click(peer.ALICE, ts, {**allow, "action_id": "someone_elses_button"})
    await env.slack.click(peer.ALICE, ts, {**allow, "action_id": "chatbridge_approval_maybe"})
    quiet = await env.slack.post_message(peer.ALICE, "elsewhere", channel=peer.QUIET_CHANNEL)
    await env.slack.click(peer.ALICE, quiet, allow, channel=peer.QUIET_CHANNEL)
    # A click that counts, last: once it arrived, the ones before were dropped.
    await env.slack.click(peer.ALICE, ts, allow)
    received = await env.sink.wait_for(1)
    assert received == [
        ApprovalAction(ROOM, UserId(peer.ALICE), ExternalMessageId(ts), ApprovalChoice.ALLOW)
    ]


async def test_closing_a_request_shows_its_outcome_without_buttons(env: Running) -> None:
    ts = await env.transport.outbound.post_approval(Reply(ROOM, TEXT), "#5")
    assert ts is not None
    await env.transport.outbound.close_approval(ROOM, ts, "✅ allowed by @alice <!here>")
    message = await posted(env, ts)
    assert [b["type"] for b in message["blocks"]] == ["section"]
    assert message["text"] == "✅ allowed by @alice &lt;!here&gt;"
    assert message["blocks"][0]["text"]["text"] == message["text"]


async def test_a_request_answers_in_the_thread_of_its_reply(env: Running) -> None:
    root = await env.slack.post_message(peer.ALICE, "do the thing")
    ts = await env.transport.outbound.post_approval(Reply(ROOM, TEXT, thread=root), "#6")
    assert ts is not None
    assert (await posted(env, ts)).get("thread_ts") == root


async def test_an_unsigned_or_forged_click_is_refused(tmp_path: Path) -> None:
    async with running(tmp_path, "events") as env:
        ts = await env.transport.outbound.post_approval(Reply(ROOM, TEXT), "#7")
        assert ts is not None
        message = await posted(env, ts)
        await env.slack.click(peer.ALICE, ts, button(message, ApprovalChoice.ALLOW))
        await env.sink.wait_for(1)
        # The genuine POST local-slack signed, replayed with a bad signature.
        [body] = [
            str(e["detail"])
            for e in await env.slack.log()
            if e["direction"] == "to_bot" and e["kind"] == "interactive"
        ]
        url = f"http://127.0.0.1:{env.transport.events_port}/slack/events"
        form = {"Content-Type": "application/x-www-form-urlencoded"}
        timestamp = str(int(time.time()))
        forged = {
            **form,
            "X-Slack-Request-Timestamp": timestamp,
            "X-Slack-Signature": str(
                SignatureVerifier("not-the-secret").generate_signature(
                    timestamp=timestamp, body=body
                )
            ),
        }
        genuine = {
            **form,
            "X-Slack-Request-Timestamp": timestamp,
            "X-Slack-Signature": str(
                SignatureVerifier(peer.SIGNING_SECRET).generate_signature(
                    timestamp=timestamp, body=body
                )
            ),
        }
        async with aiohttp.ClientSession() as http:
            for headers in (forged, form):
                async with http.post(url, data=body, headers=headers) as response:
                    assert response.status == 401
            assert len(env.sink.received) == 1
            # The control: the same body signed right is taken (a second click).
            async with http.post(url, data=body, headers=genuine) as response:
                assert response.status == 200
        assert len(await env.sink.wait_for(2)) == 2


async def test_the_answer_to_a_click_in_a_thread_is_shown_in_that_thread(env: Running) -> None:
    # A refused click on a request in a thread: told privately where they clicked
    # (a person in a thread, e.g. on a phone, does not see the channel).
    root = await env.slack.post_message(peer.ALICE, "do the thing")
    ts = await env.transport.outbound.post_approval(Reply(ROOM, TEXT, thread=root), "#8")
    assert ts is not None
    await env.slack.click(peer.ALICE, ts, button(await posted(env, ts), ApprovalChoice.ALLOW))
    received = await env.sink.wait_for(2)  # alice's message, then her click
    [action] = [a for a in received if isinstance(a, ApprovalAction)]
    await env.transport.outbound.answer_action(action, "You may not answer tool requests here.")
    [told] = [m for m in await env.slack.messages() if m.get("subtype") == "ephemeral"]
    assert told["ephemeral_to"] == peer.ALICE
    assert told.get("thread_ts") == root
