"""Approval requests in Matrix: a message marked as one, answered by reactions.

The bridge posts the request as a normal message carrying
:data:`MARKER` in its content and reacts to it itself with ✅ 🔁 ❌, so a
person only has to click one. A person's ``m.reaction`` (``m.annotation``)
with one of these keys on a request becomes an
:class:`~bridge.core.transport.ApprovalAction` (see :func:`.inbound.to_inbound`).
Whether the reacted-to event is a request is remembered for the ones this
process posted and looked up (the event, decrypted if need be) for the
others, so a reaction after a restart still counts.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping

from bridge.core.transport import ApprovalChoice

MARKER = "org.chatbridge.approval"
"""Content field of an approval request: ``{"ref": "#3"}``."""
REACTIONS: Mapping[str, ApprovalChoice] = {
    "✅": ApprovalChoice.ALLOW,
    "🔁": ApprovalChoice.ALLOW_SESSION,
    "❌": ApprovalChoice.DENY,
}
HOWTO = "React ✅ to allow once, 🔁 to allow for this session, ❌ to deny."
_VARIATION_SELECTOR = "\ufe0f"
"""Some clients send an emoji with it (``✅️``); it is the same reaction."""


def choice_of(key: str) -> ApprovalChoice | None:
    """The choice a reaction key stands for, or None for any other key."""
    return REACTIONS.get(key.replace(_VARIATION_SELECTOR, "").strip())


class KnownRequests:
    """Whether events are approval requests, as far as known (bounded, oldest forgotten)."""

    def __init__(self, size: int = 4096) -> None:
        self._size = size
        self._known: OrderedDict[str, bool] = OrderedDict()
        self.reactions: dict[str, list[str]] = {}
        """The bot's own reactions on requests it posted (to take back on closing)."""

    def get(self, event_id: str) -> bool | None:
        """True or False when known; None when the event must be looked up."""
        return self._known.get(event_id)

    def note(self, event_id: str, is_request: bool) -> None:
        self._known[event_id] = is_request
        self._known.move_to_end(event_id)
        while len(self._known) > self._size:
            forgotten, _ = self._known.popitem(last=False)
            self.reactions.pop(forgotten, None)
