"""How long a thread's worktree lives: listed and pruned by ``!worktrees``, and
removed by a sweep once its thread has had no run for ``worktree_idle_days``.

A worktree in use (its conversation has a run or waiting messages) is never
touched. Rooms may share a repository: a room lists and prunes only its own
threads' worktrees (and those made before worktrees named their room), and
any room's work keeps a worktree in use. Removing one keeps its work
(:meth:`Worktrees.retire`): uncommitted changes are committed to its
branch, which stays; the thread is told. See docs/conversations.md ("Worktrees").
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from bridge.config import RoomSettings
from bridge.core.model import RoomKey
from bridge.host.worktrees import WORKTREES, Worktree, Worktrees, named, owner_of, worktree_of

log = logging.getLogger(__name__)

DAY_S = 86400.0
SWEEP_EVERY_S = 3600.0


@dataclass(frozen=True, slots=True)
class Found:
    """A worktree of a room, as found on disk."""

    tree: Worktree
    idle_s: float
    """Since the last run started in it."""
    in_use: bool
    """Its conversation has a run or waiting messages."""


Busy = Callable[[RoomKey], Sequence[RoomKey]]
"""The conversations of a room that have work now (the dispatcher's)."""
Running = Callable[[], Awaitable[Sequence[RoomKey]]]
"""The conversations with a run marked running in the store: any replica's, since
replicas may share a working directory (docs/replicas.md)."""
Say = Callable[[RoomKey, str], Awaitable[None]]
"""A notice to a conversation."""


def found(
    room: RoomKey, settings: RoomSettings, busy: Sequence[RoomKey], now: float
) -> list[Found]:
    """The worktrees under ``room``'s cwd, longest idle first; ``busy``: the
    conversations with work now."""
    top = settings.cwd.resolve() / WORKTREES
    try:
        entries = sorted(p for p in top.iterdir() if (p / ".git").exists())
    except OSError:
        return []
    working = {tree.path for tree in _in_use(settings, busy)}
    trees = []
    for path in entries:
        thread, owner = _thread(path)
        if owner and owner != owner_of(room):
            continue  # another room's thread, in the same repository
        tree = named(path.name, settings, thread, owner)
        try:
            idle = max(0.0, now - tree.base_file.stat().st_mtime)
        except OSError:
            idle = 0.0  # no stamp: not known to be idle
        trees.append(Found(tree, idle, tree.path in working))
    return sorted(trees, key=lambda f: -f.idle_s)


def _thread(path: Path) -> tuple[str, str]:
    """The thread and the room (:func:`owner_of`) a worktree's thread file names."""
    try:
        text = path.with_name(path.name + ".thread").read_text(encoding="utf-8")
    except OSError:
        return "", ""
    thread, _, owner = text.partition("\n")
    return thread.strip(), owner.strip()


def listing(trees: Sequence[Found]) -> str:
    """What ``!worktrees`` answers."""
    if not trees:
        return "This room has no thread worktrees."
    lines = [f"{len(trees)} thread worktree(s):"]
    for f in trees:
        state = "in use" if f.in_use else f"no run for {_age(f.idle_s)}"
        lines.append(f"- `{f.tree.branch}` at `{f.tree.path}`: {state}")
    return "\n".join(lines)


def _age(seconds: float) -> str:
    if seconds >= DAY_S:
        return f"{seconds / DAY_S:.1f} days"
    if seconds >= 3600:
        return f"{seconds / 3600:.1f} h"
    return f"{max(1, round(seconds / 60))} min"


@dataclass(slots=True)
class Lifetimes:
    """Prunes the worktrees of ``worktree = true`` rooms."""

    worktrees: Worktrees
    rooms: Callable[[], Sequence[tuple[RoomKey, RoomSettings]]]
    busy: Busy
    running: Running
    say: Say
    clock: Callable[[], float] = time.time

    async def busy_in(self, room: RoomKey) -> list[RoomKey]:
        """Conversations with work here or a run on any replica, of every room: rooms
        may share ``room``'s repository, and a worktree is found by its thread alone."""
        here = [key for other, _ in self.rooms() for key in self.busy(other)]
        return [*self.busy(room), *here, *await self.running()]

    async def found(self, room: RoomKey, settings: RoomSettings) -> list[Found]:
        """:func:`found`, with what is busy now."""
        return found(room, settings, await self.busy_in(room), self.clock())

    async def prune(self, room: RoomKey, settings: RoomSettings, idle_s: float, why: str) -> int:
        """Retire ``room``'s worktrees not in use and idle at least ``idle_s``; how many
        were looked at. Each thread (or, not knowing it, the room) is told the outcome."""
        done = 0
        for f in await self.found(room, settings):
            if f.in_use or f.idle_s < idle_s:
                continue
            # Looked up again at the last moment: a run may have started meanwhile.
            if f.tree.path in {t.path for t in _in_use(settings, await self.busy_in(room))}:
                continue
            note = await self.worktrees.retire(f.tree, why)
            done += 1
            if note:
                where = room.in_thread(f.tree.thread) if f.tree.thread else room
                await self.say(where, note)
        return done

    async def sweep_forever(self) -> None:
        """:meth:`sweep` every :data:`SWEEP_EVERY_S`, from the start."""
        if not any(s.worktree for _, s in self.rooms()):
            return
        while True:
            await self.sweep()
            await asyncio.sleep(SWEEP_EVERY_S)

    async def sweep(self) -> None:
        """Once: every room's worktrees idle past its ``worktree_idle_days``."""
        for room, settings in self.rooms():
            days = settings.worktree_idle_days
            if not settings.worktree or days <= 0:
                continue
            try:
                await self.prune(room, settings, days * DAY_S, f"no run for {days:g} days")
            except Exception:
                log.exception("could not prune the worktrees of %s", room)


def _in_use(settings: RoomSettings, busy: Sequence[RoomKey]) -> list[Worktree]:
    return [t for key in busy if (t := worktree_of(key, settings)) is not None]
