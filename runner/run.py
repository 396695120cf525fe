"""``run_claude``: one run of ``claude -p`` from spawn to the last process gone.

claude runs under a supervisor process of its own (``runner/supervisor.py``):
a child subreaper that every process of the run re-parents to, which stops
the whole tree and exits only once nothing of it is left, and which stops
the run by itself when the bridge dies. This module reads claude's output,
keeps the time limits, and decides whether to stop.

A run ends in exactly one of these ways (an :data:`Ending`), each mapped to a
``RunReport``:

- claude printed its ``result`` line: done, whatever it does next (a process
  that lingers after its result is given ``stop_grace_s`` and then stopped;
  a non-error result is the outcome even if claude then exits non-zero).
  ``on_event`` gets the :class:`Result` before any of that: the caller can
  answer the room at once (:func:`answer_report`) while this module stops
  and reaps the run;
- claude exited, or closed stdout, without a result: failed, with a stderr
  tail (and ``session_not_found`` when ``--resume`` named an unknown session);
- its output was not stream-json (bad JSON, a line over the cap): failed;
- ``run_timeout_s`` passed, or ``idle_timeout_s`` without output: timed out /
  stalled;
- the supervisor exited before claude did (something killed it): failed;
- claude's credentials were refused (an ``api_retry`` line with 401/403):
  failed at once, stopped, instead of after its minutes of retries;
- the task running ``run_claude`` was cancelled (``!stop``, shutdown): the stop
  sequence runs shielded, then ``CancelledError`` propagates; unless claude
  had already printed its result: then the run is stopped all the same and
  its report returned (the answer is not thrown away), with the task still
  marked cancelling (``Task.cancelling()``), for the caller to re-raise once
  it has recorded the report.

Whatever the ending, ``run_claude`` returns only once the supervisor is gone,
and with it every process of the run, including tools that cleared their
environment, double-forked or started their own session. A supervisor that
went without saying it stopped the run (its "done" line), or that does not
finish in time, is replaced by the bridge's own fallbacks
(:meth:`Supervised.contain`); docs/operations.md says what they can miss.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import os
import signal
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, replace
from typing import Any

from bridge.core.aio import shielded
from bridge.core.model import RunReport, RunStatus, SessionId
from runner import supervision
from runner.command import build_argv, build_env
from runner.errors import InvalidRequest, StreamError
from runner.events import ApiRetry, Init, Result, RunEvent, Spawned
from runner.request import RunRequest
from runner.stream import LineFramer, parse_line
from runner.supervision import Limits, SpawnFailed, Supervised

log = logging.getLogger(__name__)

EventCallback = Callable[[RunEvent], Awaitable[None]]

READ_CHUNK = 256 * 1024
STDERR_TAIL_BYTES = 8 * 1024
"""How much of the end of stderr is kept (the error message is at the end)."""
ERROR_TAIL_CHARS = 500
"""How much stderr goes into ``RunReport.error``."""
DRAIN_S = 5.0
"""After the run's processes are gone: how long to keep reading what is left in stdout."""
STDERR_DRAIN_S = 1.0
"""After the run: how long to wait for the end of stderr (it explains failures)."""
NO_SESSION_MARK = b"No conversation found with session ID"


@dataclass(frozen=True)
class Answered:
    """claude printed its result; ``lingering``: it had not exited ``stop_grace_s`` later."""

    lingering: bool


@dataclass(frozen=True)
class Exited:
    """claude exited (or closed stdout) without a result."""


@dataclass(frozen=True)
class Expired:
    """A time limit passed: ``status`` is TIMED_OUT or STALLED."""

    status: RunStatus


@dataclass(frozen=True)
class Unreadable:
    """claude's output could not be read as stream-json."""

    reason: str


@dataclass(frozen=True)
class Unsupervised:
    """The supervisor exited while claude ran (killed: a tool, the OOM killer)."""


@dataclass(frozen=True)
class Unauthenticated:
    """claude's API request was refused for its credentials; ``detail`` is from its retry line."""

    detail: str


Ending = Answered | Exited | Expired | Unreadable | Unsupervised | Unauthenticated


def must_stop(ending: Ending) -> bool:
    """Whether the run has to be stopped, or ends on its own (claude already exited).

    Either way the supervisor stops whatever claude left behind.
    """
    match ending:
        case Answered(lingering=lingering):
            return lingering
        case Exited():
            return False
        case Expired() | Unreadable() | Unsupervised() | Unauthenticated():
            return True


async def run_claude(request: RunRequest, on_event: EventCallback) -> RunReport:
    """Run claude for ``request``, passing each event to ``on_event``; return how it ended.

    Never raises for a run that went wrong (missing binary, bad output,
    timeout): that is a failed report. Cancellation stops the run (no process
    of it survives) and then propagates, except after claude's result line:
    then the report is returned (see the module doc). An exception raised by
    ``on_event`` propagates after the same stop.
    """
    try:
        argv = build_argv(request)
        env = build_env(request, os.environ)
    except InvalidRequest as exc:
        return RunReport(RunStatus.FAILED, error=str(exc))
    limits = Limits(request.cgroup_parent, request.memory_max, request.pids_max)
    try:
        supervised = await supervision.start(
            request.run_id,
            argv,
            env=env,
            cwd=request.cwd,
            grace_s=request.stop_grace_s,
            limits=limits,
        )
    except SpawnFailed as exc:
        if exc.errno == errno.ENOENT:
            return RunReport(
                RunStatus.FAILED, error=f"claude binary not found: {request.claude_bin} ({exc})"
            )
        return RunReport(RunStatus.FAILED, error=f"cannot start claude {request.claude_bin}: {exc}")
    except FileNotFoundError as exc:
        if not request.cwd.is_dir():
            return RunReport(RunStatus.FAILED, error=f"working directory not found: {request.cwd}")
        return RunReport(RunStatus.FAILED, error=f"cannot start the run's supervisor: {exc}")
    except (OSError, ValueError) as exc:  # ValueError: a NUL or "=" where exec refuses it
        return RunReport(RunStatus.FAILED, error=f"cannot start claude {request.claude_bin}: {exc}")

    try:
        run = _Run(request, supervised, on_event)
        try:
            ending = await run.follow()
        except BaseException as exc:
            # Cancelled (a stop) or on_event failed: nothing of the run may survive.
            try:
                await shielded(run.close(stop=True))
            except Exception:
                log.exception("stopping run %s failed", request.run_id)
            if isinstance(exc, asyncio.CancelledError) and run.answered:
                return run.report(Answered(lingering=True))
            raise
        try:
            await shielded(run.close(stop=must_stop(ending)))
        except asyncio.CancelledError:
            if not run.answered:
                raise
        return run.report(ending)
    finally:
        await shielded(supervised.close())


class _Run:
    """One started run: ``follow`` gives its ending, ``close`` stops, ``report`` tells."""

    def __init__(
        self, request: RunRequest, supervised: Supervised, on_event: EventCallback
    ) -> None:
        self._request = request
        self._supervised = supervised
        self._on_event = on_event
        self._loop = asyncio.get_running_loop()
        self._last_output = self._loop.time()
        self._run_deadline = self._last_output + request.run_timeout_s
        self._tasks: set[asyncio.Task[Any]] = set()
        self._stderr = bytearray()
        self._no_session = False
        self._init: Init | None = None
        self._result: Result | None = None
        self._auth_refused: ApiRetry | None = None
        self._stderr_task: asyncio.Task[None] | None = None
        self._stdout_end: asyncio.Future[None] = self._loop.create_future()
        """stdout was decoded up to the result or its end; or why not (StreamError...)."""

    @property
    def answered(self) -> bool:
        """claude printed its result line: the run's outcome is that result."""
        return self._result is not None

    def _task(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        return task

    async def follow(self) -> Ending:
        """Follow the run until it ended one of the ways listed in the module doc."""
        request = self._request
        supervised = self._supervised
        self._task(self._feed_stdin())
        self._stderr_task = self._task(self._collect_stderr())
        await self._on_event(Spawned(supervised.claude_pid))
        self._task(self._pump_stdout())
        decoded, exited, gone = self._stdout_end, supervised.claude_exit, supervised.gone
        expired = await self._wait_deadlines({decoded, exited, gone})
        if expired is not None:
            return expired
        if not decoded.done():
            if not exited.done():
                return Unsupervised()
            # claude is gone, but a process it left may hold stdout open: the
            # supervisor is stopping them; then read what claude wrote.
            await supervised.wait(request.stop_grace_s + supervision.SUPERVISOR_KILL_S)
            await asyncio.wait({decoded}, timeout=DRAIN_S)
            if not decoded.done():
                return Unreadable("stdout stayed open after claude exited")
        try:
            decoded.result()
        except StreamError as exc:
            return Unreadable(str(exc))
        if self._auth_refused is not None:
            return Unauthenticated(self._auth_refused.describe())
        if self._result is not None:
            # Treat the result as done; a lingering process gets a bounded wait.
            ending: set[asyncio.Future[Any]] = {exited, gone}
            await asyncio.wait(ending, timeout=request.stop_grace_s)
            return Answered(lingering=not exited.done())
        # End of stdout without a result: claude should be exiting (stderr
        # says why; ``close`` reads it to the end).
        expired = await self._wait_deadlines({exited, gone})
        if expired is not None:
            return expired
        return Exited() if exited.done() else Unsupervised()

    async def _wait_deadlines(self, tasks: set[asyncio.Future[Any]]) -> Expired | None:
        """Wait for the first of ``tasks``; the expiry if a time limit passed first."""
        while True:
            now = self._loop.time()
            if now >= self._run_deadline:
                return Expired(RunStatus.TIMED_OUT)
            if now >= self._last_output + self._request.idle_timeout_s:
                return Expired(RunStatus.STALLED)
            deadline = min(self._run_deadline, self._last_output + self._request.idle_timeout_s)
            done, _ = await asyncio.wait(
                tasks, timeout=deadline - now, return_when=asyncio.FIRST_COMPLETED
            )
            if done:
                return None

    async def _feed_stdin(self) -> None:
        stdin = self._supervised.stdin
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
        stream = self._supervised.stderr
        while chunk := await stream.read(READ_CHUNK):
            self._stderr += chunk
            # Checked while the tail still holds the whole message.
            if NO_SESSION_MARK in self._stderr:
                self._no_session = True
            del self._stderr[:-STDERR_TAIL_BYTES]

    async def _pump_stdout(self) -> None:
        """Decode stdout into events, up to the result; then read the rest unread.

        Reading on to the end matters: an unread pipe blocks whatever still
        writes to it (a tool claude left) and keeps the pipe, and with it
        asyncio's view of the supervisor's exit, open.
        """
        stream = self._supervised.stdout
        try:
            await self._decode_stdout(stream)
        except StreamError as exc:
            self._stdout_end.set_exception(exc)
        except Exception as exc:  # on_event failed: follow raises it, the run stops
            self._stdout_end.set_exception(exc)
            return
        else:
            self._stdout_end.set_result(None)
        while await stream.read(READ_CHUNK):
            pass

    async def _decode_stdout(self, stream: asyncio.StreamReader) -> None:
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
        """Hand the line's events on; True once the result line (or a refused login) was seen."""
        for event in parse_line(line):
            if isinstance(event, Init):
                self._init = event
            elif isinstance(event, Result):
                self._result = event
            elif isinstance(event, ApiRetry):
                log.info(
                    "run %s: claude retries its API request (%s)",
                    self._request.run_id,
                    event.describe(),
                )
                # Rate limits and overloads pass; refused credentials never will.
                if event.auth_failed:
                    self._auth_refused = event
            await self._on_event(event)
        return self._result is not None or self._auth_refused is not None

    async def close(self, *, stop: bool) -> None:
        """Stop the run if ``stop``; wait until nothing of it is left; finish the helper tasks.

        Without ``stop`` claude has exited and the supervisor is already
        stopping whatever it left. Bounded: a supervisor that does not finish
        in time, or went without saying it stopped the run, is replaced by the
        bridge's own stop (:meth:`Supervised.contain`).
        """
        request = self._request
        supervised = self._supervised
        try:
            if stop:
                supervised.stop()
            finished = await supervised.wait(request.stop_grace_s + supervision.SUPERVISOR_KILL_S)
            if not supervised.contained:
                why = "exited without stopping the run" if finished else "did not finish"
                killed = await supervised.contain()
                log.error(
                    "run %s: its supervisor %s; the bridge stopped the run (%d process(es))",
                    request.run_id, why, killed,
                )  # fmt: skip
            elif supervised.survivors:
                log.error(
                    "run %s: processes survived SIGKILL: %s", request.run_id, supervised.survivors
                )
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
            if self._stdout_end.done() and not self._stdout_end.cancelled():
                self._stdout_end.exception()  # retrieved: follow may have ended before

    def report(self, ending: Ending) -> RunReport:
        """How the run ended (call after ``close``)."""
        request = self._request
        result = self._result
        exit_future = self._supervised.claude_exit
        code = exit_future.result() if exit_future.done() else None
        session: SessionId | None = None
        if result is not None and result.session_id:
            session = result.session_id
        elif self._init is not None and self._init.session_id:
            session = self._init.session_id
        if result is not None and not result.is_error:
            # The answer is the outcome, however claude went on (bridge.runs
            # has already sent it); an odd exit only goes to the log.
            if code != 0 or not isinstance(ending, Answered):
                log.warning(
                    "run %s: claude ended with %s (%s) after its answer; the answer stands",
                    request.run_id, _describe_exit(code), type(ending).__name__,
                )  # fmt: skip
            return replace(answer_report(result, self._init), exit_code=code)
        common: dict[str, Any] = {
            "exit_code": code,
            "session_id": session,
            "cost_usd": result.cost_usd if result else None,
            "num_turns": result.num_turns if result else None,
            "duration_ms": result.duration_ms if result else None,
            "result_text": result.text if result else "",
        }
        match ending:
            case Expired(status=RunStatus.TIMED_OUT):
                error = f"run exceeded its time limit of {request.run_timeout_s:g} s"
                return RunReport(RunStatus.TIMED_OUT, error=error, **common)
            case Expired(status=status):
                error = f"no output from claude for {request.idle_timeout_s:g} s"
                return RunReport(status, error=error, **common)
            case Unreadable(reason=reason):
                error = self._with_stderr(f"claude output unreadable: {reason}")
                return RunReport(RunStatus.FAILED, error=error, **common)
            case Unauthenticated(detail=detail):
                error = f"claude could not authenticate: {detail}"
                return RunReport(RunStatus.FAILED, error=error, **common)
            case Unsupervised() if result is None or result.is_error:
                error = self._with_stderr(
                    "the run's supervisor was killed before claude finished; "
                    "the bridge stopped the run"
                )
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
            detail = "; ".join(result.errors) or result.text or "no detail"
            error = self._with_stderr(f"claude reported an error ({result.subtype}): {detail}")
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


def answer_report(result: Result, init: Init | None) -> RunReport:
    """The outcome of a run whose ``result`` line is not an error: that answer.

    Known as soon as the line is read, before claude exits (so without an
    exit code): the caller may record and send the answer at once.
    """
    session = result.session_id or (init.session_id if init is not None else None)
    return RunReport(
        RunStatus.SUCCEEDED,
        session_id=session or None,
        cost_usd=result.cost_usd,
        num_turns=result.num_turns,
        duration_ms=result.duration_ms,
        result_text=result.text,
    )


def _describe_exit(code: int | None) -> str:
    if code is None:
        return "no exit status"
    if code < 0:
        try:
            return f"signal {signal.Signals(-code).name}"
        except ValueError:
            return f"signal {-code}"
    return f"code {code}"
