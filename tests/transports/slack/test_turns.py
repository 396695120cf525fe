"""The order of hand-overs of Socket Mode envelopes handled at once (transports.slack.turns)."""

from __future__ import annotations

import asyncio

from hypothesis import given, settings
from hypothesis import strategies as st

from transports.slack.turns import Turns

KINDS = st.sampled_from(["message", "change", "none"])
"""What an envelope carries: a message, an edit or deletion, or nothing for the sink."""


async def _yields(count: int) -> None:
    for _ in range(count):
        await asyncio.sleep(0)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(KINDS, st.integers(0, 5), st.integers(0, 5)), min_size=1, max_size=12))
def test_messages_go_in_arrival_order_and_changes_after_everything_before(
    envelopes: list[tuple[str, int, int]],
) -> None:
    """Each envelope takes its ticket on arrival, then waits a random number of turns of the
    loop before reaching the sink (Bolt, name look-ups) and after (the store)."""
    handed: list[int] = []
    finished: list[int] = []
    seen_finished_at: dict[int, set[int]] = {}

    async def envelope(turns: Turns, ticket: int, kind: str, before: int, after: int) -> None:
        try:
            await _yields(before)
            if kind == "none":
                return
            if kind == "message":
                await turns.message(ticket)
            else:
                await turns.change(ticket)
                seen_finished_at[ticket] = set(finished)
            turns.handed(ticket)
            handed.append(ticket)
            await _yields(after)
        finally:
            finished.append(ticket)
            turns.finish(ticket)

    async def burst() -> None:
        turns = Turns()
        async with asyncio.TaskGroup() as tasks:
            for kind, before, after in envelopes:
                ticket = turns.take()
                tasks.create_task(envelope(turns, ticket, kind, before, after))

    asyncio.run(burst())
    assert sorted(handed) == handed  # every hand-over in arrival order
    for ticket, done in seen_finished_at.items():
        assert set(range(1, ticket)) <= done  # a change only after all before it finished
    assert len(finished) == len(envelopes)
