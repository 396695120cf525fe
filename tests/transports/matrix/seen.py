"""What a human sees of the running bridge in a Matrix room: conditions to wait on."""

from __future__ import annotations

from collections.abc import Callable

from tests.transports.matrix.matrix_helpers import Seen, message_from
from tests.transports.matrix.synapse_peer import MatrixUser
from transports.matrix.approvals import MARKER

ECHO = {"FAKE_CLAUDE_ECHO": "1", "FAKE_CLAUDE_NO_TOOL": "1"}


ALICE = "@alice:localhost"


def answer_in(bot: MatrixUser, room: str) -> Callable[[Seen], bool]:
    def match(seen: Seen) -> bool:
        return message_from(bot.user_id, room)(seen) and seen.content.get("msgtype") == "m.text"

    return match


def notice_in(bot: MatrixUser, room: str, contains: str = "") -> Callable[[Seen], bool]:
    def match(seen: Seen) -> bool:
        return (
            message_from(bot.user_id, room)(seen)
            and seen.content.get("msgtype") == "m.notice"
            and contains.lower() in str(seen.content.get("body", "")).lower()
        )

    return match


def typing_in(bot: MatrixUser, room: str, on: bool) -> Callable[[Seen], bool]:
    def match(seen: Seen) -> bool:
        users = seen.source.get("users") or []
        return seen.ephemeral and seen.room_id == room and (bot.user_id in users) == on

    return match


MALLORY = "@mallory:localhost"


def request_in(bot: MatrixUser, room: str, ref: str) -> Callable[[Seen], bool]:
    def match(seen: Seen) -> bool:
        return (
            message_from(bot.user_id, room)(seen)
            and (seen.content.get(MARKER) or {}).get("ref") == ref
        )

    return match


def edit_of(event_id: str, contains: str) -> Callable[[Seen], bool]:
    def match(seen: Seen) -> bool:
        relates = seen.content.get("m.relates_to") or {}
        new = seen.content.get("m.new_content") or {}
        return (
            relates.get("rel_type") == "m.replace"
            and relates.get("event_id") == event_id
            and contains in str(new.get("body"))
        )

    return match


def answer_to(bot: MatrixUser, room: str, prompt: str) -> Callable[[Seen], bool]:
    def match(seen: Seen) -> bool:
        return (
            message_from(bot.user_id, room)(seen)
            and seen.content.get("msgtype") == "m.text"
            and prompt in str(seen.content.get("body"))
        )

    return match
