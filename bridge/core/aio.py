"""Small asyncio helpers shared by the core and the runner."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any


async def shielded(coro: Coroutine[Any, Any, None]) -> None:
    """Run ``coro`` to completion even if we are cancelled meanwhile, then re-cancel.

    For clean-up that must finish (stopping a process tree, recording how a
    run ended): a plain ``asyncio.shield`` returns at the first cancellation
    and leaves the work running with no owner. ``coro`` must be bounded in
    time itself.
    """
    task = asyncio.ensure_future(coro)
    cancelled = False
    while True:
        try:
            await asyncio.shield(task)
        except asyncio.CancelledError:
            if task.done():
                raise
            cancelled = True
        else:
            break
    if cancelled:
        raise asyncio.CancelledError
