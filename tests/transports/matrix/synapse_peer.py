"""A real Synapse homeserver for the Matrix tests.

Synapse lives in its own virtualenv under ``.peers/synapse`` (see
``install_hint``). The server binds 127.0.0.1 on a free port, keeps its
SQLite database in a temp dir, and can be stopped and started again on the
same port and data, which the reconnect test needs.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import secrets
import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

SYNAPSE_VERSION = "1.163.2"
SERVER_NAME = "localhost"
PEERS_DIR = Path(__file__).resolve().parents[3] / ".peers"
INSTALL_HINT = (
    f"uv venv {PEERS_DIR}/synapse --python 3.11 && "
    f"uv pip install -p {PEERS_DIR}/synapse matrix-synapse=={SYNAPSE_VERSION}"
)
_START_TIMEOUT_S = 60.0
_STOP_TIMEOUT_S = 15.0


def synapse_python() -> Path | None:
    """The interpreter of Synapse's venv: ``$CHATBRIDGE_SYNAPSE_PYTHON`` or ``.peers``."""
    override = os.environ.get("CHATBRIDGE_SYNAPSE_PYTHON")
    candidate = Path(override) if override else PEERS_DIR / "synapse" / "bin" / "python"
    return candidate if candidate.exists() else None


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass(frozen=True)
class MatrixUser:
    user_id: str
    password: str
    access_token: str
    device_id: str


class SynapseServer:
    """One Synapse process over one data directory."""

    def __init__(self, python: Path, data_dir: Path) -> None:
        self._python = python
        self._dir = data_dir
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._secret = secrets.token_hex(16)
        self._proc: subprocess.Popen[bytes] | None = None
        self._log = data_dir / "stdout.log"

    def configure(self) -> None:
        """Generate the base config once, then write the test overrides."""
        subprocess.run(
            [
                str(self._python),
                "-m",
                "synapse.app.homeserver",
                "--server-name",
                SERVER_NAME,
                "--config-path",
                str(self._dir / "homeserver.yaml"),
                "--data-directory",
                str(self._dir),
                "--generate-config",
                "--report-stats=no",
            ],
            check=True,
            capture_output=True,
            timeout=120,
            # The generated log config names a relative file: keep it in the temp dir.
            cwd=self._dir,
        )
        many = {"per_second": 1000, "burst_count": 1000}
        overrides = {
            "listeners": [
                {
                    "port": self.port,
                    "bind_addresses": ["127.0.0.1"],
                    "type": "http",
                    "tls": False,
                    "resources": [{"names": ["client"]}],
                }
            ],
            "registration_shared_secret": self._secret,
            "trusted_key_servers": [],
            "suppress_key_server_warning": True,
            "presence": {"enabled": False},
            # Password hashing dominates login and registration time otherwise.
            "bcrypt_rounds": 4,
            "rc_message": many,
            "rc_login": {"address": many, "account": many, "failed_attempts": many},
            "rc_registration": many,
            "rc_joins": {"local": many, "remote": many},
            "rc_invites": {"per_room": many, "per_user": many, "per_sender": many},
            "rc_typing": many,
            "rc_room_creation": many,
            "rc_joins_per_room": many,
            "rc_key_requests": many,
        }
        # JSON is valid YAML, so no YAML writer is needed here.
        (self._dir / "test.yaml").write_text(json.dumps(overrides))

    def start(self) -> None:
        """Start the server and wait until ``/health`` answers."""
        assert self._proc is None, "already running"
        with self._log.open("ab") as log:
            self._proc = subprocess.Popen(
                [
                    str(self._python),
                    "-m",
                    "synapse.app.homeserver",
                    "-c",
                    str(self._dir / "homeserver.yaml"),
                    "-c",
                    str(self._dir / "test.yaml"),
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self._dir,
            )
        deadline = time.monotonic() + _START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise RuntimeError(f"synapse exited: {self._log.read_text()[-2000:]}")
            try:
                with urllib.request.urlopen(f"{self.url}/health", timeout=1) as resp:  # noqa: S310
                    if resp.status == 200:
                        return
            except OSError:
                pass
            # Polling a process we do not control; this is not test synchronization.
            time.sleep(0.05)
        self.stop()
        raise RuntimeError("synapse did not become healthy in time")

    def stop(self) -> None:
        """Stop the server (TERM, then KILL) and reap it."""
        proc, self._proc = self._proc, None
        if proc is None:
            return
        proc.terminate()
        try:
            proc.wait(_STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def _post(
        self, path: str, body: dict[str, object], token: str | None = None
    ) -> dict[str, object]:
        headers = {"Content-Type": "application/json"}
        if token:
            headers["Authorization"] = f"Bearer {token}"
        req = urllib.request.Request(  # noqa: S310 - our own http://127.0.0.1 URL
            f"{self.url}{path}", data=json.dumps(body).encode(), headers=headers, method="POST"
        )
        with urllib.request.urlopen(req, timeout=30) as resp:  # noqa: S310
            result: dict[str, object] = json.loads(resp.read())
            return result

    def register(self, localpart: str, *, admin: bool = False) -> MatrixUser:
        """Register a user with the shared-secret admin API (HMAC-SHA1 over the nonce)."""
        password = secrets.token_hex(8)
        nonce_url = f"{self.url}/_synapse/admin/v1/register"
        with urllib.request.urlopen(nonce_url, timeout=30) as r:  # noqa: S310
            nonce = json.loads(r.read())["nonce"]
        mac = hmac.new(self._secret.encode(), digestmod=hashlib.sha1)
        mac.update(b"\x00".join([nonce.encode(), localpart.encode(), password.encode()]))
        mac.update(b"\x00admin" if admin else b"\x00notadmin")
        reply = self._post(
            "/_synapse/admin/v1/register",
            {
                "nonce": nonce,
                "username": localpart,
                "password": password,
                "admin": admin,
                "mac": mac.hexdigest(),
            },
        )
        return MatrixUser(
            user_id=str(reply["user_id"]),
            password=password,
            access_token=str(reply["access_token"]),
            device_id=str(reply["device_id"]),
        )

    def limit_messages(
        self, admin: MatrixUser, user: MatrixUser, per_second: float, burst: int
    ) -> None:
        """Give ``user`` its own ``rc_message`` (the server-wide one is high for tests)."""
        self._post(
            f"/_synapse/admin/v1/users/{user.user_id}/override_ratelimit",
            {"messages_per_second": per_second, "burst_count": burst},
            token=admin.access_token,
        )

    def login(self, user: MatrixUser) -> MatrixUser:
        """A fresh device (and token) for ``user``."""
        reply = self._post(
            "/_matrix/client/v3/login",
            {
                "type": "m.login.password",
                "identifier": {"type": "m.id.user", "user": user.user_id},
                "password": user.password,
            },
        )
        return MatrixUser(
            user_id=user.user_id,
            password=user.password,
            access_token=str(reply["access_token"]),
            device_id=str(reply["device_id"]),
        )

    def remove(self) -> None:
        self.stop()
        shutil.rmtree(self._dir, ignore_errors=True)


__all__ = ["INSTALL_HINT", "MatrixUser", "SynapseServer", "free_port", "synapse_python"]
