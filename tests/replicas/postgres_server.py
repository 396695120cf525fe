"""A private PostgreSQL server for one test session: its own data directory, port and
socket directory, so a test may stop or restart it without touching anyone else's.

Built from the Debian packages' binaries (``/usr/lib/postgresql/*/bin``). initdb
refuses to run as root, so as root the server runs as the ``postgres`` user.
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from tests.transports.slack.peer import free_port

SUPERUSER = "chatbridge"
START_TIMEOUT_S = 30


def binaries() -> Path | None:
    """The newest installed PostgreSQL's bin directory, or None."""
    found = sorted(
        Path("/usr/lib/postgresql").glob("*/bin/pg_ctl"),
        key=lambda p: int(p.parent.parent.name) if p.parent.parent.name.isdigit() else 0,
    )
    return found[-1].parent if found else None


@dataclass
class PostgresServer:
    """One server; ``url`` for SQLAlchemy (asyncpg), ``dsn`` for asyncpg itself."""

    bin: Path
    home: Path
    port: int
    user: str | None
    """Run the binaries as this user (root cannot run a server), or as ourselves."""

    @property
    def data(self) -> Path:
        return self.home / "data"

    @property
    def dsn(self) -> str:
        return f"postgresql://{SUPERUSER}@127.0.0.1:{self.port}/postgres"

    def url(self, database: str = "postgres") -> str:
        return f"postgresql+asyncpg://{SUPERUSER}@127.0.0.1:{self.port}/{database}"

    def _run(self, argv: Sequence[str]) -> None:
        command = list(argv)
        if self.user is not None:
            command = ["runuser", "-u", self.user, "--", *command]
        done = subprocess.run(
            command, check=False, capture_output=True, text=True, timeout=START_TIMEOUT_S
        )
        if done.returncode != 0:
            log = self.home / "server.log"
            tail = log.read_text()[-2000:] if log.exists() else ""
            raise RuntimeError(
                f"{' '.join(argv)} failed ({done.returncode}):\n{done.stdout}{done.stderr}\n{tail}"
            )

    def _ctl(self, *args: str) -> None:
        self._run([
            str(self.bin / "pg_ctl"), "-D", str(self.data), "-l", str(self.home / "server.log"),
            "-w", "-t", str(START_TIMEOUT_S), *args,
        ])  # fmt: skip

    def init(self) -> None:
        self._run([
            str(self.bin / "initdb"), "-D", str(self.data), "-U", SUPERUSER,
            "--auth=trust", "--no-sync", "-E", "UTF8", "--locale=C",
        ])  # fmt: skip
        # Fast rather than durable (a test's data dies with it), but a clean or an
        # immediate restart keeps every commit: WAL is flushed to the page cache.
        settings = {
            "listen_addresses": "'127.0.0.1'",
            "port": str(self.port),
            "unix_socket_directories": f"'{self.home}'",
            "fsync": "off",
            "full_page_writes": "off",
            "max_connections": "200",
            "shared_buffers": "32MB",
        }
        with (self.data / "postgresql.conf").open("a") as conf:
            conf.writelines(f"{k} = {v}\n" for k, v in settings.items())

    def start(self) -> None:
        self._ctl("start")

    def stop(self, mode: str = "fast") -> None:
        """``fast``: clients disconnected, a clean shutdown; ``immediate``: as if it crashed."""
        self._ctl("stop", "-m", mode)

    def restart(self, mode: str = "fast") -> None:
        self.stop(mode)
        self.start()


def missing_reason() -> str | None:
    """Why no private server can be made here, or None."""
    if binaries() is None:
        return "no PostgreSQL server under /usr/lib/postgresql/*/bin (apt-get install postgresql)"
    if os.geteuid() == 0:
        try:
            pwd.getpwnam("postgres")
        except KeyError:
            return "running as root and there is no postgres user to run the server as"
        if shutil.which("runuser") is None:
            return "running as root without runuser"
    return None


def make_server() -> PostgresServer:
    """A new, initialised and started server in a fresh directory under /tmp (a unix
    socket path must stay short)."""
    bin_dir = binaries()
    assert bin_dir is not None
    home = Path(tempfile.mkdtemp(prefix="cbpg-"))
    user = "postgres" if os.geteuid() == 0 else None
    if user is not None:
        shutil.chown(home, user)
    server = PostgresServer(bin_dir, home, free_port(), user)
    server.init()
    server.start()
    return server


def remove(server: PostgresServer) -> None:
    try:
        server.stop("immediate")
    finally:
        shutil.rmtree(server.home, ignore_errors=True)
