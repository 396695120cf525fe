"""Runs' private directories: ``<state_dir>/runs/<run id>/`` (docs/detached-runs.md).

Each holds the supervisor's socket and the run's journal. The bridge creates
it before the run, and removes it once the run ended and the room was told.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import stat
import tempfile
from pathlib import Path

from bridge.core.model import LiveRun, RunId
from runner.journal import JOURNAL

RUNS = "runs"
TEMP_PREFIX = "chatbridge-runs-"


def prepare_state_dir(state_dir: Path) -> Path:
    """Create ``state_dir`` and its ``runs/``, mode 0700; return ``state_dir`` resolved.

    Resolved first: a relative ``state_dir`` is the working directory's (the
    supervisor, which works in the run's directory, is given absolute paths),
    and a symlink the operator made to place it elsewhere is followed. Both
    may exist already, but must then be directories of this user's (``runs/``
    not a symlink): they are made mode 0700 (a lax mode lets others plant a
    symlink or read the journals). Raises OSError.
    """
    state_dir = state_dir.resolve()
    state_dir.parent.mkdir(parents=True, exist_ok=True)
    _private_dir(state_dir)
    _private_dir(state_dir / RUNS)
    return state_dir


def run_dir_made(state_dir: Path, run_id: str) -> bool:
    """Whether run ``run_id``'s directory exists under ``state_dir``: made before its
    supervisor is spawned, removed once its outcome is recorded (emptied only, when
    it could not be: see :func:`remove_run_dir`)."""
    return (state_dir / RUNS / run_id).exists()


def make_run_dir(state_dir: Path | None, run_id: RunId) -> Path:
    """Create the run's directory mode 0700 (see :func:`prepare_state_dir`); return it.

    The run's own directory is always new (an existing one, or a symlink
    there, is refused). ``state_dir`` None: a fresh temporary directory stands
    in for it (tests). Raises OSError.
    """
    if state_dir is None:
        state_dir = Path(tempfile.mkdtemp(prefix=TEMP_PREFIX))
    run_dir = prepare_state_dir(state_dir) / RUNS / run_id
    run_dir.mkdir(mode=0o700)
    return run_dir


def _private_dir(path: Path) -> None:
    """Make sure ``path`` is a directory of ours (not a symlink), mode 0700. Raises OSError."""
    with contextlib.suppress(FileExistsError):
        path.mkdir(mode=0o700)
    # Opened without following a symlink, then checked and changed through the fd:
    # what is checked is what is changed.
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            raise OSError(exc.errno, f"{path} is not a directory (a symlink?)") from exc
        raise
    try:
        st = os.fstat(fd)
        if st.st_uid != os.geteuid():
            raise OSError(errno.EPERM, f"{path} is owned by uid {st.st_uid}, not by this user")
        if stat.S_IMODE(st.st_mode) != 0o700:
            os.fchmod(fd, 0o700)
    finally:
        os.close(fd)


def journal_exists(run: LiveRun) -> bool:
    """Whether the run's journal is still there (the bridge removes it once the run ended)."""
    return (Path(run.run_dir) / JOURNAL).is_file()


def remove_run_dir(run: LiveRun | Path | str, *, keep_dir: bool = False) -> None:
    """Delete a run's directory (once its outcome is recorded); a missing one is fine.

    A temporary state directory made for it (``state_dir`` None) goes with it.
    With ``keep_dir`` only what is in it goes: the empty directory still says
    the run began (:func:`run_dir_made`), until the next start's stray sweep.
    """
    run_dir = Path(run.run_dir if isinstance(run, LiveRun) else run)
    if keep_dir:
        for entry in list(run_dir.iterdir()) if run_dir.is_dir() else []:
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry, ignore_errors=True)
            else:
                entry.unlink(missing_ok=True)
        return
    shutil.rmtree(run_dir, ignore_errors=True)
    root = run_dir.parent.parent
    if root.name.startswith(TEMP_PREFIX) and root.parent == Path(tempfile.gettempdir()):
        shutil.rmtree(root, ignore_errors=True)


def stray_runs(state_dir: Path, known: set[str]) -> list[Path]:
    """Run directories under ``state_dir`` whose run id is not in ``known``."""
    try:
        entries = list((state_dir / RUNS).iterdir())
    except OSError:
        return []
    return sorted(p for p in entries if p.is_dir() and p.name not in known)
