"""Whether an event the bot sends must declare that it mentions no one.

The bot declares ``m.mentions: {}`` so that a name or ``@room`` in its text notifies nobody,
and leaves the declaration out (Synapse validates it at a cost) only when the text holds no
``@room`` and none of the room's members' names, compared as substrings without case; a
name with a glob character always counts (docs/deployment.md, "Matrix bot account" and
"Inside the Matrix transport").
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
