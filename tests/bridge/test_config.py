from __future__ import annotations

from pathlib import Path
from typing import get_args

import pytest

from bridge.config import PERMISSION_MODES, PermissionModeSetting, load_settings
from bridge.core.model import RoomId, RoomKey, TransportName, UserId
from bridge.errors import ConfigError
from tests.bridge.config_text import clean_env, write  # noqa: F401 (clean_env: an autouse fixture)

MATRIX_ROOM = RoomKey(TransportName("matrix"), RoomId("!abc:example.org"))


def test_embedded_defaults_give_one_console_room_for_the_local_user() -> None:
    settings = load_settings(None)
    rooms = dict(settings.room_settings)
    key = RoomKey(TransportName("console"), RoomId("console"))
    assert list(rooms) == [key]
    assert rooms[key].allowed_users == ("local",)
    assert settings.runner.claude_bin == "claude"
    assert settings.dispatcher.coalesce_ms == 1500
    assert settings.console_active


def test_rooms_inherit_defaults_and_override_keys(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """
[defaults]
model = "sonnet"
allowed_users = ["@alice:example.org"]
run_timeout_s = 60

[matrix]
homeserver = "https://example.org"
user_id = "@bot:example.org"
access_token = "t"

[[rooms]]
transport = "matrix"
id = "!abc:example.org"
model = "opus"
cwd = "/srv/repo"
""",
    )
    settings = load_settings(path)
    room = settings.room(MATRIX_ROOM)
    assert room is not None
    assert room.model == "opus"
    assert room.cwd == Path("/srv/repo")
    assert room.allowed_users == ("@alice:example.org",)
    assert room.run_timeout_s == 60
    # Matrix configured, console not set explicitly: the console is off.
    assert not settings.console_active


def test_environment_overrides_file_values(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = write(tmp_path, "[runner]\nmax_concurrent_runs = 2\nclaude_bin = 'x'\n")
    monkeypatch.setenv("CHATBRIDGE_RUNNER__MAX_CONCURRENT_RUNS", "9")
    monkeypatch.setenv("CHATBRIDGE_DEFAULTS__ALLOWED_USERS", '["bob"]')
    settings = load_settings(path)
    assert settings.runner.max_concurrent_runs == 9
    assert settings.runner.claude_bin == "x"
    assert settings.defaults.allowed_users == ("bob",)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("[runner]\nmax_concurrent_runs = 0\n", "runner.max_concurrent_runs"),
        ("[runner]\nbogus = 1\n", "runner.bogus"),
        ("[nonsense]\nx = 1\n", "nonsense"),
        ("[dispatcher]\nmax_batch = 'many'\n", "dispatcher.max_batch"),
        (
            "[[rooms]]\ntransport = 'console'\nid = 'c'\nmodle = 'typo'\n",
            "rooms[0]",
        ),
        (
            "[[rooms]]\ntransport = 'console'\nid = 'c'\nmax_turns = -1\n",
            "rooms[0].max_turns",
        ),
        ("[[rooms]]\ntransport = 'irc'\nid = 'c'\n", "rooms[0].transport"),
        ("[[rooms]]\ntransport = 'slack'\nid = 'C1'\n", "no [slack] section"),
        ("[defaults]\npermission_mode = 'yolo'\n", "defaults.permission_mode"),
        ("[http]\nlisten = 'localhost'\n", "http.listen"),
        ("[http]\nlisten = '127.0.0.1:99999'\n", "http.listen"),
        ("[defaults]\nenv = { 'A=B' = 'x' }\n", "defaults.env"),
        ('[defaults]\nappend_system_prompt = "a\\u0000b"\n', "NUL"),
        ("[runner]\nstop_grace_s = inf\n", "runner.stop_grace_s"),
        ("[defaults]\nrun_timeout_s = nan\n", "defaults.run_timeout_s"),
        (
            "[defaults]\nallowed_tools = ['--dangerously-skip-permissions']\n",
            "defaults.allowed_tools",
        ),
        ("[[rooms]]\ntransport = 'console'\nid = 'other'\n", "console room's id"),
        ("[commands]\nprefix = 'c'\n", "commands.prefix"),
        ("[defaults]\napproval_timeout_s = 0\n", "defaults.approval_timeout_s"),
        ("[defaults]\nduring_run = 'later'\n", "defaults.during_run"),
        ("[defaults]\napprovers = ['']\n", "defaults.approvers"),
        ("[defaults]\napprove_tools = 'maybe'\n", "defaults.approve_tools"),
        (
            "[[rooms]]\ntransport = 'console'\nid = 'console'\nrequire_other_approver = 2\n",
            "rooms[0].require_other_approver",
        ),
        ("[runner]\nmax_prestarts = -1\n", "runner.max_prestarts"),
        ("[runner]\nmax_concurrent_runs = 2\nmax_prestarts = 3\n", "must not exceed"),
        (
            "[runner]\nprestart = false\nprestart_keep_s = 30\n",
            "prestart_keep_s (30) needs prestart = true",
        ),
        ("[runner]\nprestart = true\nprestart_keep_s = -1\n", "runner.prestart_keep_s"),
        ("[cluster]\nenabled = true\n", "replicas need a PostgreSQL database.url"),
        (
            "[cluster]\nenabled = true\n[database]\nurl = 'postgresql+asyncpg://h/db'\n",
            "the console is local to one process",
        ),
        ("[cluster]\nreplica_id = 'a b'\n", "cluster.replica_id"),
        ("[cluster]\nlease_ttl_s = 0.5\n", "cluster.lease_ttl_s"),
        ("[cluster]\nmax_concurrent_runs = 0\n", "cluster.max_concurrent_runs"),
    ],
)
def test_invalid_configuration_names_the_key(tmp_path: Path, text: str, expected: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_settings(write(tmp_path, text))
    assert expected in str(info.value)


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("postgresql+asyncpg://bob:S3cretPw@127.0.0.1:abc/db", "is not a valid URL"),
        ("postgresql+asyncpg://bob:S3cretPw@db/x?sslmode=required", "sslmode must be one of"),
        (
            "postgresql+asyncpg://bob:S3cretPw@db/x?sslmode=require&ssl=prefer",
            "give ssl or sslmode, not both",
        ),
    ],
)
def test_database_urls_that_would_crash_the_driver_are_config_errors(
    tmp_path: Path, url: str, expected: str
) -> None:
    with pytest.raises(ConfigError) as info:
        load_settings(write(tmp_path, f"[database]\nurl = '{url}'\n"))
    assert f"database.url: {expected}" in str(info.value)
    assert "S3cretPw" not in str(info.value)


def test_libpq_sslmode_is_accepted_and_given_to_asyncpg_as_ssl(tmp_path: Path) -> None:
    from sqlalchemy.engine import make_url

    from bridge.store.engine import asyncpg_ssl

    url = "postgresql+asyncpg://bob:p%40ss@db:5433/x?sslmode=verify-full&application_name=cb"
    assert load_settings(write(tmp_path, f"[database]\nurl = '{url}'\n")).database.url == url
    given = make_url(asyncpg_ssl(url))
    assert dict(given.query) == {"ssl": "verify-full", "application_name": "cb"}
    assert (given.password, given.port) == ("p@ss", 5433)
    sqlite = "sqlite+aiosqlite:///x.db"
    assert asyncpg_ssl(sqlite) == sqlite


def test_unknown_key_from_environment_is_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CHATBRIDGE_RUNNER__NOPE", "1")
    with pytest.raises(ConfigError, match=r"runner\.nope"):
        load_settings(None)


def test_duplicate_room_is_an_error(tmp_path: Path) -> None:
    text = "[[rooms]]\ntransport = 'console'\nid = 'c'\n" * 2
    with pytest.raises(ConfigError, match="configured twice"):
        load_settings(write(tmp_path, text))


def test_missing_file_and_bad_toml_are_config_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no such file"):
        load_settings(tmp_path / "absent.toml")
    with pytest.raises(ConfigError, match="invalid TOML"):
        load_settings(write(tmp_path, "[runner\n"))


def test_redacted_view_hides_secrets(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = write(
        tmp_path,
        """
[defaults]
env = { GITHUB_TOKEN = "ghp_secret_value" }
[matrix]
homeserver = "https://example.org"
user_id = "@bot:example.org"
[slack]
bot_token = "xoxb-secret-bot"
app_token = "xapp-secret-app"
[[rooms]]
transport = "matrix"
id = "!abc:example.org"
""",
    )
    monkeypatch.setenv("CHATBRIDGE_MATRIX__ACCESS_TOKEN", "syt_secret_token")
    monkeypatch.setenv(
        "CHATBRIDGE_DATABASE__URL", "postgresql+asyncpg://bridge:pg_secret_pw@db/chat"
    )
    settings = load_settings(path)
    assert settings.matrix is not None
    assert settings.matrix.access_token.get_secret_value() == "syt_secret_token"
    text = repr(settings.redacted())
    secrets = ("ghp_secret_value", "syt_secret_token", "xoxb-secret-bot", "xapp-secret-app")
    for secret in (*secrets, "pg_secret_pw"):
        assert secret not in text
    assert "GITHUB_TOKEN" in text
    assert "postgresql+asyncpg://bridge:***@db/chat" in text


@pytest.mark.parametrize(
    ("url", "secret", "shown"),
    [
        ("postgresql+asyncpg://bridge@db/chat?password=pg_q_secret", "pg_q_secret", "bridge@db"),
        ("postgresql+asyncpg://bridge@db/chat?PASSWORD=pg_q_secret", "pg_q_secret", "db/chat"),
        (
            "postgresql+asyncpg://u@db/chat?sslmode=require&sslpassword=pg_q_secret",
            "pg_q_secret",
            "sslmode=require",
        ),
        ("postgresql+asyncpg://u:pg_q_secret@db/chat?password=pg_q_secret", "pg_q_secret", "u:"),
        ("postgresql+asyncpg://u@db/chat?password=a&password=pg_q_secret", "pg_q_secret", "db"),
        ("postgresql+asyncpg://u:p%40g_q_secret@db/chat", "g_q_secret", "u:***@db"),
    ],
)
def test_redacted_database_urls_hide_passwords_anywhere(url: str, secret: str, shown: str) -> None:
    from bridge.store.engine import redacted

    text = redacted(url)
    assert secret not in text
    assert shown in text


def test_redacted_view_hides_extra_args_values(tmp_path: Path) -> None:
    mcp = '{"mcpServers": {"x": {"env": {"API_KEY": "sk-inline-secret"}}}}'
    path = write(
        tmp_path,
        f"""
[defaults]
extra_args = ["--mcp-config", '{mcp}', "--verbose", "--settings=sk-eq-secret"]
[[rooms]]
transport = "console"
id = "console"
extra_args = ["--mcp-config", "sk-room-secret"]
""",
    )
    data = load_settings(path).redacted()
    text = repr(data)
    for secret in ("sk-inline-secret", "sk-eq-secret", "sk-room-secret"):
        assert secret not in text
    assert data["defaults"]["extra_args"] == [
        "--mcp-config",
        "**********",
        "--verbose",
        "--settings=**********",
    ]


def test_approval_settings_default_off_and_rooms_override_them(tmp_path: Path) -> None:
    settings = load_settings(
        write(
            tmp_path,
            """
[defaults]
allowed_users = ["@a:x", "@b:x"]
approval_timeout_s = 60

[[rooms]]
transport = "console"
id = "console"
approve_tools = true
approvers = ["@b:x"]
require_other_approver = true
during_run = "steer"
""",
        )
    )
    defaults = settings.defaults
    assert (defaults.approve_tools, defaults.approvers, defaults.during_run) == (False, (), "queue")
    assert not defaults.require_other_approver
    room = settings.room(RoomKey(TransportName("console"), RoomId("console")))
    assert room is not None
    assert (room.approve_tools, room.approvers, room.during_run) == (True, ("@b:x",), "steer")
    assert room.require_other_approver
    assert room.approval_timeout_s == 60
    assert room.approves(UserId("@b:x"))
    assert not room.approves(UserId("@a:x"))


def test_without_approvers_the_allowed_users_approve(tmp_path: Path) -> None:
    settings = load_settings(write(tmp_path, "[defaults]\nallowed_users = ['@a:x']\n"))
    room = settings.room(RoomKey(TransportName("console"), RoomId("console")))
    assert room is not None
    assert room.approves(UserId("@a:x"))
    assert not room.approves(UserId("@z:x"))


@pytest.mark.parametrize(
    ("text", "limit"),
    [
        ("", 4),
        ("[runner]\nprestart = false\n", 0),
        ("[runner]\nprestart = true\n", 4),
        ("[runner]\nprestart = true\nmax_prestarts = 1\n", 1),
        ("[runner]\nprestart = true\nmax_prestarts = 0\n", 0),
        ("[runner]\nmax_prestarts = 2\n", 2),
        ("[runner]\nprestart = false\nmax_prestarts = 2\n", 0),
    ],
)
def test_prestart_is_on_by_default_and_its_limit_defaults_to_the_run_slots(
    tmp_path: Path, text: str, limit: int
) -> None:
    assert load_settings(write(tmp_path, text)).runner.prestart_limit == limit


def test_approval_settings_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CHATBRIDGE_DEFAULTS__APPROVERS", '["@c:x"]')
    monkeypatch.setenv("CHATBRIDGE_DEFAULTS__DURING_RUN", "interrupt")
    monkeypatch.setenv("CHATBRIDGE_RUNNER__MAX_PRESTARTS", "2")
    settings = load_settings(None)
    assert settings.defaults.approvers == ("@c:x",)
    assert settings.defaults.during_run == "interrupt"
    assert settings.runner.max_prestarts == 2


def test_keep_warm_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CHATBRIDGE_RUNNER__PRESTART", "true")
    monkeypatch.setenv("CHATBRIDGE_RUNNER__PRESTART_KEEP_S", "12.5")
    assert load_settings(None).runner.prestart_keep_s == 12.5
    monkeypatch.setenv("CHATBRIDGE_RUNNER__PRESTART", "false")
    with pytest.raises(ConfigError, match="needs prestart = true"):
        load_settings(None)


def test_mode_command_takes_the_permission_modes_of_the_setting() -> None:
    assert set(PERMISSION_MODES) == set(get_args(PermissionModeSetting)) - {""}


def test_host_port_settings_come_from_the_environment_as_text(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # As compose.yaml sets them for its replicas.
    monkeypatch.setenv("CHATBRIDGE_SLACK__LISTEN", "0.0.0.0:3001")
    monkeypatch.setenv("CHATBRIDGE_HTTP__LISTEN", "0.0.0.0:8080")
    settings = load_settings(write(tmp_path, "[slack]\nbot_token = 'x'\napp_token = 'y'\n"))
    assert settings.slack is not None
    assert str(settings.slack.listen) == "0.0.0.0:3001"
    assert str(settings.http.listen) == "0.0.0.0:8080"


def test_slack_catch_up_reaches_no_further_back_than_the_database_keeps_messages(
    tmp_path: Path,
) -> None:
    # The catch-up hands over again what it reads after a thread's (or a thread
    # broadcast's) mark; the store drops it only while it still keeps the message.
    # Kept for half a day and caught up from a day back, a reply run in the morning
    # ran again after an evening restart.
    slack = "[slack]\nbot_token = 'x'\napp_token = 'y'\n"
    with pytest.raises(ConfigError) as info:
        load_settings(write(tmp_path, f"[database]\nretention_days = 0.5\n{slack}"))
    assert "slack.catch_up_max_age_s" in str(info.value)
    assert "database.retention_days" in str(info.value)
    short = f"{slack}catch_up_max_age_s = 43200\n"
    off = f"{slack}catch_up_max_age_s = 0\n"
    for fine in (short, off):
        load_settings(write(tmp_path, f"[database]\nretention_days = 0.5\n{fine}"))
