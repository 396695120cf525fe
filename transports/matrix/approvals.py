"""Approval requests in Matrix: a message marked as one, answered by reactions.

The bridge posts the request as a normal message carrying
:data:`MARKER` in its content and reacts to it itself with ✅ 🔁 ❌ (a plan's
too: start with edits asked, with edits accepted, keep planning; a question
of one choice gets 1️⃣ … instead), so a person only has to click one. A reply
to a question is its answer (docs/live-runs.md, "Questions and plans").
A person's ``m.reaction`` (``m.annotation``)
with one of these keys on a request becomes an
:class:`~bridge.core.transport.ApprovalAction` (see :func:`.inbound.to_inbound`).
Whether the reacted-to event is a request is remembered for the ones this
process posted and looked up (the event, decrypted if need be) for the
others, so a reaction after a restart still counts.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping

from bridge.core.transport import ApprovalChoice, Asked, AskKind

MARKER = "org.chatbridge.approval"
"""Content field of an approval request: ``{"ref": "#3", "kind": "question"}`` (no kind:
a tool use's, as posted before questions had their own)."""
REACTIONS: Mapping[str, ApprovalChoice] = {
    "✅": ApprovalChoice.ALLOW,
    "🔁": ApprovalChoice.ALLOW_SESSION,
    "❌": ApprovalChoice.DENY,
}
HOWTO = "React ✅ to allow once, 🔁 to allow for this session, ❌ to deny."
PLAN_HOWTO = (
    "React ✅ to start with each edit asked, 🔁 to start with edits accepted,"
    " ❌ to keep planning (or reply with what to change)."
)
QUESTION_HOWTO = (
    "Reply to this message with the option's number (`1`), several (`1,3`) or your words."
)
NUMBERS = tuple(f"{n}\ufe0f\u20e3" for n in range(1, 10))
"""1️⃣ … 9️⃣: the reactions that answer a question of one choice."""
_KEYCAP = "\u20e3"
_VARIATION_SELECTOR = "\ufe0f"
"""Some clients send an emoji with it (``✅️``); it is the same reaction."""


def choice_of(key: str) -> ApprovalChoice | None:
    """The choice a reaction key stands for, or None for any other key."""
    return REACTIONS.get(key.replace(_VARIATION_SELECTOR, "").strip())


def number_of(key: str) -> str | None:
    """The option a number reaction (1️⃣ … 9️⃣) answers (``"2"``), or None."""
    bare = key.replace(_VARIATION_SELECTOR, "").strip()
    if len(bare) == 2 and bare[1] == _KEYCAP and bare[0] in "123456789":
        return bare[0]
    return None


def offered(asked: Asked) -> tuple[tuple[str, ...], str]:
    """The reactions the bot offers on a request, and the line that says how to answer."""
    if asked.kind is AskKind.PLAN:
        return tuple(REACTIONS), PLAN_HOWTO
    if asked.kind is AskKind.QUESTION:
        if len(asked.questions) == 1 and not asked.questions[0].multi:
            count = min(len(asked.questions[0].options), len(NUMBERS))
            if count:
                return NUMBERS[:count], f"{QUESTION_HOWTO} Or react with its number."
        several = _SEVERAL if len(asked.questions) > 1 else ""
        return (), QUESTION_HOWTO + several
    return tuple(REACTIONS), HOWTO


_SEVERAL = " One answer per question, separated by `;`."
WIDEST_HOWTO = max(
    (HOWTO, PLAN_HOWTO, f"{QUESTION_HOWTO} Or react with its number.", QUESTION_HOWTO + _SEVERAL),
    key=len,
)
"""The longest line :func:`offered` adds: what a request's text must leave room for."""


class KnownRequests:
    """Whether events are approval requests, as far as known (bounded, oldest forgotten)."""

    def __init__(self, size: int = 4096) -> None:
        self._size = size
        self._known: OrderedDict[str, str] = OrderedDict()
        """Each event's kind of request (:class:`~bridge.core.transport.AskKind`), or ""."""
        self.reactions: dict[str, list[str]] = {}
        """The bot's own reactions on requests it posted (to take back on closing)."""

    def get(self, event_id: str) -> bool | None:
        """True or False when known; None when the event must be looked up."""
        kind = self._known.get(event_id)
        return None if kind is None else bool(kind)

    def kind(self, event_id: str) -> str | None:
        """The request's kind (``tool``, ``question``, ``plan``), "" for no request, None
        when the event must be looked up."""
        return self._known.get(event_id)

    def note(self, event_id: str, is_request: bool, kind: str = AskKind.TOOL.value) -> None:
        self._known[event_id] = kind if is_request else ""
        self._known.move_to_end(event_id)
        while len(self._known) > self._size:
            forgotten, _ = self._known.popitem(last=False)
            self.reactions.pop(forgotten, None)
