"""Files that hold chat content are private to chatbridge's user, whatever the umask.

Files are created 0600 and directories 0700 (``os.open``/``mkdir`` modes are
cut by the umask, never widened, so these never come out wider); a file or
directory that is there already is narrowed to that if it is ours. What is
private and why: docs/operations.md, "Files and permissions".
"""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Sequence
from pathlib import Path

FILE_MODE = 0o600
DIR_MODE = 0o700


def narrow(path: Path | str, mode: int) -> None:
    """Take group and other permissions off ``path`` if it exists and is ours (a
    symlink is left alone: its target is not ours to change)."""
    with contextlib.suppress(FileNotFoundError):
        info = os.lstat(path)
        if stat.S_ISLNK(info.st_mode) or info.st_uid != os.geteuid():
            return
        if stat.S_IMODE(info.st_mode) & ~mode:
            os.chmod(path, stat.S_IMODE(info.st_mode) & mode)


def private_file(path: Path | str) -> None:
    """``path`` exists and is 0600 (created empty if it was not there)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, FILE_MODE)
    os.close(fd)
    narrow(path, FILE_MODE)


def sqlite_files(database: Path | str) -> None:
    """A SQLite database's file and its companions (``-wal``, ``-shm``, ``-journal``)
    private before SQLite opens them: SQLite gives its companions the database's mode.

    A symlink the operator made to place the database elsewhere is followed, as
    SQLite does (its companions are beside the file it leads to)."""
    database = os.path.realpath(database)
    private_file(database)
    for suffix in ("-wal", "-shm", "-journal"):
        narrow(f"{database}{suffix}", FILE_MODE)


_DIR_NOFOLLOW = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def open_private_dirs(base: Path, parts: Sequence[str]) -> int:
    """An fd for ``base``/``parts``, each part made (0700) if missing and narrowed to
    0700, opened one at a time from the one before: never through a symbolic link
    (raises OSError, ELOOP or ENOTDIR, for one), so what it names cannot be moved
    elsewhere by a link planted in ``base``. The caller closes the fd."""
    fd = os.open(base, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for part in parts:
            with contextlib.suppress(FileExistsError):
                os.mkdir(part, DIR_MODE, dir_fd=fd)
            inner = os.open(part, _DIR_NOFOLLOW, dir_fd=fd)
            os.close(fd)
            fd = inner
            info = os.fstat(fd)
            if info.st_uid == os.geteuid() and stat.S_IMODE(info.st_mode) & ~DIR_MODE:
                os.fchmod(fd, stat.S_IMODE(info.st_mode) & DIR_MODE)
    except BaseException:
        os.close(fd)
        raise
    return fd


def private_dirs(path: Path) -> None:
    """``path`` a directory, each part of it that was missing made 0700 (``mkdir -p``
    would give the parents the umask's mode)."""
    missing = []
    while not path.exists():
        missing.append(path)
        path = path.parent
    for directory in reversed(missing):
        with contextlib.suppress(FileExistsError):  # made meanwhile: as it is
            directory.mkdir(mode=DIR_MODE)
