"""The transport against the local-slack emulator, in Socket Mode and events mode."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from bridge.core.model import (
    Attachment,
    ExternalMessageId,
    InboundMessage,
    Reply,
    ReplyKind,
    RoomId,
    RoomKey,
    TransportName,
)
from bridge.core.transport import (
    FileTooLarge,
    MessageDeleted,
    MessageEdited,
    RunPhase,
    TransportError,
)
from tests.transports.slack import peer
from tests.transports.slack.harness import Running, running
from transports.slack.outbound import PHASE_REACTIONS

pytestmark = pytest.mark.slack

ROOM = RoomKey(TransportName("slack"), RoomId(peer.CHANNEL))
DM_ROOM = RoomKey(TransportName("slack"), RoomId(peer.DM))


async def test_channel_message_is_handed_over_before_the_ack(env: Running) -> None:
    ts = await env.slack.post_message(peer.ALICE, "hello bridge")
    # post_message returns once local-slack saw the ack: the sink already has it.
    [message] = env.sink.messages
    assert message.room == ROOM
    assert message.sender == peer.ALICE
    assert message.text == "hello bridge"
    assert message.external_id == ts
    assert message.thread is None
    assert not message.sender_is_bot
    assert not message.mentions_bot
    assert env.transport.connected


async def test_mentions_threads_and_dms_are_translated(env: Running) -> None:
    root = await env.slack.post_message(peer.ALICE, f"<@{peer.BOT_USER}> please look")
    reply = await env.slack.post_message(peer.BOB, "in the thread", thread_ts=root)
    dm = await env.slack.post_message(peer.ALICE, "just us", channel=peer.DM)
    mention, threaded, direct = env.sink.messages
    assert mention.mentions_bot
    assert mention.external_id == root
    assert threaded.thread == root
    assert threaded.external_id == reply
    assert not threaded.mentions_bot
    assert direct.room == DM_ROOM
    assert direct.external_id == dm


async def test_own_messages_and_unconfigured_rooms_are_dropped(env: Running) -> None:
    await env.slack.post_message(peer.BOT_USER, "an echo of the bridge itself")
    await env.slack.post_message(peer.ALICE, "not a bridged channel", channel=peer.QUIET_CHANNEL)
    await env.slack.post_message(peer.ALICE, "this one counts")
    assert env.sink.texts == ["this one counts"]


async def test_a_burst_arrives_complete_and_in_order(env: Running) -> None:
    sent = [await env.slack.post_message(peer.ALICE, f"part {i}") for i in range(6)]
    assert [m.external_id for m in env.sink.messages] == sent
    assert env.sink.texts == [f"part {i}" for i in range(6)]


async def test_replies_land_in_the_batch_thread(env: Running) -> None:
    first = await env.slack.post_message(peer.ALICE, "question")
    answer = await env.transport.outbound.send(
        Reply(
            ROOM,
            "**Answer**: see `x < y`",
            ReplyKind.RESULT,
            ExternalMessageId(first),
            anchor=ExternalMessageId(first),
        )
    )
    [posted] = await env.slack.bot_messages()
    assert posted["ts"] == answer
    assert posted["thread_ts"] == first
    assert posted["text"] == "*Answer*: see `x &lt; y`"


async def test_reply_keeps_an_explicit_thread_and_dm_rooms_can_answer_inline(
    env: Running,
) -> None:
    root = await env.slack.post_message(peer.ALICE, "root")
    inner = await env.slack.post_message(peer.ALICE, "inner", thread_ts=root)
    await env.transport.outbound.send(
        Reply(ROOM, "threaded", ReplyKind.NOTICE, ExternalMessageId(inner), thread=root)
    )
    dm = await env.slack.post_message(peer.ALICE, "hi", channel=peer.DM)
    await env.transport.outbound.send(
        Reply(DM_ROOM, "inline", ReplyKind.RESULT, ExternalMessageId(dm))
    )
    [threaded] = await env.slack.bot_messages()
    assert threaded["thread_ts"] == root
    [inline] = await env.slack.bot_messages(peer.DM)
    assert inline["text"] == "inline"
    assert "thread_ts" not in inline


@pytest.mark.parametrize("end", [RunPhase.DONE, RunPhase.FAILED, RunPhase.STOPPED])
async def test_reactions_follow_the_batch_phase(env: Running, end: RunPhase) -> None:
    batch = [ExternalMessageId(await env.slack.post_message(peer.ALICE, t)) for t in "ab"]
    for phase in (RunPhase.RECEIVED, RunPhase.RUNNING, end):
        await env.transport.outbound.set_phase(ROOM, batch, phase)
        for message in await env.slack.messages():
            assert [r["name"] for r in message.get("reactions", [])] == [PHASE_REACTIONS[phase]]


async def test_edit_replaces_the_text(env: Running) -> None:
    posted = await env.transport.outbound.send(Reply(ROOM, "working", ReplyKind.PROGRESS))
    assert posted is not None
    await env.transport.outbound.edit(ROOM, posted, "_done_ after **3** tools")
    [message] = await env.slack.bot_messages()
    assert message["text"] == "_done_ after *3* tools"


async def test_a_failed_hand_over_is_not_acknowledged(env: Running) -> None:
    env.sink.fail_next = 1
    await env.slack.post_message(peer.ALICE, "store is down")
    await env.slack.post_message(peer.ALICE, "store is back")
    assert env.sink.texts == ["store is back"]
    log = await env.slack.log()
    if env.slack.mode == "events":
        answers = [
            e["summary"]
            for e in log
            if e.get("direction") == "from_bot" and "HTTP" in str(e.get("summary"))
        ]
        assert answers == ["HTTP 500", "HTTP 200"]
    else:
        acks = [e for e in log if e.get("direction") == "from_bot" and e.get("kind") == "ack"]
        assert len(acks) == 1


@pytest.fixture(params=["socket", "events"])
def mode(request: pytest.FixtureRequest) -> str:
    return str(request.param)


async def test_a_long_reply_is_split_at_paragraphs_and_fences(tmp_path: Path, mode: str) -> None:
    code = "```python\n" + "\n".join(f"value_{i} = {i}" for i in range(40)) + "\n```"
    prose = "\n\n".join(f"Paragraph {i}: " + "word " * 30 for i in range(6))
    async with running(tmp_path, mode, message_limit=400, upload_threshold=0) as env:
        first = await env.slack.post_message(peer.ALICE, "long please")
        last = await env.transport.outbound.send(
            Reply(
                ROOM,
                f"{prose}\n\n{code}",
                ReplyKind.RESULT,
                ExternalMessageId(first),
                anchor=ExternalMessageId(first),
            )
        )
        posted = await env.slack.bot_messages()
    assert len(posted) > 3
    assert posted[-1]["ts"] == last
    assert all(len(m["text"]) <= 400 for m in posted)
    assert all(m["thread_ts"] == first for m in posted)
    assert all(m["text"].count("```") % 2 == 0 for m in posted)
    joined = "\n".join(m["text"] for m in posted)
    assert all(f"value_{i} = {i}" in joined for i in range(40))
    assert all(f"Paragraph {i}:" in joined for i in range(6))


async def test_a_very_long_result_is_uploaded_as_a_file(tmp_path: Path, mode: str) -> None:
    text = "# Report\n\n" + "line of the answer\n" * 200
    async with running(tmp_path, mode, upload_threshold=1000) as env:
        first = await env.slack.post_message(peer.ALICE, "report please")
        posted_id = await env.transport.outbound.send(
            Reply(
                ROOM,
                text,
                ReplyKind.RESULT,
                ExternalMessageId(first),
                anchor=ExternalMessageId(first),
            )
        )
        posted = await env.slack.bot_messages()
    assert len(posted) == 1
    [message] = posted
    assert message["ts"] == posted_id
    assert message["thread_ts"] == first
    [file] = message["files"]
    assert file["name"] == "answer.md"
    assert file["size"] == len(text.encode())


# --- what claude reads, and a message's later life --------------------------------


async def test_markup_is_decoded_with_display_names(env: Running) -> None:
    # As Slack sends typed text: entities escaped, mentions and links as tokens.
    await env.slack.post_message(
        peer.ALICE,
        f"<@{peer.BOT_USER}> ask <@{peer.BOB}>: grep x &gt; out &amp;&amp; see <https://x.test|docs>",
    )
    await env.slack.post_message(peer.ALICE, f"<@{peer.BOT_USER}> !stop")
    await env.slack.post_message(peer.ALICE, f"and <@{peer.BOB}> again <!here>")
    first, command, again = env.sink.received
    assert isinstance(first, InboundMessage)
    assert first.text == "ask @bob: grep x > out && see [docs](https://x.test)"
    assert first.mentions_bot
    assert isinstance(command, InboundMessage)
    assert command.text == "!stop"
    assert isinstance(again, InboundMessage)
    assert again.text == "and @bob again @here"
    # Alice (the sender) and Bob, once each: the cache answered the second time.
    assert env.transport.names.lookups == 2


async def test_edits_and_deletions_become_events(env: Running) -> None:
    ts = await env.slack.post_message(peer.ALICE, "frist draft")
    await env.slack.edit_message(peer.ALICE, ts, "first draft &amp; more")
    await env.slack.delete_message(peer.ALICE, ts)
    _, edited, deleted = env.sink.received
    assert edited == MessageEdited(ROOM, ExternalMessageId(ts), "first draft & more")
    assert deleted == MessageDeleted(ROOM, ExternalMessageId(ts))


async def test_shared_files_are_handed_over_and_fetched_with_the_bot_token(
    env: Running, tmp_path: Path
) -> None:
    await env.slack.share_file(peer.ALICE, "notes.txt", b"some notes")
    await env.slack.share_file(peer.ALICE, "more.txt", b"more", text="summarise this")
    assert [(m.text, len(m.attachments)) for m in env.sink.messages] == [
        ("", 1),
        ("summarise this", 1),
    ]
    assert all(m.sender == peer.ALICE for m in env.sink.messages)
    [notes] = env.sink.messages[0].attachments
    assert (notes.name, notes.size) == ("notes.txt", len(b"some notes"))
    await env.transport.outbound.fetch_attachment(notes, tmp_path / "notes", 1000)
    assert (tmp_path / "notes").read_bytes() == b"some notes"
    with pytest.raises(FileTooLarge):
        await env.transport.outbound.fetch_attachment(notes, tmp_path / "cut", 4)
    # A stub of the file (Slack sends those at times) is looked up with files.info.
    file_id = notes_id(await env.slack.messages())
    stub = Attachment(file_id, "application/octet-stream", None, f"slack-file:{file_id}")
    await env.transport.outbound.fetch_attachment(stub, tmp_path / "stub", 1000)
    assert (tmp_path / "stub").read_bytes() == b"some notes"
    # The token goes to Slack's hosts and the configured API's only.
    elsewhere = dataclasses.replace(notes, ref="http://127.0.0.2:9/steal")
    with pytest.raises(TransportError, match="not on a Slack host"):
        await env.transport.outbound.fetch_attachment(elsewhere, tmp_path / "x", 1000)


def notes_id(messages: list[dict[str, Any]]) -> str:
    for message in messages:
        for file in message.get("files") or ():
            if file.get("name") == "notes.txt":
                return str(file["id"])
    raise AssertionError("no notes.txt shared")


async def test_messages_carry_the_senders_display_name(env: Running) -> None:
    await env.slack.post_message(peer.ALICE, "hello")
    [message] = env.sink.messages
    assert message.sender_name is not None
    assert message.sender_name != peer.ALICE
