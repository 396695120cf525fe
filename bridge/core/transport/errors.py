"""What a transport raises, for the service to tell a retry from a refusal::

    TransportError        could not deliver or connect (retry later)
    ├── RateLimited       the server said "too many requests": wait retry_after_s
    ├── Undeliverable     the server refused this reply for good (no retry helps)
    └── FileTooLarge      a file being fetched turned out larger than its limit

docs/transports.md, "Errors".
"""

from __future__ import annotations


class TransportError(Exception):
    """A transport could not deliver or connect; carries the transport's name."""

    def __init__(self, transport: str, message: str) -> None:
        super().__init__(f"{transport}: {message}")
        self.transport = transport


class RateLimited(TransportError):
    """The server rate-limited the request; try again after ``retry_after_s``."""

    def __init__(self, transport: str, retry_after_s: float, message: str = "rate limited") -> None:
        super().__init__(transport, f"{message} (retry after {retry_after_s:g}s)")
        self.retry_after_s = retry_after_s


class Undeliverable(TransportError):
    """The server refused this reply for good (too large, no such room, not a member)."""


class FileTooLarge(TransportError):
    """A file being fetched (``Outbound.fetch_attachment``) grew past ``limit_bytes``;
    what was written is incomplete."""

    def __init__(self, transport: str, limit_bytes: int) -> None:
        super().__init__(transport, f"the file is larger than {limit_bytes} bytes")
        self.limit_bytes = limit_bytes
