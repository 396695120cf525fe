"""The runs going on now, by room: what chat reaches while claude works.

The executor binds each run's :class:`~runner.control.RunControl` here once
claude is spawned (also after a reattach) and unbinds it when the run ends;
commands, buttons, reactions, expiry and steering find the run through it.
At most one run per room is bound (the dispatcher's rule), so a room names
its run.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from bridge.core.model import RoomKey, RunId, SessionId
from bridge.live.questions import PLAN
from dispatcher.lending import Reclaim, SlotLease
from runner.control import RunControl
from runner.events import PermissionAsked, ToolUse


@dataclass(slots=True)
class _Bound:
    run_id: RunId
    control: RunControl
    asked: dict[str, PermissionAsked] = field(default_factory=dict)
    """claude's requests by id: an answer allows the input claude asked with."""
    session: SessionId | None = None
    """The Claude session the run writes to (its ``init``): session rules hold in it."""
    doing: str = ""
    """The last tool use claude announced, as the progress message says it (the web
    console's "last thing claude did")."""
    planned: dict[str, dict[str, Any]] = field(default_factory=dict)
    """The inputs of claude's ExitPlanMode tool uses by tool_use id: the plan, which the
    request itself does not hold (docs/live-runs.md)."""
    slot: SlotLease | None = None
    """The run's run slot, lent while it waits for a person (None: not the dispatcher's)."""


@dataclass(slots=True)
class LiveRuns:
    _rooms: dict[RoomKey, _Bound] = field(default_factory=dict)

    def bind(
        self, room: RoomKey, run_id: RunId, control: RunControl, slot: SlotLease | None = None
    ) -> None:
        self._rooms[room] = _Bound(run_id, control, slot=slot)

    def lend(self, room: RoomKey, run_id: RunId) -> None:
        """The run waits for a person: its run slot may serve another room meanwhile."""
        bound = self._rooms.get(room)
        if bound is not None and bound.run_id == run_id and bound.slot is not None:
            bound.slot.lend()

    def reclaim(self, room: RoomKey, run_id: RunId) -> Reclaim | None:
        """The run is to go on: its slot back; None if it need not wait (it holds one,
        or it is not bound here)."""
        bound = self._rooms.get(room)
        if bound is None or bound.run_id != run_id or bound.slot is None:
            return None
        reclaim = bound.slot.reclaim()
        return None if reclaim.resumed.done() else reclaim

    def went_on(self, room: RoomKey, run_id: RunId) -> None:
        """claude works on without an answer (it withdrew its request): the run holds a
        run slot again at once."""
        bound = self._rooms.get(room)
        if bound is not None and bound.run_id == run_id and bound.slot is not None:
            bound.slot.went_on()

    def _bound(self, room: RoomKey, run_id: RunId | None) -> _Bound | None:
        """The room's bound run, if it is ``run_id`` (any run, when None)."""
        bound = self._rooms.get(room)
        if bound is None or (run_id is not None and bound.run_id != run_id):
            return None
        return bound

    def unbind(self, room: RoomKey, run_id: RunId) -> None:
        if self._bound(room, run_id) is not None:
            del self._rooms[room]

    def control(self, room: RoomKey, run_id: RunId | None = None) -> RunControl | None:
        """The room's running run's control (only if it is ``run_id``, when given)."""
        bound = self._bound(room, run_id)
        return None if bound is None else bound.control

    def asked(self, room: RoomKey, run_id: RunId, event: PermissionAsked) -> None:
        if (bound := self._bound(room, run_id)) is not None:
            bound.asked[event.request_id] = event

    def used(self, room: RoomKey, run_id: RunId, use: ToolUse) -> None:
        """claude's model called a tool; a plan's is kept until its request comes."""
        if use.name == PLAN and (bound := self._bound(room, run_id)) is not None:
            bound.planned[use.id] = use.input

    def full_input(self, room: RoomKey, run_id: RunId, event: PermissionAsked) -> dict[str, Any]:
        """The request's input, completed from its tool_use block when the request's is
        empty (ExitPlanMode's plan)."""
        bound = self._bound(room, run_id)
        if event.input or bound is None:
            return event.input
        return bound.planned.get(event.tool_use_id, event.input)

    def request(self, room: RoomKey, run_id: RunId, request_id: str) -> PermissionAsked | None:
        bound = self._bound(room, run_id)
        return None if bound is None else bound.asked.get(request_id)

    def started(self, room: RoomKey, run_id: RunId, session: SessionId) -> None:
        """The run writes to ``session`` (claude's ``init``)."""
        if (bound := self._bound(room, run_id)) is not None:
            bound.session = session

    def session(self, room: RoomKey, run_id: RunId | None = None) -> SessionId | None:
        """The session the room's run (only if it is ``run_id``, when given) writes to;
        None if unknown or no such run is bound."""
        bound = self._bound(room, run_id)
        return None if bound is None else bound.session

    def did(self, room: RoomKey, run_id: RunId, what: str) -> None:
        """claude announced a tool use, described as ``what``."""
        if (bound := self._bound(room, run_id)) is not None:
            bound.doing = what

    def doing(self, run_id: str) -> str | None:
        """What run ``run_id`` (if it runs here) did last; None if it does not run here."""
        for bound in self._rooms.values():
            if bound.run_id == run_id:
                return bound.doing or "working"
        return None
