"""First-run checks of the claude CLI: which binary, which version, whether it can authenticate.

The version check trusts nothing the binary does (own session, time limit, group killed,
output bounded, one sanitised line shown). The credential check only looks where the CLI
looks (environment, ``$CLAUDE_CONFIG_DIR`` files) and never reads a secret's value into a
message; a login it cannot see (the macOS Keychain) is a warning only
(docs/operations.md, "Starting" and "Secrets and claude").
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import selectors
import shutil
import signal
import subprocess
import time
import unicodedata
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from bridge.config import Settings

VERSION_TIMEOUT_S = 10.0
"""``claude --version`` answers in well under a second; a hung binary must not hang the check."""

VERSION_OUTPUT_LIMIT = 4096
"""Bytes of each ``--version`` stream read at most; Claude Code prints about 25."""
VERSION_SHOWN = 80
"""Characters of the first line shown at most."""
CLAUDE_VERSION = re.compile(r"\d+\.\d+\.\d+\S* \(Claude Code\)")
"""What ``claude --version`` prints: ``2.1.330 (Claude Code)``."""

CREDENTIAL_ENV = ("ANTHROPIC_API_KEY", "ANTHROPIC_AUTH_TOKEN", "CLAUDE_CODE_OAUTH_TOKEN")
"""Variables that give claude credentials when set to anything."""
PROVIDER_SWITCHES = (
    "CLAUDE_CODE_USE_BEDROCK",
    "CLAUDE_CODE_USE_VERTEX",
    "CLAUDE_CODE_USE_FOUNDRY",
    "CLAUDE_CODE_USE_ANTHROPIC_AWS",
    "CLAUDE_CODE_USE_ANTHROPIC_GOOGLE_CLOUD",
    "CLAUDE_CODE_USE_MANTLE",
    "CLAUDE_CODE_USE_GATEWAY",
)
"""Switches that hand authentication to a provider (claude 2.1.330), when :func:`switched_on`."""
_ON = frozenset({"1", "true", "yes", "on"})


@dataclass(frozen=True, slots=True)
class ClaudeBinary:
    """What ``runner.claude_bin`` resolves to; ``problem`` says why it cannot be used."""

    configured: str
    path: str | None
    version: str | None
    """The first line ``--version`` printed, cleaned (see :func:`shown_line`)."""
    problem: str | None

    @property
    def looks_like_claude(self) -> bool:
        return self.version is not None and CLAUDE_VERSION.fullmatch(self.version) is not None

    def describe(self) -> str:
        if self.problem is not None:
            return f"runner.claude_bin = {self.configured!r}: {self.problem}"
        if not self.looks_like_claude:
            return (
                f"claude: {self.path}, version {self.version!r}: this does not look like"
                " Claude Code's version (such as '2.1.330 (Claude Code)'); check runner.claude_bin"
            )
        return f"claude: {self.path}, version {self.version}"


def check_binary(
    claude_bin: str, env: Mapping[str, str], timeout_s: float = VERSION_TIMEOUT_S
) -> ClaudeBinary:
    """Resolve ``claude_bin`` on ``env``'s PATH as a spawn would, and ask it for its version."""
    path = shutil.which(claude_bin, path=env.get("PATH"))
    if path is None:
        return ClaudeBinary(claude_bin, None, None, "not found (not an executable, nor on PATH)")
    try:
        answer = _ask_version(path, env, timeout_s)
    except OSError as exc:
        return ClaudeBinary(claude_bin, path, None, f"cannot run {path}: {exc.strerror or exc}")
    if answer.status is None and not answer.flooded:
        return ClaudeBinary(
            claude_bin, path, None, f"{path} --version gave no answer in {timeout_s:g}s"
        )
    first = shown_line(answer.stdout)
    # A flood is judged by its first line: it was cut short, so it has no exit status.
    if not answer.flooded and (answer.status != 0 or not first):
        why = shown_line(answer.stderr) or f"exit status {answer.status}"
        return ClaudeBinary(claude_bin, path, None, f"{path} --version failed: {why}")
    return ClaudeBinary(claude_bin, path, first, None)


def shown_line(output: bytes) -> str:
    """The first non-blank line of ``output``, safe to print on an operator's terminal.

    Terminal escape sequences and every other control or format character are
    dropped (a binary's output must not clear the screen or retitle the
    window), and the line is cut to :data:`VERSION_SHOWN` characters.
    """
    text = _ESCAPE.sub("", output.decode("utf-8", errors="replace"))
    line = next((line for line in text.split("\n") if line.strip()), "")
    line = "".join(ch for ch in line if not unicodedata.category(ch).startswith("C")).strip()
    return line if len(line) <= VERSION_SHOWN else line[: VERSION_SHOWN - 1] + "\u2026"


_ESCAPE = re.compile(r"\x1b(?:\[[0-?]*[ -/]*[@-~]|\][^\x07\x1b]*(?:\x07|\x1b\\)?|[ -/]*[0-~])")
"""ECMA-48 sequences: CSI (``ESC [ ... final``), OSC (``ESC ] ... BEL``), and two-byte ones."""


@dataclass(frozen=True, slots=True)
class _Answer:
    status: int | None
    """The exit status; None when the binary did not exit in time or was cut short."""
    stdout: bytes
    stderr: bytes
    flooded: bool
    """It printed more than :data:`VERSION_OUTPUT_LIMIT` bytes on a stream (and was killed)."""


def _ask_version(path: str, env: Mapping[str, str], timeout_s: float) -> _Answer:
    """Run ``path --version`` in a new session; nothing it started outlives the call.

    Reads both streams as they come, bounded, until the binary exits, the
    time runs out, or it prints too much. Then its whole process group is
    killed (children it left behind included) before the binary is reaped:
    until then its pid, the group's id, cannot be given to another process.
    """
    process = subprocess.Popen(
        [path, "--version"],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=dict(env),
        start_new_session=True,
    )
    out, err = bytearray(), bytearray()
    streams = [(s, kept) for s, kept in ((process.stdout, out), (process.stderr, err)) if s]
    deadline = time.monotonic() + timeout_s
    exited = flooded = False
    try:
        with selectors.DefaultSelector() as selector, _pidfd(process.pid) as pidfd:
            for stream, kept in streams:
                selector.register(stream, selectors.EVENT_READ, kept)
            # A pidfd turns readable when the process exits; it is not reaped by that.
            selector.register(pidfd, selectors.EVENT_READ)
            while not (exited or flooded) and (left := deadline - time.monotonic()) > 0:
                for key, _ in selector.select(left):
                    if key.fileobj == pidfd:
                        exited = True
                    else:
                        flooded |= _read(selector, key)
            selector.unregister(pidfd)
            _kill_group(process.pid)
            # What it wrote before it exited may still sit in the pipes; the
            # writers are gone, so the ends come at once (the deadline still holds
            # for a child that escaped into a session of its own).
            while exited and not flooded and selector.get_map():
                if (left := deadline - time.monotonic()) <= 0:
                    break
                for key, _ in selector.select(left):
                    flooded |= _read(selector, key)
    finally:
        _kill_group(process.pid)
        process.wait()
        for stream, _ in streams:
            stream.close()
    return _Answer(
        process.returncode if exited and not flooded else None,
        bytes(out),
        bytes(err),
        flooded,
    )


def _read(selector: selectors.BaseSelector, key: selectors.SelectorKey) -> bool:
    """Read what one stream has into its buffer (the key's data); True once past the limit."""
    chunk = os.read(key.fd, 65536)
    if not chunk:
        selector.unregister(key.fileobj)
        return False
    kept: bytearray = key.data
    kept += chunk[: VERSION_OUTPUT_LIMIT + 1 - len(kept)]
    return len(kept) > VERSION_OUTPUT_LIMIT


@contextlib.contextmanager
def _pidfd(pid: int) -> Iterator[int]:
    fd = os.pidfd_open(pid)
    try:
        yield fd
    finally:
        os.close(fd)


def _kill_group(pgid: int) -> None:
    # The leader is not reaped yet: the group id is still its own.
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGKILL)


def switched_on(value: object) -> bool:
    """Whether claude reads ``value`` as a switch turned on ("1", "true", "yes", "on", any case).

    Anything else is off, "0" and "false" included: only these four turn a
    provider on in claude 2.1.330, so only they stand for credentials here.
    """
    if isinstance(value, bool):
        return value
    return value is not None and str(value).strip().lower() in _ON


def _env_source(env: Mapping[str, Any]) -> str | None:
    """The variable of ``env`` that gives claude credentials, if one does."""
    for name in CREDENTIAL_ENV:
        if env.get(name):
            return name
    for name in PROVIDER_SWITCHES:
        if switched_on(env.get(name)):
            return name
    return None


def credentials_source(env: Mapping[str, str]) -> str | None:
    """Where claude, run with ``env``, would find credentials; None when nowhere."""
    if (name := _env_source(env)) is not None:
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
    if isinstance(settings_env, dict) and _env_source(settings_env) is not None:
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


__all__ = [
    "ClaudeBinary",
    "check_binary",
    "credentials_source",
    "credentials_warning",
    "shown_line",
    "switched_on",
]
