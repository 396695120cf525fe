"""First-run checks of the claude CLI: which binary, which version, whether it can authenticate.

The credential check only looks where the CLI looks (it never reads a
secret's value into a message): the environment claude gets
(``ANTHROPIC_API_KEY``, ``ANTHROPIC_AUTH_TOKEN``, ``CLAUDE_CODE_OAUTH_TOKEN``,
a cloud provider switch), then the login ``claude /login`` stores under
``$CLAUDE_CONFIG_DIR`` (default ``~/.claude``): ``.credentials.json`` with a
``claudeAiOauth`` entry on Linux, and ``.claude.json`` (in the config dir when
``CLAUDE_CONFIG_DIR`` is set, else in the home directory) with an
``oauthAccount`` or ``primaryApiKey``; ``settings.json`` may name an
``apiKeyHelper`` or set the key in its ``env``. On macOS a login lives in the
Keychain, which this check cannot see: it then reports "no credentials" as a
warning only, and the service starts all the same.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from bridge.config import Settings

VERSION_TIMEOUT_S = 10.0
"""``claude --version`` answers in well under a second; a hung binary must not hang the check."""

CREDENTIAL_ENV = (
    "ANTHROPIC_API_KEY",
    "ANTHROPIC_AUTH_TOKEN",
    "CLAUDE_CODE_OAUTH_TOKEN",
    "CLAUDE_CODE_USE_BEDROCK",
    "CLAUDE_CODE_USE_VERTEX",
    "CLAUDE_CODE_USE_FOUNDRY",
)
"""Variables that give claude credentials (or hand authentication to a cloud provider)."""


@dataclass(frozen=True, slots=True)
class ClaudeBinary:
    """What ``runner.claude_bin`` resolves to; ``problem`` says why it cannot be used."""

    configured: str
    path: str | None
    version: str | None
    problem: str | None

    def describe(self) -> str:
        if self.problem is not None:
            return f"runner.claude_bin = {self.configured!r}: {self.problem}"
        return f"claude: {self.path}, version {self.version}"


def check_binary(claude_bin: str, env: Mapping[str, str]) -> ClaudeBinary:
    """Resolve ``claude_bin`` on ``env``'s PATH as a spawn would, and ask it for its version."""
    path = shutil.which(claude_bin, path=env.get("PATH"))
    if path is None:
        return ClaudeBinary(claude_bin, None, None, "not found (not an executable, nor on PATH)")
    try:
        done = subprocess.run(
            [path, "--version"],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            errors="replace",
            timeout=VERSION_TIMEOUT_S,
            env=dict(env),
            check=False,
        )
    except subprocess.TimeoutExpired:
        return ClaudeBinary(
            claude_bin, path, None, f"{path} --version gave no answer in {VERSION_TIMEOUT_S:g}s"
        )
    except OSError as exc:
        return ClaudeBinary(claude_bin, path, None, f"cannot run {path}: {exc.strerror or exc}")
    first = (done.stdout.strip().splitlines() or [""])[0]
    if done.returncode != 0 or not first:
        why = (done.stderr.strip().splitlines() or [f"exit status {done.returncode}"])[0]
        return ClaudeBinary(claude_bin, path, None, f"{path} --version failed: {why}")
    return ClaudeBinary(claude_bin, path, first, None)


def credentials_source(env: Mapping[str, str]) -> str | None:
    """Where claude, run with ``env``, would find credentials; None when nowhere."""
    for name in CREDENTIAL_ENV:
        if env.get(name):
            return f"${name}"
    home = Path(env.get("HOME") or Path.home())
    config_dir = (
        Path(env["CLAUDE_CONFIG_DIR"]) if env.get("CLAUDE_CONFIG_DIR") else home / ".claude"
    )
    global_config = (
        config_dir / ".claude.json" if env.get("CLAUDE_CONFIG_DIR") else home / ".claude.json"
    )
    checks: tuple[tuple[Path, tuple[str, ...]], ...] = (
        (config_dir / ".credentials.json", ("claudeAiOauth",)),
        (global_config, ("oauthAccount", "primaryApiKey")),
        (config_dir / "settings.json", ("apiKeyHelper",)),
    )
    for path, keys in checks:
        data = _json_object(path)
        if any(data.get(key) for key in keys):
            return str(path)
    settings_env = _json_object(config_dir / "settings.json").get("env")
    if isinstance(settings_env, dict) and any(settings_env.get(n) for n in CREDENTIAL_ENV):
        return str(config_dir / "settings.json")
    return None


def credentials_warning(settings: Settings, base_env: Mapping[str, str]) -> str | None:
    """One line for the operator when a room's claude would find no credentials; else None.

    Each room's claude gets ``base_env`` plus the room's ``env`` (what the runner gives it).
    """
    bare = [
        f"{key.transport}:{key.room_id}"
        for key, room in settings.room_settings.items()
        if credentials_source({**base_env, **room.env}) is None
    ]
    if not bare:
        return None
    return (
        "claude has no credentials (no ANTHROPIC_API_KEY or ANTHROPIC_AUTH_TOKEN in its"
        " environment, no login under CLAUDE_CONFIG_DIR or ~/.claude): its runs will fail"
        " until `claude /login` is run as this user or a room's env sets a key"
        f" (rooms: {', '.join(sorted(bare))})"
    )


def _json_object(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


__all__ = ["ClaudeBinary", "check_binary", "credentials_source", "credentials_warning"]
