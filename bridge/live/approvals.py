"""Who may answer a tool-use request, and what claude is told of the answer.

Pure rules, no I/O: the command handler, the transports' buttons and
reactions and the expiry sweep all decide through these, so a request is
judged the same way whichever way the answer came.
"""

from __future__ import annotations

from collections.abc import Collection
from enum import Enum

from bridge.config import RoomSettings
from bridge.core.duration import format_duration
from bridge.core.model import UserId
from bridge.core.transport import ApprovalChoice
from bridge.store.base import ApprovalState


def state_of(choice: ApprovalChoice) -> ApprovalState:
    """The state a request answered with ``choice`` takes."""
    return _STATES[choice]


_STATES = {
    ApprovalChoice.ALLOW: ApprovalState.ALLOWED,
    ApprovalChoice.ALLOW_SESSION: ApprovalState.ALLOWED_SESSION,
    ApprovalChoice.DENY: ApprovalState.DENIED,
}


class Verdict(Enum):
    """Whether a sender may answer a request of a room's run, and if not, why."""

    APPROVER = "approver"
    OWN_RUN = "own_run"
    """An approver, but ``require_other_approver`` and the run works on their messages."""
    NOT_APPROVER = "not_approver"
    """Allowed in the room, not an approver."""
    STRANGER = "stranger"
    """Not allowed in the room at all: ignored without a word."""


def judge(room: RoomSettings, sender: UserId, batch_senders: Collection[UserId]) -> Verdict:
    """How ``sender``'s answer to a request of a run of ``room`` is taken.

    ``batch_senders`` are the senders of the messages the run works on: with
    ``require_other_approver`` none of them may answer, so nobody approves
    what they asked for themselves.
    """
    if room.approves(sender):
        if room.require_other_approver and sender in batch_senders:
            return Verdict.OWN_RUN
        return Verdict.APPROVER
    if room.allows(sender):
        return Verdict.NOT_APPROVER
    return Verdict.STRANGER


def judge_answer(room: RoomSettings, sender: UserId, batch_senders: Collection[UserId]) -> Verdict:
    """How ``sender``'s answer to a question of claude's is taken: by default the senders of
    the run's messages may answer it too (it is their run), beside the approvers."""
    if (
        room.questions_from == "senders_and_approvers"
        and sender in batch_senders
        and room.allows(sender)
    ):
        return Verdict.APPROVER
    verdict = judge(room, sender, batch_senders)
    return Verdict.APPROVER if verdict is Verdict.OWN_RUN else verdict


def may_approve(room: RoomSettings, sender: UserId, batch_senders: Collection[UserId]) -> bool:
    """Whether ``sender`` may answer a request of a run working on ``batch_senders``' messages."""
    return judge(room, sender, batch_senders) is Verdict.APPROVER


def refusal(verdict: Verdict) -> str | None:
    """What a refused sender is told; None: nothing (strangers learn nothing of the room)."""
    if verdict is Verdict.NOT_APPROVER:
        return "You may not answer tool requests in this room (you are not an approver)."
    if verdict is Verdict.OWN_RUN:
        return "You sent messages this run works on: another approver must answer its requests."
    return None


DEFAULT_DENIAL = "The user denied this tool use. Do not try it again another way; ask instead."


def deny_message(reason: str) -> str:
    """What claude is told of a denial: the approver's reason, or a default."""
    reason = reason.strip()
    if not reason:
        return DEFAULT_DENIAL
    return f"The user denied this tool use: {reason}"


def timeout_message(timeout_s: float) -> str:
    """What claude is told when nobody answered in time."""
    return (
        f"Nobody answered this tool use request within {format_duration(timeout_s)}:"
        " it was denied (timed out). Do not try it again another way; the user may"
        " ask for it later."
    )


WITHDRAWN = "claude withdrew it: its turn was interrupted"
"""The reason a request claude withdrew (``PermissionCancelled``) is cancelled with."""


def cancel_reason(run_ended: str) -> str:
    """The reason a request of a run that ended is kept with."""
    return f"the run ended ({run_ended})" if run_ended else "the run ended"
