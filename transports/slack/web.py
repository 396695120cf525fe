"""The Web API client: one place that sets base URL, token and retry policy."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from slack_sdk.http_retry.async_handler import AsyncRetryHandler
from slack_sdk.http_retry.builtin_async_handlers import AsyncConnectionErrorRetryHandler
from slack_sdk.http_retry.request import HttpRequest
from slack_sdk.http_retry.response import HttpResponse
from slack_sdk.http_retry.state import RetryState
from slack_sdk.web.async_client import AsyncWebClient

log = logging.getLogger(__name__)

Sleep = Callable[[float], Awaitable[None]]

# A Retry-After beyond this is not waited out inside one call: the caller
# (a reply, a reaction) would hold the room far longer than is useful.
MAX_RETRY_AFTER_S = 120.0


def retry_after_seconds(response: HttpResponse) -> float:
    """The ``Retry-After`` of a 429 in seconds; 1 when missing or unreadable."""
    for name, values in response.headers.items():
        if name.lower() == "retry-after" and values:
            try:
                return max(0.0, float(values[0]))
            except ValueError:
                break
    return 1.0


class RetryAfterHandler(AsyncRetryHandler):
    """Retries a call answered ``429 Too Many Requests`` after its ``Retry-After``.

    Like slack_sdk's ``AsyncRateLimitErrorRetryHandler``, but the wait is
    exactly the server's (no added random second, which slows tests and
    bursts of replies alike), capped, and the sleep is injectable so tests
    can check the delay without waiting for it.
    """

    def __init__(self, max_retry_count: int, sleep: Sleep = asyncio.sleep) -> None:
        super().__init__(max_retry_count=max_retry_count)
        self._sleep = sleep

    async def _can_retry_async(
        self,
        *,
        state: RetryState,
        request: HttpRequest,
        response: HttpResponse | None = None,
        error: Exception | None = None,
    ) -> bool:
        return response is not None and response.status_code == 429

    async def prepare_for_next_attempt_async(
        self,
        *,
        state: RetryState,
        request: HttpRequest,
        response: HttpResponse | None = None,
        error: Exception | None = None,
    ) -> None:
        # _can_retry_async only says yes with a response; 1 s if that ever changes.
        delay = 1.0 if response is None else min(retry_after_seconds(response), MAX_RETRY_AFTER_S)
        log.info("slack rate limited %s; retrying in %.1f s", request.url, delay)
        state.next_attempt_requested = True
        await self._sleep(delay)
        state.increment_current_attempt()


def web_client(
    token: str, base_url: str, *, rate_limit_retries: int, sleep: Sleep = asyncio.sleep
) -> AsyncWebClient:
    """An ``AsyncWebClient`` that retries 429s and dropped connections."""
    return AsyncWebClient(
        token=token,
        base_url=base_url,
        retry_handlers=[
            RetryAfterHandler(rate_limit_retries, sleep),
            AsyncConnectionErrorRetryHandler(max_retry_count=2),
        ],
    )
