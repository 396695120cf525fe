"""What one client may take of an HTTP listener (``[http]``'s settings; docs/operations.md).

Apart from bridge/core/web_server.py, which enforces them, so that the service
can build them at start-up without importing the server (aiohttp).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class ClientLimits:
    """What one client may take of a listener."""

    head_timeout_s: float = 5.0
    body_timeout_s: float = 10.0
    max_connections: int = 64
    max_head_line: int = 8190
    """Bytes of the request target, and of each header's name and value (aiohttp's default)."""
    max_headers: int = 64
