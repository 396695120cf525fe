"""Tool-use requests from a run to the room and answers back.

A ``PermissionAsked`` is recorded (idempotent, so a reattach finds it again), decided by a
kept rule (:mod:`bridge.live.tool_rules`) or posted once with its actions, and answered by a
command, button, reaction, expiry or the run's end, each judged and recorded through
:class:`~bridge.live.approval_desk.ApprovalDesk` before :meth:`decide` tells claude. claude is
only ever told "allow this input" or "deny" (docs/live-runs.md, "Tool requests" and "Tool rules").
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol

from bridge.config import Settings
from bridge.core.model import (
    Batch,
    ExternalMessageId,
    Reply,
    ReplyKind,
    RoomKey,
    RunId,
    SessionId,
    UserId,
)
from bridge.core.transport import Accepted, ApprovalAction, ApprovalChoice
from bridge.host.worktrees import in_worktree
from bridge.live.approval_desk import ApprovalDesk, DeskStore
from bridge.live.approval_text import code_span, parse_input, request_text
from bridge.live.approvals import (
    WITHDRAWN,
    Verdict,
    cancel_reason,
    judge,
    timeout_message,
)
from bridge.live.questions import (
    ASK,
    INTERACTIVE,
    NO_EXPIRY_S,
    PLAN,
    AnswerError,
    answer_decision,
    asked_of,
    deny_text,
    outcome,
    plan_of,
    questions,
    read_answers,
    request_message,
)
from bridge.live.registry import LiveRuns
from bridge.live.tool_rules import ruling
from bridge.live.tool_view import ToolView, ends, input_digest, render
from bridge.outbound.replies import Replier, in_conversation
from bridge.store.base import (
    Approval,
    ApprovalAsk,
    ApprovalDecision,
    ApprovalState,
    RoomStore,
    RuleEffect,
    StoreError,
    ToolRule,
)
from runner.control import Allow, ControlError, Deny, InputClosed, RunControl
from runner.events import PermissionAsked

log = logging.getLogger(__name__)

POSTING_WAIT_S = 10.0
"""How long an action on an unknown message waits for requests still being posted."""
SHORT_BLOCK = 1200
"""Characters of a long field a shortened request shows (head and tail), to start with."""
MIN_BLOCK = 80
CHANGED = "Denied: this tool use is not the one the user was shown and approved. Ask again."
STALE = (
    "Denied: the file changed since the user was shown this edit, so it would not do"
    " what they approved. Read the file again and ask again."
)
QUEUED = "Queued:"
"""Begins the note of an answer that waits for its run's slot back."""
HANDED_OVER = (
    "(Recorded. claude hears it from the replica running this conversation: the run"
    " goes on at once, or, if every run slot there is busy, when a run slot frees.)"
)
"""The note of an answer taken here for a run another replica runs."""
WITHDRAWN_UNHEARD = (
    "claude withdrew the request (a new message interrupted it) before it heard this"
    " answer, which waited for a run slot: it did not run."
)
ENDED_UNHEARD = (
    "The run ended before claude heard this answer, which waited for a run slot: it did not run."
)
EXPIRY_CHECK_S = 5.0
"""How often waiting requests are checked for their expiry (a 900 s default wait)."""

_CHOICES = {
    ApprovalState.ALLOWED: ApprovalChoice.ALLOW,
    ApprovalState.ALLOWED_SESSION: ApprovalChoice.ALLOW_SESSION,
    ApprovalState.DENIED: ApprovalChoice.DENY,
    ApprovalState.EXPIRED: ApprovalChoice.DENY,
}


class FlowStore(DeskStore, RoomStore, Protocol):
    """The store's roles :class:`ApprovalFlow` uses (and the desk it makes)."""


@dataclass(slots=True)
class ApprovalFlow:
    """Implements :class:`~bridge.live.controls.LiveControls` over the live runs."""

    settings: Settings
    store: FlowStore
    replier: Replier
    runs: LiveRuns
    refused: Callable[[Verdict], None]
    wall_clock: Callable[[], float] = time.time
    owns: Callable[[RoomKey], bool] = lambda room: True
    """Whether this process runs ``room``'s conversation (with replicas, its owner does)."""
    forward: Callable[[ApprovalAction, RoomKey], Awaitable[None]] | None = None
    """Hands an action on another replica's request to that replica."""
    hand_over: Callable[[Approval], Awaitable[None]] | None = None
    """Hands a decision taken here (the web console) on another replica's request to
    that replica, which tells claude (:meth:`deliver`)."""
    _posting: set[asyncio.Future[None]] = field(default_factory=set)
    _followups: set[asyncio.Task[None]] = field(default_factory=set)
    """Switches (``!model``, ``!mode``) waiting for claude's answer, and answers waiting
    for their run's slot back; ended with the expiry loop."""
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
        # As the room will be shown it, the file to edit as it is now (read off the loop).
        full = self.runs.full_input(batch.room, run_id, event)
        view = await self._view(batch.room, event.tool_name, full)
        now = self.wall_clock()
        interactive = event.tool_name in INTERACTIVE
        wait_s = room.question_timeout_s if interactive else room.approval_timeout_s
        approval = await self.store.add_approval(
            ApprovalAsk(
                batch.room,
                run_id,
                event.request_id,
                tool_name=event.tool_name,
                # A plan's request holds {}: the plan is in claude's tool_use block.
                input_json=json.dumps(full, ensure_ascii=False),
                asked_at=now,
                expires_at=now + (wait_s or NO_EXPIRY_S),
                shown_digest=view.digest,
            )
        )
        if approval.state is ApprovalState.PENDING and approval.message_id is None:
            # New (or never posted): the kept rules may decide it.
            approval, _ = await self._by_rule(approval)
        if approval.state in _CHOICES:
            # Decided before a restart, never received: say it again.
            await self._tell_decided(approval)
            return
        if approval.state is not ApprovalState.PENDING:
            return
        if approval.message_id is not None:
            # Posted before a restart or a takeover, still waiting for a person.
            self.runs.lend(batch.room, run_id)
            return
        problem = view.problem
        if event.requires_user_interaction and event.tool_name not in INTERACTIVE:
            problem = "claude says only its own user interface can answer this tool"
        elif event.tool_name == PLAN and not plan_of(parse_input(approval.input_json)):
            # No plan in the request nor in claude's tool use: an allow would end plan
            # mode on a plan nobody saw.
            problem = "the plan is not in the request, so it cannot be shown"
        if problem is not None:
            await self._refuse_unseen(batch, approval, problem)
            return
        # The run waits for a person from here: its run slot serves other rooms meanwhile
        # (taken back before claude is answered, in _answer).
        self.runs.lend(batch.room, run_id)
        # Done once the post is recorded (or failed): a click waits for this, not for
        # the task posting, which is the run's own and lives as long as the run.
        posting: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._posting.add(posting)
        try:
            if interactive:
                posted = await self._post_interactive(batch, approval, wait_s)
            else:
                posted = await self._post(batch, approval, view, room.approval_timeout_s)
            if posted is not None:
                await self.store.set_approval_message(approval, posted)
            elif (await self._current(approval)).state is ApprovalState.PENDING:
                # Not shown (the post failed): left waiting it would be listed by
                # !status and answerable by command, approved by someone who never saw it.
                await self._refuse_unseen(batch, approval, "the request could not be posted")
        finally:
            self._posting.discard(posting)
            posting.set_result(None)

    async def _tell_decided(self, approval: Approval) -> None:
        """Tell claude the recorded decision of ``approval`` (nothing if it has it)."""
        choice = _CHOICES[approval.state]
        told = ""
        if approval.state is ApprovalState.EXPIRED:
            told = timeout_message(approval.expires_at - approval.asked_at)
        elif choice is ApprovalChoice.DENY:
            told = deny_text(approval.tool_name, approval.reason)
        note = await self._answer(approval, choice, told)
        if not note or QUEUED in note:
            # Delivered only now (or once the run holds a slot again): the bridge
            # stopped before showing the outcome too (a request still showing its
            # buttons would be clicked in vain).
            await self._show(approval)

    async def deliver(self, room: RoomKey, number: int) -> None:
        """Another replica recorded the decision of request ``number`` of ``room``, a
        request of a run here: claude hears it from here (:attr:`hand_over`)."""
        approval = await self.store.approval_by_number(room, number)
        if approval is not None and approval.state in _CHOICES:
            await self._tell_decided(approval)

    async def _by_rule(self, approval: Approval) -> tuple[Approval, bool]:
        """Decide a pending request by the first kept rule that covers it: the request as
        it stands now, and whether a rule decided it just now."""
        try:
            rules = await self.store.active_rules(approval.room, await self.session_of(approval))
        except StoreError:
            log.warning("could not read the rules of %s: the room is asked", approval.room)
            return approval, False
        rules = await self._not_own(approval, rules)
        rule = ruling(rules, approval.tool_name, parse_input(approval.input_json))
        if rule is None:
            return approval, False
        if rule.effect is RuleEffect.DENY:
            state, why = ApprovalState.DENIED, f"a rule of this room denies it ({rule.rule})"
        else:
            state, why = ApprovalState.ALLOWED, f"allowed by rule {rule.id} ({rule.rule})"
        # Compare-and-set: if someone answered meanwhile, their answer stands.
        # ... and only while the rule holds: a revoke meanwhile means the room is asked.
        decided = await self.store.decide_approval(
            approval, ApprovalDecision(state, None, self.wall_clock(), why, rule_id=rule.id)
        )
        current = await self.store.approval_by_number(approval.room, approval.number)
        return (approval if current is None else current), decided

    async def _not_own(self, approval: Approval, rules: list[ToolRule]) -> list[ToolRule]:
        """``rules`` but, with ``require_other_approver``, the allow rules one of the run's
        own senders kept: nobody approves what they asked for, by a rule neither."""
        room = self.settings.room(approval.room)
        if room is None or not room.require_other_approver:
            return rules
        senders = await self.desk().batch_senders(approval)
        return [
            rule
            for rule in rules
            if rule.effect is RuleEffect.DENY
            or judge(room, rule.created_by, senders) is not Verdict.OWN_RUN
        ]

    async def apply_rules(self, room: RoomKey) -> None:
        """A rule was kept: the waiting requests of the room's runs here that it covers
        are decided by it now (claude may have asked more than one at once)."""
        for approval in await self.store.pending_approvals():
            if approval.room.channel != room.channel:
                continue
            if self.runs.control(approval.room, approval.run_id) is None:
                continue  # another replica's run, or one that ended: not answered from here
            ruled, decided = await self._by_rule(approval)
            if not decided:
                continue
            choice = _CHOICES[ruled.state]
            # As at the ask: a question is declined, a plan sent back, a tool use denied.
            told = deny_text(ruled.tool_name, ruled.reason) if choice is ApprovalChoice.DENY else ""
            await self.decide(ruled, choice, None, told)

    async def session_of(self, approval: Approval) -> SessionId | None:
        """The session the request's run writes to; if the run is not bound here, the
        conversation's (a run that ended leaves it as the next run resumes it)."""
        session = self.runs.session(approval.room, approval.run_id)
        if session is None and self.runs.control(approval.room, approval.run_id) is None:
            session = await self.store.get_session(approval.room)
        return session

    async def room_session(self, room: RoomKey) -> SessionId | None:
        session = self.runs.session(room)
        return session if session is not None else await self.store.get_session(room)

    async def _post(
        self, batch: Batch, approval: Approval, view: ToolView, timeout_s: float
    ) -> ExternalMessageId | None:
        """Post the request whole if the room's message holds it; otherwise the whole as
        a file first, then the request shortened (saying so) with its actions."""
        prefix = self.settings.commands.prefix
        text = request_text(approval, prefix, timeout_s, view.markdown())
        if self.replier.approval_fits(batch.room, text):
            return await self.replier.post_approval(
                in_conversation(batch, text, ReplyKind.NOTICE), f"#{approval.number}"
            )
        comment = (
            f"The whole of request `#{approval.number}` ({view.size} characters): what"
            f" `{prefix}approve #{approval.number}` lets run."
        )
        if not await self._post_whole(batch, approval, view.markdown(), comment):
            await self._refuse_unseen(batch, approval, "the room could not be shown it in full")
            return None
        limit = SHORT_BLOCK
        while True:
            text = request_text(approval, prefix, timeout_s, view.markdown(limit))
            if self.replier.approval_fits(batch.room, text):
                break
            if limit <= MIN_BLOCK:
                # Fields too many to fit even shortened (none is cut inline): say so,
                # rather than leave the transport to cut off the last ones unsaid.
                text = request_text(approval, prefix, timeout_s, view.pointer())
                break
            limit //= 2
        return await self.replier.post_approval(
            in_conversation(batch, text, ReplyKind.NOTICE), f"#{approval.number}"
        )

    async def _post_interactive(
        self, batch: Batch, approval: Approval, wait_s: float | None
    ) -> ExternalMessageId | None:
        """A question or a plan: whole if the room's message holds it; otherwise the whole
        as a file first, then the message with the plan's head and tail (saying so)."""
        prefix = self.settings.commands.prefix
        text = request_message(approval, prefix, wait_s)
        if not self.replier.approval_fits(batch.room, text):
            comment = f"The whole of `#{approval.number}`: what its answer answers."
            if not await self._post_whole(batch, approval, text, comment):
                await self._refuse_unseen(batch, approval, "the room could not be shown it in full")
                return None
            tool_input = parse_input(approval.input_json)
            plan = plan_of(tool_input)
            if plan:
                short = json.dumps({**tool_input, "plan": ends(plan, SHORT_BLOCK)})
                text = request_message(replace(approval, input_json=short), prefix, wait_s)
            else:
                # A question's texts, each cut (saying so) until the message holds them.
                limit = SHORT_BLOCK
                while not self.replier.approval_fits(batch.room, text) and limit >= MIN_BLOCK:
                    text = request_message(approval, prefix, wait_s, limit)
                    limit //= 2
        return await self.replier.post_approval(
            in_conversation(batch, text, ReplyKind.NOTICE),
            f"#{approval.number}",
            asked_of(approval),
        )

    async def _post_whole(self, batch: Batch, approval: Approval, whole: str, comment: str) -> bool:
        """Post ``whole`` as a file (a snippet in Slack) in the request's conversation."""
        # A folder of its own: numbers count per conversation, so another's request
        # of the same number may be posted at the same time.
        folder = await asyncio.to_thread(_private_folder, self.settings.runner.state_dir)
        path = folder / f"request-{approval.number}.md"
        try:
            await asyncio.to_thread(_write_private, path, whole)
            reply = replace(in_conversation(batch, comment, ReplyKind.NOTICE), file=str(path))
            return await self.replier.post_file(reply, f"request-{approval.id}")
        finally:
            await asyncio.to_thread(shutil.rmtree, folder, True)

    async def _refuse_unseen(self, batch: Batch, approval: Approval, problem: str) -> None:
        """Deny a request nobody could be shown faithfully: never approved blind."""
        reason = f"not shown to the room, so not asked: {problem}"
        if not await self.store.decide_approval(
            approval, ApprovalDecision(ApprovalState.DENIED, None, self.wall_clock(), reason)
        ):
            return
        told = (
            f"This tool use was denied without asking: chatbridge cannot show it to the"
            f" user faithfully ({problem}). Do it another way the user can review."
        )
        note = await self._answer(approval, ApprovalChoice.DENY, told)
        text = (
            f"Claude asked to use {code_span(approval.tool_name, 100)} (request"
            f" `#{approval.number}`): denied without asking, since it cannot be shown here"
            f" faithfully ({problem}). Nothing ran. {note}"
        ).rstrip()
        await self.replier.send(in_conversation(batch, text, ReplyKind.NOTICE))

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
        # claude works on at once (the interrupt's next turn), answered or not: its run
        # holds a slot from now, whether it lent its slot or an answer waited for one.
        self.runs.went_on(room, run_id)
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
        prefix = self.settings.commands.prefix
        if action.guide:
            # Slack's "Keep planning": feedback is words, said by command.
            await self.replier.answer_action(
                action,
                f"To keep planning, say `{prefix}deny #{approval.number} what to change`:"
                " claude reads it and plans again.",
            )
            return Accepted.ACCEPTED
        reason = ""
        if action.answer and approval.tool_name != ASK:
            # A number or a reply on what is not a question: never an approval.
            await self.replier.answer_action(
                action, f"`#{approval.number}` is not a question: it takes no answer."
            )
            return Accepted.ACCEPTED
        if action.answer.startswith(prefix):
            # A command sent as a reply to a question (Matrix): never taken as its answer.
            await self.replier.answer_action(
                action, f"Send `{prefix}` commands as messages of their own, not as a reply."
            )
            return Accepted.ACCEPTED
        if action.answer:
            try:
                reason = read_answers(questions(parse_input(approval.input_json)), action.answer)
            except AnswerError as exc:
                await self.replier.answer_action(action, str(exc))
                return Accepted.ACCEPTED
        answered = await self.desk().take(action.sender, approval, action.choice, reason)
        log.info(
            "request #%d in %s: %s by %s: %s",
            approval.number, action.room, action.choice.value, action.sender, answered.text,
        )  # fmt: skip
        if answered.text is not None and (not answered.decided or QUEUED in answered.text):
            # Refused (not an approver, their own run) or too late: the request's
            # message does not change, so only this tells the person why. Or taken, but
            # claude hears it only once a run slot frees: the message cannot say when.
            await self.replier.answer_action(action, answered.text)
        return Accepted.ACCEPTED

    async def expire_due(self) -> int:
        """Deny the requests nobody answered in time; how many."""
        return len(await self.desk().expire_due())

    async def expire_forever(self) -> None:
        """Deny expired requests until cancelled (the service's task), then end the
        switches still waiting for claude's answer."""
        try:
            while True:
                try:
                    await self.expire_due()
                except StoreError:
                    log.warning("checking tool requests for expiry failed", exc_info=True)
                await asyncio.sleep(EXPIRY_CHECK_S)
        finally:
            for task in list(self._followups):
                task.cancel()
            await asyncio.gather(*self._followups, return_exceptions=True)

    # -- LiveControls --

    async def decide(
        self,
        approval: Approval,
        choice: ApprovalChoice,
        sender: UserId | None,
        reason: str,
        *,
        shown: str = "",
    ) -> str:
        if not self.owns(approval.room) and self.hand_over is not None:
            # Taken here (the web console), for a run another replica runs: that one
            # tells claude and shows the outcome on the request. Whether the answer
            # waits there for a run slot is not known here: the note says it may.
            await self.hand_over(approval)
            return HANDED_OVER
        note = await self._answer(approval, choice, reason)
        await self._show(approval, shown)
        return note

    async def set_model(self, room: RoomKey, name: str) -> str:
        return self._switch(room, "model", lambda control: control.set_model(name))

    async def set_mode(self, room: RoomKey, mode: str) -> str:
        return self._switch(room, "mode", lambda control: control.set_permission_mode(mode))

    def _switch(
        self,
        room: RoomKey,
        what: str,
        change: Callable[[RunControl], Coroutine[Any, Any, dict[str, Any]]],
    ) -> str:
        """Ask the room's running run, if any, for ``change``; a note for the room.

        The request is written now; claude's answer is awaited by a task of its
        own, which tells the room only if the switch failed. A command never
        waits on claude: a claude that stops answering holds up no other
        command or message, in this room or any other.
        """
        control = self.runs.control(room)
        if control is None or not control.accepting:
            return ""
        try:
            answer = change(control)
        except InputClosed as exc:
            return f"The running run keeps its {what} ({exc}); the next runs use it."
        task = asyncio.get_running_loop().create_task(
            self._told_if_refused(room, what, answer), name=f"{what} switch in {room}"
        )
        self._followups.add(task)
        task.add_done_callback(self._followups.discard)
        return "The running run uses it from its next step."

    async def _told_if_refused(
        self, room: RoomKey, what: str, answer: Coroutine[Any, Any, dict[str, Any]]
    ) -> None:
        try:
            await answer
        except (ControlError, InputClosed) as exc:
            text = f"The running run keeps its {what} ({exc}); the next runs use it."
            await self.replier.send(Reply(room, text, ReplyKind.NOTICE, thread=room.thread or None))

    async def _view(self, room: RoomKey, tool_name: str, tool_input: Mapping[str, Any]) -> ToolView:
        """``tool_input`` as shown in ``room``: relative paths are read where claude runs
        (a thread's worktree, if it has one)."""
        settings = self.settings.room(room)
        cwd = None if settings is None else in_worktree(room, settings).cwd
        return await asyncio.to_thread(render, tool_name, tool_input, cwd)

    async def _answer(self, approval: Approval, choice: ApprovalChoice, told: str) -> str:
        control = self.runs.control(approval.room, approval.run_id)
        if control is None:
            return "(The run had already ended.)"
        asked = self.runs.request(approval.room, approval.run_id, approval.request_id)
        decision: Allow | Deny
        stale = False
        # The input shown (recorded when asked) is the one an allow applies to: should
        # claude's request now carry another, it is denied, never allowed unseen.
        shown = parse_input(approval.input_json)
        if choice is ApprovalChoice.DENY:
            decision = Deny(told)
        elif approval.tool_name in INTERACTIVE:
            # A question's answers or a plan as recorded (and shown): answer_decision.
            decision = answer_decision(approval, choice)
        elif asked is not None and input_digest(asked.input) != input_digest(shown):
            decision = Deny(CHANGED)
        elif (
            approval.shown_digest
            and approval.shown_digest
            != (await self._view(approval.room, approval.tool_name, shown)).digest
        ):
            # The same input would now do something else (the file was changed
            # since it was shown): what was approved is not what would run.
            decision = Deny(STALE)
            stale = True
        else:
            # The input as shown (and recorded), and nothing more: claude's permission
            # suggestions (rules for its settings files, a mode) are never sent back.
            decision = Allow(shown)
        # Only an answer claude waits for lets it go on: one it has (a replay) or a
        # request it withdrew takes no slot back (a run lent for another stays so).
        waits = any(asked.request_id == approval.request_id for asked in control.pending)
        waiting = self.runs.reclaim(approval.room, approval.run_id) if waits else None
        if waiting is not None:
            # The run lent its slot while it waited and none is free now: claude hears
            # the answer once the run holds one again (before any new run starts).
            task = asyncio.get_running_loop().create_task(
                self._answer_when_resumed(approval, control, decision, waiting.resumed),
                name=f"answer #{approval.number} in {approval.room} when a slot frees",
            )
            self._followups.add(task)
            task.add_done_callback(self._followups.discard)
            return (
                f"({QUEUED} {waiting.ahead} waiting run(s) ahead; every run slot is busy,"
                " and the run goes on with this answer when one frees.)"
            )
        try:
            delivered = control.answer(approval.request_id, decision)
        except InputClosed:
            return "(The run had already ended.)"
        if stale and delivered:
            return "(Not run: the file changed since it was shown; claude was asked to ask again.)"
        # False: answered already (a replay after a restart), or withdrawn by claude.
        return "" if delivered else "(claude no longer waits on it.)"

    async def _answer_when_resumed(
        self,
        approval: Approval,
        control: RunControl,
        decision: Allow | Deny,
        resumed: asyncio.Future[bool],
    ) -> None:
        """Tell claude ``decision`` once its run holds a run slot again. Should claude
        never hear it (the run ended first, or claude withdrew the request), the
        request's message, which shows the answer as taken, says so."""
        unheard = ENDED_UNHEARD
        if await asyncio.shield(resumed):
            try:
                if control.answer(approval.request_id, decision):
                    return
                unheard = WITHDRAWN_UNHEARD  # it waited, so nobody else answered it
            except InputClosed:
                pass
        log.info("request #%d in %s: claude never heard its answer", approval.number, approval.room)
        await self._show(approval, unheard)

    async def _current(self, approval: Approval) -> Approval:
        return await self.store.approval_by_number(approval.room, approval.number) or approval

    async def _show(self, approval: Approval, said: str = "") -> None:
        if self._posting:
            # Answered while still being posted (a command typed as the request appears;
            # Matrix adds its reactions before the post returns): its message id is
            # recorded once the post is done, and only then can it be edited.
            await asyncio.wait(set(self._posting), timeout=POSTING_WAIT_S)
        shown = await self._current(approval)
        if shown.message_id is not None:
            text = " ".join(part for part in (outcome(shown), said) if part)
            await self.replier.close_approval(shown.room, shown.message_id, text)


def _private_folder(state_dir: Path) -> Path:
    parent = state_dir / "requests"
    parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(dir=parent))


def _write_private(path: Path, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8", errors="replace") as f:
        f.write(text)
