"""One chatbridge per state directory: its runs are that process's to follow.

Two bridges on one ``[runner] state_dir`` would each reattach the other's
runs at start-up and take their supervisors' connections from each other
(a supervisor serves one bridge at a time), and each would clean up the
other's run directories as strays. An exclusive ``flock`` on
``<state_dir>/lock``, held for the service's life, rules that out: the
second start fails with one line naming the setting and the holder's pid.
The kernel drops the lock when the process dies, however it dies, so a
crash never leaves a stale lock. The lock's descriptor is close-on-exec:
runs' supervisors, which outlive the bridge, never hold it.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path

from bridge.errors import StartupError
from runner import prepare_state_dir

LOCK = "lock"


class LockHeld(Exception):
    """Another process holds the lock; ``holder`` is the pid it wrote ("?" if none)."""

    def __init__(self, holder: str) -> None:
        super().__init__(holder)
        self.holder = holder


@contextlib.contextmanager
def pid_lock(path: Path) -> Iterator[None]:
    """An exclusive ``flock`` on ``path`` (made 0600), this process's pid written in it,
    for the block. Raises OSError if it cannot be opened, :class:`LockHeld` if another
    process holds it. The kernel drops it when the process dies, however it dies."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise LockHeld(os.pread(fd, 32, 0).decode(errors="replace").strip() or "?") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield
    finally:
        os.close(fd)  # closing drops the lock


@contextlib.contextmanager
def state_dir_lock(state_dir: Path) -> Iterator[None]:
    """Hold ``state_dir``'s lock for the block (the directory is prepared as runs need it).

    Raises :class:`StartupError` when the directory cannot be made or another
    process holds the lock.
    """
    with contextlib.ExitStack() as held_for_the_block:
        try:
            # Checked as every run's directory will be: a problem is one line now,
            # not a failure of every run later.
            state_dir = prepare_state_dir(state_dir)
            held_for_the_block.enter_context(pid_lock(state_dir / LOCK))
        except LockHeld as held:
            raise StartupError(
                f"runner.state_dir: {state_dir} is in use by another chatbridge"
                f" (pid {held.holder}); give each chatbridge a state directory of its own"
            ) from None
        except OSError as exc:
            detail = exc.strerror or str(exc)
            raise StartupError(f"runner.state_dir: cannot use {state_dir}: {detail}") from exc
        yield
