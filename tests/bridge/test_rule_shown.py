"""A button or reaction that keeps a rule shows it where the request is shown: the person
clicking gets no command answer, and the room must learn the rule's number (to revoke it)
or that none was kept (docs/live-runs.md, Tool rules)."""

from __future__ import annotations

from pathlib import Path
from typing import cast

from bridge.core.model import SessionId
from bridge.core.transport import ApprovalAction, ApprovalChoice
from bridge.live.approval_flow import ApprovalFlow
from bridge.live.registry import LiveRuns
from bridge.outbound.replies import Replier
from runner.events import PermissionAsked
from tests.bridge.approval_posts import POSTED, RUN, Asking, Posting


class Closing(Posting):
    def __init__(self) -> None:
        super().__init__()
        self.closed: list[str] = []

    async def close_approval(self, *args: object) -> None:
        *_where, text = args  # (room, message id, text)
        assert isinstance(text, str)
        self.closed.append(text)


async def clicked(tmp_path: Path, asked: PermissionAsked | None = None) -> list[str]:
    asking = Asking(tmp_path)
    closing = Closing()
    asking.flow = ApprovalFlow(
        asking.flow.settings, asking.store, cast(Replier, closing), LiveRuns(), lambda _v: None
    )
    asking.store.gate.set()
    await asking.store.set_session(asking.key, SessionId("s-1"))
    await asking.flow.ask(RUN, asking.batch, asked or asking.asked)
    action = ApprovalAction(asking.key, asking.user, POSTED, ApprovalChoice.ALLOW_SESSION)
    await asking.flow.on_action(action)
    return closing.closed


async def test_the_session_button_shows_the_rule_it_kept(tmp_path: Path) -> None:
    [closed] = await clicked(tmp_path)
    assert "allowed for the session" in closed
    assert "Kept rule 1: allow `Bash(ls)` in this session." in closed


async def test_the_session_button_shows_that_no_rule_was_kept(tmp_path: Path) -> None:
    blank = PermissionAsked("r1", "Bash", {"command": " "}, "tu1", "", ())
    [closed] = await clicked(tmp_path, blank)
    assert "No rule was kept" in closed
