"""Settings: a TOML file, overridden key by key from the environment.

Every key can be set as ``CHATBRIDGE_<SECTION>__<KEY>`` (for example
``CHATBRIDGE_RUNNER__MAX_CONCURRENT_RUNS=8``); lists and tables take JSON.
Unknown keys are errors. Rooms inherit ``[defaults]`` and may override any
of its keys in their ``[[rooms]]`` entry; :meth:`Settings.room` gives the
merged view.
"""

from __future__ import annotations

import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal, Self, get_args

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from bridge.automation.config import ScheduleConfig, WebhookConfig
from bridge.core.hostport import HostPort
from bridge.core.model import MAX_THREAD_ROOM_ID, RoomId, RoomKey, TransportName, UserId
from bridge.errors import ConfigError
from bridge.web.settings import WebSettings
from transports.matrix.settings import MatrixSettings
from transports.slack.settings import SlackSettings

TRANSPORTS: tuple[str, ...] = ("console", "matrix", "slack")


class _Section(BaseModel):
    # No inf/nan: an infinite grace period would leave a stuck claude unkilled.
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class RunnerSettings(_Section):
    claude_bin: str = Field("claude", min_length=1)
    max_concurrent_runs: int = Field(4, ge=1)
    stop_grace_s: float = Field(5.0, ge=0)
    shutdown_grace_s: float = Field(30.0, ge=0)
    """On SIGTERM, active runs get this long to finish before they are stopped."""
    max_line_bytes: int = Field(16 * 1024 * 1024, ge=1024)
    cgroup_root: str = "auto"
    """Where runs get cgroup v2 groups: ``auto`` (chatbridge's own group), ``off``, or a path."""
    state_dir: Path = Path("chatbridge-state")
    """Where each run's supervisor keeps its socket and journal (``runs/<run>/``, mode 0700);
    relative to the working directory. Keep it across restarts: it is how runs are found again."""
    on_shutdown: Literal["detach", "stop"] = "detach"
    """On SIGTERM: ``detach`` leaves active runs to their supervisors and exits at once (a
    restarted chatbridge reattaches); ``stop`` gives them ``shutdown_grace_s``, then stops them."""
    orphan_timeout_s: float = Field(600.0, gt=0)
    """A run with no chatbridge attached for this long is stopped by its supervisor."""
    spool_max_bytes: int = Field(64 * 1024 * 1024, ge=64 * 1024)
    """A run's journal stops taking progress at this size (its answer is always kept)."""
    resume_after_limit: bool = False
    """A run cut short by a usage limit that names its reset time is retried then, once."""
    prestart: bool = True
    """Start claude when a batch opens in an idle room, so the run skips the cold start
    (its cost: docs/live-runs.md); ``false`` to start each run's claude cold."""
    max_prestarts: int | None = Field(None, ge=0)
    """Prestarted claudes at once; None: as many as ``max_concurrent_runs``."""
    prestart_keep_s: float = Field(0.0, ge=0)
    """With ``prestart``: after a run, the room's next claude is started at once and kept
    this long for the room's next run (0: not kept). Costs one idle claude per room."""
    transcripts_in_db: bool = False
    """Save each conversation's Claude session transcript to the database after a run and
    restore it before a resume where this host lacks it: ``--resume`` then works on any
    replica (docs/replicas-sessions.md)."""
    transcript_max_bytes: int = Field(20 * 1024 * 1024, ge=1024)
    """A transcript larger than this, compressed, is not saved: another replica then starts
    a fresh session (the one that ran it keeps resuming its own copy)."""

    @property
    def prestart_limit(self) -> int:
        """How many prestarts may wait at once (0 when prestart is off)."""
        if not self.prestart:
            return 0
        return self.max_concurrent_runs if self.max_prestarts is None else self.max_prestarts

    @field_validator("cgroup_root")
    @classmethod
    def _cgroup_root(cls, value: str) -> str:
        if value not in ("auto", "off") and not value.startswith("/"):
            raise ValueError('must be "auto", "off" or an absolute path')
        return value

    @model_validator(mode="after")
    def _prestarts_fit(self) -> Self:
        # A prestart holds a run slot's worth of claude: more than the slots is a typo.
        if self.max_prestarts is not None and self.max_prestarts > self.max_concurrent_runs:
            raise ValueError(
                f"max_prestarts ({self.max_prestarts}) must not exceed"
                f" max_concurrent_runs ({self.max_concurrent_runs})"
            )
        return self

    @model_validator(mode="after")
    def _keep_needs_prestart(self) -> Self:
        # Kept warm is a prestart: without prestart the setting would silently do nothing.
        if self.prestart_keep_s > 0 and not self.prestart:
            raise ValueError(f"prestart_keep_s ({self.prestart_keep_s:g}) needs prestart = true")
        return self


_MEMORY_UNITS = {"": 1, "K": 1024, "M": 1024**2, "G": 1024**3, "T": 1024**4}


class DispatcherSettings(_Section):
    coalesce_ms: int = Field(1500, ge=0)
    max_wait_ms: int = Field(15000, ge=0)
    max_batch: int = Field(25, ge=1)


class DeliverySettings(_Section):
    """The outbox and the pace of cosmetic updates (progress edits) per chat server."""

    drain_timeout_s: float = Field(10.0, ge=0)
    """At shutdown, how long answers still in the outbox get to go out."""
    retry_max_s: float = Field(300.0, gt=0)
    """Longest pause between tries of an answer the chat server did not take."""
    console_edits_per_minute: float = Field(600.0, gt=0)
    matrix_edits_per_minute: float = Field(6.0, gt=0)
    """Synapse's default ``rc_message`` (0.2/s, burst 10) covers answers and edits
    together: progress edits take a small share of it."""
    slack_edits_per_minute: float = Field(40.0, gt=0)
    """``chat.update`` is Tier 3: about 50 a minute per workspace."""

    def edits_per_minute(self, transport: str) -> float:
        rates = {
            "console": self.console_edits_per_minute,
            "matrix": self.matrix_edits_per_minute,
            "slack": self.slack_edits_per_minute,
        }
        return rates.get(transport, self.console_edits_per_minute)


class ProgressSettings(_Section):
    """The status message a run shows while it works."""

    show_after_s: float = Field(3.0, ge=0)
    """Posted only once a run has lasted this long: a quick run posts its answer alone."""


class CommandSettings(_Section):
    prefix: str = Field("!", min_length=1)

    @field_validator("prefix")
    @classmethod
    def _no_space(cls, value: str) -> str:
        if value != value.strip():
            raise ValueError("must not contain leading or trailing whitespace")
        if value[-1].isalnum():
            # With prefix "c", "check this" would read as the command "heck".
            raise ValueError("must end with a character that is not a letter or digit")
        return value


PermissionModeSetting = Literal[
    "", "acceptEdits", "auto", "bypassPermissions", "default", "dontAsk", "plan"
]
"""claude's ``--permission-mode`` values; empty: claude's default. One literal, so a
typo gets one error listing them all."""

PERMISSION_MODES: tuple[str, ...] = tuple(m for m in get_args(PermissionModeSetting) if m)
"""The modes ``!mode`` takes."""

DuringRun = Literal["queue", "steer", "interrupt"]
"""What messages arriving while a room's run is going do (docs/live-runs.md)."""


class RoomDefaults(_Section):
    """What every room inherits; a ``[[rooms]]`` entry may override any key."""

    cwd: Path = Path()
    model: str = ""
    permission_mode: PermissionModeSetting = ""
    allowed_tools: tuple[str, ...] = ()
    disallowed_tools: tuple[str, ...] = ()
    append_system_prompt: str = ""
    max_turns: int = Field(0, ge=0)
    run_timeout_s: float = Field(1800, gt=0)
    idle_timeout_s: float = Field(600, gt=0)
    allowed_users: tuple[str, ...] = ()
    """Sender ids allowed to run and command; ``"*"`` admits anyone in the room."""
    env: dict[str, str] = Field(default_factory=dict)
    extra_args: tuple[str, ...] = ()
    memory_max: int | None = Field(None, ge=1024 * 1024)
    """A run's memory limit in bytes (``"512M"``, ``"2G"`` accepted); needs cgroup v2."""
    pids_max: int | None = Field(None, ge=1)
    """A run's limit on processes and threads; needs cgroup v2."""
    approve_tools: bool = False
    """Tool uses claude's own rules do not decide are asked in the room, not refused."""
    approvers: tuple[str, ...] = ()
    """Who may answer those requests (and use ``!model``/``!mode``); empty: ``allowed_users``."""
    require_other_approver: bool = False
    """A request cannot be approved by a sender of the messages the run is working on."""
    approval_timeout_s: float = Field(900, gt=0)
    """A request unanswered this long is denied (claude is told it timed out)."""
    follow_typing: bool = True
    """Matrix rooms: a batch's window follows typing. It stays open (up to ``max_wait_ms``)
    while a sender of a waiting message types, and closes ``idle_ms`` after the last message
    or the end of their typing, instead of ``coalesce_ms``. False: the plain window."""
    idle_ms: int = Field(300, ge=0)
    """With ``follow_typing``: how long the window stays open once nobody it waits for types."""
    sign_of_life: bool = True
    """Show at once that a message was received, while its window is open: typing on
    Matrix, a reaction on Slack, a line on the console (cosmetic)."""
    question_timeout_s: float | None = Field(None, gt=0)
    """claude's questions and plans unanswered this long are declined; None: they wait."""
    questions_from: Literal["senders_and_approvers", "approvers"] = "senders_and_approvers"
    """Who answers claude's questions: the senders of the run's messages and the approvers,
    or the approvers only (plans are always the approvers')."""
    during_run: DuringRun = "queue"
    """Messages during a run: ``queue`` (a follow-up run), ``steer`` (into it), ``interrupt``."""
    conversation: Literal["channel", "thread"] = "channel"
    """``channel``: the room is one conversation; ``thread``: each thread is one (a
    top-level message opens a thread), with its own runs, session and answers."""
    max_runs_per_room: int | None = Field(None, ge=1)
    """Runs of one room's conversations at once (``thread`` rooms); unset: only the global cap."""
    worktree: bool = False
    """``thread`` rooms in a git repository: each thread works in a git worktree of its own."""
    worktree_idle_days: float = Field(14.0, ge=0)
    """A thread's worktree with no run for this long is removed (its work kept on its
    branch, see bridge/runs/worktree_lifetime.py); 0: never for idleness."""
    max_budget_usd: float | None = Field(None, gt=0)
    """One run's spending cap, passed to claude as ``--max-budget-usd``; None: no cap."""
    daily_budget_usd: float | None = Field(None, gt=0)
    """The room's spending per UTC day; a run does not start once it is spent (docs/budgets.md)."""
    max_file_bytes: int = Field(20 * 1024 * 1024, ge=0)
    """A shared file larger than this is not downloaded (the prompt says so); 0: no files."""
    max_message_files_bytes: int = Field(50 * 1024 * 1024, ge=0)
    """All files of one message together are downloaded up to this many bytes."""
    send_files: bool = True
    """Runs get the ``chatbridge`` MCP tool ``send_file``: claude posts files from its cwd."""
    max_send_file_bytes: int = Field(20 * 1024 * 1024, ge=1)
    """The largest file ``send_file`` posts (``"20M"`` accepted)."""
    send_files_need_approval: bool = False
    """``send_file`` is not pre-allowed: claude's own rules (and ``approve_tools``) decide."""
    summarize_changes: bool = True
    """A run in a git working directory that changed files: its answer ends with what
    changed, and the whole diff follows as a file (bridge/runs/changes.py)."""
    run_figures: bool = True
    """The run's status message ends with its turns and cost beside its duration."""

    @field_validator("memory_max", "max_send_file_bytes", mode="before")
    @classmethod
    def _memory_size(cls, value: object) -> object:
        if isinstance(value, str):
            text = value.strip().upper().removesuffix("B").removesuffix("I")
            number, unit = (text[:-1], text[-1]) if text[-1:] in _MEMORY_UNITS else (text, "")
            if not number.isdigit():
                raise ValueError(f"{value!r} is not a size like 512M or 2G")
            return int(number) * _MEMORY_UNITS[unit]
        return value

    @field_validator("approvers")
    @classmethod
    def _approvers_are_ids(cls, approvers: tuple[str, ...]) -> tuple[str, ...]:
        for approver in approvers:
            if not approver.strip() or approver != approver.strip():
                raise ValueError(f"{approver!r} is not a sender id")
        return approvers

    @field_validator("allowed_tools", "disallowed_tools")
    @classmethod
    def _rules_are_not_flags(cls, rules: tuple[str, ...]) -> tuple[str, ...]:
        for rule in rules:
            if not rule.strip() or rule.startswith("-"):
                raise ValueError(f"{rule!r} is not a tool rule")
        return rules

    @field_validator("env")
    @classmethod
    def _env_names(cls, env: dict[str, str]) -> dict[str, str]:
        for name in env:
            if not name or "=" in name:
                raise ValueError(f"{name!r} is not an environment variable name")
        return env

    @model_validator(mode="after")
    def _no_nul(self) -> Self:
        # The kernel refuses NUL in argv and the environment: fail here, not at every run.
        texts = [self.model, self.append_system_prompt, *self.extra_args]
        texts += [*self.allowed_tools, *self.disallowed_tools, *self.env, *self.env.values()]
        if any("\0" in text for text in texts):
            raise ValueError("NUL characters cannot be passed to claude")
        return self


ROOM_KEYS = frozenset(RoomDefaults.model_fields)


class RoomConfig(BaseModel):
    """One ``[[rooms]]`` entry as written: its identity plus any overridden defaults."""

    model_config = ConfigDict(extra="allow", frozen=True)

    transport: Literal["console", "matrix", "slack"]
    id: str = Field(min_length=1)
    trigger: Literal["all", "mention"] = "all"
    reply_in_thread: bool = True

    @field_validator("id")
    @classmethod
    def _no_slash(cls, value: str) -> str:
        # The store keeps a thread conversation as "room/thread" (bridge.store.sql).
        if "/" in value:
            raise ValueError(f"a room id cannot contain '/': {value!r}")
        return value

    @model_validator(mode="after")
    def _only_known_overrides(self) -> Self:
        unknown = sorted(set(self.model_extra or {}) - ROOM_KEYS)
        if unknown:
            raise ValueError(f"unknown key(s) {', '.join(unknown)}")
        return self

    @property
    def key(self) -> RoomKey:
        return RoomKey(TransportName(self.transport), RoomId(self.id))

    @property
    def overrides(self) -> dict[str, Any]:
        return dict(self.model_extra or {})


class RoomSettings(RoomDefaults):
    """A room's effective settings: ``[defaults]`` merged with its entry."""

    key: RoomKey
    trigger: Literal["all", "mention"] = "all"
    reply_in_thread: bool = True

    @model_validator(mode="after")
    def _worktrees_need_threads(self) -> Self:
        if self.worktree and self.conversation != "thread":
            raise ValueError('worktree = true needs conversation = "thread"')
        return self

    @model_validator(mode="after")
    def _thread_keys_fit(self) -> Self:
        # A thread conversation is kept as "room/thread" in the store's id columns.
        if self.conversation == "thread" and len(self.key.room_id) > MAX_THREAD_ROOM_ID:
            raise ValueError(
                f'conversation = "thread" needs a room id of at most {MAX_THREAD_ROOM_ID}'
                f" characters: {self.key.room_id[:40]!r}... has {len(self.key.room_id)}"
            )
        return self

    def allows(self, sender: UserId) -> bool:
        return "*" in self.allowed_users or sender in self.allowed_users

    def approves(self, sender: UserId) -> bool:
        """Whether ``sender`` is one of the room's approvers (by default its allowed users;
        ``"*"``: anyone the room allows, never a stranger to it)."""
        if not self.approvers or "*" in self.approvers:
            return self.allows(sender)
        return sender in self.approvers


class ConsoleSettings(_Section):
    enabled: bool = True
    """On when no other transport is configured, or when set explicitly."""
    room: str = Field("console", min_length=1, pattern=r"^[^/]+$")
    """No ``/``: the store keeps a thread conversation as ``room/thread``."""
    user: str = Field("local", min_length=1)


_DATABASE_SCHEMES = ("sqlite+aiosqlite://", "postgresql+asyncpg://")
"""The async drivers the store is built and tested on."""

_SSL_MODES = ("disable", "allow", "prefer", "require", "verify-ca", "verify-full")
"""libpq's ``sslmode`` values, which asyncpg's ``ssl`` parameter takes as well."""


class DatabaseSettings(_Section):
    url: str = "sqlite+aiosqlite:///chatbridge.db"
    auto_migrate: bool = True
    retention_days: float = Field(30, gt=0)

    @field_validator("url")
    @classmethod
    def _known_driver(cls, value: str) -> str:
        # Checked here so a typo is a configuration error, not a driver traceback;
        # the message never repeats the URL (it may hold a password).
        if not value.startswith(_DATABASE_SCHEMES):
            raise ValueError(f"must start with {' or '.join(_DATABASE_SCHEMES)}")
        # Parsed as the engine will parse it: a bad port would otherwise crash
        # the start-up. SQLAlchemy is needed by every command that loads settings.
        from sqlalchemy.engine import make_url
        from sqlalchemy.exc import ArgumentError

        try:
            parsed = make_url(value)
        except (ArgumentError, ValueError):  # never repeated: they may quote the URL
            raise ValueError("is not a valid URL (is the port a number?)") from None
        mode = parsed.query.get("sslmode")
        if mode is not None and parsed.get_backend_name() == "postgresql":
            # libpq's name; the engine hands it to asyncpg as ``ssl`` (same modes).
            if not isinstance(mode, str) or mode not in _SSL_MODES:
                raise ValueError(f"sslmode must be one of {', '.join(_SSL_MODES)}")
            if "ssl" in parsed.query:
                raise ValueError("give ssl or sslmode, not both")
        return value


class LoggingSettings(_Section):
    level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"
    """chatbridge's own loggers."""
    library_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "WARNING"
    """Third-party libraries (nio, slack_sdk, aiosqlite, markdown-it, ...)."""
    format: Literal["text", "json"] = "text"


class BudgetSettings(_Section):
    """Spending of the whole service (docs/budgets.md)."""

    daily_usd: float | None = Field(None, gt=0)
    """All rooms' spending per UTC day; no run starts once it is spent. None: no limit."""


class HttpSettings(_Section):
    listen: HostPort | None = HostPort("127.0.0.1", 8080)
    """``host:port`` of the private listener (/healthz, /readyz, /metrics); empty disables it."""
    public_listen: HostPort | None = None
    """``host:port`` of the public listener (the ``[[webhooks]]`` paths); the same address
    as ``listen`` serves both on one listener, metrics included."""
    head_timeout_s: float = Field(5.0, gt=0, le=300)
    """A request head must be in within this of the connection's opening or the previous answer."""
    body_timeout_s: float = Field(10.0, gt=0, le=600)
    """A body must be in within this of its head (408 beyond)."""
    max_connections: int = Field(64, ge=1, le=100_000)
    """Connections open at once, per listener; one more closes the oldest not being answered."""

    @field_validator("listen", "public_listen", mode="before")
    @classmethod
    def _empty_disables(cls, value: object) -> object:
        return None if value == "" else value


class ScheduleSettings(_Section):
    """What all ``[[schedules]]`` share."""

    catch_up_s: float = Field(3600, ge=0)
    """A firing missed while chatbridge was down runs at start if at most this old."""


_REPLICA_ID = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"


class ClusterSettings(_Section):
    """Several replicas on one PostgreSQL database (docs/replicas.md)."""

    enabled: bool = False
    replica_id: str | None = Field(None, pattern=_REPLICA_ID)
    """Unique per live replica; None: the host's name. A replica restarted with the
    same id on the same host keeps its leases and reattaches its runs."""
    lease_ttl_s: float = Field(15.0, ge=1, le=3600)
    """How long a replica that stopped renewing keeps its conversations (failover time)."""
    poll_s: float = Field(2.0, gt=0, le=60)
    """How often each replica looks for work no notification told it of."""
    max_concurrent_runs: int | None = Field(None, ge=1)
    """Runs of the whole cluster at once; None: only each replica's own
    ``[runner] max_concurrent_runs``."""

    @property
    def renew_every_s(self) -> float:
        """The heartbeat's period: three tries before a lease runs out."""
        return self.lease_ttl_s / 3


class Settings(BaseSettings):
    """The whole configuration, validated at startup."""

    model_config = SettingsConfigDict(
        env_prefix="CHATBRIDGE_",
        env_nested_delimiter="__",
        extra="forbid",
        frozen=True,
    )

    runner: RunnerSettings = RunnerSettings()
    dispatcher: DispatcherSettings = DispatcherSettings()
    delivery: DeliverySettings = DeliverySettings()
    progress: ProgressSettings = ProgressSettings()
    commands: CommandSettings = CommandSettings()
    defaults: RoomDefaults = RoomDefaults()
    console: ConsoleSettings = ConsoleSettings()
    database: DatabaseSettings = DatabaseSettings()
    logging: LoggingSettings = LoggingSettings()
    http: HttpSettings = HttpSettings()
    budget: BudgetSettings = BudgetSettings()
    matrix: MatrixSettings | None = None
    slack: SlackSettings | None = None
    rooms: tuple[RoomConfig, ...] = ()
    schedule: ScheduleSettings = ScheduleSettings()
    schedules: tuple[ScheduleConfig, ...] = ()
    webhooks: tuple[WebhookConfig, ...] = ()
    cluster: ClusterSettings = ClusterSettings()
    web: WebSettings = WebSettings()

    _rooms: dict[RoomKey, RoomSettings] = PrivateAttr(default_factory=dict)

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # The file's contents arrive as init values; the environment wins over them.
        return (env_settings, init_settings)

    @model_validator(mode="after")
    def _resolve_rooms(self) -> Self:
        rooms: dict[RoomKey, RoomSettings] = {}
        base = self.defaults.model_dump()
        for index, entry in enumerate(self.rooms):
            key = entry.key
            if key in rooms:
                raise ValueError(f"rooms[{index}]: room {key} is configured twice")
            if entry.transport != "console" and getattr(self, entry.transport) is None:
                name = entry.transport
                raise ValueError(f"rooms[{index}]: transport {name!r} has no [{name}] section")
            try:
                rooms[key] = RoomSettings.model_validate(
                    {
                        **base,
                        **entry.overrides,
                        "key": key,
                        "trigger": entry.trigger,
                        "reply_in_thread": entry.reply_in_thread,
                    }
                )
            except ValidationError as exc:
                raise ValueError(_nested_errors(f"rooms[{index}]", exc)) from None
        for index, entry in enumerate(self.rooms):
            if entry.transport == "console" and entry.id != self.console.room:
                # The console speaks in one room only; another id would never hear it.
                raise ValueError(
                    f"rooms[{index}]: a console room's id must be [console] room"
                    f" ({self.console.room!r})"
                )
        if self.console_active and not any(k.transport == "console" for k in rooms):
            # Embedded default: one console room that the local user may use.
            key = RoomKey(TransportName("console"), RoomId(self.console.room))
            rooms[key] = RoomSettings.model_validate(
                {**base, "key": key, "allowed_users": base["allowed_users"] or [self.console.user]}
            )
        self._rooms = rooms
        self._check_automation()
        self._check_web()
        self._check_ledger()
        self._check_catch_up()
        self._check_cluster()
        return self

    def _check_cluster(self) -> None:
        """Replicas coordinate through PostgreSQL, and share no console."""
        if not self.cluster.enabled:
            return
        from sqlalchemy.engine import make_url

        if make_url(self.database.url).get_backend_name() != "postgresql":
            raise ValueError(
                "cluster.enabled: replicas need a PostgreSQL database.url"
                " (SQLite serves one process)"
            )
        if self.console_active:
            raise ValueError(
                "cluster.enabled: the console is local to one process;"
                " set [console] enabled = false"
            )

    def _check_ledger(self) -> None:
        """A daily budget sums the ledger's rows of the UTC day: they must outlive it."""
        budgets = self.budget.daily_usd is not None or any(
            r.daily_budget_usd is not None for r in self._rooms.values()
        )
        if budgets and self.database.retention_days < 1:
            raise ValueError(
                f"database.retention_days: {self.database.retention_days:g} is too short for"
                " a daily budget, which sums the day's runs: it must be at least 1"
            )

    def _check_catch_up(self) -> None:
        """Slack's catch-up hands over again what it reads after a thread's mark; the
        store drops it only while it keeps the message (and the mark)."""
        if self.slack is None:
            return
        max_age_s = self.slack.catch_up_max_age_s
        if max_age_s > self.database.retention_days * 86400:
            raise ValueError(
                f"slack.catch_up_max_age_s: {max_age_s:g} reaches further back than"
                f" database.retention_days ({self.database.retention_days:g}) keeps messages,"
                " so a message caught up again after its record was pruned would run twice:"
                " lower it or keep messages longer"
            )

    def _check_web(self) -> None:
        """The console is on the private listener only: one shared with webhooks is public."""
        if not self.web.enabled:
            return
        listen, public = self.http.listen, self.http.public_listen
        if listen is None or listen == public:
            where = "no address" if listen is None else f"{listen}, which public_listen shares"
            raise ValueError(
                "web.enabled: the console is served on [http] listen, the private listener,"
                f" which has {where}: give listen its own private address (the console is"
                " never served on the listener that takes webhooks from the internet)"
            )

    def _check_automation(self) -> None:
        """Schedules and webhooks name configured rooms, unique names and paths."""
        entries: list[tuple[str, ScheduleConfig | WebhookConfig]] = [
            (f"schedules[{i}]", e) for i, e in enumerate(self.schedules)
        ]
        entries += [(f"webhooks[{i}]", e) for i, e in enumerate(self.webhooks)]
        for at, entry in entries:
            if entry.room_key not in self._rooms:
                configured = ", ".join(str(k) for k in self._rooms) or "none"
                raise ValueError(
                    f"{at}.room: {entry.room} is not a configured room (configured: {configured})"
                )
        names = [s.key for s in self.schedules]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ValueError(f"schedules: name(s) {', '.join(twice)} used twice")
        paths = [w.path for w in self.webhooks]
        twice = sorted({p for p in paths if paths.count(p) > 1})
        if twice:
            raise ValueError(f"webhooks: path(s) {', '.join(twice)} used twice")
        if self.webhooks and self.http.public_listen is None:
            # [http] listen served webhooks before public_listen existed: say what moved.
            raise ValueError(
                "webhooks: need [http] public_listen (webhooks are not served on [http] listen,"
                " which shows /metrics; the same address as listen keeps both on one listener)"
            )

    @property
    def web_secret_file(self) -> Path:
        """The key that signs the web console's tokens (docs/web.md)."""
        return self.web.secret_file or self.runner.state_dir / "web-secret"

    @property
    def console_active(self) -> bool:
        if not self.console.enabled:
            return False
        explicit = "enabled" in self.console.model_fields_set
        return explicit or (self.matrix is None and self.slack is None)

    def room(self, key: RoomKey) -> RoomSettings | None:
        """The settings of ``key``'s room (a thread conversation has its room's)."""
        return self._rooms.get(key.channel)

    @property
    def room_settings(self) -> Mapping[RoomKey, RoomSettings]:
        return self._rooms

    def redacted(self) -> dict[str, Any]:
        """The effective configuration as plain data, secrets masked."""
        data: dict[str, Any] = self.model_dump(mode="json")
        from bridge.store.engine import redacted  # SQLAlchemy: only when printing

        data["database"]["url"] = redacted(self.database.url)
        data["rooms"] = [
            {
                **r.model_dump(mode="json", exclude={"key"}),
                "transport": k.transport,
                "id": k.room_id,
            }
            for k, r in self._rooms.items()
        ]
        for hook in data["webhooks"]:
            hook["secret"] = "**********"  # noqa: S105 (the mask, not a password)
        for section in (*data["rooms"], data["defaults"]):
            section["env"] = {name: "**********" for name in section["env"]}
            section["extra_args"] = _redacted_args(section["extra_args"])
        return data


def _redacted_args(args: list[str]) -> list[str]:
    """Flags kept, values masked: ``extra_args`` may carry an inline MCP config with keys."""
    out = []
    for arg in args:
        if arg.startswith("-"):
            flag, sep, _ = arg.partition("=")
            out.append(f"{flag}=**********" if sep else flag)
        else:
            out.append("**********")
    return out


def _nested_errors(prefix: str, exc: ValidationError) -> str:
    parts = []
    for err in exc.errors():
        loc = ".".join(str(p) for p in err["loc"])
        parts.append(f"{prefix}.{loc}: {err['msg']}")
    return "; ".join(parts)


def load_settings(path: Path | None) -> Settings:
    """Read ``path`` (if any), apply the environment, validate.

    Raises :class:`ConfigError` naming every offending key by its full path.
    """
    data: dict[str, Any] = {}
    if path is not None:
        try:
            with path.open("rb") as fh:
                data = tomllib.load(fh)
        except FileNotFoundError:
            raise ConfigError(f"{path}: no such file") from None
        except OSError as exc:
            raise ConfigError(f"{path}: {exc.strerror}") from None
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"{path}: invalid TOML: {exc}") from None
    try:
        return Settings(**data)
    except ValidationError as exc:
        raise ConfigError(_describe(exc, path)) from None


def _describe(exc: ValidationError, path: Path | None) -> str:
    where = f"{path}: " if path else ""
    lines = [f"{where}invalid configuration:"]
    for err in exc.errors():
        loc = _dotted(err["loc"])
        msg = err["msg"].removeprefix("Value error, ")
        lines.append(f"  {loc}: {msg}" if loc else f"  {msg}")
    return "\n".join(lines)


def _dotted(loc: tuple[int | str, ...]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else part
    return out
