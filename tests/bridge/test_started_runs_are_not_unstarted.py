"""Review of the late changes (698002d): a run whose start was recorded and that did
begin is never taken for one that never began (bridge/runs/stale_runs.py)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from bridge.config import load_settings
from bridge.store.base import Store
from tests.bridge.harness import ConsoleSession, rows, write_config
from tests.fakes.flaky_store import FlakyStore

WAIT_S = 30.0


async def test_a_run_that_ran_but_whose_end_went_unrecorded_is_not_run_again(
    tmp_path: Path,
) -> None:
    """The database fails while a run goes on: its registration (the run goes on
    unregistered, no pid recorded) and the recording of its end (the answer goes
    into the outbox alone and out; the run stays marked running). The end then
    removes the run's directory ("the journal has served"). At the next start,
    never_started() sees no registry entry, no pid and no directory, takes the run
    for one killed before it began, and runs its message again: claude runs it a
    second time and the room gets the answer twice. Expected (as with only the end
    failing): the run reported with "did not finish ... If its answer is not above"
    and `!retry`, not run again behind the room's back."""
    flaky: list[FlakyStore] = []

    def wrap(store: Store) -> Store:
        flaky.append(FlakyStore(store))
        return flaky[0].store

    settings = load_settings(write_config(tmp_path))
    async with ConsoleSession(settings, wrap_store=wrap) as session:
        assert session.service is not None
        session.service.parts.executor.store_retry_delays_s = (0.01,)
        flaky[0].fail("register_live_run", times=None)
        flaky[0].fail("finish_run", times=None)
        session.send("precious")
        async with asyncio.timeout(WAIT_S):
            await session.wait_for("\nprecious\n")
    assert rows(tmp_path, "select status from runs") == [("running",)]
    async with ConsoleSession(settings) as again:
        async with asyncio.timeout(WAIT_S):
            # Either the honest notice, or the message run a second time.
            while "If its answer is not above" not in again.out.getvalue() and rows(
                tmp_path, "select count(*) from runs"
            ) == [(1,)]:
                await asyncio.sleep(0.05)
        # A message sent now runs after anything recovery would run again (or with it,
        # in one batch): once it is answered alone, nothing else is coming.
        again.send("probe")
        async with asyncio.timeout(WAIT_S):
            await again.wait_for("\nprobe\n")
    runs = rows(tmp_path, "select status, error_excerpt from runs order by seq")
    answers = rows(
        tmp_path,
        "select text, count(*) from outbox where text in ('precious', 'probe') group by text",
    )
    assert runs == [("interrupted", "chatbridge restarted during the run"), ("succeeded", "")]
    assert sorted(answers) == [("precious", 1), ("probe", 1)]
