"""What a run changed in its git working directory: files, lines, and the whole diff.

Before the run, the working tree as it is (tracked and untracked files that
git does not ignore, whatever is staged) is written as a git tree through a
private copy of the index, so the repository's own index, branch and stash
are never touched; after the run the same again, and the two trees are
compared. Commits the run made, edits left uncommitted and new files all
count; chatbridge's own ``.chatbridge/`` does not. git runs with an argument
list, never a shell, and with nothing the repository's configuration names run
(fsmonitor, hooks, clean filters, textconv, external diffs): a run that may edit
files may write ``.git/config`` (docs/conversations.md, "What a run changed").
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from bridge.host.git import run_git
from bridge.live.approval_text import code_span

GIT_TIMEOUT_S = 30.0
OWN = ".chatbridge"
"""Inbox files and worktrees chatbridge keeps under a room's cwd: never a run's change."""


@dataclass(frozen=True, slots=True)
class Snapshot:
    top: Path
    """The repository's top directory."""
    cwd: Path
    tree: str
    """The git tree of the working directory as it was."""
    guard: tuple[str, ...] = ()
    """git's ``-c`` options that keep the repository's configuration from running commands."""


@dataclass(frozen=True, slots=True)
class FileChange:
    path: str
    added: int | None
    """None for a binary file."""
    removed: int | None


@dataclass(frozen=True, slots=True)
class Changes:
    files: tuple[FileChange, ...]
    patch: str
    """The whole diff (``git diff`` of the two trees), binary files named, not shown;
    "" when it is over the size asked for (``patch_over``) or git failed."""
    patch_over: bool = False

    @property
    def added(self) -> int:
        return sum(f.added or 0 for f in self.files)

    @property
    def removed(self) -> int:
        return sum(f.removed or 0 for f in self.files)


async def _git(
    cwd: Path, *args: str, env: Mapping[str, str] | None = None, limit: int | None = None
) -> tuple[int, bytes]:
    """git's exit code and output (-1 and none when git cannot start or hangs); with
    ``limit``, at most ``limit + 1`` bytes of it are read (git is stopped there: its code
    is then -1)."""
    try:
        return await run_git(cwd, *args, timeout_s=GIT_TIMEOUT_S, env=env, limit=limit)
    except (OSError, TimeoutError):
        return -1, b""


async def _guard(top: Path) -> tuple[str, ...] | None:
    """``-c`` options that turn off what a repository's configuration could make our git
    run: a run that may edit files may write ``.git/config``, and chatbridge's own git
    asks nobody (the fsmonitor, hooks, and every configured clean filter; diffs are
    taken with ``--no-textconv --no-ext-diff``)."""
    code, out = await _git(top, "config", "-z", "--name-only", "--get-regexp", r"^filter\.")
    if code not in (0, 1):  # 1: no filter configured
        return None
    guard = ["-c", "core.fsmonitor=false", "-c", f"core.hooksPath={os.devnull}"]
    for name in out.decode(errors="surrogateescape").split("\0"):
        driver, _, key = name.rpartition(".")
        if driver.startswith("filter.") and key in ("clean", "smudge", "process"):
            guard += ["-c", f"{driver}.{key}="]
    return tuple(guard)


async def snapshot(cwd: Path) -> Snapshot | None:
    """The working directory's state as a git tree; None where ``cwd`` is not in a work
    tree of git (or git fails): such runs get no summary of changes."""
    code, out = await _git(cwd, "rev-parse", "--show-toplevel", "--git-path", "index")
    lines = out.decode(errors="replace").splitlines()
    if code != 0 or len(lines) != 2:
        return None
    top = Path(lines[0])
    index = Path(lines[1]) if os.path.isabs(lines[1]) else cwd / lines[1]
    guard = await _guard(top)
    if guard is None:
        return None
    with tempfile.TemporaryDirectory(prefix="chatbridge-index-") as private:
        temp_index = Path(private) / "index"
        # From the real index: git then rehashes only what changed since it.
        with contextlib.suppress(OSError):
            shutil.copyfile(index, temp_index)
        env = {"GIT_INDEX_FILE": str(temp_index)}
        own = f":(top,exclude){_relative(top, cwd / OWN)}"
        code, _ = await _git(top, *guard, "add", "-A", "--", ":(top)", own, env=env)
        if code != 0:
            return None
        code, out = await _git(top, *guard, "write-tree", env=env)
    tree = out.decode().strip()
    if code != 0 or not tree:
        return None
    return Snapshot(top, cwd, tree, guard)


def _relative(top: Path, path: Path) -> str:
    try:
        return str(path.resolve().relative_to(top.resolve()))
    except ValueError:
        return str(path)


async def changes(before: Snapshot, max_patch_bytes: int | None = None) -> Changes | None:
    """What changed since ``before``; None if nothing did (or git cannot say). A diff
    longer than ``max_patch_bytes`` is not read past that (``patch_over``)."""
    after = await snapshot(before.cwd)
    if after is None or after.tree == before.tree:
        return None
    plain = ("--no-textconv", "--no-ext-diff")
    code, out = await _git(
        before.top, *after.guard, "diff", *plain, "--numstat", "-z", before.tree, after.tree
    )
    if code != 0:
        return None
    files = tuple(_numstat(out))
    if not files:
        return None
    code, patch = await _git(
        before.top,
        *after.guard,
        "diff",
        *plain,
        "--no-color",
        before.tree,
        after.tree,
        limit=max_patch_bytes,
    )
    if max_patch_bytes is not None and len(patch) > max_patch_bytes:
        return Changes(files, "", patch_over=True)
    return Changes(files, patch.decode(errors="replace") if code == 0 else "")


def _numstat(out: bytes) -> list[FileChange]:
    """``git diff --numstat -z``: ``added\\tremoved\\tpath\\0`` (a rename: empty path,
    then the old and new paths as two more fields)."""
    fields = out.split(b"\0")
    found = []
    i = 0
    while i < len(fields) and fields[i]:
        added, removed, path = fields[i].split(b"\t", 2)
        if not path:
            path = fields[i + 2]  # renamed: old at i + 1, new at i + 2
            i += 2
        found.append(
            FileChange(
                path.decode(errors="replace"),
                None if added == b"-" else int(added),
                None if removed == b"-" else int(removed),
            )
        )
        i += 1
    return found


SHOWN_FILES = 10


def summary_line(changes: Changes) -> str:
    """``Changed 3 files (+12 -4): a.py (+10 -1), …``: what a person reads under the answer."""
    n = len(changes.files)
    head = f"Changed {n} file{'s' if n != 1 else ''} (+{changes.added} -{changes.removed})"
    shown = []
    for f in changes.files[:SHOWN_FILES]:
        lines = "binary" if f.added is None else f"+{f.added} -{f.removed}"
        shown.append(f"{code_span(f.path)} ({lines})")
    more = f", and {n - SHOWN_FILES} more" if n > SHOWN_FILES else ""
    return f"{head}: {', '.join(shown)}{more}."
