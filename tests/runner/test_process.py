"""The marker sweep against real processes that are not our children."""

from __future__ import annotations

import pytest

from bridge.core.model import RunId
from runner import find_marked, kill_marked
from tests.runner.conftest import is_alive, pids_with_marker
from tests.runner.orphans import leave_orphans

pytestmark = pytest.mark.slow


async def test_kill_marked_sweeps_leftovers_of_a_previous_run(run_id: RunId) -> None:
    pids = await leave_orphans(run_id)
    other = RunId(f"{run_id}-other")
    bystanders = await leave_orphans(other)
    try:
        assert sorted(pids_with_marker(run_id)) == sorted(pids)
        assert sorted(find_marked(run_id)) == sorted(pids)

        killed = await kill_marked(run_id, grace_s=0.3)

        assert killed == 2
        assert pids_with_marker(run_id) == []
        assert not any(is_alive(pid) for pid in pids)
        # Another run's processes (a marker that merely starts the same) are untouched.
        assert all(is_alive(pid) for pid in bystanders)
    finally:
        await kill_marked(other, grace_s=0)
    assert pids_with_marker(other) == []


async def test_kill_marked_with_nothing_to_kill(run_id: RunId) -> None:
    assert await kill_marked(run_id, grace_s=1.0) == 0


async def test_kill_marked_without_grace_kills_at_once(run_id: RunId) -> None:
    pids = await leave_orphans(run_id)
    assert await kill_marked(run_id, grace_s=0) == 2
    assert not any(is_alive(pid) for pid in pids)


def test_empty_marker_is_refused() -> None:
    with pytest.raises(ValueError, match="empty marker"):
        find_marked("")
