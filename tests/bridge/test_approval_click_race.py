"""A click that arrives before the request's message id is recorded is not lost."""

from __future__ import annotations

import asyncio
from pathlib import Path

from bridge.core.transport import Accepted
from bridge.store.base import ApprovalState
from tests.bridge.approval_posts import POSTED, RUN, Asking


async def test_a_click_right_after_the_post_waits_for_the_id(tmp_path: Path) -> None:
    asking = Asking(tmp_path)
    store, key = asking.store, asking.key
    ask = asyncio.create_task(asking.flow.ask(RUN, asking.batch, asking.asked))
    await asking.posting.posted.wait()
    click = asking.click()
    for _ in range(5):  # the click looks its message up while the id is not recorded
        await asyncio.sleep(0)
    assert not click.done()
    store.gate.set()
    await ask
    assert await click is Accepted.ACCEPTED
    found = await store.approval_by_message(key, POSTED)
    assert found is not None
    assert found.state is ApprovalState.DENIED


async def test_a_click_waits_for_the_post_not_for_the_task_that_posted(tmp_path: Path) -> None:
    """The request is asked from the run's own task, which lives on after the post:
    a click during the post is decided once the id is recorded, not when the run ends."""
    asking = Asking(tmp_path)
    run_ends = asyncio.Event()

    async def run() -> None:
        await asking.flow.ask(RUN, asking.batch, asking.asked)
        await run_ends.wait()  # the run goes on, waiting for the answer

    running = asyncio.create_task(run())
    await asking.posting.posted.wait()
    click = asking.click()
    asking.store.gate.set()
    async with asyncio.timeout(5):  # well under the wait's own bound (POSTING_WAIT_S)
        assert await click is Accepted.ACCEPTED
    assert not running.done()
    run_ends.set()
    await running
