"""Review 5: a member's *user name* (localpart) is a glob to Synapse too.

``.m.rule.contains_user_name`` is an ``event_match`` on ``content.body`` with
``pattern_type: user_localpart``; Synapse builds its matcher with
``get_glob_matcher(localpart, GlobMatchType::Word)`` (rust/src/push/evaluator.rs,
utils.rs), the same glob semantics as the display name. Historical user ids
(spec: localpart chars %x21-39 / %x3B-7E) may hold ``*`` and ``?``. The glob
check in ``must_declare`` looks at the display name only. (``[`` is escaped by
Synapse's glob_to_regex: it does not matter, for either name.)
"""

from __future__ import annotations

import pytest
from nio import MatrixRoom

from transports.matrix.mentions import must_declare

BOT = "@chatbridge:localhost"


@pytest.mark.parametrize(
    ("user_id", "text"),
    [
        ("@b?b:localhost", "Bob: the build is green"),
        ("@al*:localhost", "ask alice"),
    ],
)
def test_a_glob_in_a_members_localpart_declares_mentions(user_id: str, text: str) -> None:
    room = MatrixRoom("!r:localhost", BOT)
    room.add_member(BOT, "Chatbridge Bot", None)
    room.add_member(user_id, None, None)  # no display name: the user name rule alone
    assert must_declare(text, room, BOT)
