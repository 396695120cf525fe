"""Signed tokens: login tokens from ``chatbridge web-token``, browser sessions, CSRF tokens.

A token is ``<kind>.<identity, base64url>.<expiry>.<HMAC-SHA256>``, signed with
the console's secret; nothing is stored server-side, so every replica that
shares the secret accepts it. The secret file is created 0600 and never logged.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import secrets
from dataclasses import dataclass
from pathlib import Path

SECRET_BYTES = 32


def load_secret(path: Path) -> bytes:
    """The console's signing key, created on first use (mode 0600, never follows a link)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        key = secrets.token_bytes(SECRET_BYTES)
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        try:
            fd = os.open(path, flags, 0o600)
        except FileExistsError:  # another replica or process made it first
            return load_secret(path)
        with os.fdopen(fd, "wb") as f:
            f.write(key)
        return key
    with os.fdopen(fd, "rb") as f:
        key = f.read()
    if len(key) < SECRET_BYTES:
        raise ValueError(f"{path}: the web console's secret is too short")
    return key


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


@dataclass(frozen=True, slots=True)
class Signer:
    key: bytes

    def _mac(self, message: str) -> str:
        return _b64(hmac.new(self.key, message.encode(), hashlib.sha256).digest())

    def mint(self, kind: str, identity: str, expires_at: float) -> str:
        body = f"{kind}.{_b64(identity.encode())}.{int(expires_at)}"
        return f"{body}.{self._mac(body)}"

    def verify(self, kind: str, token: str, now: float) -> str | None:
        """The identity a valid, unexpired ``kind`` token names; None otherwise."""
        valid = self.verified(kind, token, now)
        return None if valid is None else valid[0]

    def verified(self, kind: str, token: str, now: float) -> tuple[str, int] | None:
        """The identity a valid, unexpired ``kind`` token names, and when it expires."""
        parts = token.split(".")
        if len(parts) != 4 or parts[0] != kind:
            return None
        body = ".".join(parts[:3])
        if not hmac.compare_digest(self._mac(body), parts[3]):
            return None
        if not parts[2].isascii() or not parts[2].isdigit() or int(parts[2]) <= now:
            return None
        try:
            return _unb64(parts[1]).decode(), int(parts[2])
        except (ValueError, UnicodeDecodeError):
            return None

    def csrf(self, identity: str, nonce: str) -> str:
        """The form token of a browser session: bound to its identity and cookie nonce."""
        return self._mac(f"csrf.{identity}.{nonce}")
