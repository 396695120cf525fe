"""The service's lifecycle: build the parts, recover, serve, shut down in order.

:func:`serve` runs one TaskGroup owning the dispatcher, the transports and the housekeeping
loop; the parts are built once (:meth:`Service.__post_init__`) and never rewired. Shutdown is
one ordered path: no run begins (messages are still accepted durably), runs are detached or
finish within the grace, answers are delivered, then the transports close, the store last
(docs/operations.md, "Stopping").
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import signal
import socket
import time
from collections.abc import Awaitable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from bridge.automation.schedules import CronSchedules, WallClock
from bridge.automation.webhooks import Webhooks
from bridge.cluster.leader_gate import LeaderGated
from bridge.cluster.paused_holders import stop_paused_holders
from bridge.cluster.replica import Cluster
from bridge.cluster.role import ClusterRole
from bridge.config import HttpSettings, Settings
from bridge.core.aio import shielded
from bridge.core.http_limits import ClientLimits
from bridge.core.model import (
    Batch,
    Message,
    Reply,
    ReplyKind,
    RoomKey,
    RunId,
    RunReport,
    RunStatus,
)
from bridge.core.transport import RoomBinding, RunPhase, SeenMarks, Transport, TransportError
from bridge.errors import ChatbridgeError, StartupError, reason
from bridge.host.claude_check import credentials_warning
from bridge.host.containment import report_containment
from bridge.host.database_lock import database_lock
from bridge.host.http_sockets import HttpSockets, bind_http
from bridge.host.preflight import run_problems
from bridge.host.state_lock import state_dir_lock
from bridge.inbound.commands import CommandHandler
from bridge.inbound.history import RoomHistory
from bridge.inbound.intake import Intake
from bridge.live.approval_flow import ApprovalFlow
from bridge.live.approvals import Verdict
from bridge.metrics import Metrics
from bridge.outbound.notices import Notices
from bridge.outbound.outbox import Outbox
from bridge.outbound.pacing import Pacing
from bridge.outbound.replies import Replier, in_conversation
from bridge.runs.budget import Budgets
from bridge.runs.executor import RunExecutor, new_run_id
from bridge.runs.file_posts import FilePosts
from bridge.runs.inbox import Inbox
from bridge.runs.prestarts import Prestarts
from bridge.runs.stale_runs import interruption_text, never_started
from bridge.runs.usage import LimitResumes
from bridge.runs.worktree_lifetime import Lifetimes
from bridge.store.base import Approval, RegisteredRun, RunRecord, Store, StoreError
from bridge.store.cluster import Leases, ReplicaIdInUse
from bridge.store.sql import SqlStore
from dispatcher import (
    Clock,
    DispatchedRun,
    Dispatcher,
    DispatchLimits,
    DuringRun,
    EndReason,
    RoomStatus,
)
from runner import (
    Spares,
    clean_stray_runs,
    journal_exists,
    prestart,
    recover_run,
    remove_run_dir,
)

if TYPE_CHECKING:
    from aiohttp import web

WEB_PREFIX = "/web"
"""Where the web console is mounted on the private listener (docs/web.md)."""

log = logging.getLogger(__name__)

PRUNE_INTERVAL_S = 3600.0
MIN_IDLE_TRANSACTION_S = 2.0
"""Replicas' PostgreSQL sessions idle in a transaction longer than this (or than the
renewal period, if longer) are ended by the server: no transaction of ours idles that
long unless its process was paused (docs/replicas.md)."""
READY_TIMEOUT_S = 60.0
_REACHES = {"matrix": "matrix.homeserver", "slack": "slack.api_url"}
"""The setting to check when a part does not connect in time (it keeps retrying meanwhile)."""


def http_limits(http: HttpSettings) -> ClientLimits:
    """``[http]``'s bounds on each client, for its listeners and the Slack events endpoint."""
    return ClientLimits(
        head_timeout_s=http.head_timeout_s,
        body_timeout_s=http.body_timeout_s,
        max_connections=http.max_connections,
    )


def build_transports(settings: Settings, marks: SeenMarks | None = None) -> list[Transport]:
    """One transport per configured chat system; library imports stay lazy.

    ``marks`` (the store) keeps where Slack got to in each channel, for its catch-up.
    """
    transports: list[Transport] = []

    def bindings(name: str) -> list[RoomBinding]:
        return [
            RoomBinding(key.room_id, trigger=room.trigger, reply_in_thread=room.reply_in_thread)
            for key, room in settings.room_settings.items()
            if key.transport == name
        ]

    if settings.console_active:
        from transports.console import ConsoleTransport

        transports.append(
            ConsoleTransport(
                settings.console.room,
                settings.console.user,
            )
        )
    if settings.matrix is not None:
        from transports.matrix import MatrixTransport

        transports.append(MatrixTransport(settings.matrix, bindings("matrix")))
    if settings.slack is not None:
        from transports.slack import SlackTransport

        transports.append(
            SlackTransport(
                settings.slack,
                bindings("slack"),
                marks=marks,
                http_limits=http_limits(settings.http),
            )
        )
    return transports


@dataclass(slots=True)
class Service:
    """The assembled parts; :meth:`serve` runs them until input ends or a signal arrives."""

    settings: Settings
    store: Store
    transports: Sequence[Transport]
    schedule_clock: Clock = field(default_factory=WallClock)
    """Wall-clock time for ``[[schedules]]`` (tests move a ManualClock)."""
    dispatcher: Dispatcher = field(init=False)
    executor: RunExecutor = field(init=False)
    intake: Intake = field(init=False)
    replier: Replier = field(init=False)
    outbox: Outbox = field(init=False)
    notices: Notices = field(init=False)
    lifetimes: Lifetimes = field(init=False)
    approvals: ApprovalFlow = field(init=False)
    scheduler: CronSchedules = field(init=False)
    webhooks: Webhooks = field(init=False)
    limits: LimitResumes = field(init=False)
    commands: CommandHandler = field(init=False)
    _closed_at_start: list[Approval] = field(default_factory=list, init=False)
    _adopted: set[RunId] = field(default_factory=set, init=False)
    """Runs reattached at start: their run directories are not strays."""
    cluster: Cluster | None = field(init=False, default=None)
    """This replica's part in the cluster (``[cluster] enabled``), None alone."""
    """Tool requests of runs interrupted by the restart: shown closed once connected."""
    metrics: Metrics = field(init=False, default_factory=Metrics)
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
    spares: Spares = field(init=False, default_factory=Spares)
    """A supervisor started ahead of the next run: from recovery's end to the shutdown's."""

    def __post_init__(self) -> None:
        settings = self.settings
        if settings.cluster.enabled:
            self.cluster = self._new_cluster()
        by_name = {t.name: t for t in self.transports}
        pacing = {
            name: Pacing(settings.delivery.edits_per_minute(name), time.monotonic)
            for name in by_name
        }
        self.replier = Replier(by_name, pacing)
        self.outbox = Outbox(
            self.store,
            by_name,
            self.metrics,
            on_rate_limited=self.replier.rate_limited,
            retry_cap_s=settings.delivery.retry_max_s,
        )
        self.notices = Notices(self.store, self.outbox, self.replier)
        self.executor = RunExecutor(
            settings, self.store, self.replier, self.metrics, self.outbox, self.notices
        )
        self.executor.spares = self.spares
        self.approvals = ApprovalFlow(
            settings, self.store, self.replier, self.executor.live_runs, self._refused
        )
        self.executor.approvals = self.approvals
        self.executor.inbox = Inbox(by_name, self.metrics)
        self.executor.file_posts = FilePosts(
            self.store, self.outbox, self.metrics, settings.runner.state_dir
        )
        if settings.runner.prestart:
            self.executor.prestarts = Prestarts(
                self.executor.prestart_request,
                self.metrics,
                new_run_id,
                start=functools.partial(prestart, spares=self.spares),
                keep_s=settings.runner.prestart_keep_s,
                keep_limit=settings.runner.prestart_limit,
            )
        d = settings.dispatcher
        self.dispatcher = Dispatcher(
            DispatchLimits(
                coalesce_s=d.coalesce_ms / 1000,
                max_wait_s=d.max_wait_ms / 1000,
                max_batch=d.max_batch,
                max_concurrent_runs=settings.runner.max_concurrent_runs,
            ),
            self._execute,
            mode_of=self._during_run,
            prestarter=self.executor.prestarts,
            max_prestarts=settings.runner.prestart_limit,
            room_cap=self._max_runs_per_room,
            idle_of=self._idle_of,
        )
        self.lifetimes = Lifetimes(
            self.executor.worktrees,
            lambda: list(settings.room_settings.items()),
            self.dispatcher.conversations,
            self._running_conversations,
            self.notices.say,
        )
        self.limits = LimitResumes(
            self.store,
            self.dispatcher.submit,
            self.notices,
            self.metrics,
            settings.runner.resume_after_limit,
            settings.commands.prefix,
            configured=lambda room: settings.room(room) is not None,
        )
        self.executor.limits = self.limits
        # Command answers are recorded in the outbox and sent from its per-room
        # worker: the transport's acknowledgement never waits for the network.
        commands = self.commands = CommandHandler(
            self.dispatcher,
            self.store,
            settings.commands.prefix,
            self.notices.answer,
            self.executor.reset_session,
            rooms=settings.room,
            live=self.approvals,
            refused=self._refused,
            dropped=self._show_dropped,
            worktrees=self.executor.worktrees,
            lifetimes=self.lifetimes,
            automation=self._automation_status,
            status_parts=(Budgets(settings, self.store).status_lines, self.limits.status_lines),
            history=RoomHistory(
                self.store,
                settings,
                settings.commands.prefix,
                self.notices.answer,
                forget_session=self.executor.reset_session,
            ),
            call_off_retries=self.limits.call_off,
        )
        self.intake = Intake(
            settings,
            self.store,
            self.dispatcher,
            commands,
            self.metrics,
            on_accepted=self._show_received,
            on_withdrawn=lambda message: self._show_dropped((message,)),
            on_approval_action=self.approvals.on_action,
        )
        accept = self.intake.accept_synthetic
        self.scheduler = CronSchedules(
            settings.schedules,
            self.store,
            accept,
            self._busy,
            self.metrics,
            settings.schedule.catch_up_s,
            self.schedule_clock,
        )
        self.webhooks = Webhooks(settings.webhooks, accept, self.metrics)
        self.metrics.watch(
            lambda: self.dispatcher.active_runs,
            lambda: self.dispatcher.queued,
            self.transports,
        )
        if self.cluster is not None:
            self._join_cluster(self.cluster)

    def _new_cluster(self) -> Cluster:
        """This replica's cluster part; Matrix goes behind its leader lease."""
        if not isinstance(self.store, SqlStore):
            raise StartupError("cluster.enabled: replicas share a PostgreSQL store")
        settings = self.settings.cluster
        cluster = Cluster(
            settings,
            Leases(self.store.engine, settings.lease_ttl_s),
            self.metrics,
            self.settings.runner.max_concurrent_runs,
            # Placement counts what the dispatcher counts: runs waiting for a person lent theirs.
            lambda: self.dispatcher.active_runs - self.dispatcher.lent_runs,
            str(self.settings.runner.state_dir.absolute()),
            # Slack spreads its events over every replica; Matrix syncs on one.
            serves=lambda transport: transport != "matrix" or cluster.leads(transport),
        )
        store = Path() if self.settings.matrix is None else self.settings.matrix.store_path

        async def unblock() -> list[int]:
            # nio's SQLite store, shared by the replicas: one file per device.
            files = await asyncio.to_thread(lambda: list(store.glob("*.db")))
            return await stop_paused_holders(files, await cluster.neighbours())

        self.transports = [
            LeaderGated(t, cluster, settings.poll_s, unblock) if t.name == "matrix" else t
            for t in self.transports
        ]
        return cluster

    def _join_cluster(self, cluster: Cluster) -> None:
        """Wire the parts to the cluster: who runs, delivers, expires what (docs/replicas.md)."""
        leases = cluster.leases
        role = ClusterRole(
            self.settings,
            cluster,
            leases,
            self.store,
            self.dispatcher,
            self.intake,
            self.outbox,
            self.metrics,
            self._recover_run,
            self.approvals.on_action,
            on_decided=self.approvals.deliver,
            taken=self.limits.noted,
        )
        cluster.take_over = role.take_over
        cluster.give_up = role.give_up
        prestarts = self.executor.prestarts
        if prestarts is not None:
            # A conversation lost or let go: its claude kept warm here goes (the new
            # owner resumes the session; two claudes of it must never run).
            def give_up(room: RoomKey) -> None:
                role.give_up(room)
                prestarts.let_go(room)

            cluster.give_up = give_up
            cluster.released = prestarts.release
        cluster.on_notice = role.heard
        cluster.recheck = role.recheck
        self.intake.placement = role
        self.executor.fence_of = cluster.fence
        self.executor.holds = cluster.holds
        self.outbox.owns = cluster.has
        self.approvals.owns = cluster.has
        self.approvals.forward = role.forward_action
        self.approvals.hand_over = role.hand_over_decision
        self.limits.owns = cluster.holds
        cluster.idle = self._idle
        role.stop_threads = self.commands.stop_threads
        self.commands.elsewhere = role

    async def _execute(self, run: DispatchedRun) -> None:
        try:
            await self.executor.execute(run)
        finally:
            if self.cluster is not None:
                self.cluster.wake()  # a slot is free: work nobody owns may be taken now

    def _refused(self, verdict: Verdict) -> None:
        self.metrics.answers_refused.labels(verdict.value).inc()

    def _max_runs_per_room(self, room: RoomKey) -> int | None:
        settings = self.settings.room(room)
        return None if settings is None else settings.max_runs_per_room

    def _idle(self, room: RoomKey) -> bool:
        """Nothing of ``room`` runs, waits or is being delivered here."""
        return self.dispatcher.status(room) == RoomStatus() and not self.outbox.busy(room)

    def _busy(self, room: RoomKey) -> bool:
        status = self.dispatcher.status(room)
        return status.running is not None or status.waiting > 0

    def _automation_status(self, room: RoomKey) -> list[str]:
        return self.scheduler.status_lines(room) + self.webhooks.status_lines(room)

    def _idle_of(self, room: RoomKey) -> float | None:
        """A room's window follows typing where its transport says who types (Matrix)."""
        settings = self.settings.room(room)
        if room.transport != "matrix" or settings is None or not settings.follow_typing:
            return None
        return settings.idle_ms / 1000

    def _during_run(self, room: RoomKey) -> DuringRun:
        settings = self.settings.room(room)
        return DuringRun.QUEUE if settings is None else DuringRun(settings.during_run)

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
        webhooks = self.webhooks if self.settings.webhooks else None
        mounts = {WEB_PREFIX: self._web_console()} if self.settings.web.enabled else {}
        await serve_http(
            sockets,
            self.readiness,
            self.metrics.exposition,
            webhooks=webhooks,
            limits=limits,
            mounts=mounts,
        )

    def _web_console(self) -> web.Application:
        """The web console (docs/web.md), on the private listener."""
        from bridge.cluster.status_report import status_text
        from bridge.web.actions import DeskActions
        from bridge.web.app import web_app
        from bridge.web.tokens import Signer, load_secret

        if not isinstance(self.store, SqlStore):
            raise StartupError("web.enabled: the web console reads a SQL database")
        settings = self.settings

        def budgets() -> tuple[float | None, dict[str, float]]:
            rooms = {
                f"{key.transport}:{key.room_id}": room.daily_budget_usd
                for key, room in settings.room_settings.items()
                if room.daily_budget_usd is not None
            }
            return settings.budget.daily_usd, rooms

        async def cluster_text() -> str:
            return await status_text(settings)

        return web_app(
            settings.web,
            Signer(load_secret(settings.web_secret_file)),
            self.store.engine,
            DeskActions(self.store, self.approvals.desk(), settings.room),
            activity=self.executor.live_runs.doing,
            cluster_text=cluster_text,
            budgets=budgets,
        )

    def request_stop(self) -> None:
        """First call: graceful shutdown. Second call: stop runs at once."""
        if self._stop.is_set():
            self._stop_now.set()
        self._stop.set()

    async def recover(self) -> None:
        """Reattach the runs a previous process left running, sweep the rest, re-queue
        what never ran.

        A run in the registry of live runs on this host goes back to its room
        as that room's active run (:meth:`Dispatcher.adopt`), before the room's
        waiting messages, which become its follow-up batch; whether its
        supervisor is still there is the runner's to find out (a run that
        ended meanwhile is reported from its journal, one whose supervisor was
        killed as interrupted). Any other run still marked running is
        interrupted: an interrupted run's notice is recorded in the outbox with
        its outcome, in one transaction: it goes out once a transport is
        connected, exactly once, also if this start stops before that (the
        next start sends it).
        """
        if self.cluster is not None:
            await self._recover_replica(self.cluster)
            return
        registered = {entry.live.run_id: entry for entry in await self.store.live_runs()}
        adopted: set[RunId] = set()
        state_dir = self.settings.runner.state_dir
        for run in await self.store.running_runs():
            entry = registered.get(run.id)
            never = never_started(run, entry, state_dir)
            if await self._recover_run(run, entry, True, never_started=never):
                adopted.add(run.id)
        await self._clean_strays(adopted)
        resumed = await self.intake.recover(await self.store.pending_messages())
        if resumed:
            log.info("re-queued %d message(s) accepted before the restart", resumed)

    async def _recover_replica(self, cluster: Cluster) -> None:
        """A replica's start (docs/replicas.md): join, keep the conversations it held
        (each recovered as it is kept), and stop its own runs in conversations it
        no longer holds. Pending messages elsewhere are found by the poll."""
        try:
            await cluster.register()
        except ReplicaIdInUse as exc:
            raise StartupError(f"cluster.replica_id: {exc}") from None
        kept = set(await cluster.keep_own())
        registered = {entry.live.run_id: entry for entry in await self.store.live_runs()}
        state_dir = self.settings.runner.state_dir
        followed_elsewhere: set[RunId] = set()
        for run in await self.store.running_runs():
            if run.replica == cluster.replica_id:
                if run.room not in kept and await self._owned_elsewhere(cluster, run.room):
                    # Its conversation's new owner recovered it (it may be following
                    # the run from this host): not this replica's to stop any more.
                    followed_elsewhere.add(run.id)
                    continue
                # A kept conversation is recovered as a restart recovers: its
                # detached run reattached (or reported); in the others it is stopped.
                entry = registered.get(run.id)
                never = never_started(run, entry, state_dir)
                await self._recover_run(run, entry, run.room in kept, never_started=never)
        # After the recovery: the runs it reattached, and those another replica
        # follows, are not strays.
        await self._clean_strays(set(self._adopted) | followed_elsewhere)
        if kept:
            pending = [m for m in await self.store.pending_messages() if m.room in kept]
            await self.intake.recover(pending, keep_commands=True)
            log.info("kept %d conversation(s) held before the restart", len(kept))

    @staticmethod
    async def _owned_elsewhere(cluster: Cluster, room: RoomKey) -> bool:
        found = await cluster.leases.lease(room)
        return found is not None and found[1] and found[0].owner != cluster.replica_id

    async def _clean_strays(self, adopted: set[RunId]) -> None:
        # Run directories of runs that are no longer running (their outcome is
        # recorded, or they never got registered): whatever is left of them goes.
        killed = await clean_stray_runs(
            self.settings.runner.state_dir, set(adopted), self.settings.runner.cgroup_root
        )
        if killed:
            log.warning("stopped %d process(es) of runs no record names", killed)

    async def _recover_run(
        self,
        run: RunRecord,
        entry: RegisteredRun | None,
        may_follow: bool,
        *,
        never_started: bool = False,
    ) -> bool:
        """Reattach one run left running (True), or stop it and report it interrupted.

        A run in the registry of live runs on this host goes back to its room
        as that room's active run (:meth:`Dispatcher.adopt`), before the room's
        waiting messages, which become its follow-up batch. Otherwise its
        notice is recorded with its outcome in one transaction; it goes out
        once a transport is connected.
        """
        prefix = self.settings.commands.prefix
        host = socket.gethostname()
        followable = (
            may_follow
            and entry is not None
            and entry.live.host == host
            and self.settings.room(run.room) is not None
            # No journal: the run ended here but its end could not be recorded.
            and journal_exists(entry.live)
        )
        # Also for a run not followed: its notice goes where the run was asked.
        messages = await self.store.messages(run.message_ids)
        if followable and entry is not None and messages:
            batch = Batch(run.room, tuple(messages))
            self.dispatcher.adopt(batch, self.executor.reattach(entry, run.started_at))
            log.info("run %s in %s: reattaching to its supervisor", run.id, run.room)
            self._adopted.add(run.id)
            return True
        # Not to be followed (no registry entry, no journal, its room gone):
        # its supervisor, if still there, is asked to stop and waited for;
        # then the run's cgroup and the marker sweep (runner/recovery.py).
        killed = await recover_run(run.id, self.settings.runner.cgroup_root)
        if never_started and not killed:
            # Its start was recorded, and then its process died before it spawned
            # anything: its messages never ran, and run now as if it never began.
            # One transaction: a failure between ending it and re-queueing its
            # messages would leave them failed, and nothing to say so.
            await self.store.finish_run(
                run.id,
                RunReport(RunStatus.INTERRUPTED, error="stopped before claude was started"),
                time.time(),
                requeue=True,
            )
            log.warning(
                "run %s in %s never started; its %d message(s) wait to run again",
                run.id, run.room, len(run.message_ids),
            )  # fmt: skip
            return False
        text, error = interruption_text(run, self.settings.cluster.replica_id, prefix)
        notice = (
            in_conversation(Batch(run.room, tuple(messages)), text, ReplyKind.NOTICE)
            if messages
            else Reply(run.room, text, ReplyKind.NOTICE, thread=run.room.thread or None)
        )
        await self.store.finish_run(
            run.id,
            RunReport(RunStatus.INTERRUPTED, error=error),
            time.time(),
            [notice],
        )
        # Its waiting tool requests can no longer be answered: out of `!status` and
        # out of reach of an `!approve` meant for a live run (shown once connected).
        closed = await self.approvals.cancel_run(run.id, RunStatus.INTERRUPTED.value)
        if self.ready.is_set() and self._tasks is not None:
            self._tasks.create_task(self.approvals.show(closed), name="close requests")
        else:
            self._closed_at_start += closed
        log.warning(
            "run %s in %s was interrupted (killed %d process(es))", run.id, run.room, killed
        )
        if entry is not None and entry.live.host == host:
            remove_run_dir(entry.live.run_dir)  # (another host's is not ours to touch)
        return False

    def _show_received(self, message: Message) -> None:
        # The sign of life: in the service's task group, so the transport's
        # acknowledgement does not wait for it (the replier never raises).
        settings = self.settings.room(message.room)
        if settings is not None and not settings.sign_of_life:
            return
        if self._tasks is not None:
            batch = Batch(message.room, (message,))
            self._tasks.create_task(self.replier.phase(batch, RunPhase.RECEIVED))

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
            self._tasks.create_task(self.replier.phase(batch, RunPhase.STOPPED))

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
        await self.recover()
        self.spares.refill()  # the first run's supervisor, ready well before it
        try:
            await self._serve_parts()
        finally:
            await shielded(self.spares.close())

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
                tg.create_task(self.lifetimes.sweep_forever(), name="worktree lifetimes"),
                tg.create_task(self.approvals.expire_forever(), name="approval expiry"),
            ]
            if self.cluster is not None:
                # From the start: the leases kept at recovery must be renewed
                # while the transports connect.
                background.append(tg.create_task(self.cluster.serve(), name="cluster"))
            readies: dict[str, asyncio.Event] = {}
            input_ended = asyncio.Event()
            for transport in self.transports:
                ready = readies[transport.name] = asyncio.Event()
                name = f"transport-{transport.name}"
                part = self._run_transport(transport, ready, input_ended)
                background.append(tg.create_task(self._part(name, part), name=name))
            if await self._wait_ready(readies, background):
                # Runs start only now: a recovered run's replies need a connected transport.
                background.append(tg.create_task(self.outbox.serve(), name="outbox"))
                dispatcher_task = tg.create_task(self.dispatcher.serve(), name="dispatcher")
                # Fired from here on: a firing is a message, which needs the dispatcher.
                background.append(tg.create_task(self.scheduler.run(), name="schedules"))
                background.append(tg.create_task(self.limits.serve(), name="limit resumes"))
                if sockets.private is not None or sockets.public is not None:
                    background.append(tg.create_task(self._serve_http(sockets), name="http"))
                log.info("chatbridge ready")
                self.ready.set()
                if self._closed_at_start:
                    closed, self._closed_at_start = self._closed_at_start, []
                    tg.create_task(self.approvals.show(closed), name="close requests")
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
            idle = tg.create_task(self.dispatcher.wait_idle())
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
        await transport.run(self.intake.accept, ready)
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
        if self.executor.prestarts is not None:
            # No run comes for a claude kept warm now; runs ending in the grace keep none.
            await self.executor.prestarts.stop_keeping()
        if self.cluster is not None:
            # Scale-in: idle conversations go to other replicas at once.
            self.cluster.draining = True
            await self._hand_over(self.cluster, busy=False)
        # From here no run begins; transports keep delivering inbound messages,
        # which are recorded and wait for the restart.
        if self.settings.runner.on_shutdown == "detach" and not self._stop_now.is_set():
            # Runs go on under their supervisors; the next start reattaches them.
            # (One not yet registered, or already answered, ends here as usual.)
            if self.dispatcher.active_runs:
                log.info(
                    "leaving %d active run(s) to their supervisors", self.dispatcher.active_runs
                )
            await self.dispatcher.drain(0.0, reason=EndReason.DETACHED)
        else:
            grace = 0.0 if self._stop_now.is_set() else self.settings.runner.shutdown_grace_s
            if self.dispatcher.active_runs:
                log.info(
                    "waiting up to %gs for %d active run(s)", grace, self.dispatcher.active_runs
                )
            # Runs cut off at the end of the grace are interrupted: the runner
            # leaves no process behind and the executor records and reports
            # them while transports still send.
            if not await self.dispatcher.drain(grace, cut_off=self._stop_now):
                log.info("interrupted the runs still active after the grace period")
        dispatcher_task.cancel()
        # wait(), not await: the task's own CancelledError is expected, but a
        # cancellation of this shutdown must still propagate.
        await asyncio.wait({dispatcher_task})
        if self.executor.prestarts is not None:
            await self.executor.prestarts.close()  # (the drain cancelled each; this waits)
        # The runs' answers and notices go out while the transports still run;
        # what cannot be delivered in time stays in the outbox for the restart.
        # The progress messages' last edits (tasks under way, each after its
        # answer) share that time.
        drain_s = self.settings.delivery.drain_timeout_s
        deadline = time.monotonic() + drain_s
        await self.outbox.drain(drain_s)
        await self.executor.drain(max(0.0, deadline - time.monotonic()))
        if self.cluster is not None:
            await self._hand_over(self.cluster, busy=True)

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
            if room not in detached and (busy or self.dispatcher.status(room).running is None)
        ]
        try:
            await cluster.release_idle(rooms)
            if busy and not detached.intersection(cluster.owned()):
                await cluster.leave()
        except StoreError:
            log.warning("could not hand conversations over; their leases run out")

    async def _running_conversations(self) -> list[RoomKey]:
        """Conversations with a run marked running (any replica's): their worktrees stay."""
        return [run.room for run in await self.store.running_runs()]

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


def sqlite_file_problem(url: str) -> str | None:
    """Why a SQLite database file at ``url`` cannot be opened for writing; None if it can.

    Checked before connecting: the driver's own failure says only "unable to
    open database file", and a connection that failed to open can outlive the
    event loop (aiosqlite's worker thread) and print a traceback at exit.
    """
    from sqlalchemy.engine import make_url

    parsed = make_url(url)
    if parsed.get_backend_name() != "sqlite" or parsed.database in (None, "", ":memory:"):
        return None
    path = Path(parsed.database or "")
    if path.exists():
        if path.is_dir():
            return f"{path} is a directory"
        if not os.access(path, os.R_OK | os.W_OK):
            return f"{path} is not readable and writable by this user"
        return None
    parent = path.parent
    if not parent.is_dir():
        return f"cannot create {path}: {parent} is not a directory"
    if not os.access(parent, os.W_OK | os.X_OK):
        return f"cannot create {path}: {parent} is not writable by this user"
    return None


async def open_store(settings: Settings) -> Store:
    problem = sqlite_file_problem(settings.database.url)
    if problem is not None:
        raise StartupError(f"database.url: {problem}")
    try:
        cluster = settings.cluster
        return await SqlStore.open(
            settings.database.url,
            auto_migrate=settings.database.auto_migrate,
            # A paused replica's open transaction must not hold the others' takeovers.
            idle_transaction_timeout_s=(
                max(MIN_IDLE_TRANSACTION_S, cluster.renew_every_s) if cluster.enabled else None
            ),
        )
    except StoreError as exc:
        # SQLAlchemy appends a "Background on this error" link line: one line is enough.
        raise StartupError(f"database.url: {str(exc).splitlines()[0]}") from exc


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


__all__ = ["Service", "build_transports", "open_store", "run_service"]
