"""Spare supervisors: a run's supervisor started before the run is known.

A spare is started ahead of need (its interpreter and imports, about 30 ms, off the run's
path), in a session of its own with an empty environment, and waits on a pipe for its orders
(``standby`` in ``runner/supervisor.py``); taken, it is the run's supervisor. The next one
starts ``REFILL_DELAY_S`` later. Its pipe ending without orders lets it go, so a dead bridge
leaves no spare (docs/detached-runs.md, "The socket": spares).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import fcntl
import logging
import os
import signal
import socket
import subprocess
from collections.abc import Mapping
from pathlib import Path

from runner import protocol
from runner.bare import bare_argv
from runner.process import wait_exited
from runner.proctree import is_stopped

log = logging.getLogger(__name__)

SUPERVISOR = Path(__file__).with_name("supervisor.py")
REFILL_DELAY_S = 0.1
"""After a spare is taken: when the next one starts. Not at once: the taking run's own
start-ups (claude, its MCP servers) go first; the next run seldom comes sooner."""
LET_GO_S = 2.0
"""How long a spare let go may take to exit (it only has to read the end of its pipe)."""


class Spare:
    """A supervisor waiting for its run: the process, our end of its first connection,
    and the pipe its orders go down."""

    __slots__ = ("conn", "orders", "proc")

    def __init__(self, proc: subprocess.Popen[bytes], conn: socket.socket, orders: int) -> None:
        self.proc = proc
        self.conn = conn
        self.orders = orders

    def send(self, args: list[str], env: Mapping[str, str]) -> bool:
        """Give it its run: ``args`` as the supervisor's command line would have them
        (without ``--conn-fd``), ``env`` claude's. False if it could not take them
        (it died, or they do not fit in its pipe): then it is let go, and the run
        starts a supervisor of its own."""
        data = protocol.orders(args, env)
        try:
            # Whole into the pipe, or not at all: never a blocking write on the
            # event loop, which a spare frozen (SIGSTOP) or stuck would hold for
            # ever once the orders outgrow the pipe (64 KiB: a long system prompt,
            # a big environment). The pipe is grown to fit them (up to the host's
            # pipe-max-size, 1 MiB by default).
            if len(data) > fcntl.fcntl(self.orders, fcntl.F_GETPIPE_SZ):
                fcntl.fcntl(self.orders, fcntl.F_SETPIPE_SZ, len(data))
            os.set_blocking(self.orders, False)
            if os.write(self.orders, data) != len(data):
                raise BlockingIOError(errno.EAGAIN, "the orders do not fit in the pipe")
        except OSError as exc:
            log.warning("a spare supervisor could not take its orders: %s", exc)
            self._discard()
            return False
        finally:
            os.close(self.orders)
        return True

    def alive(self) -> bool:
        return self.proc.poll() is None

    def _discard(self) -> None:
        """It is not to be used (dead, or its orders failed): kill and reap it."""
        with contextlib.suppress(ProcessLookupError):
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()
        self.conn.close()

    async def let_go(self) -> None:
        """End its pipe without orders and wait for it to exit (killed if it does not)."""
        os.close(self.orders)
        self.conn.close()
        pidfd = os.pidfd_open(self.proc.pid)  # our child, not reaped yet: still its pid
        try:
            if await wait_exited([pidfd], LET_GO_S):
                with contextlib.suppress(ProcessLookupError):
                    signal.pidfd_send_signal(pidfd, signal.SIGKILL)
                await wait_exited([pidfd], LET_GO_S)
        finally:
            os.close(pidfd)
        self.proc.poll()


def start_spare() -> Spare:
    """Start a spare supervisor (a fork and exec: about a millisecond). Raises OSError."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    orders_r, orders_w = os.pipe2(os.O_CLOEXEC)
    try:
        proc = subprocess.Popen(
            [*bare_argv(str(SUPERVISOR)), "--standby", f"--conn-fd={theirs.fileno()}"],
            env={},
            cwd="/",
            stdin=orders_r,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
            close_fds=True,
            pass_fds=(theirs.fileno(),),
        )
    except BaseException:
        ours.close()
        os.close(orders_w)
        raise
    finally:
        theirs.close()  # only the spare may hold it: its death must end the connection
        os.close(orders_r)
    return Spare(proc, ours, orders_w)


class Spares:
    """Keeps one spare supervisor ready for the next run or prestart.

    Owned by whoever starts runs (the service): :meth:`refill` once at its
    start, :meth:`close` at its end. Not thread-safe: the event loop's.
    """

    def __init__(self) -> None:
        self._ready: Spare | None = None
        self._closed = False
        self._soon: asyncio.TimerHandle | None = None

    def take(self) -> Spare | None:
        """The ready spare, if there is a live one (the caller refills after its start)."""
        spare, self._ready = self._ready, None
        if spare is None:
            return None
        if not spare.alive():
            why = f"died waiting (exit {spare.proc.returncode})"
        elif is_stopped(spare.proc.pid):
            # Given the run, it would leave it unanswered (WELCOME_S, then a failed run).
            why = "was stopped (SIGSTOP) waiting"
        else:
            return spare
        log.warning("a spare supervisor %s; not used", why)
        spare._discard()
        os.close(spare.orders)
        return None

    def refill_soon(self) -> None:
        """Start a spare in ``REFILL_DELAY_S`` (unless one is on its way)."""
        if self._soon is None and not self._closed:
            self._soon = asyncio.get_running_loop().call_later(REFILL_DELAY_S, self.refill)

    def refill(self) -> None:
        """Start a spare unless one is ready or this is closed."""
        if self._soon is not None:
            self._soon.cancel()
            self._soon = None
        if self._closed or self._ready is not None:
            return
        try:
            self._ready = start_spare()
        except OSError as exc:
            # Runs then start their supervisors themselves, as without spares.
            log.warning("could not start a spare supervisor: %s", exc)

    async def close(self) -> None:
        """Let the ready spare go and start no more."""
        self._closed = True
        if self._soon is not None:
            self._soon.cancel()
            self._soon = None
        spare, self._ready = self._ready, None
        if spare is not None:
            await spare.let_go()


__all__ = ["Spare", "Spares", "start_spare"]
