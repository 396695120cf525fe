"""What a Slack channel got while chatbridge was not listening, read from its history.

On every connection: each served channel's history after its seen mark, and the replies of
recently active threads, handed to the sink oldest first like live events (the store's
idempotent accept drops what it has). Nothing older than the maximum age is read (skipped
top-level messages are counted); a 429 is waited out where it came
(docs/deployment.md, "Slack app", ``*:history``; docs/conversations.md).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from slack_sdk.errors import SlackApiError
from slack_sdk.web.async_client import AsyncWebClient
from slack_sdk.web.async_slack_response import AsyncSlackResponse

from bridge.core.transport import RateLimited, TransportError
from transports.slack.inbound import HUMAN_SUBTYPES, SLACK
from transports.slack.web import error_code, retry_after_seconds

log = logging.getLogger(__name__)

PAGE = 200
"""Messages asked for per page."""
MAX_PAGES = 50
"""Pages read per channel or thread at most: a bound on one catch-up's work."""
MAX_THREADS = 100
"""Threads with recent activity read per channel at most (the most recent first)."""
WAITS_PER_CALL = 10
"""429s one call waits out (each as long as Slack asks) before the catch-up gives up
on this attempt: a limit of one call a minute must not restart a channel's reading."""
UNREADABLE = frozenset({"not_in_channel", "channel_not_found", "missing_scope", "no_permission"})
"""Answers no retry changes: the channel is skipped (and the log says why)."""

Ts = tuple[int, int]


def ts_key(ts: object) -> Ts | None:
    """A Slack ts (``"1700000000.000100"``) as comparable numbers; None if it is not one."""
    if not isinstance(ts, str):
        return None
    seconds, _, micros = ts.partition(".")
    if not _digits(seconds) or (micros and not _digits(micros)):
        return None
    return int(seconds), int(micros[:6].ljust(6, "0")) if micros else 0


def _digits(text: str) -> bool:
    return text.isascii() and text.isdecimal()


def _key(ts: object) -> Ts:
    """:func:`ts_key`, with what is not a ts before every ts."""
    return ts_key(ts) or (0, 0)


def later(a: str, b: str) -> str:
    """The later of two ts."""
    return max(a, b, key=_key)


def ts_of(seconds: float) -> str:
    """The Slack ts of a wall-clock time (the epoch at the earliest)."""
    return f"{max(0.0, seconds):.6f}"


@dataclass(slots=True)
class Missed:
    """What one channel got after its marks: events to hand over, oldest first."""

    events: list[dict[str, Any]] = field(default_factory=list)
    skipped: int = 0
    """Top-level messages after the channel's mark but older than the maximum age."""
    newest: str | None = None
    """The newest ts read from the channel's own timeline (its mark once all is handed over)."""


class History:
    """Reads a channel's history with the bot's Web API client."""

    def __init__(
        self, client: AsyncWebClient, sleep: Callable[[float], Awaitable[None]] = asyncio.sleep
    ) -> None:
        """``sleep`` waits out a 429 (for tests)."""
        self._client = client
        self._sleep = sleep

    async def missed(
        self, channel: str, marks: Mapping[str, str], cutoff: str, bridge_user: str
    ) -> Missed:
        """Messages of ``channel`` after its ``marks`` ("" the channel's own, else by
        thread ts) and after ``cutoff``, oldest first, with ``channel`` and ``type`` set.

        Without a mark of its own the channel is new to the bridge: nothing is
        handed over (history from before the bridge served it is not served),
        and its newest message (or ``cutoff``) becomes its mark. The
        channel's timeline is read from ``cutoff``: its messages after the mark
        are missed ones, and its threads with a reply after their mark (by
        anyone but ``bridge_user``) are read too.
        """
        missed = Missed()
        own = marks.get("")
        cut = ts_key(cutoff)
        if cut is None:
            return missed
        window = await self._read("conversations.history", channel=channel, oldest=cutoff)
        if own is None:
            stamps = [ts for m in window if (ts := m.get("ts")) and ts_key(ts)]
            missed.newest = max(stamps, key=_key) if stamps else cutoff
            return missed
        since = _key(later(own, cutoff))
        found: dict[str, dict[str, Any]] = {}
        threads: dict[str, str] = {}
        parents: set[str] = set()
        for message in window:
            ts = message.get("ts")
            key = ts_key(ts)
            if not isinstance(ts, str) or key is None or key <= cut:
                continue
            parents.add(ts)
            if key > since:
                found[ts] = message
                if missed.newest is None or key > _key(missed.newest):
                    missed.newest = ts
            after = later(marks.get(ts, own), cutoff)
            if _replied_after(message, after, bridge_user):
                threads[ts] = after
        # Threads the bridge saw recently whose parent is older than the window.
        recent = sorted(
            ((t, m) for t, m in marks.items() if t and t not in parents and _key(m) >= cut),
            key=lambda item: _key(item[1]),
            reverse=True,
        )
        for thread, mark in recent[:MAX_THREADS]:
            threads.setdefault(thread, mark)
        if len(recent) > MAX_THREADS:
            log.warning(
                "slack catch-up: %d threads of %s were active recently; reading the %d newest",
                len(recent),
                channel,
                MAX_THREADS,
            )
        for thread, after in threads.items():
            floor = _key(after)
            for reply in await self._read(
                "conversations.replies", channel=channel, ts=thread, oldest=after
            ):
                ts = reply.get("ts")
                key = ts_key(ts)
                if not isinstance(ts, str) or key is None or key <= floor or ts == thread:
                    continue
                found.setdefault(ts, reply)
        if _key(own) < cut:
            missed.skipped = await self._count_before(channel, own, cutoff, bridge_user)
        ordered = sorted(found.items(), key=lambda item: _key(item[0]))
        missed.events = [{**m, "type": "message", "channel": channel} for _, m in ordered]
        return missed

    async def _count_before(self, channel: str, after: str, before: str, bridge_user: str) -> int:
        """How many top-level messages of people (not bots, not ``bridge_user``) lie
        between ``after`` and ``before``."""
        low, high = _key(after), _key(before)
        found = await self._read(
            "conversations.history", channel=channel, oldest=after, latest=before
        )
        return sum(
            1
            for m in found
            if low < _key(m.get("ts")) <= high
            and m.get("bot_id") is None
            and m.get("user") != bridge_user
            and m.get("subtype") in (None, *HUMAN_SUBTYPES)
        )

    async def _read(self, method: str, **args: Any) -> list[dict[str, Any]]:
        """Every message of a paged ``conversations.*`` answer (up to :data:`MAX_PAGES`)."""
        messages: list[dict[str, Any]] = []
        cursor = ""
        for _ in range(MAX_PAGES):
            response = await self._call(method, limit=PAGE, cursor=cursor or None, **args)
            page = response.get("messages")
            messages.extend(m for m in page or () if isinstance(m, dict))
            meta = response.get("response_metadata") or {}
            cursor = str(meta.get("next_cursor") or "")
            if not response.get("has_more") or not cursor:
                return messages
        log.warning("slack catch-up: %s of %s has more than %d pages", method, args, MAX_PAGES)
        return messages

    async def _call(self, method: str, **args: Any) -> AsyncSlackResponse:
        """One page, a 429 waited out (up to :data:`WAITS_PER_CALL` times) so that what
        was read so far is not read again."""
        call = (
            self._client.conversations_history
            if method == "conversations.history"
            else self._client.conversations_replies
        )
        waits = 0
        while True:
            try:
                return await call(**args)
            except SlackApiError as exc:
                problem = _translated(exc, method)
                if not isinstance(problem, RateLimited) or waits >= WAITS_PER_CALL:
                    raise problem from exc
            waits += 1
            log.info("slack catch-up: %s rate limited; waiting %gs", method, problem.retry_after_s)
            await self._sleep(problem.retry_after_s)


def _replied_after(parent: Mapping[str, Any], after: str, bridge_user: str) -> bool:
    """Whether ``parent``'s thread has a reply after ``after`` that may be a person's
    (Slack lists who replied; a thread only the bridge answered in is not read)."""
    if not parent.get("reply_count") or _key(parent.get("latest_reply")) <= _key(after):
        return False
    users = parent.get("reply_users")
    return not isinstance(users, list) or any(user != bridge_user for user in users)


class Unreadable(TransportError):
    """Slack refuses to show this channel's history (no retry changes that)."""


def _translated(exc: SlackApiError, method: str) -> TransportError:
    code = error_code(exc)
    status = getattr(exc.response, "status_code", None)
    if status == 429 or code == "ratelimited":
        headers = getattr(exc.response, "headers", None) or {}
        return RateLimited(SLACK, retry_after_seconds(headers), f"{method}: ratelimited")
    if code in UNREADABLE:
        return Unreadable(SLACK, f"{method}: {code}")
    return TransportError(SLACK, f"{method}: {code}")
