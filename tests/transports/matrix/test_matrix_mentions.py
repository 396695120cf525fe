"""When the bot's events must declare ``m.mentions: {}`` (transports.matrix.mentions)."""

from __future__ import annotations

import pytest
from nio import MatrixRoom

from transports.matrix.mentions import must_declare

BOT = "@chatbridge:hs"


def room() -> MatrixRoom:
    r = MatrixRoom("!r:hs", BOT)
    r.add_member(BOT, "Chatbridge Bot", None)
    r.add_member("@alice:hs", "Alice Liddell", None)
    r.add_member("@bob:hs", None, None)
    r.add_member("@gretchen:hs", "Straße", None, invited=True)
    return r


@pytest.mark.parametrize(
    "text",
    [
        "done, @room",
        "done, @ROOM",
        "ask alice liddell",  # a display name, any case
        "ALICE LIDDELL knows",
        "ping alice",  # a user name (localpart)
        "bob's build",
        "the strasse is closed",  # case-folded: ß is ss
        "ask Straße",  # an invited member counts
        "alicebob",  # inside a word too: more than the rules match, never less
    ],
)
def test_text_that_could_notify_someone_is_declared(text: str) -> None:
    assert must_declare(text, room(), BOT)


@pytest.mark.parametrize(
    "text", ["all done", "the build is green", "chatbridge bot finished", "room for two", ""]
)
def test_text_that_names_no_one_else_is_not(text: str) -> None:
    # The bot's own names notify nobody: the sender is never notified.
    assert not must_declare(text, room(), BOT)


def test_a_room_not_known_yet_is_declared_whatever_the_text() -> None:
    assert must_declare("all done", None, BOT)
