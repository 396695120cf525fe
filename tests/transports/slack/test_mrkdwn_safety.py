"""No text rendered for Slack can mention, ping or broadcast.

Slack reads ``<@U1>``, ``<!channel>``, ``<!here>``, ``<!subteam^S1>`` and
``<#C1>`` as mentions; the renderer may emit ``<`` only to open a link to an
``http(s)``/``mailto`` target. The property: strip the links the renderer
writes, and no ``<`` is left.
"""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from transports.slack.mrkdwn import to_mrkdwn

# A link as the renderer writes it: safe scheme, no separators in the target,
# a label without angle brackets.
_OWN_LINK = re.compile(r"<(?:https?://|mailto:)[^\s<>|]+(?:\|[^<>]*)?>", re.IGNORECASE)
_MENTION = re.compile(r"<[!@#]")


def unsafe_remainder(mrkdwn: str) -> str:
    """What is left of ``mrkdwn`` once the renderer's own links are removed."""
    return _OWN_LINK.sub("", mrkdwn)


@pytest.mark.parametrize(
    "markdown",
    [
        "[x](!channel)",
        "[x](@U0ALICE)",
        "[x](#C0GENERAL)",
        "[x](!subteam^S0TEAM)",
        "[all](!here)",
        "<!channel> <!here> <@U1> <#C1|general> <!subteam^S1|@team>",
        "<https://x.test|<!channel>>",
        "<https://x.test|a<!channel>>",
        "[a](https://x.test/<!channel>)",
        "[a](javascript:alert(1))",
        "&lt;!channel&gt;",
        "`code`<!here>`",
        "**<!channel>**",
        "> <@U1>",
        "| <!channel> |",
        "```\n<!channel>\n```",
        # The "Unknown command" echo around a user's word with a link in it.
        "Unknown command `!x`[a](!channel)`; try `!help`.",
    ],
)
def test_known_breakouts_do_not_mention(markdown: str) -> None:
    rendered = to_mrkdwn(markdown)
    assert "<" not in unsafe_remainder(rendered), rendered
    assert not _MENTION.search(rendered), rendered


def test_safe_links_are_still_links() -> None:
    assert to_mrkdwn("[docs](https://x.test/a?b=1&c=2)") == "<https://x.test/a?b=1&amp;c=2|docs>"
    assert to_mrkdwn("[mail](mailto:a@x.test)") == "<mailto:a@x.test|mail>"
    assert to_mrkdwn("see <http://x.test>") == "see <http://x.test>"
    # A link that may not be one is shown as the text that was written.
    assert to_mrkdwn("[x](!channel)") == "[x](!channel)"
    assert to_mrkdwn("<https://x.test|<!here>>") == "<https://x.test%7C%3C!here>&gt;"


# Text that likes the characters which matter: brackets, sigils, markup.
_ALPHABET = st.sampled_from(list("<>&|!@#^[]()*_~`:/ \nhtpsmailoUCS1x.-"))
_PIECES = st.sampled_from(
    [
        "<!channel>",
        "<!here>",
        "<@U1>",
        "<#C1|x>",
        "<!subteam^S1|@t>",
        "https://",
        "mailto:",
        "](",
        "```",
        "**",
        "&lt;",
        "&amp;",
        "| a |",
        "> ",
        "- ",
        "# ",
    ]
)
_TEXT = st.lists(st.one_of(_ALPHABET, _PIECES), max_size=60).map("".join)


@settings(max_examples=2000, deadline=None)
@given(_TEXT)
def test_no_text_renders_a_mention(markdown: str) -> None:
    rendered = to_mrkdwn(markdown)
    assert "<" not in unsafe_remainder(rendered), rendered
    assert not _MENTION.search(rendered), rendered


@settings(max_examples=500, deadline=None)
@given(st.text())
def test_no_unicode_text_renders_a_mention(markdown: str) -> None:
    assert "<" not in unsafe_remainder(to_mrkdwn(markdown))
