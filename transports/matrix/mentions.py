"""Whether an event the bot sends must declare that it mentions no one.

An event with ``m.mentions`` is notified by its declared mentions alone: the
homeserver's legacy push rules, which notify a member whose display name or
user name appears in the body and everyone on ``@room``, are off for it. The
bot declares ``m.mentions: {}`` so that a name or an ``@room`` in an answer
notifies nobody. Without any such text the legacy rules cannot fire, and the
event notifies exactly the same without the declaration, which Synapse checks
at a cost: it validates ``m.mentions`` against a JSON schema on every event
(about 4 ms on the answer's ``PUT``, measured 2026-11-27, Synapse 1.163).

So the declaration is left out only when it cannot matter: the text holds no
``@room`` and none of the room's members' names, compared as substrings
without case (the rules want whole words; any occurrence counts here). A
name with a glob character (``*``, ``?``) always counts: the homeserver
matches display names and user names as globs, so ``B?b`` is notified by
"Bob" and ``*`` by anything.

A member who joined or was renamed after the bot's last sync is not known
here: the sync is a long poll, so that gap is the time the homeserver takes
to tell the bot, and the text would have to name them meanwhile.
"""

from __future__ import annotations

from nio import MatrixRoom

from transports.matrix.inbound import localpart

ROOM_MENTION = "@room"
GLOB = frozenset("*?")
"""Characters the homeserver's legacy rules read as a pattern in a name (it escapes
the others, ``[`` included)."""


def must_declare(text: str, room: MatrixRoom | None, own_user_id: str) -> bool:
    """Whether ``text``, sent by ``own_user_id`` in ``room`` without ``m.mentions``,
    could notify anyone by a legacy rule (an unknown room: it could)."""
    if room is None:
        return True
    folded = _forms(text)
    if any(ROOM_MENTION in form for form in folded):
        return True
    for user_id, user in room.users.items():
        if user_id == own_user_id:
            continue  # nobody is notified of their own event
        for name in (user.display_name, localpart(user_id)):
            if name and GLOB.intersection(name):
                return True  # a pattern: it may match text that does not hold it
            if name and any(a in b for a, b in zip(_forms(name), folded, strict=True)):
                return True
    return False


def _forms(text: str) -> tuple[str, str]:
    """``text`` lowered and case-folded: a name matches if either form does, a
    superset of the homeserver's case-insensitive match."""
    return text.lower(), text.casefold()
