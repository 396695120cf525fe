"""Review 2: a claude kept warm must not outlive its conversation's lease (failing)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bridge.core.model import RoomKey
from tests.replicas.conftest import ROOM, replica, replica_settings, until
from tests.replicas.replicas import results
from tests.runner.conftest import is_alive


async def test_a_shutdown_hands_the_conversation_over_only_once_its_warm_claude_is_gone(
    tmp_path: Path, cluster_db: str
) -> None:
    # The shutdown's first step cancels the warm claudes without waiting
    # (Prestarts.stop_keeping, a stop_later), taking them out of ``_warm``; its second
    # hands the idle conversations over (release_idle), whose ``released`` hook
    # (Prestarts.release) waits only for one still in ``_warm``: so none. The lease
    # goes while the claude kept warm still runs, and the next owner may resume the
    # session beside it: what release() exists to rule out.
    # A claude that takes its time to exit on SIGTERM (the real CLI flushes and ends
    # its MCP servers), within the stop's grace.
    config = {"runner": {"prestart": True, "prestart_keep_s": 600, "stop_grace_s": 2}}
    env = {"FAKE_CLAUDE_ECHO": "1", "FAKE_CLAUDE_IGNORE_TERM": "1"}
    alive_at_release: list[bool] = []
    async with replica(replica_settings(tmp_path, "a", cluster_db, config, env=env)) as a:
        cluster, prestarts = a.service.parts.cluster, a.service.parts.executor.prestarts
        assert cluster is not None
        assert prestarts is not None
        await a.chat.say("hello")
        await a.chat.wait_until(lambda: results(a) == ["hello"])
        await until(lambda: ROOM in prestarts._warm)
        started = await prestarts._rooms[ROOM].task
        assert started is not None
        supervised = started._supervised
        assert supervised is not None
        pid = supervised.claude_pid
        assert is_alive(pid)
        release = cluster.leases.release

        async def watched(rooms: Sequence[RoomKey], replica_id: str, *args: Any) -> Any:
            if ROOM in rooms:
                alive_at_release.append(is_alive(pid))
            return await release(rooms, replica_id, *args)

        cluster.leases.release = watched  # type: ignore[method-assign]
        a.service.request_stop()
        await a.task
    assert alive_at_release, "the conversation was not handed over at the shutdown"
    assert alive_at_release[0] is False, "the lease went while its warm claude still ran"
