"""The Matrix transport against a real Synapse: delivery, replies, rooms, encryption."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest
from nio import RoomMessageText

from bridge.core.model import (
    ExternalMessageId,
    InboundMessage,
    Reply,
    ReplyKind,
    RoomId,
    RoomKey,
    TransportName,
)
from bridge.core.transport import MessageDeleted, MessageEdited, TransportError
from tests.transports.matrix.matrix_helpers import (
    Human,
    RecordingSink,
    Seen,
    TransportFactory,
    joined,
    message_from,
    running,
)
from tests.transports.matrix.synapse_peer import SynapseServer

pytestmark = [pytest.mark.synapse, pytest.mark.slow]

BOT = "@chatbridge:localhost"


def key(room_id: str) -> RoomKey:
    return RoomKey(TransportName("matrix"), RoomId(room_id))


async def test_delivers_messages_in_order_and_replies(
    alice: Human, make_transport: TransportFactory
) -> None:
    room = await alice.create_room([BOT])
    sink = RecordingSink()
    transport = make_transport([room])
    async with running(transport, sink):
        await alice.wait_for(joined(BOT, room))
        ids = [await alice.send(room, f"message {i}") for i in range(3)]
        await sink.wait_for_text("message 2")
        assert sink.texts() == ["message 0", "message 1", "message 2"]
        first = sink.messages[0]
        assert first.room == key(room)
        assert first.sender == alice.user.user_id
        assert [m.external_id for m in sink.messages] == ids
        assert not first.sender_is_bot
        assert first.thread is None

        sent = await transport.outbound.send(
            Reply(key(room), "**done**", ReplyKind.RESULT, in_reply_to=ExternalMessageId(ids[-1]))
        )
        answer = await alice.wait_for(message_from(BOT, room))
        assert answer.source["event_id"] == sent
        assert answer.content["msgtype"] == "m.text"
        assert answer.content["body"] == "**done**"
        assert answer.content["formatted_body"] == "<p><strong>done</strong></p>"
        assert answer.content["m.relates_to"] == {"m.in_reply_to": {"event_id": ids[-1]}}

        await transport.outbound.send(Reply(key(room), "unknown command", ReplyKind.NOTICE))
        notice = await alice.wait_for(
            lambda s: message_from(BOT, room)(s) and s.content.get("msgtype") == "m.notice"
        )
        assert notice.content["body"] == "unknown command"
    # The bot's own replies never come back as input.
    assert sink.texts() == ["message 0", "message 1", "message 2"]


async def test_edits_and_redactions_reach_the_sink_and_bots_are_marked(
    alice: Human, mallory: Human, make_transport: TransportFactory
) -> None:
    room = await alice.create_room([BOT, mallory.user.user_id])
    sink = RecordingSink()
    transport = make_transport([room], ignore_users=["@mallory:localhost"])
    async with running(transport, sink):
        await alice.wait_for(joined(BOT, room))
        await mallory.join(room)
        original = await alice.send(room, "original")
        await mallory.send(room, "* forged", extra=edit_of(original, "forged"))
        await alice.send(room, "* edited", extra=edit_of(original, "edited"))
        await alice.client.room_redact(room, original)
        await alice.send(room, "a notice", msgtype="m.notice")
        await mallory.send(room, "from an ignored user")
        await alice.send(room, f"hey {BOT}", extra={"m.mentions": {"user_ids": [BOT]}})
        await alice.send(
            room,
            "in a thread",
            extra={"m.relates_to": {"rel_type": "m.thread", "event_id": original}},
        )
        await sink.wait_for_text("in a thread")
    original_id = ExternalMessageId(original)
    # Mallory's edit of alice's message is a forgery: it never reaches the service.
    assert [e for e in sink.events if not isinstance(e, InboundMessage)] == [
        MessageEdited(key(room), original_id, "edited"),
        MessageDeleted(key(room), original_id),
    ]
    by_text = {m.text: m for m in sink.messages}
    assert list(by_text) == [
        "original",
        "a notice",
        "from an ignored user",
        f"hey {BOT}",
        "in a thread",
    ]
    assert by_text["a notice"].sender_is_bot
    assert by_text["from an ignored user"].sender_is_bot
    assert not by_text["original"].sender_is_bot
    assert by_text[f"hey {BOT}"].mentions_bot
    assert not by_text["original"].mentions_bot
    assert by_text["in a thread"].thread == original


def edit_of(event_id: str, text: str) -> dict[str, object]:
    return {
        "m.new_content": {"msgtype": "m.text", "body": text},
        "m.relates_to": {"rel_type": "m.replace", "event_id": event_id},
    }


async def test_reply_keeps_pasted_quotes_and_a_leading_mention_makes_a_command(
    alice: Human, make_transport: TransportFactory
) -> None:
    room = await alice.create_room([BOT])
    sink = RecordingSink()
    async with running(make_transport([room]), sink):
        await alice.wait_for(joined(BOT, room))
        asked = await alice.send(room, "what failed?")
        logs = "> 12:00:01 ERROR disk full\n> 12:00:02 WARN retrying\nwhy?"
        await alice.send(
            room,
            f"> <{alice.user.user_id}> what failed?\n\n{logs}",
            extra={"m.relates_to": {"m.in_reply_to": {"event_id": asked}}},
        )
        await alice.send(
            room,
            "chatbridge: !stop",
            extra={
                "format": "org.matrix.custom.html",
                "formatted_body": f'<a href="https://matrix.to/#/{BOT}">chatbridge</a>: !stop',
                "m.mentions": {"user_ids": [BOT]},
            },
        )
        await sink.wait_for_text("!stop")
    assert sink.texts() == ["what failed?", logs, "!stop"]
    assert sink.messages[-1].mentions_bot


async def test_joins_only_configured_rooms(
    alice: Human, mallory: Human, make_transport: TransportFactory
) -> None:
    configured = await alice.create_room([BOT])
    other = await mallory.create_room([BOT])
    sink = RecordingSink()
    async with running(make_transport([configured]), sink):
        await alice.wait_for(joined(BOT, configured))
        await mallory.send(other, "not served here")
        # A message in the configured room, sent after all of the above, is
        # a barrier: once it arrives, the invite and 'other' were processed.
        await alice.send(configured, "barrier")
        await sink.wait_for_text("barrier")
    assert sink.texts() == ["barrier"]
    assert await mallory.membership(other, BOT) == "invite"


async def test_auto_join_none_accepts_no_invite(
    alice: Human, make_transport: TransportFactory
) -> None:
    configured = await alice.create_room([BOT])
    sink = RecordingSink()
    async with running(make_transport([configured], auto_join="none"), sink):
        # The first sync (before ready) already carried the invite.
        pass
    assert await alice.membership(configured, BOT) == "invite"


async def test_restart_replays_nothing_and_misses_nothing(
    alice: Human, make_transport: TransportFactory
) -> None:
    room = await alice.create_room([BOT])
    sink = RecordingSink()
    first = make_transport([room])
    async with running(first, sink):
        await alice.wait_for(joined(BOT, room))
        await alice.send(room, "before restart")
        await sink.wait_for_text("before restart")
    # Down: more messages than one sync's timeline carries (50) arrive.
    missed = [f"while down {i}" for i in range(60)]
    for text in missed:
        await alice.send(room, text)
    after = RecordingSink()
    async with running(make_transport([room]), after):
        await alice.send(room, "after restart")
        await after.wait_for_text("after restart")
    assert after.texts() == [*missed, "after restart"]
    assert sink.texts() == ["before restart"]


async def test_first_start_ignores_history(
    alice: Human, bot_client: Human, make_transport: TransportFactory
) -> None:
    room = await alice.create_room([BOT])
    await bot_client.join(room)
    await alice.send(room, "history")
    sink = RecordingSink()
    async with running(make_transport([room]), sink):
        await alice.send(room, "new")
        await sink.wait_for_text("new")
    assert sink.texts() == ["new"]


async def test_password_login_creates_one_device_and_reuses_it(
    alice: Human, bot_client: Human, make_transport: TransportFactory
) -> None:
    async def device_ids() -> set[str]:
        response = await bot_client.client.devices()
        return {d.id for d in response.devices}

    before = await device_ids()
    room = await alice.create_room([BOT])
    for _ in range(2):
        async with running(make_transport([room]), RecordingSink()):
            pass
    assert len((await device_ids()) - before) == 1


async def test_access_token_login(
    alice: Human, synapse_bot_token: str, make_transport: TransportFactory
) -> None:
    room = await alice.create_room([BOT])
    sink = RecordingSink()
    async with running(make_transport([room], password="", access_token=synapse_bot_token), sink):
        await alice.wait_for(joined(BOT, room))
        await alice.send(room, "hello")
        await sink.wait_for_text("hello")


async def test_refused_token_ends_the_transport(make_transport: TransportFactory) -> None:
    transport = make_transport([], password="", access_token="syt_not_a_token")
    with pytest.raises(TransportError, match="refused"):
        await transport.run(RecordingSink(), asyncio.Event())


async def test_encrypted_room_round_trip(alice: Human, make_transport: TransportFactory) -> None:
    room = await alice.create_room([BOT], encrypted=True)
    sink = RecordingSink()
    transport = make_transport([room])
    async with running(transport, sink):
        await alice.wait_for(joined(BOT, room))
        await alice.sync()  # learn the bot's device before encrypting to it
        asked = await alice.send(room, "secret question")
        message = await sink.wait_for_text("secret question")
        assert message.external_id == asked
        await transport.outbound.send(
            Reply(key(room), "secret *answer*", ReplyKind.RESULT, in_reply_to=message.external_id)
        )
        answer = await alice.wait_for(message_from(BOT, room))
    assert answer.source["type"] == "m.room.message"  # decrypted by alice
    assert isinstance(answer.event, RoomMessageText)
    assert answer.event.decrypted
    assert answer.content["body"] == "secret *answer*"
    assert answer.content["formatted_body"] == "<p>secret <em>answer</em></p>"


async def test_long_markdown_reply_arrives_split_and_rendered(
    alice: Human, make_transport: TransportFactory
) -> None:
    room = await alice.create_room([BOT])
    transport = make_transport([room], max_event_chars=1_000)
    code = "```python\n" + "\n".join(f"print({i})  # a line of code" for i in range(60)) + "\n```"
    prose = "\n\n".join(f"Paragraph {i}: " + "words " * 30 for i in range(8))
    text = f"# Title\n\n{prose}\n\n{code}\n\nThe end."
    async with running(transport, RecordingSink()):
        await alice.wait_for(joined(BOT, room))
        asked = await alice.send(room, "please be long")
        last = await transport.outbound.send(
            Reply(key(room), text, ReplyKind.RESULT, in_reply_to=ExternalMessageId(asked))
        )
        await alice.wait_for(lambda s: s.source.get("event_id") == last)
    # Events arrive in order: once the last part is seen, all parts are.
    parts = [
        s for s in alice.seen if message_from(BOT, room)(s) and s.content.get("msgtype") == "m.text"
    ]
    bodies = [p.content["body"] for p in parts]
    assert len(bodies) > 3
    assert all(len(b) <= 1_000 for b in bodies)
    assert parts[0].content["m.relates_to"] == {"m.in_reply_to": {"event_id": asked}}
    assert all("m.relates_to" not in p.content for p in parts[1:])
    assert bodies[0].startswith("# Title")
    assert bodies[-1].endswith("The end.")
    code_parts = [p for p in parts if "```python" in p.content["body"]]
    assert len(code_parts) > 1
    for part in code_parts:
        body = part.content["body"]
        assert body.count("```") % 2 == 0  # every piece of code is a whole block
        assert '<pre><code class="language-python">' in part.content["formatted_body"]
    assert "<h1>Title</h1>" in parts[0].content["formatted_body"]


async def test_typing_notice_while_a_run_is_active(
    alice: Human, make_transport: TransportFactory
) -> None:
    room = await alice.create_room([BOT])
    transport = make_transport([room])

    def typing(users: list[str]) -> Callable[[Seen], bool]:
        return lambda s: s.ephemeral and s.room_id == room and s.source["users"] == users

    async with running(transport, RecordingSink()):
        await alice.wait_for(joined(BOT, room))
        await transport.outbound.set_typing(key(room), True)
        await alice.wait_for(typing([BOT]))
        await transport.outbound.set_typing(key(room), False)
        await alice.wait_for(typing([]))


async def test_edit_replaces_a_notice(alice: Human, make_transport: TransportFactory) -> None:
    room = await alice.create_room([BOT])
    transport = make_transport([room])
    async with running(transport, RecordingSink()):
        await alice.wait_for(joined(BOT, room))
        progress = await transport.outbound.send(Reply(key(room), "working…", ReplyKind.PROGRESS))
        assert progress is not None
        await transport.outbound.edit(key(room), progress, "working… `ls`")
        edit = await alice.wait_for(
            lambda s: message_from(BOT, room)(s) and "m.new_content" in s.content
        )
    assert edit.content["m.relates_to"] == {"rel_type": "m.replace", "event_id": progress}
    assert edit.content["m.new_content"]["body"] == "working… `ls`"
    assert edit.content["m.new_content"]["formatted_body"] == "<p>working… <code>ls</code></p>"


async def test_send_to_a_room_of_another_transport_is_refused(
    make_transport: TransportFactory,
) -> None:
    transport = make_transport([])
    with pytest.raises(TransportError, match="not a Matrix room"):
        await transport.outbound.send(Reply(RoomKey(TransportName("slack"), RoomId("C1")), "hi"))


async def test_recovers_when_synapse_restarts_and_loses_nothing(
    alice: Human,
    synapse: SynapseServer,
    make_transport: TransportFactory,
    caplog: pytest.LogCaptureFixture,
) -> None:
    room = await alice.create_room([BOT])
    sink = RecordingSink()
    transport = make_transport([room])
    async with running(transport, sink) as task:
        await alice.wait_for(joined(BOT, room))
        await alice.send(room, "before the outage")
        await sink.wait_for_text("before the outage")
        # Stored by the server, perhaps not yet synced by the bridge.
        await alice.send(room, "just before the outage")
        await asyncio.to_thread(synapse.stop)
        await asyncio.to_thread(synapse.start)
        await alice.send(room, "after the outage")
        await sink.wait_for_text("after the outage")
        assert not task.done()
        assert transport.reconnects == 1
    assert sink.texts() == ["before the outage", "just before the outage", "after the outage"]
    assert any("matrix sync failed" in r.getMessage() for r in caplog.records)
