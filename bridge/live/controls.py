"""What commands may ask of a room's live run, without knowing the runner.

The bridge implements :class:`LiveControls` over the runner's ``RunControl``
(docs/live-runs.md); the command handler and the approval desk only call it,
so they are tested with a fake.
"""

from __future__ import annotations

from typing import Protocol

from bridge.core.model import RoomKey, SessionId, UserId
from bridge.core.transport import ApprovalChoice
from bridge.store.base import Approval


class LiveControls(Protocol):
    async def decide(
        self,
        approval: Approval,
        choice: ApprovalChoice,
        sender: UserId | None,
        reason: str,
        *,
        shown: str = "",
    ) -> str:
        """Hand a decision the store has just recorded to the run that asked.

        Called once per request (after the store's compare-and-set). For a
        denial ``reason`` is the message claude gets (``deny_message`` or
        ``timeout_message``); ``sender`` is None for an expiry. ``shown``:
        said with the outcome where the request is shown (the rule the answer
        kept: a button's clicker gets no other answer). Returns a note for the
        room ("" when there is nothing to add, e.g. "the run had already ended").
        """
        ...

    async def session_of(self, approval: Approval) -> SessionId | None:
        """The Claude session the request's run writes to (where a session rule holds);
        None if it is not known."""
        ...

    async def apply_rules(self, room: RoomKey) -> None:
        """A rule of ``room`` was just kept: decide by it the waiting requests it covers."""
        ...

    async def room_session(self, room: RoomKey) -> SessionId | None:
        """The Claude session of ``room``'s conversation now: its running run's, else the
        one its next run resumes; None for none."""
        ...

    async def set_model(self, room: RoomKey, name: str) -> str:
        """Switch the room's running run, if any, to model ``name`` (the store keeps it
        for the next runs). Returns a note for the room, "" for none."""
        ...

    async def set_mode(self, room: RoomKey, mode: str) -> str:
        """Switch the room's running run, if any, to permission mode ``mode``. Returns a note."""
        ...
