"""What a service is built of: the store, the transports, and its parts, built once.

:func:`open_store` opens the database (a SQLite file checked first, so its problem is
one line naming the setting); :func:`build_transports` makes one transport per
configured chat system, importing its library only then (docs/configuration.md).
:func:`build_parts` builds every part in dependency order, each given what it needs in
its constructor; nothing is assigned into a part afterwards. Where two parts need each
other (the dispatcher and the executor; with replicas, the cluster and its role) the part
built earlier gets a :class:`~bridge.core.late.Late` bound once, here, to the later one.
:func:`web_console` builds the web console over the parts, when the listener serves it.
"""

from __future__ import annotations

import asyncio
import functools
import os
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from bridge.automation.schedules import CronSchedules
from bridge.automation.webhooks import Webhooks
from bridge.cluster.leader_gate import LeaderGated
from bridge.cluster.paused_holders import stop_paused_holders
from bridge.cluster.replica import Cluster, Notice
from bridge.cluster.role import ClusterRole
from bridge.config import HttpSettings, Settings
from bridge.core.http_limits import ClientLimits
from bridge.core.late import Late
from bridge.core.model import Message, MessageId, RoomKey, UserId
from bridge.core.transport import ApprovalAction, RoomBinding, SeenMarks, Transport
from bridge.errors import StartupError
from bridge.inbound.commands import CommandHandler
from bridge.inbound.history import RoomHistory
from bridge.inbound.intake import Intake
from bridge.live.approval_flow import ApprovalFlow
from bridge.live.approvals import Verdict
from bridge.live.registry import LiveRuns
from bridge.metrics import Metrics
from bridge.outbound.notices import Notices
from bridge.outbound.outbox import Outbox
from bridge.outbound.pacing import Pacing
from bridge.outbound.replies import Replier
from bridge.recovery import Recovery
from bridge.runs.budget import Budgets
from bridge.runs.executor import RunExecutor, held_alone, new_run_id, unfenced
from bridge.runs.file_posts import FilePosts
from bridge.runs.inbox import Inbox
from bridge.runs.prestarts import Prestarts
from bridge.runs.request import RunRequests, kept_transcripts
from bridge.runs.usage import LimitResumes
from bridge.runs.worktree_lifetime import Lifetimes
from bridge.store.base import Approval, RegisteredRun, RunRecord, Store, StoreError
from bridge.store.cluster import Leases
from bridge.store.sql import SqlStore
from dispatcher import Clock, DispatchedRun, Dispatcher, DispatchLimits, DuringRun, RoomStatus
from runner import Spares, prestart

if TYPE_CHECKING:
    from aiohttp import web

MIN_IDLE_TRANSACTION_S = 2.0
"""Replicas' PostgreSQL sessions idle in a transaction longer than this (or than the
renewal period, if longer) are ended by the server: no transaction of ours idles that
long unless its process was paused (docs/replicas.md)."""


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


@dataclass(frozen=True, slots=True)
class Signs:
    """What the parts show through the service's task group (it owns those tasks)."""

    received: Callable[[Message], None]
    """A message accepted: its sign of life."""
    dropped: Callable[[Sequence[Message]], None]
    """Messages a stop dropped (or withdrawn): their sign of life ends."""
    closed: Callable[[list[Approval]], None]
    """Tool requests of runs interrupted by the restart: shown closed once connected."""


@dataclass(frozen=True, slots=True)
class Parts:
    """Everything a service runs, built once by :func:`build_parts`."""

    transports: Sequence[Transport]
    """The configured transports; with replicas, Matrix behind its leader lease."""
    metrics: Metrics
    spares: Spares
    replier: Replier
    outbox: Outbox
    notices: Notices
    approvals: ApprovalFlow
    dispatcher: Dispatcher
    lifetimes: Lifetimes
    limits: LimitResumes
    executor: RunExecutor
    commands: CommandHandler
    intake: Intake
    scheduler: CronSchedules
    webhooks: Webhooks
    recovery: Recovery
    cluster: Cluster | None
    """This replica's part in the cluster (``[cluster] enabled``), None alone."""


def build_parts(
    settings: Settings,
    store: Store,
    transports: Sequence[Transport],
    schedule_clock: Clock,
    signs: Signs,
) -> Parts:
    """Build the service's parts in dependency order (see the module)."""
    metrics = Metrics()
    spares = Spares()
    dispatcher_of = Late[Dispatcher]("the dispatcher")
    outbox_of = Late[Outbox]("the outbox")
    executor_of = Late[RunExecutor]("the executor")
    role_of = Late[ClusterRole]("the cluster role")
    prestarts_of = Late[Prestarts]("the prestarts")
    cluster = None
    if settings.cluster.enabled:
        cluster = _cluster(
            settings,
            store,
            metrics=metrics,
            dispatcher=dispatcher_of,
            outbox=outbox_of,
            role=role_of,
            prestarts=prestarts_of if settings.runner.prestart else None,
        )
        transports = _gated(settings, cluster, transports)
    by_name = {t.name: t for t in transports}
    transcripts = kept_transcripts(settings, store)
    requests = RunRequests(
        settings, store, metrics, inbox=Inbox(by_name, metrics), transcripts=transcripts
    )
    prestarts = _prestarts(settings, requests, metrics, spares)
    if prestarts is not None:
        prestarts_of.bind(prestarts)
    # Which conversations this process speaks for: with replicas, the one whose
    # lease it has (delivery, tool requests) or holds now (runs, limit resumes).
    has = cluster.has if cluster is not None else held_alone
    holds = cluster.holds if cluster is not None else held_alone

    def refused(verdict: Verdict) -> None:
        metrics.answers_refused.labels(verdict.value).inc()

    pacing = {
        name: Pacing(settings.delivery.edits_per_minute(name), time.monotonic) for name in by_name
    }
    replier = Replier(by_name, pacing)
    outbox = outbox_of.bind(
        Outbox(
            store,
            by_name,
            metrics,
            on_rate_limited=replier.rate_limited,
            retry_cap_s=settings.delivery.retry_max_s,
            owns=has,
        )
    )
    notices = Notices(store, outbox, replier)

    dispatcher = dispatcher_of.bind(
        _dispatcher(settings, functools.partial(_execute, executor_of, cluster), prestarts)
    )

    lifetimes = Lifetimes(
        requests.worktrees,
        lambda: list(settings.room_settings.items()),
        dispatcher.conversations,
        functools.partial(_running_conversations, store),
        notices.say,
    )
    limits = LimitResumes(
        store,
        dispatcher.submit,
        notices,
        metrics,
        settings.runner.resume_after_limit,
        settings.commands.prefix,
        configured=lambda room: settings.room(room) is not None,
        owns=holds,
    )
    intake_of = Late[Intake]("the intake")
    commands_of = Late[CommandHandler]("the commands")
    recovery_of = Late[Recovery]("the recovery")
    live_runs = LiveRuns()
    approvals_of = Late[ApprovalFlow]("the approvals")
    role = None
    if cluster is not None:
        role = role_of.bind(
            _role(
                settings,
                cluster,
                store=store,
                dispatcher=dispatcher,
                outbox=outbox,
                metrics=metrics,
                limits=limits,
                intake=intake_of,
                commands=commands_of,
                recovery=recovery_of,
                approvals=approvals_of,
            )
        )
    approvals = approvals_of.bind(
        ApprovalFlow(
            settings,
            store,
            replier,
            live_runs,
            refused,
            owns=has,
            forward=None if role is None else role.forward_action,
            hand_over=None if role is None else role.hand_over_decision,
        )
    )
    executor = executor_of.bind(
        RunExecutor(
            settings,
            store,
            replier,
            metrics,
            outbox,
            notices,
            live_runs=live_runs,
            approvals=approvals,
            prestarts=prestarts,
            spares=spares,
            limits=limits,
            file_posts=FilePosts(store, outbox, metrics, settings.runner.state_dir),
            fence_of=cluster.fence if cluster is not None else unfenced,
            holds=holds,
            transcripts=transcripts,
            requests=requests,
        )
    )
    scheduler_of = Late[CronSchedules]("the schedules")
    webhooks_of = Late[Webhooks]("the webhooks")

    # Command answers are recorded in the outbox and sent from its per-room
    # worker: the transport's acknowledgement never waits for the network.
    commands = commands_of.bind(
        CommandHandler(
            dispatcher,
            store,
            settings.commands.prefix,
            notices.answer,
            executor.reset_session,
            rooms=settings.room,
            live=approvals,
            refused=refused,
            dropped=signs.dropped,
            worktrees=requests.worktrees,
            lifetimes=lifetimes,
            automation=functools.partial(_automation_status, scheduler_of, webhooks_of),
            status_parts=(Budgets(settings, store).status_lines, limits.status_lines),
            elsewhere=role,
            history=RoomHistory(
                store,
                settings,
                settings.commands.prefix,
                notices.answer,
                forget_session=executor.reset_session,
            ),
            call_off_retries=limits.call_off,
        )
    )
    intake = intake_of.bind(
        Intake(
            settings,
            store,
            dispatcher,
            commands,
            metrics,
            on_accepted=signs.received,
            on_withdrawn=lambda message: signs.dropped((message,)),
            on_approval_action=approvals.on_action,
            placement=role,
        )
    )

    accept = intake.accept_synthetic
    scheduler = scheduler_of.bind(
        CronSchedules(
            settings.schedules,
            store,
            accept,
            functools.partial(_busy, dispatcher),
            metrics,
            settings.schedule.catch_up_s,
            schedule_clock,
        )
    )
    webhooks = webhooks_of.bind(Webhooks(settings.webhooks, accept, metrics))
    metrics.watch(lambda: dispatcher.active_runs, lambda: dispatcher.queued, transports)
    recovery = recovery_of.bind(
        Recovery(settings, store, dispatcher, executor, intake, approvals, signs.closed, cluster)
    )
    return Parts(
        transports=transports,
        metrics=metrics,
        spares=spares,
        replier=replier,
        outbox=outbox,
        notices=notices,
        approvals=approvals,
        dispatcher=dispatcher,
        lifetimes=lifetimes,
        limits=limits,
        executor=executor,
        commands=commands,
        intake=intake,
        scheduler=scheduler,
        webhooks=webhooks,
        recovery=recovery,
        cluster=cluster,
    )


def web_console(settings: Settings, store: Store, parts: Parts) -> web.Application:
    """The web console (docs/web.md), on the private listener; aiohttp is imported only now."""
    from bridge.cluster.status_report import status_text
    from bridge.web.actions import DeskActions
    from bridge.web.app import web_app
    from bridge.web.tokens import Signer, load_secret

    if not isinstance(store, SqlStore):
        raise StartupError("web.enabled: the web console reads a SQL database")

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
        store.engine,
        DeskActions(store, parts.approvals.desk(), settings.room),
        activity=parts.executor.live_runs.doing,
        cluster_text=cluster_text,
        budgets=budgets,
    )


def _prestarts(
    settings: Settings, requests: RunRequests, metrics: Metrics, spares: Spares
) -> Prestarts | None:
    """Claudes started ahead of their runs (``[runner] prestart``), None without."""
    if not settings.runner.prestart:
        return None
    return Prestarts(
        requests.prestart_request,
        metrics,
        new_run_id,
        start=functools.partial(prestart, spares=spares),
        keep_s=settings.runner.prestart_keep_s,
        keep_limit=settings.runner.prestart_limit,
    )


def _dispatcher(
    settings: Settings,
    execute: Callable[[DispatchedRun], Awaitable[None]],
    prestarts: Prestarts | None,
) -> Dispatcher:
    d = settings.dispatcher
    return Dispatcher(
        DispatchLimits(
            coalesce_s=d.coalesce_ms / 1000,
            max_wait_s=d.max_wait_ms / 1000,
            max_batch=d.max_batch,
            max_concurrent_runs=settings.runner.max_concurrent_runs,
        ),
        execute,
        mode_of=functools.partial(_during_run, settings),
        prestarter=prestarts,
        max_prestarts=settings.runner.prestart_limit,
        room_cap=functools.partial(_max_runs_per_room, settings),
        idle_of=functools.partial(_idle_of, settings),
    )


def _cluster(
    settings: Settings,
    store: Store,
    *,
    metrics: Metrics,
    dispatcher: Late[Dispatcher],
    outbox: Late[Outbox],
    role: Late[ClusterRole],
    prestarts: Late[Prestarts] | None,
) -> Cluster:
    """This replica's cluster part; what a lease means is the role's (docs/replicas.md)."""
    if not isinstance(store, SqlStore):
        raise StartupError("cluster.enabled: replicas share a PostgreSQL store")
    cluster_settings = settings.cluster

    def give_up(room: RoomKey) -> None:
        role().give_up(room)
        if prestarts is not None:
            # A conversation lost or let go: its claude kept warm here goes (the new
            # owner resumes the session; two claudes of it must never run).
            prestarts().let_go(room)

    async def take_over(room: RoomKey) -> None:
        await role().take_over(room)

    async def heard(notice: Notice) -> None:
        await role().heard(notice)

    async def recheck() -> None:
        await role().recheck()

    def idle(room: RoomKey) -> bool:
        # Nothing of ``room`` runs, waits or is being delivered here.
        return dispatcher().status(room) == RoomStatus() and not outbox().busy(room)

    def active_runs() -> int:
        # Placement counts what the dispatcher counts: runs waiting for a person lent theirs.
        return dispatcher().active_runs - dispatcher().lent_runs

    cluster: Cluster = Cluster(
        cluster_settings,
        Leases(store.engine, cluster_settings.lease_ttl_s),
        metrics,
        settings.runner.max_concurrent_runs,
        active_runs,
        str(settings.runner.state_dir.absolute()),
        # Slack spreads its events over every replica; Matrix syncs on one.
        serves=lambda transport: transport != "matrix" or cluster.leads(transport),
        take_over=take_over,
        give_up=give_up,
        released=None if prestarts is None else _released(prestarts),
        on_notice=heard,
        idle=idle,
        recheck=recheck,
    )
    return cluster


def _released(prestarts: Late[Prestarts]) -> Callable[[RoomKey], Awaitable[None]]:
    """Lets go of the claude kept warm for an idle conversation released."""

    async def released(room: RoomKey) -> None:
        await prestarts().release(room)

    return released


def _gated(
    settings: Settings, cluster: Cluster, transports: Sequence[Transport]
) -> list[Transport]:
    """The transports, Matrix behind the cluster's leader lease."""
    store = Path() if settings.matrix is None else settings.matrix.store_path

    async def unblock() -> list[int]:
        # nio's SQLite store, shared by the replicas: one file per device.
        files = await asyncio.to_thread(lambda: list(store.glob("*.db")))
        return await stop_paused_holders(files, await cluster.neighbours())

    return [
        LeaderGated(t, cluster, settings.cluster.poll_s, unblock) if t.name == "matrix" else t
        for t in transports
    ]


def _role(
    settings: Settings,
    cluster: Cluster,
    *,
    store: Store,
    dispatcher: Dispatcher,
    outbox: Outbox,
    metrics: Metrics,
    limits: LimitResumes,
    intake: Late[Intake],
    commands: Late[CommandHandler],
    recovery: Late[Recovery],
    approvals: Late[ApprovalFlow],
) -> ClusterRole:
    """What holding a lease means for the parts: who runs, delivers, expires what."""

    async def recover_run(
        run: RunRecord,
        entry: RegisteredRun | None,
        may_follow: bool,
        *,
        never_started: bool = False,
    ) -> bool:
        return await recovery().recover_run(run, entry, may_follow, never_started=never_started)

    async def on_action(action: ApprovalAction) -> object:
        return await approvals().on_action(action)

    async def decided(room: RoomKey, number: int) -> None:
        await approvals().deliver(room, number)

    async def stop_threads(
        room: RoomKey, actor: UserId, *, before: MessageId | None = None
    ) -> tuple[int, list[Message], bool]:
        return await commands().stop_threads(room, actor, before=before)

    return ClusterRole(
        settings,
        cluster,
        cluster.leases,
        store,
        dispatcher,
        intake,
        outbox,
        metrics,
        recover_run,
        on_action,
        on_decided=decided,
        taken=limits.noted,
        stop_threads=stop_threads,
    )


async def _execute(
    executor: Late[RunExecutor], cluster: Cluster | None, run: DispatchedRun
) -> None:
    try:
        await executor().execute(run)
    finally:
        if cluster is not None:
            cluster.wake()  # a slot is free: work nobody owns may be taken now


async def _running_conversations(store: Store) -> list[RoomKey]:
    """Conversations with a run marked running (any replica's): their worktrees stay."""
    return [run.room for run in await store.running_runs()]


def _automation_status(
    scheduler: Late[CronSchedules], webhooks: Late[Webhooks], room: RoomKey
) -> list[str]:
    return scheduler().status_lines(room) + webhooks().status_lines(room)


def _busy(dispatcher: Dispatcher, room: RoomKey) -> bool:
    status = dispatcher.status(room)
    return status.running is not None or status.waiting > 0


def _max_runs_per_room(settings: Settings, room: RoomKey) -> int | None:
    room_settings = settings.room(room)
    return None if room_settings is None else room_settings.max_runs_per_room


def _idle_of(settings: Settings, room: RoomKey) -> float | None:
    """A room's window follows typing where its transport says who types (Matrix)."""
    room_settings = settings.room(room)
    if room.transport != "matrix" or room_settings is None or not room_settings.follow_typing:
        return None
    return room_settings.idle_ms / 1000


def _during_run(settings: Settings, room: RoomKey) -> DuringRun:
    room_settings = settings.room(room)
    return DuringRun.QUEUE if room_settings is None else DuringRun(room_settings.during_run)
