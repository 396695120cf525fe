"""The Web API client: one place that sets base URL, token and retry policy.

The client retries nothing. A ``429`` surfaces at once (as
``SlackApiError``; :mod:`.outbound` turns it into ``RateLimited`` with the
server's ``Retry-After``) because every caller has a better answer than
sleeping inside the call: the durable outbox waits and retries answers; a
reply to a command or a display-name lookup sits on the inbound path, where
a sleep would delay the acknowledgement of every later event; progress
edits and reactions are cosmetic and are dropped first. Dropped connections
are not retried either: a ``chat.postMessage`` whose connection broke may
have been posted, and only the caller knows how to find out (see
:meth:`.outbound.SlackOutbound.send`).
"""

from __future__ import annotations

from collections.abc import Mapping

from slack_sdk.web.async_client import AsyncWebClient

DEFAULT_RETRY_AFTER_S = 1.0


def retry_after_seconds(headers: Mapping[str, object]) -> float:
    """The ``Retry-After`` of a 429 in seconds; 1 when missing or unreadable."""
    for name, values in headers.items():
        if name.lower() != "retry-after":
            continue
        value = values[0] if isinstance(values, list | tuple) and values else values
        try:
            return max(0.0, float(str(value)))
        except ValueError:
            break
    return DEFAULT_RETRY_AFTER_S


def web_client(token: str | None, base_url: str, *, timeout_s: int = 30) -> AsyncWebClient:
    """An ``AsyncWebClient`` without retries (an empty list: the library's default retries)."""
    return AsyncWebClient(token=token, base_url=base_url, timeout=timeout_s, retry_handlers=[])
