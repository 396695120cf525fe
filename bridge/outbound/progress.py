"""Live progress of a run: one status message, edited in place, throttled per room.

The message is posted only once the run has lasted ``show_after_s``
(``[progress]``): a quick run posts its answer alone. Once the answer
exists (:meth:`ProgressMessage.close`) no status message is posted any more;
a post already under way is completed, never cut off (:meth:`ProgressMessage.posted`),
and the message is finished (:meth:`ProgressMessage.finish`) after the
answer went out.

Edits are also paced per transport (:class:`bridge.outbound.pacing.Pacing`): an edit
the budget refuses is folded into a later one; the last edit, which says
how the run ended, is tried again until the budget allows it.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from bridge.core.duration import format_duration
from bridge.core.model import ExternalMessageId
from bridge.core.text import visible

MAX_RECENT_TOOLS = 3
_DETAIL_LIMIT = 80
SKIPPED_RETRY_S = 1.0
"""After an edit was skipped (budget spent), the next try waits at least this long."""


def tool_name(name: str) -> str:
    """An MCP tool (``mcp__server__tool``) as ``tool (server)``: the raw name means
    little to a person, and its ``__`` read as bold markup in Slack."""
    server, sep, tool = name.removeprefix("mcp__").partition("__")
    if not name.startswith("mcp__") or not sep or not server or not tool:
        return name
    return f"{tool} ({server})"


def describe_tool_use(name: str, tool_input: dict[str, Any]) -> str:
    """``Bash: git status``, ``Edit: src/app.py``: what a person wants to see of a tool use."""
    name = tool_name(name)
    for key in ("command", "file_path", "path", "pattern", "url", "query", "description"):
        value = tool_input.get(key)
        if isinstance(value, str) and value.strip():
            # Escaped like a request's text: the line sits next to the approval request.
            detail = visible(value.strip().splitlines()[0])
            if len(detail) > _DETAIL_LIMIT:
                detail = detail[: _DETAIL_LIMIT - 1] + "…"
            return f"{name}: {detail}"
    return name


Post = Callable[[str], Awaitable[ExternalMessageId | None]]
Edit = Callable[[ExternalMessageId, str], Awaitable[bool]]
"""Edits the status message; False when the edit was skipped (try again later)."""


@dataclass(slots=True)
class ProgressMessage:
    """The status message of one run.

    ``post`` sends a new message, ``edit`` replaces the status message's text.
    Updates closer together than ``min_interval_s`` are folded into one edit,
    sent when the interval has passed: chat servers rate-limit edits, and
    people cannot read faster anyway.
    """

    post: Post
    edit: Edit
    clock: Callable[[], float]
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep
    """Waits before a skipped last edit is tried again."""
    min_interval_s: float = 2.0
    show_after_s: float = 0.0
    started_at: float = 0.0
    """When the run started, on ``clock``."""
    tools: list[str] = field(default_factory=list)
    tool_count: int = 0
    _message_id: ExternalMessageId | None = None
    _last_sent: float | None = None
    _dirty: bool = False
    _skipped: bool = False
    figures: str = ""
    """What the run's end says beside its duration (turns, cost): its last edit shows it."""
    _wake: asyncio.Event = field(default_factory=asyncio.Event)
    _closed: asyncio.Event = field(default_factory=asyncio.Event)
    _posting: asyncio.Future[None] | None = None

    def text(self, now: float, finished: str | None = None) -> str:
        elapsed = format_duration(now - self.started_at)
        head = f"{finished} after {elapsed}" if finished else f"Working… {elapsed}"
        if self.tool_count:
            head += f" · {self.tool_count} tool use{'s' if self.tool_count != 1 else ''}"
        if finished and self.figures:
            head += f" · {self.figures}"
        return "\n".join([head, *(f"- {t}" for t in self.tools)])

    def close(self) -> None:
        """The run has its answer: never post the status message from now on."""
        self._closed.set()

    async def _show(self) -> None:
        self._message_id = await self.post(self.text(self.clock()))
        self._last_sent = self.clock()

    def tool_used(self, name: str, tool_input: dict[str, Any]) -> None:
        self.tools.append(describe_tool_use(name, tool_input))
        del self.tools[:-MAX_RECENT_TOOLS]
        self.tool_count += 1
        self._dirty = True
        self._wake.set()

    async def pump(self) -> None:
        """Post the message once the run has lasted ``show_after_s``, then send folded
        edits until cancelled; runs beside the run."""
        delay = self.started_at + self.show_after_s - self.clock()
        if delay > 0:
            # Woken early only by close(): the answer makes the message pointless.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(delay):
                    await self._closed.wait()
        if self._closed.is_set():
            return
        # Shielded: a run that ends while the post is under way must not lose
        # the message's id, or the message would never be finished.
        self._posting = asyncio.ensure_future(self._show())
        await asyncio.shield(self._posting)
        while True:
            await self._wake.wait()
            self._wake.clear()
            if self._last_sent is not None:
                interval = self.min_interval_s
                if self._skipped:
                    interval = max(interval, SKIPPED_RETRY_S)
                delay = self._last_sent + interval - self.clock()
                if delay > 0:
                    await asyncio.sleep(delay)
            await self._flush()

    async def _flush(self) -> None:
        if not self._dirty or self._message_id is None:
            return
        self._dirty = False
        self._last_sent = self.clock()
        sent = await self.edit(self._message_id, self.text(self._last_sent))
        self._skipped = not sent
        if not sent:
            self._dirty = True
            self._wake.set()

    @property
    def posting(self) -> bool:
        """The message's post is under way."""
        return self._posting is not None and not self._posting.done()

    async def posted(self) -> None:
        """Until a post under way is done; a caller giving up does not cancel it."""
        if self._posting is not None:
            await asyncio.shield(self._posting)

    async def finish(self, outcome: str) -> None:
        """Edit the message to say how the run ended, if it was posted.

        Waits for a post under way, then makes the edit, trying again every
        ``SKIPPED_RETRY_S`` while the edit budget skips it: the budget is
        shared by every room of the transport, so runs ending together can
        spend it. The caller bounds the wait (then calls :meth:`abandon`).
        """
        self.close()
        ended = self.clock()
        await self.posted()
        if self._message_id is None:
            return
        text = self.text(ended, finished=outcome)
        while not await self.edit(self._message_id, text):
            await self.sleep(SKIPPED_RETRY_S)

    async def abandon(self) -> None:
        """Cancel a post still under way and wait for it: nothing of the message outlives this."""
        if self._posting is not None and not self._posting.done():
            self._posting.cancel()
        if self._posting is not None:
            await asyncio.wait({self._posting})
