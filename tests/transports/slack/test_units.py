"""Pure parts of the Slack transport: settings, event filtering, mrkdwn."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from bridge.core.model import InboundMessage
from bridge.core.transport import InboundEvent
from tests.transports.slack.events import event
from transports.slack.inbound import RecentKeys, mentions, to_event
from transports.slack.mrkdwn import to_mrkdwn
from transports.slack.settings import SlackSettings

BOT = "U0BOT"
ROOMS = frozenset({"C1", "D1"})


# --- settings -----------------------------------------------------------------


def test_settings_keep_secrets_out_of_repr_and_dumps() -> None:
    settings = SlackSettings(bot_token="xoxb-HUSH1", app_token="xapp-HUSH2", signing_secret="HUSH3")
    shown = repr(settings) + settings.model_dump_json() + str(settings.model_dump())
    assert "HUSH" not in shown
    assert settings.bot_token.get_secret_value() == "xoxb-HUSH1"


@pytest.mark.parametrize(
    ("values", "problem"),
    [
        ({"app_token": "xapp-1"}, "bot_token is required"),
        ({"bot_token": "xoxb-1"}, "app_token is required"),
        ({"bot_token": "xoxb-1", "mode": "events"}, "signing_secret is required"),
        ({"bot_token": "b", "app_token": "a", "listen": "nope"}, "host:port"),
        ({"bot_token": "b", "app_token": "a", "tokens": "x"}, "Extra inputs"),
    ],
)
def test_settings_fail_fast(values: dict[str, Any], problem: str) -> None:
    with pytest.raises(ValidationError, match=problem):
        SlackSettings.model_validate(values)


def test_settings_normalise_the_api_url_and_split_listen() -> None:
    settings = SlackSettings(
        mode="events",
        bot_token="b",
        signing_secret="s",
        api_url="http://127.0.0.1:9/api",
        listen="[::1]:3001",
    )
    assert settings.api_url == "http://127.0.0.1:9/api/"
    assert (settings.listen_host, settings.listen_port) == ("::1", 3001)


# --- inbound --------------------------------------------------------------------


def inbound(parsed: InboundEvent | None) -> InboundMessage:
    assert isinstance(parsed, InboundMessage), parsed
    return parsed


def test_a_plain_message_becomes_an_inbound_message() -> None:
    message = inbound(to_event(event(thread_ts="0.5"), BOT, "B0BOT", ROOMS))
    assert (message.room.transport, message.room.room_id) == ("slack", "C1")
    assert (message.sender, message.text, message.external_id) == ("U0ALICE", "hi", "1.000001")
    assert message.thread == "0.5"
    assert not message.sender_is_bot
    assert not message.mentions_bot


@pytest.mark.parametrize(
    "fields",
    [
        {"channel": "C_OTHER"},
        {"user": BOT},
        {"bot_id": "B0BOT", "user": None, "subtype": "bot_message"},
        {"subtype": "message_changed"},
        {"subtype": "message_deleted"},
        {"subtype": "channel_join"},
        {"hidden": True},
        {"ts": None},
        {"user": None},
        {"type": "reaction_added"},
    ],
)
def test_events_that_are_not_new_human_text_are_dropped(fields: dict[str, Any]) -> None:
    assert to_event(event(**fields), BOT, "B0BOT", ROOMS) is None


@pytest.mark.parametrize("subtype", ["thread_broadcast", "file_share", "me_message"])
def test_human_subtypes_are_kept(subtype: str) -> None:
    assert to_event(event(subtype=subtype), BOT, "B0BOT", ROOMS) is not None


def test_other_bots_are_passed_on_flagged() -> None:
    by_user = inbound(to_event(event(bot_id="B0OTHER"), BOT, "B0BOT", ROOMS))
    legacy = inbound(
        to_event(event(user=None, bot_id="B0OLD", subtype="bot_message"), BOT, None, ROOMS)
    )
    assert by_user.sender_is_bot
    assert legacy.sender_is_bot
    assert legacy.sender == "B0OLD"


def test_mentions_are_recognised_in_text_and_app_mention_events() -> None:
    assert mentions("hey <@U0BOT> look", BOT)
    assert mentions("<@U0BOT|bridge>: look", BOT)
    assert not mentions("hey <@U0BOTX> and U0BOT", BOT)
    via_text = inbound(to_event(event(text="look <@U0BOT> go"), BOT, None, ROOMS))
    via_event = inbound(to_event(event(type="app_mention", text="go"), BOT, None, ROOMS))
    assert via_text.mentions_bot
    assert via_event.mentions_bot


def test_recent_keys_forget_the_oldest() -> None:
    recent = RecentKeys(size=2)
    for ts in ("1", "2", "3"):
        recent.add(("C1", ts))
    assert ("C1", "1") not in recent
    assert ("C1", "2") in recent
    assert ("C1", "3") in recent


# --- mrkdwn ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("markdown", "mrkdwn"),
    [
        ("**bold** and __bold__", "*bold* and *bold*"),
        ("*em* and _em_", "_em_ and _em_"),
        ("~~gone~~", "~gone~"),
        ("[docs](https://x.test/?a=1&b=2)", "<https://x.test/?a=1&amp;b=2|docs>"),
        ("see <https://x.test>", "see <https://x.test>"),
        ("a < b && c > d", "a &lt; b &amp;&amp; c &gt; d"),
        ("`**not bold** <x>`", "`**not bold** &lt;x&gt;`"),
        ("## Heading **strong**", "*Heading strong*"),
        ("- one\n  * two", "• one\n  • two"),
        ("> quoted **b**", "> quoted *b*"),
        ("snake_case_name and 2*3*4", "snake_case_name and 2*3*4"),
        ("---", "──────────"),
    ],
)
def test_markdown_becomes_mrkdwn(markdown: str, mrkdwn: str) -> None:
    assert to_mrkdwn(markdown) == mrkdwn


def test_code_fences_lose_the_info_string_and_keep_their_content() -> None:
    source = "```python\nif a < b:\n    print('**x**')\n```\ntext"
    assert to_mrkdwn(source) == "```\nif a &lt; b:\n    print('**x**')\n```\ntext"


def test_tables_and_unterminated_fences_become_closed_code_blocks() -> None:
    assert to_mrkdwn("| a | b |\n|---|---|\nafter") == "```\n| a | b |\n|---|---|\n```\nafter"
    assert to_mrkdwn("~~~\nopen") == "```\nopen\n```"
