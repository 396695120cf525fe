"""How the supervisor starts claude: in a session of its own, on the run's pipes, in its cgroup.

By ``clone3(CLONE_INTO_CGROUP)``; where that is refused (old kernel, seccomp ``ENOSYS``), by
subprocess, imported only then. A failure to ``exec`` comes back to the parent as an errno
over a close-on-exec pipe. Why, and why the child may run Python between ``clone3`` and
``exec``: docs/detached-runs.md, "The bridge's side (`runner`)".
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import signal

TYPE_CHECKING = False
"""As ``typing.TYPE_CHECKING`` (mypy takes either), without importing ``typing`` at each start."""

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence
    from typing import NoReturn

    from runner.proctree import Cgroup

_SYS_CLONE3 = 435
"""The same number on every architecture (the syscall table is unified since 5.3)."""
_CLONE_INTO_CGROUP = 0x200000000


class _CloneArgs(ctypes.Structure):
    """``struct clone_args`` as of Linux 5.7 (88 bytes, with ``cgroup``)."""

    _fields_ = [
        (name, ctypes.c_uint64)
        for name in (
            "flags",
            "pidfd",
            "child_tid",
            "parent_tid",
            "exit_signal",
            "stack",
            "stack_size",
            "tls",
            "set_tid",
            "set_tid_size",
            "cgroup",
        )
    ]


class CgroupRefused(Exception):
    """claude's process could not enter the run's group; it did not start."""


def spawn(
    argv: Sequence[str],
    cwd: str,
    fds: tuple[int, int, int],
    cgroup: Cgroup | None,
    env: Mapping[str, str] | None = None,
) -> int:
    """Start ``argv`` in ``cwd`` with ``fds`` as its stdin, stdout and stderr, in a session
    of its own and (if given) in ``cgroup``, with ``env`` (None: this process's); its pid.
    The caller reaps it.

    Raises OSError when the program cannot be started, CgroupRefused when it
    could not enter ``cgroup`` (it did not start: try again without one).
    """
    pid = _clone_exec(argv, cwd, fds, cgroup, env)
    if pid is None:
        pid = _popen(argv, cwd, fds, cgroup, env)
    return pid


def _clone_exec(
    argv: Sequence[str],
    cwd: str,
    fds: tuple[int, int, int],
    cgroup: Cgroup | None,
    env: Mapping[str, str] | None,
) -> int | None:
    """Fork and exec by ``clone3``; None when ``clone3`` (with the group) is refused."""
    try:
        group = -1 if cgroup is None else os.open(cgroup.path, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return None  # subprocess tries the group its way, and says why it cannot
    err_r, err_w = os.pipe2(os.O_CLOEXEC)
    try:
        args = _CloneArgs(exit_signal=signal.SIGCHLD)
        if group >= 0:
            args.flags, args.cgroup = _CLONE_INTO_CGROUP, group
        libc = ctypes.PyDLL(None, use_errno=True)
        libc.syscall.restype = ctypes.c_long
        pid = int(libc.syscall(_SYS_CLONE3, ctypes.byref(args), ctypes.sizeof(args)))
        if pid == 0:
            _become(argv, cwd, fds, err_w, env)
    except BaseException:
        os.close(err_r)
        raise
    finally:
        os.close(err_w)
        if group >= 0:
            os.close(group)
    if pid < 0:
        os.close(err_r)
        return None
    with os.fdopen(err_r, "rb") as errors:
        failed = errors.read()
    if failed:
        os.waitpid(pid, 0)
        number, _, step = failed.partition(b":")
        code = int(number) if number.isdigit() else errno.ENOEXEC
        # Named as subprocess names it: the directory for a failed chdir.
        raise OSError(code, os.strerror(code), cwd if step == b"cwd" else argv[0])
    return pid


def _become(
    argv: Sequence[str],
    cwd: str,
    fds: tuple[int, int, int],
    err_w: int,
    env: Mapping[str, str] | None,
) -> NoReturn:
    """The child's part: set itself up and ``exec``; never returns."""
    code, step = errno.ENOEXEC, ""
    try:
        os.setsid()
        step = ":cwd"
        os.chdir(cwd)
        step = ""
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
        # The supervisor's inherited connection and the like: claude gets 0-2 only.
        os.closerange(3, err_w)
        os.closerange(err_w + 1, os.sysconf("SC_OPEN_MAX"))
        # Python ignores these; a program expects them at their defaults (as subprocess does).
        for sig in (signal.SIGPIPE, signal.SIGXFSZ):
            signal.signal(sig, signal.SIG_DFL)
        # argv, never a shell: chat text is on stdin.
        if env is None:
            os.execvp(argv[0], list(argv))  # noqa: S606
        os.execvpe(argv[0], list(argv), env)  # noqa: S606
    except OSError as exc:
        code = exc.errno or code
    finally:
        with contextlib.suppress(OSError):
            os.write(err_w, f"{code}{step}".encode())
        os._exit(127)


def _popen(
    argv: Sequence[str],
    cwd: str,
    fds: tuple[int, int, int],
    cgroup: Cgroup | None,
    env: Mapping[str, str] | None,
) -> int:
    import subprocess  # only where clone3 is refused: see the module's doc

    try:
        proc = subprocess.Popen(
            argv,
            stdin=fds[0],
            stdout=fds[1],
            stderr=fds[2],
            cwd=cwd,
            env=env,
            start_new_session=True,
            close_fds=True,
            # Only with a cgroup: a preexec_fn rules out the faster vfork path. Safe
            # here: the supervisor has no other thread.
            preexec_fn=cgroup.enter if cgroup is not None else None,  # noqa: PLW1509
        )
    except subprocess.SubprocessError as exc:
        # Only the preexec_fn raises this: the child could not enter the group
        # and exited before exec.
        raise CgroupRefused(str(exc)) from exc
    # The supervisor reaps with waitpid(-1); Popen must not try to.
    proc.returncode = 0
    return proc.pid


__all__ = ["CgroupRefused", "spawn"]
