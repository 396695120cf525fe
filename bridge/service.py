"""The service's lifecycle: recover, serve, shut down in order.

:func:`serve` runs one TaskGroup owning the dispatcher, the transports and the housekeeping
loop; the parts are built once, before (:func:`bridge.assembly.build_parts`, each given
what it needs in its constructor). Recovery, the runs left from before, is
:mod:`bridge.recovery`'s. Shutdown is one ordered path: no run begins (messages are still
accepted durably), runs are detached or finish within the grace, answers are delivered, then
the transports close, the store last (docs/operations.md, "Stopping").
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import time
from collections.abc import Awaitable, Sequence
from dataclasses import dataclass, field

from bridge.assembly import (
    Parts,
    Signs,
    build_parts,
    build_transports,
    http_limits,
    open_store,
    sqlite_file_problem,
    web_console,
)
from bridge.automation.schedules import WallClock
from bridge.cluster.replica import Cluster
from bridge.config import Settings
from bridge.core.aio import shielded
from bridge.core.model import Batch, Message, RoomKey
from bridge.core.transport import RunPhase, Transport, TransportError
from bridge.errors import ChatbridgeError, StartupError, reason
from bridge.host.claude_check import credentials_warning
from bridge.host.containment import report_containment
from bridge.host.database_lock import database_lock
from bridge.host.http_sockets import HttpSockets, bind_http
from bridge.host.preflight import run_problems
from bridge.host.state_lock import state_dir_lock
from bridge.store.base import Approval, Store, StoreError
from bridge.store.sql import SqlStore
from dispatcher import Clock, EndReason

WEB_PREFIX = "/web"
"""Where the web console is mounted on the private listener (docs/web.md)."""

log = logging.getLogger(__name__)

PRUNE_INTERVAL_S = 3600.0
READY_TIMEOUT_S = 60.0
_REACHES = {"matrix": "matrix.homeserver", "slack": "slack.api_url"}
"""The setting to check when a part does not connect in time (it keeps retrying meanwhile)."""


@dataclass(slots=True)
class Service:
    """The assembled parts; :meth:`serve` runs them until input ends or a signal arrives."""

    settings: Settings
    store: Store
    transports: Sequence[Transport]
    """The transports; once built, those of :attr:`parts` (Matrix gated with replicas)."""
    schedule_clock: Clock = field(default_factory=WallClock)
    """Wall-clock time for ``[[schedules]]`` (tests move a ManualClock)."""
    parts: Parts = field(init=False)
    """What the service runs, built once (:func:`bridge.assembly.build_parts`)."""
    _closed_at_start: list[Approval] = field(default_factory=list, init=False)
    """Tool requests of runs interrupted by the restart: shown closed once connected."""
    _stop: asyncio.Event = field(init=False, default_factory=asyncio.Event)
    _stop_now: asyncio.Event = field(init=False, default_factory=asyncio.Event)
    _tasks: asyncio.TaskGroup | None = field(init=False, default=None)
    ready: asyncio.Event = field(init=False, default_factory=asyncio.Event)
    """Set once recovery is done and every transport is connected."""
    shutting_down: asyncio.Event = field(init=False, default_factory=asyncio.Event)
    """Set when the shutdown path begins (readiness says so). Runs stop beginning when the
    dispatcher drains, after the warm claudes are stopped and idle conversations handed
    over: one that begins meanwhile is drained (or detached) like any other."""
    http_port: int | None = field(init=False, default=None)
    """The port /healthz, /readyz and /metrics listen on, once bound."""
    public_http_port: int | None = field(init=False, default=None)
    """The port the webhooks listen on, once bound (``http_port`` when they share it)."""

    def __post_init__(self) -> None:
        signs = Signs(self._show_received, self._show_dropped, self._closed)
        self.parts = build_parts(
            self.settings, self.store, self.transports, self.schedule_clock, signs
        )
        self.transports = self.parts.transports

    async def readiness(self) -> str | None:
        """None when the store answers and every transport is connected."""
        if self.shutting_down.is_set():
            return "shutting down"
        try:
            await self.store.ping()
        except StoreError as exc:
            return f"store: {exc}"
        for transport in self.transports:
            if not transport.connected:
                return f"{transport.name}: not connected"
        return None

    def _http_bound(self, sockets: HttpSockets) -> None:
        self.http_port, self.public_http_port = sockets.private_port, sockets.public_port
        for setting, port in (("listen", self.http_port), ("public_listen", self.public_http_port)):
            if port is not None:
                log.info("http.%s listening on port %d", setting, port)

    async def _serve_http(self, sockets: HttpSockets) -> None:
        from bridge.host.http import serve_http

        limits = http_limits(self.settings.http)
        webhooks = self.parts.webhooks if self.settings.webhooks else None
        mounts = (
            {WEB_PREFIX: web_console(self.settings, self.store, self.parts)}
            if self.settings.web.enabled
            else {}
        )
        await serve_http(
            sockets,
            self.readiness,
            self.parts.metrics.exposition,
            webhooks=webhooks,
            limits=limits,
            mounts=mounts,
        )

    def request_stop(self) -> None:
        """First call: graceful shutdown. Second call: stop runs at once."""
        if self._stop.is_set():
            self._stop_now.set()
        self._stop.set()

    def _closed(self, closed: list[Approval]) -> None:
        """Tool requests of runs interrupted by the restart: shown closed once connected."""
        if self.ready.is_set() and self._tasks is not None:
            self._tasks.create_task(self.parts.approvals.show(closed), name="close requests")
        else:
            self._closed_at_start += closed

    def _show_received(self, message: Message) -> None:
        # The sign of life: in the service's task group, so the transport's
        # acknowledgement does not wait for it (the replier never raises).
        settings = self.settings.room(message.room)
        if settings is not None and not settings.sign_of_life:
            return
        if self._tasks is not None:
            batch = Batch(message.room, (message,))
            self._tasks.create_task(self.parts.replier.phase(batch, RunPhase.RECEIVED))

    def _show_dropped(self, messages: Sequence[Message]) -> None:
        # A sign of life shown for messages a stop dropped (or the last one waiting,
        # deleted) ends now (Matrix's typing would otherwise go on until it lapses):
        # they are shown stopped.
        conversations: dict[RoomKey, list[Message]] = {}
        for message in messages:
            conversations.setdefault(message.room, []).append(message)
        for room, dropped in conversations.items():
            settings = self.settings.room(room)
            if self._tasks is None or (settings is not None and not settings.sign_of_life):
                continue
            batch = Batch(room, tuple(dropped))
            self._tasks.create_task(self.parts.replier.phase(batch, RunPhase.STOPPED))

    async def serve(self) -> None:
        try:
            await self._serve()
        finally:
            self._tasks = None

    async def _serve(self) -> None:
        with state_dir_lock(self.settings.runner.state_dir):
            if isinstance(self.store, SqlStore):
                shared = self.settings.cluster.enabled
                async with database_lock(self.store.engine, shared=shared):
                    await self._serve_locked()
            else:
                await self._serve_locked()

    async def _serve_locked(self) -> None:
        report_containment(self.settings)
        await self.parts.recovery.recover()
        self.parts.spares.refill()  # the first run's supervisor, ready well before it
        try:
            await self._serve_parts()
        finally:
            prestarts = self.parts.executor.prestarts
            if prestarts is not None:
                # The shutdown closed them; a serve cancelled or failed before it did
                # not, and their tasks are no run's: nothing else would stop them.
                await shielded(prestarts.close())
            await shielded(self.parts.spares.close())

    async def _serve_parts(self) -> None:
        # Bound now (a taken port fails the start), served once ready: the server's
        # import (aiohttp) is not on the start-up's path; early clients wait queued.
        http = self.settings.http
        sockets = bind_http(http.listen, http.public_listen)
        self._http_bound(sockets)
        try:
            await self._serve_parts_bound(sockets)
        finally:
            sockets.close()

    async def _serve_parts_bound(self, sockets: HttpSockets) -> None:
        async with asyncio.TaskGroup() as tg:
            self._tasks = tg
            background = [
                tg.create_task(self._housekeeping(), name="housekeeping"),
                tg.create_task(self.parts.lifetimes.sweep_forever(), name="worktree lifetimes"),
                tg.create_task(self.parts.approvals.expire_forever(), name="approval expiry"),
            ]
            if self.parts.cluster is not None:
                # From the start: the leases kept at recovery must be renewed
                # while the transports connect.
                background.append(tg.create_task(self.parts.cluster.serve(), name="cluster"))
            readies: dict[str, asyncio.Event] = {}
            input_ended = asyncio.Event()
            for transport in self.transports:
                ready = readies[transport.name] = asyncio.Event()
                name = f"transport-{transport.name}"
                part = self._run_transport(transport, ready, input_ended)
                background.append(tg.create_task(self._part(name, part), name=name))
            if await self._wait_ready(readies, background):
                # Runs start only now: a recovered run's replies need a connected transport.
                background.append(tg.create_task(self.parts.outbox.serve(), name="outbox"))
                dispatcher_task = tg.create_task(self.parts.dispatcher.serve(), name="dispatcher")
                # Fired from here on: a firing is a message, which needs the dispatcher.
                background.append(tg.create_task(self.parts.scheduler.run(), name="schedules"))
                background.append(tg.create_task(self.parts.limits.serve(), name="limit resumes"))
                if sockets.private is not None or sockets.public is not None:
                    background.append(tg.create_task(self._serve_http(sockets), name="http"))
                log.info("chatbridge ready")
                self.ready.set()
                if self._closed_at_start:
                    closed, self._closed_at_start = self._closed_at_start, []
                    tg.create_task(self.parts.approvals.show(closed), name="close requests")
                await self._until_stopped_or_done(tg, input_ended)
                await self._shutdown(dispatcher_task)
            else:
                # What the outbox holds (notices, command answers) goes out after the restart.
                log.info("stopped while starting")
            for task in background:
                task.cancel()
        log.info("chatbridge stopped")

    async def _until_stopped_or_done(
        self, tg: asyncio.TaskGroup, input_ended: asyncio.Event
    ) -> None:
        stop_wait = tg.create_task(self._stop.wait())
        eof_wait = tg.create_task(input_ended.wait())
        await asyncio.wait({stop_wait, eof_wait}, return_when=asyncio.FIRST_COMPLETED)
        if eof_wait.done() and not self._stop.is_set():
            # End of console input: finish the room's work, then leave.
            log.info("end of input; finishing outstanding work")
            idle = tg.create_task(self.parts.dispatcher.wait_idle())
            await asyncio.wait({idle, stop_wait}, return_when=asyncio.FIRST_COMPLETED)
            idle.cancel()
        stop_wait.cancel()
        eof_wait.cancel()

    async def _part(self, name: str, part: Awaitable[None]) -> None:
        """Run one part (HTTP, a transport); a crash before "ready" becomes a StartupError.

        A task that fails makes the task group cancel the start-up and raise
        what the task raised: the start-up cannot catch it on the way. So the
        part itself sums up an unexpected exception in one line naming it (the
        traceback goes to the DEBUG log); an operator's error (a setting's
        problem) already is such a line. After "ready" a crash stays a crash.
        """
        try:
            await part
        except (ChatbridgeError, TransportError):
            raise
        except Exception as exc:
            if self.ready.is_set():
                raise
            log.debug("%s failed to start", name, exc_info=True)
            raise StartupError(f"{name} failed to start: {reason(exc)}") from exc

    async def _run_transport(
        self, transport: Transport, ready: asyncio.Event, input_ended: asyncio.Event
    ) -> None:
        await transport.run(self.parts.intake.accept, ready)
        input_ended.set()

    async def _stop_wait(self) -> None:
        await self._stop.wait()

    async def _wait_ready(
        self, readies: dict[str, asyncio.Event], tasks: list[asyncio.Task[None]]
    ) -> bool:
        """True once every part (HTTP, transports) has started; False if a stop came first.

        A part that fails to start fails the start-up with its own message
        (one line naming the setting): "ready" is never logged before.
        """

        async def all_ready() -> None:
            for ready in readies.values():
                await ready.wait()

        waiter = asyncio.ensure_future(all_ready())
        stop = asyncio.ensure_future(self._stop_wait())
        pending: set[asyncio.Future[None]] = {waiter, stop, *tasks}
        try:
            async with asyncio.timeout(READY_TIMEOUT_S):
                while not waiter.done():
                    done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                    if stop in done:
                        return False
                    for task in done - {waiter}:
                        # Usually the task group cancels this wait first and
                        # raises the part's own error (see _part).
                        error = None if task.cancelled() else task.exception()
                        if error is not None:
                            raise StartupError(reason(error)) from error
        except TimeoutError:
            late = ", ".join(
                f"{name} (check {_REACHES.get(name, name)})"
                for name, ready in readies.items()
                if not ready.is_set()
            )
            raise StartupError(f"not started within {READY_TIMEOUT_S:g}s: {late}") from None
        finally:
            waiter.cancel()
            stop.cancel()
        return True

    async def _shutdown(self, dispatcher_task: asyncio.Task[None]) -> None:
        """Steps 1-3 of the shutdown path; the caller then closes the transports."""
        self.shutting_down.set()
        if self.parts.executor.prestarts is not None:
            # No run comes for a claude kept warm now; runs ending in the grace keep none.
            await self.parts.executor.prestarts.stop_keeping()
        if self.parts.cluster is not None:
            # Scale-in: idle conversations go to other replicas at once.
            self.parts.cluster.draining = True
            await self._hand_over(self.parts.cluster, busy=False)
        # From here no run begins; transports keep delivering inbound messages,
        # which are recorded and wait for the restart.
        if self.settings.runner.on_shutdown == "detach" and not self._stop_now.is_set():
            # Runs go on under their supervisors; the next start reattaches them.
            # (One not yet registered, or already answered, ends here as usual.)
            if self.parts.dispatcher.active_runs:
                log.info(
                    "leaving %d active run(s) to their supervisors",
                    self.parts.dispatcher.active_runs,
                )
            await self.parts.dispatcher.drain(0.0, reason=EndReason.DETACHED)
        else:
            grace = 0.0 if self._stop_now.is_set() else self.settings.runner.shutdown_grace_s
            if self.parts.dispatcher.active_runs:
                log.info(
                    "waiting up to %gs for %d active run(s)",
                    grace,
                    self.parts.dispatcher.active_runs,
                )
            # Runs cut off at the end of the grace are interrupted: the runner
            # leaves no process behind and the executor records and reports
            # them while transports still send.
            if not await self.parts.dispatcher.drain(grace, cut_off=self._stop_now):
                log.info("interrupted the runs still active after the grace period")
        dispatcher_task.cancel()
        # wait(), not await: the task's own CancelledError is expected, but a
        # cancellation of this shutdown must still propagate.
        await asyncio.wait({dispatcher_task})
        if self.parts.executor.prestarts is not None:
            await self.parts.executor.prestarts.close()  # (the drain cancelled each; this waits)
        # The runs' answers and notices go out while the transports still run;
        # what cannot be delivered in time stays in the outbox for the restart.
        # The progress messages' last edits (tasks under way, each after its
        # answer) share that time.
        drain_s = self.settings.delivery.drain_timeout_s
        deadline = time.monotonic() + drain_s
        await self.parts.outbox.drain(drain_s)
        await self.parts.executor.drain(max(0.0, deadline - time.monotonic()))
        if self.parts.cluster is not None:
            await self._hand_over(self.parts.cluster, busy=True)

    async def _hand_over(self, cluster: Cluster, *, busy: bool) -> None:
        """Let conversations go at shutdown: the idle ones first, the rest once their
        runs have ended. A conversation whose run was left to its supervisor
        (``on_shutdown = "detach"``) is kept: a restart within ``lease_ttl_s``
        reattaches it, and otherwise its lease runs out and another replica
        takes it over (docs/replicas.md)."""
        try:
            detached = {
                run.room
                for run in await self.store.running_runs()
                if run.replica == cluster.replica_id
            }
        except StoreError:
            return  # the leases run out on their own
        rooms = [
            room
            for room in cluster.owned()
            if room not in detached and (busy or self.parts.dispatcher.status(room).running is None)
        ]
        try:
            await cluster.release_idle(rooms)
            if busy and not detached.intersection(cluster.owned()):
                await cluster.leave()
        except StoreError:
            log.warning("could not hand conversations over; their leases run out")

    async def _housekeeping(self) -> None:
        retention_s = self.settings.database.retention_days * 86400
        while True:
            try:
                pruned = await self.store.prune(time.time() - retention_s)
                if pruned:
                    log.info("pruned %d old row(s)", pruned)
            except StoreError:
                log.warning("pruning failed", exc_info=True)
            await asyncio.sleep(PRUNE_INTERVAL_S)


async def run_service(settings: Settings) -> None:
    """Build, serve until stopped, close. Installs SIGTERM/SIGINT handlers."""
    warning = credentials_warning(settings, os.environ)
    if warning is not None:
        # The service still starts: the login may be in a keychain this check cannot see.
        log.warning("%s", warning)
    # `claude --version` takes a moment: in a thread, while the store opens.
    checking = asyncio.ensure_future(asyncio.to_thread(run_problems, settings, dict(os.environ)))
    try:
        store = await open_store(settings)
    except BaseException:
        checking.cancel()  # the thread ends on its own, within claude_check's timeout
        raise
    try:
        for problem in await checking:
            # Warnings, not failures: the directory or binary may appear later.
            log.warning("%s", problem)
        service = Service(settings, store, build_transports(settings, store))
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, service.request_stop)
        try:
            await service.serve()
        finally:
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.remove_signal_handler(sig)
    finally:
        await store.close()


__all__ = ["Service", "build_transports", "open_store", "run_service", "sqlite_file_problem"]
