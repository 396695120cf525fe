"""Tool-use requests from a run to the room and answers back (docs/live-runs.md).

claude asks (``PermissionAsked``, with ``approve_tools``): the request is
recorded (idempotent on the run and claude's request id, so a reattach that
replays the journal finds it again), posted once with its actions (Slack
buttons, Matrix reactions; commands everywhere), and then waits for an
answer: a command, a button, a reaction, its expiry, or its run's end. Every
answer goes through :class:`~bridge.approval_desk.ApprovalDesk` (judged,
recorded by compare-and-set) and reaches claude here (:meth:`decide`), which
also shows the request as decided.

A request already decided when it is asked again (the decision was recorded
but the bridge stopped before claude got it) is answered again from the
record: claude never waits on an answer the room already gave.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from bridge.approval_desk import ApprovalDesk
from bridge.approval_text import parse_input
from bridge.approvals import WITHDRAWN, Verdict, cancel_reason, timeout_message
from bridge.config import Settings
from bridge.core.model import Batch, ReplyKind, RoomKey, RunId, UserId
from bridge.core.transport import Accepted, ApprovalAction, ApprovalChoice
from bridge.live_runs import LiveRuns
from bridge.questions import (
    INTERACTIVE,
    NO_EXPIRY_S,
    answer_decision,
    deny_text,
    outcome,
    request_message,
)
from bridge.replies import Replier, in_conversation
from bridge.store.base import Approval, ApprovalState, Store, StoreError
from runner.control import Allow, ControlError, Deny, InputClosed, RunControl
from runner.events import PermissionAsked

log = logging.getLogger(__name__)

POSTING_WAIT_S = 10.0
"""How long an action on an unknown message waits for requests still being posted."""
EXPIRY_CHECK_S = 5.0
"""How often waiting requests are checked for their expiry (a 900 s default wait)."""

_CHOICES = {
    ApprovalState.ALLOWED: ApprovalChoice.ALLOW,
    ApprovalState.ALLOWED_SESSION: ApprovalChoice.ALLOW_SESSION,
    ApprovalState.DENIED: ApprovalChoice.DENY,
    ApprovalState.EXPIRED: ApprovalChoice.DENY,
}


@dataclass(slots=True)
class ApprovalFlow:
    """Implements :class:`~bridge.live_controls.LiveControls` over the live runs."""

    settings: Settings
    store: Store
    replier: Replier
    runs: LiveRuns
    refused: Callable[[Verdict], None]
    wall_clock: Callable[[], float] = time.time
    owns: Callable[[RoomKey], bool] = lambda room: True
    """Whether this process runs ``room``'s conversation (with replicas, its owner does)."""
    forward: Callable[[ApprovalAction, RoomKey], Awaitable[None]] | None = None
    """Hands an action on another replica's request to that replica."""
    _posting: set[asyncio.Future[None]] = field(default_factory=set)
    """Asks posting their request now: a click may come before its id is recorded."""

    def desk(self) -> ApprovalDesk:
        return ApprovalDesk(
            self.store, self.settings.room, self, self.refused, self.wall_clock, self.owns
        )

    # -- from the run --

    async def ask(self, run_id: RunId, batch: Batch, event: PermissionAsked) -> None:
        """claude asks to use a tool: record, post (once), or answer again from the record."""
        room = self.settings.room(batch.room)
        if room is None:
            return
        self.runs.asked(batch.room, run_id, event)
        now = self.wall_clock()
        interactive = event.tool_name in INTERACTIVE
        wait_s = room.question_timeout_s if interactive else room.approval_timeout_s
        approval = await self.store.add_approval(
            batch.room,
            run_id,
            event.request_id,
            tool_name=event.tool_name,
            # A plan's request holds {}: the plan is in claude's tool_use block.
            input_json=json.dumps(
                self.runs.full_input(batch.room, run_id, event), ensure_ascii=False
            ),
            asked_at=now,
            expires_at=now + (wait_s or NO_EXPIRY_S),
        )
        choice = _CHOICES.get(approval.state)
        if choice is not None:
            # Decided before a restart, never received: say it again.
            told = approval.reason if choice is ApprovalChoice.DENY else ""
            if approval.state is ApprovalState.EXPIRED:
                told = timeout_message(approval.expires_at - approval.asked_at)
            elif choice is ApprovalChoice.DENY:
                told = deny_text(approval.tool_name, approval.reason)
            if not await self._answer(approval, choice, told):
                # Delivered only now: the bridge stopped before showing the outcome too
                # (a request still showing its buttons would be clicked in vain).
                await self._show(approval)
            return
        if approval.state is not ApprovalState.PENDING or approval.message_id is not None:
            return
        text = request_message(approval, self.settings.commands.prefix, wait_s)
        # Done once the post is recorded (or failed): a click waits for this, not for
        # the task posting, which is the run's own and lives as long as the run.
        posting: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._posting.add(posting)
        try:
            posted = await self.replier.post_approval(
                in_conversation(batch, text, ReplyKind.NOTICE), f"#{approval.number}"
            )
            if posted is not None:
                await self.store.set_approval_message(approval, posted)
        finally:
            self._posting.discard(posting)
            posting.set_result(None)

    async def run_ended(self, room: RoomKey, run_id: RunId, how: str) -> None:
        """The run is over: what it still waited on can no longer be answered."""
        await self.show(await self.cancel_run(run_id, how))

    async def cancel_run(self, run_id: RunId, how: str) -> list[Approval]:
        """Cancel the ended run's waiting requests in the store (not shown yet); them."""
        try:
            return await self.store.cancel_approvals(run_id, cancel_reason(how), self.wall_clock())
        except StoreError:
            log.warning("could not cancel the tool requests of run %s", run_id, exc_info=True)
            return []

    async def show(self, approvals: list[Approval]) -> None:
        """Show the requests as decided (their messages lose their actions)."""
        for approval in approvals:
            await self._show(approval)

    async def withdrawn(self, room: RoomKey, run_id: RunId, request_id: str) -> None:
        """claude withdrew a request (an interrupt while it asked): nobody answers it now."""
        try:
            cancelled = await self.store.cancel_approvals(
                run_id, WITHDRAWN, self.wall_clock(), (request_id,)
            )
        except StoreError:
            log.warning("could not cancel a withdrawn request of run %s", run_id, exc_info=True)
            return
        for approval in cancelled:
            await self._show(approval)

    # -- from the room --

    async def on_action(self, action: ApprovalAction) -> Accepted:
        """A button or reaction on a request message."""
        approval = await self.store.approval_by_message(action.room, action.message_id)
        if approval is None and self._posting:
            # A person may click within milliseconds of the post, before its id is
            # recorded: wait for the requests being posted, then look again.
            await asyncio.wait(set(self._posting), timeout=POSTING_WAIT_S)
            approval = await self.store.approval_by_message(action.room, action.message_id)
        if approval is None:
            # Said at info: a click that decides nothing is what a person will ask about.
            log.info(
                "a %s by %s on %s in %s: no tool request was posted as that message; ignored",
                action.choice.value, action.sender, action.message_id, action.room,
            )  # fmt: skip
            return Accepted.IGNORED
        if not self.owns(approval.room) and self.forward is not None:
            # Its run is another replica's: that one answers claude and the room.
            await self.forward(action, approval.room)
            return Accepted.ACCEPTED
        text = await self.desk().answer(action.sender, approval, action.choice)
        log.info(
            "request #%d in %s: %s by %s: %s",
            approval.number, action.room, action.choice.value, action.sender, text,
        )  # fmt: skip
        return Accepted.ACCEPTED

    async def expire_due(self) -> int:
        """Deny the requests nobody answered in time; how many."""
        return len(await self.desk().expire_due())

    async def expire_forever(self) -> None:
        while True:
            try:
                await self.expire_due()
            except StoreError:
                log.warning("checking tool requests for expiry failed", exc_info=True)
            await asyncio.sleep(EXPIRY_CHECK_S)

    # -- LiveControls --

    async def decide(
        self, approval: Approval, choice: ApprovalChoice, sender: UserId | None, reason: str
    ) -> str:
        note = await self._answer(approval, choice, reason)
        await self._show(approval)
        return note

    async def set_model(self, room: RoomKey, name: str) -> str:
        return await self._switch(room, "model", lambda control: control.set_model(name))

    async def set_mode(self, room: RoomKey, mode: str) -> str:
        return await self._switch(room, "mode", lambda control: control.set_permission_mode(mode))

    async def _switch(
        self, room: RoomKey, what: str, change: Callable[[RunControl], Awaitable[None]]
    ) -> str:
        """Apply ``change`` to the room's running run, if any; a note for the room."""
        control = self.runs.control(room)
        if control is None or not control.accepting:
            return ""
        try:
            await change(control)
        except (ControlError, InputClosed) as exc:
            return f"The running run keeps its {what} ({exc}); the next runs use it."
        return "The running run uses it from its next step."

    async def _answer(self, approval: Approval, choice: ApprovalChoice, told: str) -> str:
        control = self.runs.control(approval.room, approval.run_id)
        if control is None:
            return "(The run had already ended.)"
        asked = self.runs.request(approval.room, approval.run_id, approval.request_id)
        decision: Allow | Deny
        if choice is ApprovalChoice.DENY:
            decision = Deny(told)
        elif approval.tool_name in INTERACTIVE:
            decision = answer_decision(approval, choice)
        else:
            tool_input = asked.input if asked is not None else parse_input(approval.input_json)
            session = choice is ApprovalChoice.ALLOW_SESSION and asked is not None
            decision = Allow(tool_input, asked.suggestions if session and asked else ())
        try:
            delivered = control.answer(approval.request_id, decision)
        except InputClosed:
            return "(The run had already ended.)"
        # False: answered already (a replay after a restart), or withdrawn by claude.
        return "" if delivered else "(claude no longer waits on it.)"

    async def _show(self, approval: Approval) -> None:
        if self._posting:
            # Answered while still being posted (a command typed as the request appears;
            # Matrix adds its reactions before the post returns): its message id is
            # recorded once the post is done, and only then can it be edited.
            await asyncio.wait(set(self._posting), timeout=POSTING_WAIT_S)
        current = await self.store.approval_by_number(approval.room, approval.number)
        shown = current or approval
        if shown.message_id is not None:
            await self.replier.close_approval(shown.room, shown.message_id, outcome(shown))
