"""Tool requests under stress, through the whole service (console room, fake claude asking
for each tool): a request claude withdraws, an answer racing another, a request of a run
that ended, "allow for this session", the words of ``!deny``, an approver who may not
start runs, ``!status``."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from bridge.store.base import ApprovalState
from tests.bridge.test_live_runs import WAIT_S, rows, session, tool_log
from tests.config_files import Table

pytestmark = pytest.mark.slow


def journal_in(tmp_path: Path) -> list[dict[str, Any]]:
    """What the bridge wrote to claude's stdin, from the runs' journals (``in`` records)."""
    written = []
    for journal in (tmp_path / "state").rglob("journal"):
        for line in journal.read_bytes().splitlines():
            try:
                obj = json.loads(line)
            except ValueError:
                continue
            if isinstance(obj, dict):
                written.append(obj)
    return written


async def test_a_request_claude_withdrew_is_no_longer_answered_in_place_of_the_next(
    tmp_path: Path,
) -> None:
    # interrupt mode: a new message ends the turn; claude withdraws the request it waits
    # on (control_cancel_request) and asks again in the new turn.
    config: Table = {
        "defaults": {"approve_tools": True, "during_run": "interrupt"},
        "dispatcher": {"coalesce_ms": 50, "max_wait_ms": 500},
    }
    async with asyncio.timeout(WAIT_S), session(tmp_path, config) as bridge:
        bridge.send("first job")
        await bridge.wait_for("(request `#1`")
        bridge.send("do this instead")
        await bridge.wait_for("(request `#2`")
        await bridge.wait_for("Request `#1` (`Bash`): cancelled")
        bridge.send("!approve")  # the oldest waiting request: #2, not the withdrawn #1
        await bridge.wait_for("Request `#2` (`Bash`): allowed")
        await bridge.wait_for("\ndo this instead\n")  # the answer
    assert [t["command"] for t in tool_log(tmp_path)] == ["echo hello"]
    states = rows(tmp_path, "select number, state from approvals order by number")
    assert states == [(1, ApprovalState.CANCELLED.value), (2, ApprovalState.ALLOWED.value)]
