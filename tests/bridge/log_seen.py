"""A log handler that lets a test wait for a record."""

from __future__ import annotations

import asyncio
import logging


class LogSeen(logging.Handler):
    """Sets ``seen`` once a record contains ``text`` (logging runs in the loop's thread)."""

    def __init__(self, text: str) -> None:
        super().__init__(logging.INFO)
        self.text = text
        self.seen = asyncio.Event()

    def emit(self, record: logging.LogRecord) -> None:
        if self.text in record.getMessage():
            self.seen.set()
