"""What the transport keeps under ``store_path`` besides nio's device keys.

``sync_position``, ``undecryptable.json``, ``set_aside.json`` and ``session.json``, each
written atomically (temp file, fsync, rename) and readable only by the owner; a damaged
file never stops the bridge: it is moved aside and logged (docs/deployment.md, "Inside the
Matrix transport").
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Generic, TypeVar

log = logging.getLogger(__name__)

T = TypeVar("T")
E = TypeVar("E", bound="KeptEvent")


def _write_private(path: Path, data: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _load_list(path: Path, parse: Callable[[Any], T]) -> list[T]:
    """The items of the JSON list in ``path``; [] when absent or damaged.

    A damaged file is renamed to ``<name>.damaged-<unix time>`` (kept for a
    person to look at, and out of the way of the next save) and logged.
    """
    try:
        raw = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return []
    except (OSError, ValueError) as exc:
        return _set_aside_damaged(path, exc)
    try:
        data = json.loads(raw)
    except ValueError as exc:
        return _set_aside_damaged(path, exc)
    if not isinstance(data, list):
        return _set_aside_damaged(path, TypeError(f"a list expected, not {type(data).__name__}"))
    try:
        return [parse(item) for item in data]
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        return _set_aside_damaged(path, exc)


def _set_aside_damaged(path: Path, problem: Exception) -> list[Any]:
    aside = path.with_name(f"{path.name}.damaged-{int(time.time())}")
    try:
        os.replace(path, aside)
    except OSError as exc:
        log.error("matrix: %s is damaged (%s) and cannot be moved: %s", path, problem, exc)
    else:
        log.error(
            "matrix: %s is damaged (%s); moved to %s, starting without it", path, problem, aside
        )
    return []


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


class _EventsFile(Generic[E]):
    """A list of events kept in one JSON file, each saved as its fields."""

    def __init__(self, path: Path, parse: Callable[[Any], E]) -> None:
        self._path = path
        self._parse = parse

    def load(self) -> list[E]:
        """The saved events; [] when there are none or the file is damaged."""
        return _load_list(self._path, self._parse)

    def save(self, events: list[E]) -> None:
        _write_private(self._path, json.dumps([asdict(e) for e in events]))


@dataclass(slots=True)
class KeptEvent:
    """A room's event kept in a file until it can be handed over."""

    room_id: str
    source: dict[str, Any]
    """The event's JSON (what it holds: see each kind)."""

    @property
    def event_id(self) -> str:
        return str(self.source.get("event_id", ""))


@dataclass(slots=True)
class Undecryptable(KeptEvent):
    """An encrypted event the bridge could not read yet, kept until its key arrives;
    ``source`` is the event as the server sent it (still encrypted)."""

    first_seen: float
    """Wall-clock time it was first seen (survives restarts)."""
    noticed: bool = False
    """The room was told it could not be read."""


def _undecryptable(item: Any) -> Undecryptable:
    return Undecryptable(
        room_id=str(item["room_id"]),
        source=dict(item["source"]),
        first_seen=float(item["first_seen"]),
        noticed=bool(item.get("noticed", False)),
    )


class UndecryptableFile(_EventsFile[Undecryptable]):
    """The encrypted events waiting for their keys, saved before the sync position moves
    past them, so a restart does not lose them."""

    def __init__(self, store_path: Path) -> None:
        super().__init__(store_path / "undecryptable.json", _undecryptable)


@dataclass(slots=True)
class SetAside(KeptEvent):
    """A readable event the service failed to take several times in a row; ``source`` is
    the event as readable JSON (decrypted, if it came encrypted)."""

    decrypted: bool
    """It came encrypted: ``source`` is the decrypted payload nio parsed."""
    first_failed: float
    failures: int
    next_try: float
    """Wall-clock time of the next attempt."""
    problem: str
    """The last error, for the log and a person reading the file."""


def _set_aside(item: Any) -> SetAside:
    return SetAside(
        room_id=str(item["room_id"]),
        source=dict(item["source"]),
        decrypted=bool(item.get("decrypted", False)),
        first_failed=float(item["first_failed"]),
        failures=int(item["failures"]),
        next_try=float(item["next_try"]),
        problem=str(item.get("problem", "")),
    )


class SetAsideFile(_EventsFile[SetAside]):
    """The events set aside so one the service cannot take does not block the others;
    saved before the sync position moves past them."""

    def __init__(self, store_path: Path) -> None:
        super().__init__(store_path / "set_aside.json", _set_aside)
