"""A git worktree per thread conversation (``worktree = true`` with ``conversation = "thread"``).

Each thread works in ``.chatbridge/worktrees/<thread>`` under the room's ``cwd``, on branch
``chatbridge/<thread>``, made on its first run; it is removed only when nothing would be lost
(no uncommitted change, no commit neither in its base nor on a remote). git runs with an
argument list, never a shell, and thread ids become names through :func:`slug`
(docs/conversations.md, "Worktrees").
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from bridge.config import RoomSettings
from bridge.core.model import RoomKey
from bridge.host.git import run_git

log = logging.getLogger(__name__)

WORKTREES = Path(".chatbridge") / "worktrees"
"""Under the room's cwd."""
BRANCH_PREFIX = "chatbridge/"
GIT_TIMEOUT_S = 60.0
"""A git command that takes longer is given up (a hung filesystem, a lock)."""


class WorktreeError(Exception):
    """The thread's worktree could not be made: the message says why, for the room."""


@dataclass(frozen=True, slots=True)
class Worktree:
    repo: Path
    """The room's cwd: a directory of the git repository the worktree belongs to."""
    path: Path
    branch: str
    workdir: Path
    """Where runs work: the place of ``repo`` inside the worktree (a ``cwd`` below
    the repository's top has the same place in each thread's checkout)."""
    thread: str = ""
    """The thread's id, when known (a worktree found on disk names it in its thread file)."""
    owner: str = ""
    """The room whose thread it is (:func:`owner_of`), when known: rooms may share a
    repository, and each lists and prunes only its own threads' worktrees."""

    @property
    def base_file(self) -> Path:
        """Where the commit the worktree started from is kept (for the removal check).
        Touched at every run's start: its age is how long the thread has been idle."""
        return self.path.with_name(self.path.name + ".base")

    @property
    def thread_file(self) -> Path:
        """Where the thread's id and its room (:attr:`owner`) are kept, one a line, so a
        worktree found on disk can name its thread."""
        return self.path.with_name(self.path.name + ".thread")


def owner_of(room: RoomKey) -> str:
    """How a worktree names the room of its thread (transport and room id, no blanks)."""
    return f"{room.transport} {room.room_id}"


def slug(thread: str) -> str:
    """A file and branch name for ``thread``: letters, digits, ``-`` and ``_`` only,
    plus a short hash so two ids that clean up alike stay apart."""
    clean = re.sub(r"[^A-Za-z0-9_-]+", "-", thread).strip("-")[:40]
    digest = hashlib.sha256(thread.encode()).hexdigest()[:8]
    return f"{clean}-{digest}" if clean else digest


def worktree_of(key: RoomKey, room: RoomSettings) -> Worktree | None:
    """The worktree of the conversation ``key``, if its room gives threads one."""
    if not room.worktree or not key.thread:
        return None
    return named(slug(key.thread), room, key.thread, owner_of(key))


def named(name: str, room: RoomSettings, thread: str = "", owner: str = "") -> Worktree:
    """The worktree called ``name`` (a :func:`slug`) of ``room``."""
    repo = room.cwd.resolve()
    path = repo / WORKTREES / name
    top = _top(repo)
    workdir = path if top is None else path / repo.relative_to(top)
    branch = BRANCH_PREFIX + name
    return Worktree(
        repo=repo, path=path, branch=branch, workdir=workdir, thread=thread, owner=owner
    )


def _top(directory: Path) -> Path | None:
    """The top of the git checkout holding ``directory`` (as git finds it: the
    nearest directory with a ``.git``), if any."""
    return next((d for d in (directory, *directory.parents) if (d / ".git").exists()), None)


def in_worktree(key: RoomKey, room: RoomSettings) -> RoomSettings:
    """``room``'s settings for a run of ``key``: in its thread's worktree, if it has one."""
    tree = worktree_of(key, room)
    return room if tree is None else room.model_copy(update={"cwd": tree.workdir})


async def git(cwd: Path, *args: str) -> tuple[int, str]:
    """Run git in ``cwd``: its exit status and its output (stdout and stderr).

    Raises :class:`WorktreeError` when git cannot run (not installed, no such
    directory) or hangs: the room is told that, not of an internal error.
    """
    try:
        code, out = await run_git(
            cwd, *args, timeout_s=GIT_TIMEOUT_S, stderr=asyncio.subprocess.STDOUT
        )
    except OSError as exc:
        raise WorktreeError(f"could not run git: {exc.strerror or exc}") from exc
    except TimeoutError:
        raise WorktreeError(f"git {args[0]} took longer than {GIT_TIMEOUT_S:g}s") from None
    return code, out.decode(errors="replace").strip()


def _glob_escaped(path: str) -> str:
    """``path`` as a gitignore pattern matching just itself (its directory names are
    the operator's, and may hold glob characters or a trailing space)."""
    return re.sub(r"([*?\[\]\\!# ])", r"\\\1", path)


@dataclass(slots=True)
class Worktrees:
    """Makes and removes threads' worktrees; git's own locks do not like two at once
    in one repository, so each repository's changes go one at a time."""

    _locks: dict[Path, asyncio.Lock] = field(default_factory=dict)

    def _lock(self, tree: Worktree) -> asyncio.Lock:
        return self._locks.setdefault(tree.repo, asyncio.Lock())

    async def settings_for(self, key: RoomKey, room: RoomSettings) -> RoomSettings:
        """``room``'s settings for a run of ``key``, its worktree made if it needs one.
        Raises :class:`WorktreeError`."""
        tree = worktree_of(key, room)
        if tree is None:
            return room
        await self.ensure(tree)
        return room.model_copy(update={"cwd": tree.workdir})

    async def ensure(self, tree: Worktree) -> None:
        """Make the worktree if it is not there yet. Raises :class:`WorktreeError`."""
        async with self._lock(tree):
            if not (tree.path / ".git").exists():
                await self._make(tree)
            # cwd may be a directory the commit lacks (nothing tracked there yet).
            tree.workdir.mkdir(parents=True, exist_ok=True)
            # A run starts in it: the thread is not idle (bridge/runs/worktree_lifetime.py).
            with contextlib.suppress(OSError):
                os.utime(tree.base_file)
            with contextlib.suppress(OSError):
                self._name_thread(tree)

    @staticmethod
    def _name_thread(tree: Worktree) -> None:
        """Write the thread file, unless it names the thread and its room already (one
        made before worktrees named their room gets the room now)."""
        if not tree.thread:
            return
        text = f"{tree.thread}\n{tree.owner}\n"
        file = tree.thread_file
        if not file.exists() or len(file.read_text(encoding="utf-8").split()) < 3:
            file.write_text(text, encoding="utf-8")

    async def _make(self, tree: Worktree) -> None:
        """Make the worktree (under the repository lock)."""
        status, top = await git(tree.repo, "rev-parse", "--show-toplevel")
        if status != 0:
            raise WorktreeError(f"`worktree = true`, but {tree.repo} is not in a git repository")
        status, head = await git(tree.repo, "rev-parse", "--verify", "HEAD")
        if status != 0:
            raise WorktreeError(f"the repository at {top} has no commit to start a branch from")
        await self._exclude(tree)
        tree.path.parent.mkdir(parents=True, exist_ok=True)
        if not tree.path.exists():
            # Deleted by hand (rm -rf), it stays registered, and git would refuse
            # its path and branch forever: unregister just this one (its branch,
            # and so its commits, stay; git says "not a working tree" otherwise).
            await git(tree.repo, "worktree", "remove", str(tree.path))
        status, _ = await git(tree.repo, "rev-parse", "--verify", f"refs/heads/{tree.branch}")
        if status == 0:  # the branch outlived an earlier worktree: carry on with it
            args = ["worktree", "add", str(tree.path), tree.branch]
        else:
            args = ["worktree", "add", "-b", tree.branch, str(tree.path), head]
        status, out = await git(tree.repo, *args)
        if status != 0:
            raise WorktreeError(f"could not make the thread's worktree: {out}")
        tree.base_file.write_text(head + "\n", encoding="utf-8")
        log.info("made worktree %s on branch %s", tree.path, tree.branch)

    async def _exclude(self, tree: Worktree) -> None:
        """Keep ``.chatbridge/`` out of the repository's own ``git status`` (local only).

        The pattern is anchored where the worktrees are: ``cwd`` may be below
        the repository's top, and an exclude pattern with a ``/`` is relative
        to the top.
        """
        status, path = await git(tree.repo, "rev-parse", "--git-path", "info/exclude")
        if status != 0:
            return
        exclude = Path(path) if Path(path).is_absolute() else tree.repo / path
        below = tree.workdir.relative_to(tree.path).as_posix()  # where cwd is below the top
        pattern = "/.chatbridge/" if below == "." else f"/{_glob_escaped(below)}/.chatbridge/"
        lines = exclude.read_text(encoding="utf-8").splitlines() if exclude.exists() else []
        if pattern not in lines and ".chatbridge/" not in lines:
            exclude.parent.mkdir(parents=True, exist_ok=True)
            with exclude.open("a", encoding="utf-8") as f:
                f.write(pattern + "\n")

    async def unsaved(self, tree: Worktree) -> list[str]:
        """What removing the worktree would lose, for the room; [] when nothing."""
        status, changes = await git(tree.path, "status", "--porcelain")
        if status != 0:
            return [f"git cannot read it: {changes}"]
        found = []
        if changes:
            found.append(f"{len(changes.splitlines())} uncommitted change(s)")
        base = tree.base_file.read_text(encoding="utf-8").strip() if tree.base_file.exists() else ""
        keep = [f"^{base}"] if base else []
        # The branch too: the worktree may have left it (a detached HEAD, another
        # branch), and removing the worktree deletes the branch.
        heads = ["HEAD"]
        branch = f"refs/heads/{tree.branch}"
        if (await git(tree.path, "rev-parse", "--verify", "--quiet", branch))[0] == 0:
            heads.append(branch)
        status, count = await git(
            tree.path, "rev-list", "--count", *heads, *keep, "--not", "--remotes"
        )
        if status != 0:
            found.append(f"git cannot count its commits: {count}")
        elif int(count or 0):
            found.append(f"{count} commit(s) on `{tree.branch}` not pushed")
        return found

    async def remove(self, tree: Worktree) -> str:
        """Remove the worktree and its branch if nothing would be lost; what the room is told."""
        async with self._lock(tree):
            if not (tree.path / ".git").exists():
                return ""
            try:
                return await self._remove(tree)
            except WorktreeError as problem:
                return f"The thread's worktree `{tree.path}` stays: {problem}."

    async def _remove(self, tree: Worktree) -> str:
        unsaved = await self.unsaved(tree)
        if unsaved:
            return (
                f"The thread's worktree `{tree.path}` stays: {'; '.join(unsaved)}."
                " Commit and push (or discard) it, then reset again to remove it."
            )
        status, out = await git(tree.repo, "worktree", "remove", str(tree.path))
        if status != 0:
            return f"The thread's worktree `{tree.path}` stays: git said {out}"
        tree.base_file.unlink(missing_ok=True)
        tree.thread_file.unlink(missing_ok=True)
        # Every commit of the branch is in its base or on a remote (checked above).
        await git(tree.repo, "branch", "-D", tree.branch)
        log.info("removed worktree %s and branch %s", tree.path, tree.branch)
        return f"Removed the thread's worktree and its branch `{tree.branch}`."

    async def retire(self, tree: Worktree, why: str) -> str:
        """Remove the worktree of a thread that is done with it (``why``: idle, pruned),
        keeping its work; what the thread is told ("" if there was none).

        Nothing to lose: the worktree and its branch go, as with ``!reset``.
        Otherwise the uncommitted changes are committed to the branch, and the
        worktree goes while the branch stays with all the work. When they
        cannot be committed (git refuses, HEAD is not on the branch) the
        worktree stays, and the message says why.
        """
        async with self._lock(tree):
            if not (tree.path / ".git").exists():
                return ""
            try:
                return await self._retire(tree, why)
            except WorktreeError as problem:
                return f"The thread's worktree `{tree.path}` stays: {problem}."

    async def _retire(self, tree: Worktree, why: str) -> str:
        unsaved = await self.unsaved(tree)
        if not unsaved:
            note = await self._remove(tree)
            return f"{why}: {note}" if note.startswith("Removed") else note
        status, head = await git(tree.path, "symbolic-ref", "--quiet", "HEAD")
        if status != 0 or head != f"refs/heads/{tree.branch}":
            return (
                f"The thread's worktree `{tree.path}` stays ({why}): it is not on its branch"
                f" `{tree.branch}`, so its work would not be kept there. Remove it by hand."
            )
        saved = ""
        _, changes = await git(tree.path, "status", "--porcelain")
        if changes:
            await git(tree.path, "add", "--all")
            status, out = await git(
                tree.path,
                *_COMMITTER,
                "commit",
                "--quiet",
                "--no-verify",
                "--message",
                f"chatbridge: uncommitted work of thread worktree {tree.path.name} ({why})",
            )
            if status != 0:
                return f"The thread's worktree `{tree.path}` stays ({why}): git commit said {out}"
            _, commit = await git(tree.path, "rev-parse", "--short", "HEAD")
            saved = f" Its uncommitted changes were committed there as {commit}."
        status, out = await git(tree.repo, "worktree", "remove", str(tree.path))
        if status != 0:
            return f"The thread's worktree `{tree.path}` stays ({why}): git said {out}"
        tree.base_file.unlink(missing_ok=True)
        tree.thread_file.unlink(missing_ok=True)
        log.info("retired worktree %s (%s); branch %s kept", tree.path, why, tree.branch)
        return (
            f"{why}: removed the thread's worktree; its work stays on branch `{tree.branch}`."
            f"{saved} A new run here starts from that branch."
        )


_COMMITTER = ("-c", "user.name=chatbridge", "-c", "user.email=chatbridge@localhost")
"""The commit that keeps an idle thread's uncommitted work is chatbridge's: it says
so whatever identity the repository configures, and needs none configured."""
