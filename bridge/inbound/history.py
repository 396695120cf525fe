"""``!sessions``, ``!resume``, ``!fork`` and ``!usage``: a conversation's sessions and spend.

Everything is read from and written to the store, so each command works on
any replica (docs/conversations.md, docs/budgets.md).
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol

from bridge.config import Settings
from bridge.core.duration import format_duration
from bridge.core.model import Message, RoomKey, SessionId
from bridge.core.text import visible
from bridge.runs.budget import day_start
from bridge.store.base import (
    AuditAction,
    AuditEntry,
    AuditStore,
    LedgerStore,
    MessageStore,
    RoomStore,
    RunRecord,
    RunStore,
)

HISTORY = 200
"""Runs of a conversation read to list its sessions."""
LISTED = 10
"""Sessions ``!sessions`` lists, most recent first."""
COSTLIEST = 3
PROMPT_CHARS = 80


@dataclass(frozen=True, slots=True)
class SessionSummary:
    session_id: SessionId
    first_at: float
    last_at: float
    runs: int
    cost_usd: float | None
    """None when no run of it reported a cost."""
    first_prompt: str


def _cost(run: RunRecord) -> float | None:
    return None if run.report is None else run.report.cost_usd


def _money(value: float | None) -> str:
    return "cost unknown" if value is None else f"${value:.2f}"


def _excerpt(text: str) -> str:
    line = " ".join(visible(text).split())
    return line if len(line) <= PROMPT_CHARS else line[: PROMPT_CHARS - 1] + "…"


class HistoryStore(MessageStore, RunStore, RoomStore, LedgerStore, AuditStore, Protocol):
    """The store's roles :class:`RoomHistory` uses."""


@dataclass(slots=True)
class RoomHistory:
    store: HistoryStore
    settings: Settings
    prefix: str
    answer: Callable[[Message, str], Awaitable[None]]
    forget_session: Callable[[RoomKey], Awaitable[None]]
    """``!reset``'s: forgets the room's session, also for the run active now (whose end
    then does not make its own session the room's again)."""
    wall_clock: Callable[[], float] = time.time

    async def sessions(self, room: RoomKey) -> list[SessionSummary]:
        """The conversation's sessions, most recently used first."""
        runs = await self.store.room_runs(room, HISTORY)  # newest first
        found: dict[SessionId, list[RunRecord]] = {}
        for run in runs:
            sid = None if run.report is None else run.report.session_id
            if sid is not None:
                found.setdefault(sid, []).append(run)
        summaries = []
        for sid, its_runs in list(found.items())[:LISTED]:
            first = its_runs[-1]
            messages = await self.store.messages(first.message_ids[:1])
            costs = [c for c in map(_cost, its_runs) if c is not None]
            summaries.append(
                SessionSummary(
                    session_id=sid,
                    first_at=first.started_at,
                    last_at=its_runs[0].started_at,
                    runs=len(its_runs),
                    cost_usd=sum(costs) if costs else None,
                    first_prompt=messages[0].text if messages else "",
                )
            )
        return summaries

    async def list_sessions(self, message: Message) -> None:
        room = message.room
        summaries = await self.sessions(room)
        if not summaries:
            await self.answer(message, "No Claude session has run here yet.")
            return
        current = await self.store.get_session(room)
        now = self.wall_clock()
        lines = [f"Recent sessions (`{self.prefix}resume N` continues one):"]
        for n, s in enumerate(summaries, 1):
            mark = " (current)" if s.session_id == current else ""
            lines.append(
                f"{n}. `{s.session_id}`{mark}: {s.runs} run{'s' if s.runs != 1 else ''},"
                f" last {format_duration(now - s.last_at)} ago, {_money(s.cost_usd)};"
                f" began with “{_excerpt(s.first_prompt)}”"
            )
        await self.answer(message, "\n".join(lines))

    async def resume(self, message: Message, which: str) -> None:
        room = message.room
        summaries = await self.sessions(room)
        chosen = None
        if which.isascii() and which.isdigit() and 1 <= int(which) <= len(summaries):
            chosen = summaries[int(which) - 1]
        else:
            # A session id, but only one of this conversation's: never another room's.
            chosen = next((s for s in summaries if s.session_id == which), None)
        if chosen is None:
            await self.answer(
                message,
                f"Name a session by its number in `{self.prefix}sessions` (1–{len(summaries)})"
                " or by its id."
                if summaries
                else "No Claude session has run here yet.",
            )
            return
        await self.forget_session(room)
        await self.store.set_session(room, chosen.session_id)
        await self._done(
            message,
            AuditAction.SESSION_RESUMED,
            chosen.session_id,
            f"The next run continues session `{chosen.session_id}`"
            f" (began with “{_excerpt(chosen.first_prompt)}”).",
        )

    async def fork(self, message: Message) -> None:
        room = message.room
        session = await self.store.get_session(room)
        if session is None:
            await self.answer(message, "There is no session to fork: the next run starts fresh.")
            return
        await self.store.set_room_fork(room, True)
        await self._done(
            message,
            AuditAction.SESSION_FORKED,
            session,
            f"The next run starts from a copy of session `{session}`; that session stays as"
            f" it is (`{self.prefix}sessions` lists both, `{self.prefix}resume` goes back).",
        )

    async def _done(
        self, message: Message, action: AuditAction, session: SessionId, text: str
    ) -> None:
        """Audit a change to the room's session asked by ``message``, then answer ``text``."""
        entry = AuditEntry.asked(message, action, self.wall_clock(), detail=f"session={session}")
        await self.store.audit(entry)
        await self.answer(message, text)

    async def usage(self, message: Message) -> None:
        room = message.room
        now = self.wall_clock()
        since = day_start(now)
        settings = self.settings.room(room)
        room_limit = settings.daily_budget_usd if settings is not None else None
        service_limit = self.settings.budget.daily_usd
        room_spent = await self.store.spend(since, room)
        service_spent = await self.store.spend(since)
        lines = [
            "Today (UTC): this room "
            + _against(room_spent, room_limit)
            + "; the whole service "
            + _against(service_spent, service_limit)
            + "."
        ]
        today = [r for r in await self.store.room_runs(room, HISTORY) if r.started_at >= since]
        unknown = [r for r in today if r.report is not None and _cost(r) is None]
        costly = sorted(
            (r for r in today if _cost(r) is not None), key=lambda r: _cost(r) or 0.0, reverse=True
        )[:COSTLIEST]
        if costly:
            lines.append("Costliest runs today:")
            for run in costly:
                took = (
                    ""
                    if run.ended_at is None
                    else f", {format_duration(run.ended_at - run.started_at)}"
                )
                lines.append(f"- `{run.id}`: {_money(_cost(run))}{took}")
        if unknown:
            lines.append(
                f"{len(unknown)} run{'s' if len(unknown) != 1 else ''} today ended before claude"
                " reported a cost (not counted)."
            )
        await self.answer(message, "\n".join(lines))


def _against(spent: float, limit: float | None) -> str:
    if limit is None:
        return f"${spent:.2f} (no daily budget)"
    return f"${spent:.2f} of ${limit:.2f}"
