"""What the transport keeps under ``store_path`` besides nio's device keys.

- ``sync_position``: the sync token after the last batch of events that the
  service durably accepted. Written after the sink returned, so a crash
  replays (the service drops duplicates) rather than loses.
- ``undecryptable.json``: encrypted events whose keys have not arrived yet.
- ``session.json``: user, device and access token from a password login, so
  the same device (and its encryption keys) is reused on every start.

All are written atomically (temp file, fsync, rename) and readable only by
the owner, since the session holds a secret.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any


def _write_private(path: Path, data: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


class SyncPosition:
    """The persisted sync token."""

    def __init__(self, store_path: Path) -> None:
        self._path = store_path / "sync_position"

    def load(self) -> str | None:
        """The saved token, or None on the very first start."""
        try:
            token = self._path.read_text(encoding="utf-8").strip()
        except FileNotFoundError:
            return None
        return token or None

    def save(self, token: str) -> None:
        _write_private(self._path, token)


@dataclass(frozen=True, slots=True)
class SavedSession:
    user_id: str
    device_id: str
    access_token: str

    def __repr__(self) -> str:
        # Keep the token out of logs and tracebacks.
        return f"SavedSession(user_id={self.user_id!r}, device_id={self.device_id!r})"


class SessionFile:
    """The device created by a password login, reused on later starts."""

    def __init__(self, store_path: Path) -> None:
        self._path = store_path / "session.json"

    def load(self, user_id: str) -> SavedSession | None:
        """The saved session of ``user_id``; None if absent, unreadable or another user's."""
        try:
            data = json.loads(self._path.read_text(encoding="utf-8"))
            session = SavedSession(
                user_id=str(data["user_id"]),
                device_id=str(data["device_id"]),
                access_token=str(data["access_token"]),
            )
        except (FileNotFoundError, ValueError, KeyError, TypeError):
            return None
        return session if session.user_id == user_id else None

    def save(self, session: SavedSession) -> None:
        _write_private(
            self._path,
            json.dumps(
                {
                    "user_id": session.user_id,
                    "device_id": session.device_id,
                    "access_token": session.access_token,
                }
            ),
        )

    def forget(self) -> None:
        self._path.unlink(missing_ok=True)


@dataclass(slots=True)
class Undecryptable:
    """An encrypted event the bridge could not read yet, kept until its key arrives."""

    room_id: str
    source: dict[str, Any]
    """The event as the server sent it (still encrypted)."""
    first_seen: float
    """Wall-clock time it was first seen (survives restarts)."""
    noticed: bool = False
    """The room was told it could not be read."""

    @property
    def event_id(self) -> str:
        return str(self.source.get("event_id", ""))


class UndecryptableFile:
    """The encrypted events waiting for their keys, saved before the sync position moves
    past them, so a restart does not lose them."""

    def __init__(self, store_path: Path) -> None:
        self._path = store_path / "undecryptable.json"

    def load(self) -> list[Undecryptable]:
        try:
            data = json.loads(self._path.read_text(encoding="utf-8"))
            return [
                Undecryptable(
                    room_id=str(item["room_id"]),
                    source=dict(item["source"]),
                    first_seen=float(item["first_seen"]),
                    noticed=bool(item.get("noticed", False)),
                )
                for item in data
            ]
        except FileNotFoundError:
            return []

    def save(self, events: list[Undecryptable]) -> None:
        _write_private(
            self._path,
            json.dumps(
                [
                    {
                        "room_id": e.room_id,
                        "source": e.source,
                        "first_seen": e.first_seen,
                        "noticed": e.noticed,
                    }
                    for e in events
                ]
            ),
        )
