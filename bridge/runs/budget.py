"""Daily budgets: what a room and the whole service spent today, and whether a run may start.

Spending is read from the store's ledger (``Store.spend``), which the end of
every run writes with the cost claude reported. "Today" is the UTC day: the
same day for every room and every replica, whatever the host's time zone,
and the day a limit resets is midnight UTC. A budget is spent once the runs
that ended today cost at least its limit; a run already going is never cut
by it (``max_budget_usd`` caps a single run inside claude instead).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime

from bridge.config import Settings
from bridge.core.model import RoomKey
from bridge.core.money import usd
from bridge.store.base import LedgerStore, StoreError

log = logging.getLogger(__name__)

DAY_S = 86400.0


def day_start(now: float) -> float:
    """The start of ``now``'s UTC day, in seconds since the epoch."""
    return math.floor(now / DAY_S) * DAY_S


@dataclass(frozen=True, slots=True)
class Spending:
    """Today's spending beside the limits that apply to one room."""

    room: float
    service: float
    room_limit: float | None
    service_limit: float | None

    def spent(self) -> str | None:
        """Which budget is spent (``room``, ``service``), or None while both leave room."""
        if self.room_limit is not None and self.room >= self.room_limit:
            return "room"
        if self.service_limit is not None and self.service >= self.service_limit:
            return "service"
        return None


@dataclass(frozen=True, slots=True)
class Budgets:
    """The daily budgets of ``settings``, read from ``store`` at ``wall_clock``'s today."""

    settings: Settings
    store: LedgerStore
    wall_clock: Callable[[], float] = time.time

    async def spending(self, room: RoomKey) -> Spending:
        """Today's spending of ``room`` and of the service (raises :class:`StoreError`)."""
        since = day_start(self.wall_clock())
        settings = self.settings.room(room)
        room_limit = settings.daily_budget_usd if settings is not None else None
        service_limit = self.settings.budget.daily_usd
        # Only the sums a limit needs: most rooms have none, and this is on a run's path.
        room_spent = await self.store.spend(since, room) if room_limit is not None else 0.0
        service_spent = await self.store.spend(since) if service_limit is not None else 0.0
        return Spending(room_spent, service_spent, room_limit, service_limit)

    async def refusal(self, room: RoomKey) -> tuple[str, str] | None:
        """Why a run of ``room`` may not start now (which budget, and the words for the
        room), or None. A store that cannot say lets the run start: the budget is a
        guard on spending, not a reason to stop a room while the database recovers."""
        if self.settings.budget.daily_usd is None:
            settings = self.settings.room(room)
            if settings is None or settings.daily_budget_usd is None:
                return None
        try:
            spending = await self.spending(room)
        except StoreError:
            log.warning("could not read today's spending; the run starts unchecked", exc_info=True)
            return None
        which = spending.spent()
        if which == "room" and spending.room_limit is not None:
            spent, limit, whose = spending.room, spending.room_limit, "this room's"
        elif which == "service" and spending.service_limit is not None:
            spent, limit, whose = spending.service, spending.service_limit, "chatbridge's"
        else:
            return None
        reset = datetime.fromtimestamp(day_start(self.wall_clock()) + DAY_S, UTC)
        text = (
            f"{whose} daily budget is spent ({usd(spent)} of {usd(limit)} today), so it did"
            f" not start. The budget resets at {reset:%Y-%m-%d %H:%M} UTC; your messages"
            " are kept."
        )
        return which, text

    async def status_lines(self, room: RoomKey) -> list[str]:
        """``!status``'s line about spending: today's spend and the limits that apply."""
        since = day_start(self.wall_clock())
        try:
            room_spent = await self.store.spend(since, room)
            service_spent = await self.store.spend(since)
        except StoreError:
            return ["Spent today: unknown (the database failed)."]
        settings = self.settings.room(room)
        room_limit = settings.daily_budget_usd if settings is not None else None
        run_limit = settings.max_budget_usd if settings is not None else None
        service_limit = self.settings.budget.daily_usd
        text = f"Spent today (UTC): {usd(room_spent)} in this room"
        if room_limit is not None:
            text += f" of {usd(room_limit)}"
        text += f", {usd(service_spent)} in all rooms"
        if service_limit is not None:
            text += f" of {usd(service_limit)}"
        text += "."
        if run_limit is not None:
            text += f" Each run may spend {usd(run_limit)}."
        return [text]
