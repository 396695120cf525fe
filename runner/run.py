"""``run_claude``: one run of ``claude -p`` from spawn to the last process gone.

A run ends in exactly one of these ways, each mapped to a ``RunReport``:

- claude printed its ``result`` line: done, whatever it does next (a process
  that lingers after its result is given ``stop_grace_s`` and then stopped);
- claude exited, or closed stdout, without a result: failed, with a stderr
  tail (and ``session_not_found`` when ``--resume`` named an unknown session);
- its output was not stream-json (bad JSON, a line over the cap): failed;
- ``run_timeout_s`` passed, or ``idle_timeout_s`` without output: timed out /
  stalled;
- the task running ``run_claude`` was cancelled (``!stop``, shutdown): the stop
  sequence runs shielded, then ``CancelledError`` propagates.

Every way out runs the marker sweep, so background processes a tool left
behind do not outlive the run.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

from bridge.core.aio import shielded
from bridge.core.model import RunReport, RunStatus, SessionId
from runner.command import build_argv, build_env
from runner.errors import InvalidRequest, StreamError
from runner.events import Init, Result, RunEvent, Spawned
from runner.process import Claude, kill_marked, spawn, stop_tree
from runner.request import RunRequest
from runner.stream import LineFramer, parse_line

log = logging.getLogger(__name__)

EventCallback = Callable[[RunEvent], Awaitable[None]]

READ_CHUNK = 256 * 1024
STDERR_TAIL_BYTES = 8 * 1024
"""How much of the end of stderr is kept (the error message is at the end)."""
ERROR_TAIL_CHARS = 500
"""How much stderr goes into ``RunReport.error``."""
DRAIN_S = 5.0
"""After claude exited: how long to keep reading what it left in the stdout pipe."""
STDERR_DRAIN_S = 1.0
"""After the sweep: how long to wait for the end of stderr (it explains failures)."""
NO_SESSION_MARK = b"No conversation found with session ID"


async def run_claude(request: RunRequest, on_event: EventCallback) -> RunReport:
    """Run claude for ``request``, passing each event to ``on_event``; return how it ended.

    Never raises for a run that went wrong (missing binary, bad output,
    timeout): that is a failed report. Cancellation stops the run (no process
    carrying the marker survives) and then propagates; so does an exception
    raised by ``on_event``, after the same stop.
    """
    try:
        argv = build_argv(request)
        env = build_env(request, os.environ)
    except InvalidRequest as exc:
        return RunReport(RunStatus.FAILED, error=str(exc))
    try:
        claude = await spawn(argv, env, request.cwd)
    except FileNotFoundError as exc:
        if not request.cwd.is_dir():
            return RunReport(RunStatus.FAILED, error=f"working directory not found: {request.cwd}")
        return RunReport(
            RunStatus.FAILED, error=f"claude binary not found: {request.claude_bin} ({exc})"
        )
    except (OSError, ValueError) as exc:  # ValueError: a NUL or "=" where exec refuses it
        return RunReport(RunStatus.FAILED, error=f"cannot start claude {request.claude_bin}: {exc}")
    except asyncio.CancelledError:
        # asyncio kills a child whose start was cancelled; sweep anything it began.
        await shielded(_sweep_now(request))
        raise

    try:
        run = _Run(request, claude, on_event)
        try:
            await run.supervise()
        except BaseException:
            # Cancelled (a stop) or on_event failed: nothing of the run may survive.
            try:
                await shielded(run.close(force_stop=True))
            except Exception:
                log.exception("stopping run %s failed", request.run_id)
            raise
        await shielded(run.close(force_stop=False))
        return run.report()
    finally:
        claude.close()


async def _sweep_now(request: RunRequest) -> None:
    await kill_marked(request.run_id, grace_s=0)


class _Run:
    """State of one started run; ``supervise`` then ``close`` then ``report``."""

    def __init__(self, request: RunRequest, claude: Claude, on_event: EventCallback) -> None:
        self._request = request
        self._claude = claude
        self._proc = proc = claude.proc
        if proc.stdin is None or proc.stdout is None or proc.stderr is None:
            raise RuntimeError("claude was started without pipes")
        self._stdin = proc.stdin
        self._stdout = proc.stdout
        self._stderr_pipe = proc.stderr
        self._on_event = on_event
        self._loop = asyncio.get_running_loop()
        self._last_output = self._loop.time()
        self._run_deadline = self._last_output + request.run_timeout_s
        self._tasks: set[asyncio.Task[Any]] = set()
        self._stderr = bytearray()
        self._no_session = False
        self._init: Init | None = None
        self._result: Result | None = None
        self._stream_error = ""
        self._expired: RunStatus | None = None
        self._stop_needed = False
        self._stderr_task: asyncio.Task[None] | None = None

    def _task(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        return task

    async def supervise(self) -> None:
        """Follow the run until it ended one of the ways listed in the module doc."""
        self._task(self._feed_stdin())
        self._stderr_task = self._task(self._collect_stderr())
        await self._on_event(Spawned(self._proc.pid))
        pump = self._task(self._pump_stdout())
        exited = self._task(self._proc.wait())
        if not await self._wait_deadlines({pump, exited}):
            return
        if not pump.done():
            # claude is gone, but a child it left may hold stdout open: sweep
            # them, then read what claude wrote before it exited.
            await kill_marked(self._request.run_id, self._request.stop_grace_s)
            await asyncio.wait({pump}, timeout=DRAIN_S)
            if not pump.done():
                self._stream_error = "stdout stayed open after claude exited"
                return
        try:
            pump.result()
        except StreamError as exc:
            self._stream_error = str(exc)
            self._stop_needed = True
            return
        if self._result is not None:
            # Treat the result as done; a lingering process gets a bounded wait.
            await asyncio.wait({exited}, timeout=self._request.stop_grace_s)
            self._stop_needed = not exited.done()
            return
        # End of stdout without a result: claude should be exiting (stderr
        # says why; ``close`` reads it to the end).
        await self._wait_deadlines({exited})

    async def _wait_deadlines(self, tasks: set[asyncio.Task[Any]]) -> bool:
        """Wait for the first of ``tasks``; False (and stop needed) if a deadline hit."""
        while True:
            now = self._loop.time()
            if now >= self._run_deadline:
                self._expired = RunStatus.TIMED_OUT
            elif now >= self._last_output + self._request.idle_timeout_s:
                self._expired = RunStatus.STALLED
            if self._expired is not None:
                self._stop_needed = True
                return False
            deadline = min(self._run_deadline, self._last_output + self._request.idle_timeout_s)
            done, _ = await asyncio.wait(
                tasks, timeout=deadline - now, return_when=asyncio.FIRST_COMPLETED
            )
            if done:
                return True

    async def _feed_stdin(self) -> None:
        stdin = self._stdin
        try:
            stdin.write(self._request.prompt.encode())
            await stdin.drain()
        except (BrokenPipeError, ConnectionResetError):
            pass  # claude exited without reading it; its exit status tells why
        finally:
            stdin.close()
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                await stdin.wait_closed()

    async def _collect_stderr(self) -> None:
        stream = self._stderr_pipe
        while chunk := await stream.read(READ_CHUNK):
            self._stderr += chunk
            # Checked while the tail still holds the whole message.
            if NO_SESSION_MARK in self._stderr:
                self._no_session = True
            del self._stderr[:-STDERR_TAIL_BYTES]

    async def _pump_stdout(self) -> None:
        """Frame and decode stdout into events, up to and including the result."""
        stream = self._stdout
        framer = LineFramer(self._request.max_line_bytes)
        while chunk := await stream.read(READ_CHUNK):
            self._last_output = self._loop.time()
            for line in framer.feed(chunk):
                if await self._dispatch(line):
                    return
        last = framer.finish()
        if last is not None:
            await self._dispatch(last)

    async def _dispatch(self, line: bytes) -> bool:
        """Hand the line's events on; True once the result line was seen."""
        for event in parse_line(line):
            if isinstance(event, Init):
                self._init = event
            elif isinstance(event, Result):
                self._result = event
            await self._on_event(event)
        return self._result is not None

    async def close(self, *, force_stop: bool) -> None:
        """Stop claude if needed, sweep the marker, and finish every helper task."""
        try:
            if force_stop or self._stop_needed or self._proc.returncode is None:
                await stop_tree(self._claude, self._request.run_id, self._request.stop_grace_s)
            else:
                await kill_marked(self._request.run_id, self._request.stop_grace_s)
            if self._stderr_task is not None:
                # Once nothing of the run is left, stderr ends: read its last words
                # (e.g. "No conversation found") before giving up on it.
                await asyncio.wait({self._stderr_task}, timeout=STDERR_DRAIN_S)
        finally:
            for task in self._tasks:
                task.cancel()
            results = await asyncio.gather(*self._tasks, return_exceptions=True)
            for result in results:
                if isinstance(result, Exception) and not isinstance(result, StreamError):
                    log.warning("run %s: helper task failed: %r", self._request.run_id, result)

    def report(self) -> RunReport:
        """How the run ended (call after ``close``)."""
        request = self._request
        result = self._result
        code = self._proc.returncode
        session: SessionId | None = None
        if result is not None and result.session_id:
            session = result.session_id
        elif self._init is not None and self._init.session_id:
            session = self._init.session_id
        common: dict[str, Any] = {
            "exit_code": code,
            "session_id": session,
            "cost_usd": result.cost_usd if result else None,
            "num_turns": result.num_turns if result else None,
            "duration_ms": result.duration_ms if result else None,
            "result_text": result.text if result else "",
        }
        if self._expired is RunStatus.TIMED_OUT:
            error = f"run exceeded its time limit of {request.run_timeout_s:g} s"
            return RunReport(RunStatus.TIMED_OUT, error=error, **common)
        if self._expired is RunStatus.STALLED:
            error = f"no output from claude for {request.idle_timeout_s:g} s"
            return RunReport(RunStatus.STALLED, error=error, **common)
        if self._stream_error:
            error = self._with_stderr(f"claude output unreadable: {self._stream_error}")
            return RunReport(RunStatus.FAILED, error=error, **common)
        if self._no_session and request.session_id:
            common["session_id"] = None
            return RunReport(
                RunStatus.FAILED,
                error=f"session not found: {request.session_id}",
                session_not_found=True,
                **common,
            )
        if result is not None:
            if result.is_error:
                detail = "; ".join(result.errors) or result.text or "no detail"
                error = self._with_stderr(f"claude reported an error ({result.subtype}): {detail}")
                return RunReport(RunStatus.FAILED, error=error, **common)
            # A result with exit 0 is the normal case; a process we had to stop
            # after a successful result still delivered its answer.
            if code == 0 or self._stop_needed:
                return RunReport(RunStatus.SUCCEEDED, **common)
            error = self._with_stderr(f"claude exited with {_describe_exit(code)} after its result")
            return RunReport(RunStatus.FAILED, error=error, **common)
        error = self._with_stderr(f"claude exited with {_describe_exit(code)} without a result")
        return RunReport(RunStatus.FAILED, error=error, **common)

    def _with_stderr(self, message: str) -> str:
        tail = self._stderr.decode("utf-8", "replace").strip()
        if not tail:
            return message
        if len(tail) > ERROR_TAIL_CHARS:
            tail = "…" + tail[-ERROR_TAIL_CHARS:]
        return f"{message}; stderr: {tail}"


def _describe_exit(code: int | None) -> str:
    if code is None:
        return "no exit status"
    if code < 0:
        try:
            return f"signal {signal.Signals(-code).name}"
        except ValueError:
            return f"signal {-code}"
    return f"code {code}"
