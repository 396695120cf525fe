"""The Matrix transport's pure parts: event rules, rendering, state files, settings."""

from __future__ import annotations

import json
import stat
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from nio import Event, RedactionEvent, RoomMemberEvent, RoomMessageNotice, RoomMessageText
from pydantic import ValidationError

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
from bridge.core.transport import MessageDeleted, MessageEdited
from transports.matrix import MatrixSettings
from transports.matrix.context import replied_to
from transports.matrix.inbound import InboundPolicy, history_before, to_inbound
from transports.matrix.media import attachment_of
from transports.matrix.outbound import MatrixOutbound
from transports.matrix.render import MarkdownRenderer
from transports.matrix.state import SavedSession, SessionFile, SyncPosition
from transports.matrix.sync import Synced

BOT = InboundPolicy("@bot:hs", ignore_other_bots=True, ignore_users=frozenset({"@ci:hs"}))


def event(content: dict[str, Any], sender: str = "@alice:hs", kind: str = "m.room.message") -> Any:
    return Event.parse_event(
        {
            "type": kind,
            "event_id": "$e1",
            "sender": sender,
            "origin_server_ts": 1,
            "content": content,
        }
    )


def message(content: dict[str, Any], sender: str = "@alice:hs", name: str | None = None) -> Any:
    """The inbound message of an ``m.room.message`` event; fails if it is none."""
    inbound = to_inbound(event(content, sender), "!r", BOT, name)
    assert isinstance(inbound, InboundMessage), inbound
    return inbound


def test_text_message_becomes_inbound() -> None:
    msg = to_inbound(event({"msgtype": "m.text", "body": "hi"}), "!r", BOT)
    assert isinstance(msg, InboundMessage)
    assert msg.room == RoomKey(TransportName("matrix"), RoomId("!r"))
    assert (msg.sender, msg.text, msg.external_id) == ("@alice:hs", "hi", "$e1")
    assert not msg.sender_is_bot
    assert not msg.mentions_bot
    assert msg.thread is None


def test_own_messages_are_dropped() -> None:
    assert (
        to_inbound(event({"msgtype": "m.text", "body": "x"}, sender="@bot:hs"), "!r", BOT) is None
    )


def test_edits_and_redactions_become_edited_and_deleted() -> None:
    edit = event(
        {
            "msgtype": "m.text",
            "body": "* new",
            "m.new_content": {"msgtype": "m.text", "body": "new"},
            "m.relates_to": {"rel_type": "m.replace", "event_id": "$e0"},
        }
    )
    assert isinstance(edit, RoomMessageText)
    room = RoomKey(TransportName("matrix"), RoomId("!r"))
    assert to_inbound(edit, "!r", BOT) == MessageEdited(room, ExternalMessageId("$e0"), "new")
    redaction = Event.parse_event(
        {
            "type": "m.room.redaction",
            "event_id": "$e2",
            "sender": "@alice:hs",
            "origin_server_ts": 1,
            "redacts": "$e0",
            "content": {},
        }
    )
    assert isinstance(redaction, RedactionEvent)
    assert to_inbound(redaction, "!r", BOT) == MessageDeleted(room, ExternalMessageId("$e0"))
    # The bridge's own edits (progress) and redactions are not input.
    own_edit = event(edit.source["content"], sender="@bot:hs")
    assert to_inbound(own_edit, "!r", BOT) is None


def test_an_edit_without_new_content_is_nothing() -> None:
    broken = event({"msgtype": "m.text", "body": "* x", "m.relates_to": {"rel_type": "m.replace"}})
    assert to_inbound(broken, "!r", BOT) is None


def test_notices_and_ignored_users_are_bots_only_when_configured() -> None:
    notice = event({"msgtype": "m.notice", "body": "beep"})
    assert isinstance(notice, RoomMessageNotice)
    from_ci = event({"msgtype": "m.text", "body": "build ok"}, sender="@ci:hs")
    for e in (notice, from_ci):
        msg = to_inbound(e, "!r", BOT)
        assert isinstance(msg, InboundMessage)
        assert msg.sender_is_bot
    lenient = InboundPolicy("@bot:hs", ignore_other_bots=False, ignore_users=frozenset({"@ci:hs"}))
    for e in (notice, from_ci):
        msg = to_inbound(e, "!r", lenient)
        assert isinstance(msg, InboundMessage)
        assert not msg.sender_is_bot


def test_mentions_threads_and_reply_fallbacks() -> None:
    msg = to_inbound(
        event(
            {
                "msgtype": "m.text",
                "body": "> <@bob:hs> earlier words\n> more\n\nplease look",
                "m.mentions": {"user_ids": ["@bot:hs"]},
                "m.relates_to": {
                    "rel_type": "m.thread",
                    "event_id": "$root",
                    "m.in_reply_to": {"event_id": "$e0"},
                },
            }
        ),
        "!r",
        BOT,
    )
    assert isinstance(msg, InboundMessage)
    assert msg.text == "please look"
    assert msg.thread == "$root"
    assert msg.mentions_bot
    plain = to_inbound(event({"msgtype": "m.text", "body": "ask @bot:hs"}), "!r", BOT)
    assert isinstance(plain, InboundMessage)
    assert plain.mentions_bot
    pill = to_inbound(
        event(
            {
                "msgtype": "m.text",
                "body": "Bridge: hello",
                "format": "org.matrix.custom.html",
                "formatted_body": '<a href="https://matrix.to/#/@bot:hs">Bridge</a>: hello',
            }
        ),
        "!r",
        BOT,
    )
    assert isinstance(pill, InboundMessage)
    assert pill.mentions_bot
    assert pill.text == "hello"


def test_pasted_quote_lines_in_a_reply_are_kept() -> None:
    logs = "> 12:00:01 ERROR disk full\n> 12:00:02 WARN retrying\nwhy does this happen?"
    reply = {"m.relates_to": {"m.in_reply_to": {"event_id": "$e0"}}}
    # A reply whose client sent no fallback: every line is the user's.
    assert message({"msgtype": "m.text", "body": logs, **reply}).text == logs
    # A reply with a fallback: only the fallback goes, the pasted lines stay.
    fallback = "> <@bob:hs> the deploy failed\n> see the logs\n\n"
    assert message({"msgtype": "m.text", "body": fallback + logs, **reply}).text == logs
    # Not a reply: nothing is a fallback, even when it looks like one.
    assert message({"msgtype": "m.text", "body": fallback + logs}).text == fallback + logs


@pytest.mark.parametrize(
    ("body", "formatted", "name", "text"),
    [
        ("@bot:hs !stop", None, None, "!stop"),
        ("@bot:hs: !stop", None, None, "!stop"),
        ("Bridge: !stop", '<a href="https://matrix.to/#/@bot:hs">Bridge</a>: !stop', None, "!stop"),
        ("Bridge !status", None, "Bridge", "!status"),
        ("  @bot:hs,   explain this", None, None, "explain this"),
        ("@bot:hs", None, None, ""),
    ],
)
def test_a_leading_mention_of_the_bot_is_not_part_of_the_text(
    body: str, formatted: str | None, name: str | None, text: str
) -> None:
    content: dict[str, Any] = {"msgtype": "m.text", "body": body}
    if formatted:
        content.update(format="org.matrix.custom.html", formatted_body=formatted)
    msg = message(content, name=name)
    assert msg.text == text
    assert msg.mentions_bot


@pytest.mark.parametrize(
    "body",
    ["@bot:hsx !stop", "Bridgework !stop", "ask @bot:hs !stop", "@alice:hs !stop"],
)
def test_text_that_only_looks_like_a_leading_mention_stays(body: str) -> None:
    assert message({"msgtype": "m.text", "body": body}, name="Bridge").text == body


def test_files_are_handed_over_with_their_file_and_other_types_not_at_all() -> None:
    # The body of a file event is its name, not a request.
    image = event(
        {
            "msgtype": "m.image",
            "body": "cat.png",
            "url": "mxc://hs/x",
            "info": {"mimetype": "image/png", "size": 42},
        }
    )
    shared = to_inbound(image, "!r", BOT)
    assert isinstance(shared, InboundMessage)
    assert (shared.text, shared.sender) == ("", "@alice:hs")
    assert shared.attachments == (Attachment("cat.png", "image/png", 42, '{"url":"mxc://hs/x"}'),)
    emote = event({"msgtype": "m.emote", "body": "waves"})
    assert to_inbound(emote, "!r", BOT) is None


def test_a_files_caption_is_its_text_and_its_filename_its_name() -> None:
    content = {"msgtype": "m.file", "body": "please read", "filename": "r.pdf", "url": "mxc://hs/y"}
    shared = to_inbound(event(content), "!r", BOT)
    assert isinstance(shared, InboundMessage)
    assert shared.text == "please read"
    [file] = shared.attachments
    assert (file.name, file.mime, file.size) == ("r.pdf", "application/octet-stream", None)


def test_encrypted_files_carry_their_keys_and_broken_ones_are_not_files() -> None:
    keys = {
        "url": "mxc://hs/z",
        "key": {"k": "abc", "alg": "A256CTR", "kty": "oct", "key_ops": ["decrypt"], "ext": True},
        "iv": "iv",
        "hashes": {"sha256": "h"},
        "v": "v2",
    }
    described = attachment_of({"msgtype": "m.file", "body": "s.txt", "file": keys})
    assert described is not None
    assert json.loads(described.ref) == {"url": "mxc://hs/z", "file": keys}
    no_hash = {**keys, "hashes": {}}
    assert attachment_of({"msgtype": "m.file", "body": "s.txt", "file": no_hash}) is None
    assert attachment_of({"msgtype": "m.file", "body": "s.txt", "url": "https://x"}) is None


def member(membership: str, prev: str | None, state_key: str = "@bot:hs") -> Any:
    source: dict[str, Any] = {
        "type": "m.room.member",
        "event_id": "$m",
        "sender": state_key,
        "state_key": state_key,
        "origin_server_ts": 1,
        "content": {"membership": membership},
    }
    if prev:
        source["unsigned"] = {"prev_content": {"membership": prev}}
    return Event.parse_event(source)


def test_history_ends_at_the_bots_invite_not_its_join() -> None:
    text = event({"msgtype": "m.text", "body": "x"})
    assert isinstance(member("join", "invite"), RoomMemberEvent)
    # Someone invites the bot and types before it joins: that message is for it.
    assert (
        history_before([text, member("invite", None), text, member("join", "invite")], BOT.user_id)
        == 2
    )
    # The join's prev_content missing: the invite before it still marks the cut.
    assert (
        history_before([text, member("invite", None), text, member("join", None)], BOT.user_id) == 2
    )
    # A public room joined without an invite: history ends at the join.
    assert history_before([text, member("join", None), text], BOT.user_id) == 2
    # A profile change, or someone else's membership, is no cut.
    assert history_before([text, member("join", "join"), text], BOT.user_id) == 0
    assert history_before([text, member("invite", None, "@alice:hs"), text], BOT.user_id) == 0
    # Invited again after leaving: the new invite is the cut.
    events = [
        member("invite", None),
        text,
        member("leave", "join"),
        text,
        member("invite", "leave"),
    ]
    assert history_before([*events, text], BOT.user_id) == 5


@pytest.mark.parametrize(
    ("markdown", "html"),
    [
        ("**bold** and `code`", "<p><strong>bold</strong> and <code>code</code></p>"),
        ("```py\nx = 1\n```", '<pre><code class="language-py">x = 1\n</code></pre>'),
        ("<script>alert(1)</script>", "<p>&lt;script&gt;alert(1)&lt;/script&gt;</p>"),
        ("[x](javascript:alert(1))", "<p>[x](javascript:alert(1))</p>"),
        ("[x](https://example.org)", '<p><a href="https://example.org">x</a></p>'),
        ("~~gone~~", "<p><s>gone</s></p>"),
    ],
)
def test_markdown_is_rendered_and_sanitised(markdown: str, html: str) -> None:
    assert MarkdownRenderer().html(markdown) == html


def test_tables_render() -> None:
    html = MarkdownRenderer().html("| a | b |\n|---|---|\n| 1 | 2 |")
    assert "<table>" in html
    assert "<td>1</td>" in html


def test_sync_position_round_trip_is_private(tmp_path: Path) -> None:
    position = SyncPosition(tmp_path)
    assert position.load() is None
    position.save("s1_2_3")
    position.save("s4_5_6")
    assert position.load() == "s4_5_6"
    assert stat.S_IMODE((tmp_path / "sync_position").stat().st_mode) == 0o600
    assert sorted(p.name for p in tmp_path.iterdir()) == ["sync_position"]


def test_session_file_is_per_user_and_hides_its_token(tmp_path: Path) -> None:
    sessions = SessionFile(tmp_path)
    assert sessions.load("@bot:hs") is None
    saved = SavedSession("@bot:hs", "DEV", "syt_secret")
    sessions.save(saved)
    assert sessions.load("@bot:hs") == saved
    assert sessions.load("@other:hs") is None
    assert "syt_secret" not in repr(saved)
    assert stat.S_IMODE((tmp_path / "session.json").stat().st_mode) == 0o600
    (tmp_path / "session.json").write_text("{not json")
    assert sessions.load("@bot:hs") is None
    sessions.forget()
    assert not (tmp_path / "session.json").exists()


def settings(**fields: object) -> MatrixSettings:
    return MatrixSettings.model_validate(
        {"homeserver": "https://hs", "user_id": "@bot:hs", **fields}
    )


def test_settings_keep_secrets_out_of_output() -> None:
    s = settings(access_token="syt_secret", password="hunter2")
    assert s.access_token.get_secret_value() == "syt_secret"
    for text in (repr(s), str(s), s.model_dump_json(), json.dumps(s.model_dump(mode="json"))):
        assert "syt_secret" not in text
        assert "hunter2" not in text


def test_settings_need_a_credential_and_reject_unknown_keys() -> None:
    with pytest.raises(ValidationError, match=r"access_token or matrix\.password"):
        settings()
    with pytest.raises(ValidationError, match="extra"):
        settings(password="x", acess_token="typo")
    with pytest.raises(ValidationError, match="user_id"):
        settings(password="x", user_id="bot")
    assert settings(password="x").auto_join == "configured"


class CountingRenderer(MarkdownRenderer):
    """Counts how often each text is rendered."""

    def __init__(self) -> None:
        super().__init__()
        self.rendered: Counter[str] = Counter()

    def html(self, markdown: str) -> str:
        self.rendered[markdown] += 1
        return super().html(markdown)


@pytest.mark.parametrize(
    ("text", "max_event_chars"),
    [
        ("a short **answer**", 4_000),
        ("\n\n".join(f"Paragraph {p}: " + "lorem ipsum " * 60 for p in range(8)), 1_000),
        # Only the size check splits: oversized pieces are measured, then halved.
        ("\n\n".join(f"Paragraph {p}: " + "<&> ipsum " * 400 for p in range(10)), 200_000),
    ],
)
def test_markdown_is_rendered_once_per_chunk(text: str, max_event_chars: int) -> None:
    settings = MatrixSettings.model_validate(
        {
            "homeserver": "http://127.0.0.1:9",
            "user_id": "@bot:hs",
            "access_token": "t",
            "max_event_chars": max_event_chars,
        }
    )
    outbound = MatrixOutbound(settings, Synced(), typing_refresh_s=1.0, send_attempts=1)
    outbound._renderer = renderer = CountingRenderer()
    room = RoomKey(TransportName("matrix"), RoomId("!r"))
    parts = outbound._parts(
        Reply(room, text, ReplyKind.RESULT, in_reply_to=ExternalMessageId("$q"))
    )
    assert parts
    assert all(renderer.rendered[part["body"]] == 1 for part in parts)
    assert max(renderer.rendered.values()) == 1  # nothing, sent or measured, twice


def test_a_thread_messages_reply_fallback_is_not_a_reply() -> None:
    """Element puts an ``m.in_reply_to`` in every thread message for thread-unaware
    clients (``is_falling_back``); only a real reply inside a thread counts."""
    fallback = {
        "rel_type": "m.thread",
        "event_id": "$root",
        "is_falling_back": True,
        "m.in_reply_to": {"event_id": "$latest"},
    }
    real = {**fallback, "is_falling_back": False, "m.in_reply_to": {"event_id": "$quoted"}}
    plain = {"m.in_reply_to": {"event_id": "$quoted"}}
    assert replied_to({"body": "x", "m.relates_to": fallback}) is None
    assert replied_to({"body": "x", "m.relates_to": real}) == "$quoted"
    assert replied_to({"body": "x", "m.relates_to": plain}) == "$quoted"
