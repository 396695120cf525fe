"""Logging to stderr, as plain text or one JSON object per line.

Lines logged while handling a room or a run carry its ids: :func:`log_context`
sets them in a context variable, which each asyncio task inherits as a copy,
so concurrent runs never mix their ids up.
"""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from datetime import UTC, datetime
from typing import TextIO

from bridge.config import LoggingSettings

_room: ContextVar[str | None] = ContextVar("chatbridge_log_room", default=None)
_run: ContextVar[str | None] = ContextVar("chatbridge_log_run", default=None)

OWN_PACKAGES = ("bridge", "dispatcher", "runner", "transports", "migrations")
"""Loggers at ``[logging] level``; everything else is at ``library_level``."""

_TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s%(context)s: %(message)s"


@contextmanager
def log_context(*, room: object = None, run: object = None) -> Iterator[None]:
    """Tag every line logged inside with the room and/or run."""
    tokens = []
    if room is not None:
        tokens.append((_room, _room.set(str(room))))
    if run is not None:
        tokens.append((_run, _run.set(str(run))))
    try:
        yield
    finally:
        for var, token in reversed(tokens):
            var.reset(token)


class ContextFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        room, run = _room.get(), _run.get()
        # LogRecord takes extra attributes by design; mypy does not know them.
        record.__dict__.update(room=room, run=run)
        parts = [f"{k}={v}" for k, v in (("room", room), ("run", run)) if v]
        record.context = f" [{' '.join(parts)}]" if parts else ""
        return True


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, object] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key in ("room", "run"):
            value = getattr(record, key, None)
            if value:
                entry[key] = value
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return json.dumps(entry, ensure_ascii=False)


def setup_logging(settings: LoggingSettings, stream: TextIO | None = None) -> None:
    handler = logging.StreamHandler(stream if stream is not None else sys.stderr)
    handler.addFilter(ContextFilter())
    if settings.format == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter(_TEXT_FORMAT))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    # The root level governs every library (nio, aiosqlite, markdown-it, ...):
    # at DEBUG they log each request and parse, which costs time on every
    # message. chatbridge's own packages get the configured level.
    root.setLevel(settings.library_level)
    for package in OWN_PACKAGES:
        logging.getLogger(package).setLevel(settings.level)
