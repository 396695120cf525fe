"""What claude reads of a Slack message, and which events a message's life produces."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from bridge.core.model import Attachment, ExternalMessageId, InboundMessage
from bridge.core.transport import MessageDeleted, MessageEdited
from tests.transports.slack.events import event
from transports.slack.decode import decode, mentioned_users, strip_leading_mention
from transports.slack.files import may_have_token
from transports.slack.inbound import dedup_key, to_event
from transports.slack.names import CachePolicy, DisplayNames, WaitBudget

BOT = "U0BOT"
ROOMS = frozenset({"C1"})


@pytest.mark.parametrize(
    ("slack", "plain"),
    [
        ("grep x &gt; out &amp;&amp; cat &lt;in", "grep x > out && cat <in"),
        ("typed &amp;lt; literally", "typed &lt; literally"),
        ("see <https://x.test/a?b=1&amp;c=2>", "see https://x.test/a?b=1&c=2"),
        ("see <http://x.test|x.test>", "see x.test"),
        ("the <https://x.test/docs|docs>", "the [docs](https://x.test/docs)"),
        ("mail <mailto:a@x.test|a@x.test>", "mail a@x.test"),
        ("ask <@U0ALICE> now", "ask @Alice now"),
        ("ask <@U0NOBODY>", "ask @U0NOBODY"),
        ("in <#C0GEN|general> and <#C0X>", "in #general and #C0X"),
        ("<!here> <!channel> <!everyone>", "@here @channel @everyone"),
        ("<!subteam^S0T|@team> and <!subteam^S0U>", "@team and @S0U"),
        ("<!date^1392734382^{date}|Feb 18>", "Feb 18"),
    ],
)
def test_slack_markup_becomes_what_the_person_saw(slack: str, plain: str) -> None:
    assert decode(slack, {"U0ALICE": "Alice"}) == plain


def test_mentioned_users_and_a_leading_mention() -> None:
    assert mentioned_users("<@U1> <@U2|bob> <@U1>") == ["U1", "U2"]
    assert strip_leading_mention("<@U0BOT> !stop", BOT) == ("!stop", True)
    assert strip_leading_mention("  <@U0BOT|bridge>: do it", BOT) == ("do it", True)
    assert strip_leading_mention("hey <@U0BOT>", BOT) == ("hey <@U0BOT>", False)
    assert strip_leading_mention("<@U0BOTX> hi", BOT) == ("<@U0BOTX> hi", False)


def test_a_command_after_a_mention_of_the_bot_is_a_command() -> None:
    parsed = to_event(event(text="<@U0BOT> !stop"), BOT, "B0BOT", ROOMS)
    assert isinstance(parsed, InboundMessage)
    assert parsed.text == "!stop"
    assert parsed.mentions_bot


def test_a_bare_mention_starts_nothing() -> None:
    assert to_event(event(text="<@U0BOT>"), BOT, "B0BOT", ROOMS) is None


def test_files_are_described_with_or_without_text() -> None:
    files = [
        {
            "id": "F1",
            "name": "x.png",
            "mimetype": "image/png",
            "size": 10,
            "url_private_download": "https://files.slack.com/F1/download/x.png",
        },
        {"id": "F2", "name": "y.png", "url_private": "https://files.slack.com/F2/y.png"},
        {"id": "F3", "mode": "tombstone"},  # deleted: nothing to fetch
        {"id": "F4", "file_access": "check_file_info"},  # a stub: files.info has the rest
    ]
    shared = to_event(event(subtype="file_share", text="", files=files), BOT, None, ROOMS)
    assert isinstance(shared, InboundMessage)
    assert shared.text == ""
    assert shared.attachments == (
        Attachment("x.png", "image/png", 10, "https://files.slack.com/F1/download/x.png"),
        Attachment("y.png", "application/octet-stream", None, "https://files.slack.com/F2/y.png"),
        Attachment("F4", "application/octet-stream", None, "slack-file:F4"),
    )
    with_text = to_event(event(subtype="file_share", text="look", files=files), BOT, None, ROOMS)
    assert isinstance(with_text, InboundMessage)
    assert (with_text.text, len(with_text.attachments)) == ("look", 3)
    mention = to_event(event(subtype="file_share", text="<@U0BOT>", files=files), BOT, None, ROOMS)
    assert isinstance(mention, InboundMessage)
    assert (mention.text, mention.mentions_bot) == ("", True)
    gone = to_event(event(subtype="file_share", text="", files=files[2:3]), BOT, None, ROOMS)
    assert gone is None


def test_the_token_goes_to_slack_hosts_and_the_configured_api_only() -> None:
    api = "http://127.0.0.1:4000/api/"
    assert may_have_token("https://files.slack.com/F1/x.png", "https://slack.com/api/")
    assert may_have_token("http://127.0.0.1:4000/files/F1", api)
    assert not may_have_token("http://files.slack.com/F1/x.png", api)  # not https
    assert not may_have_token("https://files.slack.com.evil.test/F1", api)
    assert not may_have_token("http://127.0.0.1:4001/files/F1", api)
    assert not may_have_token("https://evilslack.com/F1", api)


def edited(text: str, previous: str = "old", **original: Any) -> dict[str, Any]:
    inner = {"type": "message", "user": "U0ALICE", "text": text, "ts": "1.000001"}
    inner.update(original)
    return event(
        subtype="message_changed",
        hidden=True,
        ts="2.000001",
        event_ts="2.000001",
        message=inner,
        previous_message={**inner, "text": previous},
    )


def test_an_edit_names_the_original_message_and_its_new_text() -> None:
    parsed = to_event(edited("<@U0BOT> new words"), BOT, "B0BOT", ROOMS)
    assert isinstance(parsed, MessageEdited)
    assert (parsed.room.room_id, parsed.external_id) == ("C1", ExternalMessageId("1.000001"))
    assert parsed.text == "new words"


@pytest.mark.parametrize(
    "event",
    [
        edited("progress 2", user=BOT),  # the bridge's own progress edit
        edited("x", user=None, bot_id="B0BOT"),
        edited("unfurled", previous="unfurled"),  # a link preview, same text
        event(subtype="message_deleted", deleted_ts="1.5", previous_message={"user": BOT}),
    ],
)
def test_edits_and_deletions_that_are_not_a_persons_are_dropped(event: dict[str, Any]) -> None:
    assert to_event(event, BOT, "B0BOT", ROOMS) is None


def tombstone(previous_user: str = "U0ALICE") -> dict[str, Any]:
    """Slack's event for deleting a thread parent that has replies."""
    thread = {"ts": "1.000001", "thread_ts": "1.000001", "reply_count": 1}
    return event(
        subtype="message_changed",
        hidden=True,
        ts="3.000001",
        event_ts="3.000001",
        message={
            "type": "message",
            "subtype": "tombstone",
            "hidden": True,
            "user": "USLACKBOT",
            "text": "This message was deleted.",
            **thread,
        },
        previous_message={"type": "message", "user": previous_user, "text": "do X", **thread},
    )


@pytest.mark.parametrize(
    "event",
    [
        tombstone(),
        edited("<@U0BOT>", previous="<@U0BOT> do X"),  # nothing left to run
        edited("  ", previous="do X"),
    ],
)
def test_a_deleted_thread_parent_or_an_edit_to_no_text_is_a_deletion(
    event: dict[str, Any],
) -> None:
    parsed = to_event(event, BOT, "B0BOT", ROOMS)
    assert isinstance(parsed, MessageDeleted)
    assert (parsed.room.room_id, parsed.external_id) == ("C1", ExternalMessageId("1.000001"))


def test_the_bridges_own_deleted_thread_parent_is_dropped() -> None:
    assert to_event(tombstone(previous_user=BOT), BOT, "B0BOT", ROOMS) is None


def test_a_deletion_names_the_deleted_message() -> None:
    deleted = event(
        subtype="message_deleted",
        hidden=True,
        ts="3.000001",
        deleted_ts="1.000001",
        previous_message={"user": "U0ALICE", "ts": "1.000001", "text": "hi"},
    )
    parsed = to_event(deleted, BOT, "B0BOT", ROOMS)
    assert isinstance(parsed, MessageDeleted)
    assert parsed.external_id == "1.000001"
    assert dedup_key(deleted) != dedup_key(event(ts="1.000001"))


class Lookup:
    def __init__(self, names: dict[str, str]) -> None:
        self.names = names
        self.asked: list[str] = []

    async def __call__(self, user: str) -> str | None:
        self.asked.append(user)
        if user == "U0FAIL":
            raise RuntimeError("ratelimited")
        return self.names.get(user)


async def test_display_names_are_cached_bounded_and_failures_cost_only_the_name() -> None:
    now = [0.0]
    lookup = Lookup({"U1": "One", "U2": "Two", "U3": "Three"})
    names = DisplayNames(
        lookup, CachePolicy(size=2, ttl_s=100, failure_ttl_s=10), clock=lambda: now[0]
    )
    assert await names.resolve(["U1", "U2", "U1"]) == {"U1": "One", "U2": "Two"}
    assert await names.resolve(["U1"]) == {"U1": "One"}
    assert lookup.asked == ["U1", "U2"]
    assert await names.resolve(["U3", "U0FAIL"]) == {"U3": "Three"}
    await names.resolve(["U0FAIL"])  # a failure is remembered for a while...
    assert lookup.asked.count("U0FAIL") == 1
    now[0] = 11
    await names.resolve(["U0FAIL"])  # ...then asked again
    assert lookup.asked.count("U0FAIL") == 2
    await names.resolve(["U1"])  # evicted by the bound of two
    assert lookup.asked.count("U1") == 2


def test_the_wait_budget_is_shared_capped_and_refills() -> None:
    now = [0.0]
    budget = WaitBudget(capacity_s=0.5, refill_per_s=0.1, clock=lambda: now[0])
    assert budget.take(1.0) == 0.5
    assert budget.take(1.0) == 0.0
    now[0] = 2.0
    assert budget.take(1.0) == pytest.approx(0.2)
    budget.give_back(0.1)
    assert budget.take(1.0) == pytest.approx(0.1)
    now[0] = 100.0
    assert budget.take(1.0) == 0.5  # never more than the capacity


async def test_slow_lookups_stop_costing_waits_once_the_budget_is_spent() -> None:
    """Names of a users.info that never answers: one bounded wait, then ids at once."""
    now = [0.0]
    asked: list[str] = []

    async def never_answers(user: str) -> str | None:
        asked.append(user)
        await asyncio.Event().wait()
        return None

    budget = WaitBudget(capacity_s=0.2, refill_per_s=0.1, clock=lambda: now[0])
    names = DisplayNames(never_answers, budget=budget, clock=lambda: now[0])
    for user in ("U1", "U2", "U3", "U4", "U5", "U6"):
        assert await names.resolve([user]) == {}
    assert asked == ["U1"]  # cut after the budget's 0.2 s; the others not waited for
    assert names.skipped == 5
    now[0] = 2.0  # refilled
    assert await names.resolve(["U7"]) == {}
    assert asked == ["U1", "U7"]
