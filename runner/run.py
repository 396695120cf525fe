"""``run_claude`` and ``attach_claude``: one run of ``claude -p``, followed to its end.

claude runs under its detached supervisor (``runner/supervisor.py``); this module reads
the run's journal (over the supervisor's socket, or from its file once the supervisor is
gone), hands claude's output on as events, applies the end rule and decides whether to
stop. A run ends in exactly one :data:`Ending`, mapped to a ``RunReport``; whatever the
ending (but a detach) it returns only once every process of the run is gone
(docs/detached-runs.md, "The bridge's side (`runner`)"; docs/live-runs.md, "The runner's API").
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import signal
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from bridge.core import stages
from bridge.core.aio import shielded
from bridge.core.model import LiveRun, RunReport, RunStatus, SessionId
from bridge.core.money import usd
from runner import supervision
from runner.command import build_argv, build_env, new_uuid, user_message
from runner.control import ControlError, InputClosed, RunControl, too_long
from runner.errors import InvalidRequest, StreamError
from runner.events import (
    ApiRetry,
    ControlAnswer,
    Init,
    JournalUnwritable,
    JournalWritable,
    Result,
    RunEvent,
    Spawned,
)
from runner.prestart import Prestarted
from runner.protocol import Refused
from runner.recovery import recover_run
from runner.request import RunRequest
from runner.rundir import make_run_dir, remove_run_dir
from runner.spare import Spares
from runner.stream import LineFramer, parse_line
from runner.supervision import Record, RunLimits, SpawnFailed, Supervised, Unanswered

log = logging.getLogger(__name__)

EventCallback = Callable[[RunEvent], Awaitable[None]]
PositionCallback = Callable[[int], None]
"""Told the journal offset just past each stdout line, before that line's events."""

STDERR_TAIL_BYTES = 8 * 1024
"""How much of the end of stderr is kept (the error message is at the end)."""
ERROR_TAIL_CHARS = 500
"""How much stderr goes into ``RunReport.error``."""
NO_SESSION_MARK = b"No conversation found with session ID"


@dataclass(frozen=True)
class Answered:
    """claude printed its final result; ``lingering``: it had not exited ``stop_grace_s``
    after it (and the ``eof`` the end rule sent)."""

    lingering: bool


@dataclass(frozen=True)
class Exited:
    """claude exited without a result."""


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
class Orphaned:
    """The supervisor stopped the run: no bridge was attached for ``orphan_timeout_s``."""


@dataclass(frozen=True)
class Unresponsive:
    """The supervisor said nothing of the run's end well past its time limit (frozen, stuck)."""


@dataclass(frozen=True)
class Unauthenticated:
    """claude's API request was refused for its credentials; ``detail`` is from its retry line."""

    detail: str


Ending = (
    Answered
    | Exited
    | Expired
    | Orphaned
    | Unreadable
    | Unsupervised
    | Unresponsive
    | Unauthenticated
)


def must_stop(ending: Ending) -> bool:
    """Whether the run has to be stopped, or ends on its own (claude already exited).

    Either way the supervisor stops whatever claude left behind; after an
    expiry it is stopping the run already (asking again changes nothing).
    """
    match ending:
        case Answered(lingering=lingering):
            return lingering
        case Exited():
            return False
        case Expired() | Orphaned() | Unreadable() | Unsupervised() | Unresponsive():
            return True
        case Unauthenticated():
            return True


@dataclass(frozen=True)
class _ResultSeen:
    """The final ``result`` line was read (the end rule held); whether claude lingers is
    known a grace period later."""


_RESULT_SEEN = _ResultSeen()

EXPIRIES: dict[str, Ending] = {
    "timed_out": Expired(RunStatus.TIMED_OUT),
    "stalled": Expired(RunStatus.STALLED),
    "orphaned": Orphaned(),
}
"""The supervisor's ``expired`` statuses."""

GONE_AT_RESTART = "the run's supervisor was gone when chatbridge restarted"


_NOT_STARTED = RunReport(
    RunStatus.INTERRUPTED, error="the conversation moved to another replica", not_started=True
)


async def run_claude(
    request: RunRequest,
    on_event: EventCallback,
    *,
    on_position: PositionCallback | None = None,
    detach: Callable[[], bool] | None = None,
    control: RunControl | None = None,
    prestarted: Prestarted | None = None,
    may_start: Callable[[], bool] | None = None,
    spares: Spares | None = None,
) -> RunReport:
    """Run claude for ``request``, passing each event to ``on_event``; return how it ended.

    Never raises for a run that went wrong (missing binary, bad output,
    timeout): that is a failed report. ``on_position`` is called, before the
    events of each stdout line, with the journal offset just past that line.
    Cancellation stops the run (no process of it survives) and then
    propagates, except after claude's result line: then the report is
    returned (see the module doc); and except when ``detach()`` is true: then
    the run is left to its supervisor (``Spawned.live`` says where) and
    ``CancelledError`` propagates at once. An exception raised by
    ``on_event`` propagates after the same stop. ``control`` is bound to the
    run before ``Spawned`` is handed on (docs/live-runs.md). ``may_start`` is
    asked last, just before claude is started (or a prestarted one is given
    the prompt): false, nothing starts and the report says ``not_started``
    (with replicas: this one lost the conversation while it was paused). With
    ``prestarted`` (runner.prestart) the prompt goes into that claude, unless
    it does not match ``request``, died or never got ready: then it is
    cancelled and the run starts cold. A cold start takes its supervisor from
    ``spares`` when one is ready (runner/spare.py).
    """
    control = control if control is not None else RunControl()
    first = user_message(request.prompt, new_uuid(), request.images)
    if too_long(first, request.max_line_bytes):
        # claude would take it, and its echo would end the run unreadable, unanswered.
        if prestarted is not None:
            await prestarted.cancel()
        error = f"the message is too long for claude's stream ({len(first)} bytes)"
        return RunReport(RunStatus.FAILED, error=error)
    if may_start is not None and not may_start():
        if prestarted is not None:
            await prestarted.cancel()
        return _NOT_STARTED
    if prestarted is not None:
        supervised = await prestarted.take(request)
        if supervised is not None:
            return await _follow_prestarted(
                request,
                supervised,
                prestarted.run_dir,
                first,
                on_event,
                on_position,
                detach,
                control,
            )
        await prestarted.cancel()
    try:
        argv = build_argv(request)
        env = build_env(request, os.environ)
    except InvalidRequest as exc:
        return RunReport(RunStatus.FAILED, error=str(exc))
    limits = RunLimits(request.cgroup_parent, request.memory_max, request.pids_max)
    try:
        run_dir = make_run_dir(request.state_dir, request.run_id)
    except OSError as exc:
        return RunReport(RunStatus.FAILED, error=f"cannot create the run's directory: {exc}")
    if may_start is not None and not may_start():
        # Asked again after the directory exists (nothing awaited in between
        # before the spawn): a new owner that looked meanwhile and found no
        # directory took the run for one that never began, and runs its messages.
        remove_run_dir(run_dir)
        return _NOT_STARTED
    detached = False
    try:
        try:
            supervised = await supervision.start(
                request, argv, env=env, run_dir=run_dir, limits=limits, first=first, spares=spares
            )
        except SpawnFailed as exc:
            if not request.cwd.is_dir():
                return RunReport(
                    RunStatus.FAILED, error=f"working directory not found: {request.cwd}"
                )
            if exc.errno == errno.ENOENT:
                return RunReport(
                    RunStatus.FAILED,
                    error=f"claude binary not found: {request.claude_bin} ({exc})",
                )
            return RunReport(
                RunStatus.FAILED, error=f"cannot start claude {request.claude_bin}: {exc}"
            )
        except Unanswered as exc:
            return RunReport(RunStatus.FAILED, error=str(exc))
        except (OSError, ValueError) as exc:  # ValueError: a NUL where exec refuses it
            return RunReport(RunStatus.FAILED, error=f"cannot start the run's supervisor: {exc}")
        try:
            return await _follow(request, supervised, on_event, on_position, detach, control)
        finally:
            detached = supervised.detached
    finally:
        if request.state_dir is None and not detached:
            remove_run_dir(run_dir)  # a temporary one nobody else knows of


async def _follow_prestarted(  # noqa: PLR0917
    request: RunRequest,
    supervised: Supervised,
    run_dir: Path,
    first: bytes,
    on_event: EventCallback,
    on_position: PositionCallback | None,
    detach: Callable[[], bool] | None,
    control: RunControl,
) -> RunReport:
    """A prestarted claude gets the prompt (``first``) as its first user message, then as
    a cold start."""
    try:
        stages.stamp("prompt_sent")
        if not supervised.write_stdin(first):
            supervised.stop()  # its connection is gone: the run cannot be given its prompt
        return await _follow(request, supervised, on_event, on_position, detach, control)
    finally:
        if request.state_dir is None and not supervised.detached:
            remove_run_dir(run_dir)


async def attach_claude(
    request: RunRequest,
    live: LiveRun,
    on_event: EventCallback,
    *,
    on_position: PositionCallback | None = None,
    detach: Callable[[], bool] | None = None,
    control: RunControl | None = None,
) -> RunReport:
    """Follow a run a previous bridge started (``live``), from its journal's start.

    ``request`` is rebuilt from the room's settings (its prompt is not used).
    Like :func:`run_claude` from ``Spawned`` on: every event of the journal
    is handed on again (``on_position`` tells the ones already shown), the
    report is the run's. A live supervisor is attached to; one that is gone
    leaves its journal: a complete one is reported as it says, an incomplete
    one (the supervisor was killed) means the run is stopped with the
    fallbacks and reported interrupted. A supervisor that does not answer
    (frozen) has its run killed, one that refuses this bridge's protocol
    versions (a newer one, after a downgrade) has it stopped: both are
    reported interrupted, since the room may start another run after this
    report and must not have two. Never raises for a run that went wrong.
    ``control`` is rebuilt from the journal (messages sent and taken,
    permission requests pending) and bound once the replay caught up with
    the live run; a version 1 run takes no input.
    """
    control = control if control is not None else RunControl()
    try:
        supervised = await supervision.attach(request.run_id, live)
    except Refused as exc:
        # Nobody would follow the run after this report: stop it, as every version can.
        await shielded(_stop_unattached(request))
        return RunReport(RunStatus.INTERRUPTED, error=f"{exc}, so the run was stopped")
    except Unanswered as exc:
        return RunReport(RunStatus.INTERRUPTED, error=str(exc))
    except asyncio.CancelledError:
        if detach is None or not detach():
            # A stop that came before the run was attached to still stops it:
            # its supervisor is asked to, and what it leaves is swept.
            await shielded(_stop_unattached(request))
        raise
    replayed = supervised is None
    if supervised is None:
        supervised = supervision.replay(request.run_id, live)
    if supervised is None:
        killed = await Supervised(request.run_id, _ended(), None, live=live).contain()
        log.warning(
            "run %s: its journal is unreadable; the bridge stopped the run (%d process(es))",
            request.run_id, killed,
        )  # fmt: skip
        return RunReport(RunStatus.INTERRUPTED, error=GONE_AT_RESTART)
    return await _follow(
        request, supervised, on_event, on_position, detach, control, replayed=replayed
    )


async def _stop_unattached(request: RunRequest) -> None:
    killed = await recover_run(request.run_id, request.cgroup_parent or "off")
    log.info("run %s: stopped before it was attached to (%d process(es))", request.run_id, killed)


def _ended() -> asyncio.StreamReader:
    """A journal with nothing in it (for a run whose journal could not be read)."""
    reader = asyncio.StreamReader()
    reader.feed_eof()
    return reader


PROMISE_WAIT_S = 10.0
"""A run being left to its supervisor waits this long for the messages promised to it
(``RunControl.reserve``: steered, being recorded; the store's retries take ~8 s)."""


async def _promises_kept(control: RunControl, run_id: str) -> None:
    """Wait (bounded) for the messages promised to a run being left to its supervisor."""
    if not await control.promises_kept(PROMISE_WAIT_S):
        log.error("run %s: left to its supervisor with steered messages not sent", run_id)


async def _follow(  # noqa: PLR0917
    request: RunRequest,
    supervised: Supervised,
    on_event: EventCallback,
    on_position: PositionCallback | None,
    detach: Callable[[], bool] | None,
    control: RunControl,
    *,
    replayed: bool = False,
) -> RunReport:
    """Follow a started (or re-attached) run to its report; see :func:`run_claude`."""
    try:
        run = _Run(request, supervised, on_event, on_position, control, replayed=replayed)
        try:
            ending = await run.follow()
        except BaseException as exc:
            answered = run.answered  # before the stop: its interrupted turn is no answer
            if isinstance(exc, asyncio.CancelledError) and detach is not None and detach():
                # Shutting down: the supervisor carries on alone; a restart attaches again.
                # Messages promised to the run are being recorded: they go in first
                # (record, then send; unsent, the reattached run would never see them).
                await shielded(_promises_kept(control, request.run_id))
                control.unbind()
                supervised.detach()
                await shielded(run.abandon())
                raise
            # Cancelled (a stop) or on_event failed: nothing of the run may survive.
            try:
                # A stop keeps the conversation: claude ends its turn and exits itself first.
                gently = isinstance(exc, asyncio.CancelledError) and not answered
                await shielded(run.stop(gently=gently))
            except Exception:
                log.exception("stopping run %s failed", request.run_id)
            if isinstance(exc, asyncio.CancelledError) and answered:
                return run.report(Answered(lingering=True))
            raise
        try:
            await shielded(run.close(stop=must_stop(ending)))
        except asyncio.CancelledError:
            if not run.answered:
                raise
        return run.report(ending)
    finally:
        control.unbind()
        await shielded(supervised.close())


class _Run:
    """One started run: ``follow`` gives its ending, ``close`` stops, ``report`` tells."""

    def __init__(
        self,
        request: RunRequest,
        supervised: Supervised,
        on_event: EventCallback,
        on_position: PositionCallback | None,
        control: RunControl,
        *,
        replayed: bool,
    ) -> None:
        self._request = request
        self._supervised = supervised
        self._control = control
        self._final = False
        """The end rule held (a result after every message was taken): the answer is in."""
        self._bound = False
        """The control was bound (see :meth:`_bind`)."""
        self._results = asyncio.Event()
        """Set at each result (the stop waits for the one its interrupt causes)."""
        self._on_event = on_event
        self._on_position = on_position
        self._replayed = replayed
        self._loop = asyncio.get_running_loop()
        self._tasks: set[asyncio.Task[Any]] = set()
        self._stderr = bytearray()
        self._no_session = False
        self._init: Init | None = None
        self._result: Result | None = None
        self._ending: asyncio.Future[Ending | _ResultSeen] = self._loop.create_future()
        """The first ending the journal tells, in its order (or the error of ``on_event``)."""

    @property
    def answered(self) -> bool:
        """claude printed its final result (the end rule held): the run's outcome is that."""
        return self._final

    def _task(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        return task

    def _end(self, ending: Ending | _ResultSeen) -> None:
        if not self._ending.done():
            self._ending.set_result(ending)

    async def follow(self) -> Ending:
        """Follow the run until it ended one of the ways listed in the module doc."""
        request = self._request
        supervised = self._supervised
        # Where the replayed history ends (0: a run started here): the bridge holds a
        # result there until it knows nothing was sent after it.
        self._control.history_end = supervised.history_end
        if not supervised.history_end:
            self._bind()  # a new run: no history to replay first
        await self._on_event(Spawned(supervised.claude_pid, supervised.live))
        self._task(self._feed_stdin())
        self._task(self._pump())
        self._task(self._end_rule_on_withdrawal())
        # The supervisor keeps the time limits; this only catches one that froze.
        backstop = request.run_timeout_s + request.stop_grace_s + supervision.SUPERVISOR_KILL_S
        # A supervisor whose connection ended early is waited for as long, no longer.
        supervised.deadline = self._loop.time() + backstop
        await asyncio.wait({self._ending}, timeout=backstop)
        if not self._ending.done():
            return Unresponsive()
        ending = self._ending.result()  # the error of on_event, if it failed
        if isinstance(ending, _ResultSeen):
            # Treat the result as done; a lingering process gets a bounded wait.
            exited = supervised.claude_exit
            both: set[asyncio.Future[Any]] = {exited, supervised.gone}
            await asyncio.wait(both, timeout=request.stop_grace_s)
            return Answered(lingering=not exited.done())
        if isinstance(ending, Expired):
            # The supervisor interrupted claude at its time limit: its result (what the
            # run cost) comes before it exits, unless the grace period runs out first.
            # Waited for here, so a stop meanwhile stops the run as any stop does.
            ends: set[asyncio.Future[Any]] = {supervised.claude_exit, supervised.gone}
            await asyncio.wait(ends, timeout=request.stop_grace_s)
        return ending

    def _bind(self) -> None:
        """Input goes to the supervisor from now on (protocol version 2).

        A reattached control is bound only once its replay reached the journal's
        length at the attach: until then it does not know whether the run still
        takes input (a ``stdin_closed`` may come), and the supervisor drops what it
        is sent after that, while ``send`` would have returned as if it was counted.
        """
        if self._bound or self._supervised.version < 2:
            return
        self._bound = True
        self._control.bind(
            self._supervised.write_stdin,
            self._supervised.close_stdin,
            max_line_bytes=self._request.max_line_bytes,
        )

    async def _feed_stdin(self) -> None:
        # The prompt went with the first records; this only waits for it to be sent.
        await self._supervised.drain()

    async def _pump(self) -> None:
        """Read the journal to its end: claude's output into events, the rest into the ending.

        Reading on after the result matters: the ``exited`` and ``done``
        records come after it, and the end of the journal is how the run's
        end is known.
        """
        supervised = self._supervised
        framer = LineFramer(self._request.max_line_bytes)
        decoding = True
        last_out = 0
        if supervised.unwritable_at_start is not None:  # read before ``spawned``, at the start
            await self._journal_trouble(supervised.unwritable_at_start)
        while (record := await supervised.read()) is not None:
            if record.end >= supervised.history_end:
                self._bind()  # the replay caught up (this record's events are live)
            match record.kind:
                case "out":
                    last_out = record.end
                    if decoding:
                        decoding = await self._decode(framer, record.payload, record.end)
                case "in":
                    self._control.note_in(record.payload)
                case "stdin_closed":
                    self._control.note_closed()
                case "err":
                    self._add_stderr(record.payload)
                case "exited":
                    # Everything claude wrote comes before this record: a last line
                    # without a newline is complete now.
                    last = framer.finish() if decoding else None
                    if last is not None:
                        decoding = await self._decode_line(last, last_out)
                    decoding = False
                    self._end(Exited())
                case "expired":
                    self._end(EXPIRIES.get(str(record.fields.get("status")), Orphaned()))
                case "unwritable" | "writable":
                    await self._journal_trouble(record)
                case "held_full":
                    log.warning(
                        "run %s: its supervisor holds %s bytes it cannot write: until the"
                        " disk has space, only the lines the run depends on are kept",
                        self._request.run_id,
                        record.fields.get("max"),
                    )
            self._control.note_read(record.end)
            if decoding and self._check_end(record.end):
                decoding = False
        # The journal ended: after ``done`` the ending was told before; without
        # it the supervisor died before claude did.
        self._end(Unsupervised())

    async def _decode(self, framer: LineFramer, payload: bytes, end: int) -> bool:
        """Hand on the events of the lines ``payload`` completes; False once decoding is over."""
        start = end - len(payload)
        try:
            lines = framer.feed_ends(payload)
        except StreamError as exc:
            self._end(Unreadable(str(exc)))
            return False
        for line, line_end in lines:
            if not await self._decode_line(line, start + line_end):
                return False
        return True

    async def _decode_line(self, line: bytes, position: int) -> bool:
        try:
            if self._on_position is not None:
                self._on_position(position)
            return not await self._dispatch(line, position)
        except StreamError as exc:
            self._end(Unreadable(str(exc)))
        except Exception as exc:  # on_event failed: follow raises it, the run stops
            if not self._ending.done():
                self._ending.set_exception(exc)
        return False

    async def _journal_trouble(self, record: Record) -> None:
        """The supervisor could not write the journal, or can again: the caller is told."""
        if record.kind == "unwritable":
            error = str(record.fields.get("error") or "an error")
            log.warning(
                "run %s: its journal cannot be written (%s); the supervisor holds the output",
                self._request.run_id,
                error,
            )
            event: RunEvent = JournalUnwritable(error)
        else:
            held = record.fields.get("held")
            held = held if isinstance(held, int) and not isinstance(held, bool) else 0
            log.info(
                "run %s: its journal is written again (%d bytes held)", self._request.run_id, held
            )
            event = JournalWritable(held)
        try:
            await self._on_event(event)
        except Exception as exc:  # on_event failed: follow raises it, the run stops
            if not self._ending.done():
                self._ending.set_exception(exc)

    def _add_stderr(self, chunk: bytes) -> None:
        self._stderr += chunk
        # Checked while the tail still holds the whole message.
        if NO_SESSION_MARK in self._stderr:
            self._no_session = True
        del self._stderr[:-STDERR_TAIL_BYTES]

    async def _dispatch(self, line: bytes, position: int) -> bool:
        """Hand the line's events on; True once the final result (or a refused login) was seen."""
        for event in parse_line(line):
            self._control.note(event)
            if isinstance(event, ControlAnswer):
                continue  # the control's business, not the caller's
            if isinstance(event, Init):
                self._init = event
            elif isinstance(event, Result):
                self._result = event  # the report is built from the last one
                self._results.set()
            elif isinstance(event, ApiRetry):
                log.info(
                    "run %s: claude retries its API request (%s)",
                    self._request.run_id,
                    event.describe(),
                )
                # Rate limits and overloads pass; refused credentials never will.
                if event.auth_failed:
                    self._end(Unauthenticated(event.describe()))
            await self._on_event(event)
        return self._check_end(position) or self._ending.done()

    async def _end_rule_on_withdrawal(self) -> None:
        """A message promised to the run was withdrawn, never sent (its record failed):
        the end rule the promise held may hold now, and no journal record comes to say so."""
        while not self._final:
            await self._control.promise_withdrawn()
            self._check_end(self._control.read_offset)

    def _check_end(self, position: int) -> bool:
        """The end rule (runner.control): once it holds, and the journal's history was
        read (a reattach rebuilt what was sent since), claude's stdin is closed and the
        last result is the answer. True once it held."""
        if self._final:
            return True
        control = self._control
        if not control.settled or position < self._supervised.history_end:
            return False
        control.close_input()  # eof (a version 1 run had its eof with the prompt)
        self._final = True
        self._end(_RESULT_SEEN)
        return True

    async def stop(self, *, gently: bool) -> None:
        """Stop the run, first with :meth:`stop_gently` if ``gently``; one shielded whole."""
        if gently:
            await self.stop_gently()
        await self.close(stop=True)

    async def stop_gently(self) -> None:
        """A stop that keeps the conversation resumable (before the hard one, :meth:`close`).

        claude is asked to end its turn (``interrupt``: its tools are abandoned,
        the session is written), and the turn of each message sent and not taken
        yet, given ``stop_grace_s`` for those turns' results,
        then its stdin is closed and it is given as long to exit. Bounded; what
        does not work out is left to the hard stop (TERM, grace, KILL, sweep).
        """
        supervised = self._supervised
        control = self._control
        grace = self._request.stop_grace_s
        if supervised.version < 2 or supervised.claude_exit.done() or not control.accepting:
            return
        try:
            async with asyncio.timeout(grace):
                # A turn runs (or a message waits): end it. A message sent into the run
                # and not taken yet starts a turn of its own once the interrupted one
                # ended: that one is interrupted too, so claude does not work on it.
                while not control.settled:
                    self._results.clear()
                    if not await control.interrupt():
                        break
                    await self._results.wait()
        except (TimeoutError, ControlError, InputClosed) as exc:
            log.info("run %s: the interrupt did not end the turn: %r", self._request.run_id, exc)
        control.close_input()
        exited: set[asyncio.Future[Any]] = {supervised.claude_exit, supervised.gone}
        await asyncio.wait(exited, timeout=grace)

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
                if self._replayed:
                    why = "was gone before the bridge restarted"
                killed = await supervised.contain()
                log.error(
                    "run %s: its supervisor %s; the bridge stopped the run (%d process(es))",
                    request.run_id, why, killed,
                )  # fmt: skip
            elif supervised.survivors:
                log.error(
                    "run %s: processes survived SIGKILL: %s", request.run_id, supervised.survivors
                )
        finally:
            await self.abandon()

    async def abandon(self) -> None:
        """Finish the helper tasks (the run itself is left as it is)."""
        for task in self._tasks:
            task.cancel()
        results = await asyncio.gather(*self._tasks, return_exceptions=True)
        for result in results:
            if isinstance(result, Exception):
                log.warning("run %s: helper task failed: %r", self._request.run_id, result)
        if self._ending.done() and not self._ending.cancelled():
            self._ending.exception()  # retrieved: follow may have ended before

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
        if result is not None and not result.is_error and self._control.last_result_answers:
            # The answer is the outcome, however claude went on (bridge.runs.executor
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
            case Orphaned():
                error = (
                    "the run was stopped: no chatbridge was attached to it for "
                    f"{request.orphan_timeout_s:g} s"
                )
                return RunReport(RunStatus.INTERRUPTED, error=error, **common)
            case Unreadable(reason=reason):
                error = self._with_stderr(f"claude output unreadable: {reason}")
                return RunReport(RunStatus.FAILED, error=error, **common)
            case Unauthenticated(detail=detail):
                error = f"claude could not authenticate: {detail}"
                return RunReport(RunStatus.FAILED, error=error, **common)
            case Unresponsive():
                error = "the run's supervisor stopped responding; the bridge stopped the run"
                return RunReport(RunStatus.FAILED, error=error, **common)
            case Unsupervised() if self._replayed:
                return RunReport(RunStatus.INTERRUPTED, error=GONE_AT_RESTART, **common)
            case Unsupervised():
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
        if result is not None and result.subtype == BUDGET_SPENT:
            cap = f" of {usd(request.max_budget_usd)}" if request.max_budget_usd else ""
            spent = f" after spending {usd(result.cost_usd)}" if result.cost_usd is not None else ""
            error = f"it reached its spending cap{cap} (max_budget_usd){spent}."
            return RunReport(RunStatus.FAILED, error=error, **common)
        if result is not None and result.is_error:
            detail = "; ".join(result.errors) or result.text or "no detail"
            error = self._with_stderr(f"claude reported an error ({result.subtype}): {detail}")
            return RunReport(RunStatus.FAILED, error=error, **common)
        if result is not None:
            # An earlier turn's answer (handed on already): a message sent after it
            # was not answered, and that answer is not this run's outcome.
            error = self._with_stderr(
                f"claude exited with {_describe_exit(code)} before it answered "
                "the message(s) sent after its last answer"
            )
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


BUDGET_SPENT = "error_max_budget_usd"
"""The result subtype of a run claude ended at its ``--max-budget-usd``."""


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
