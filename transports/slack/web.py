"""The Web API client: one place that sets base URL, token and retry policy.

The client retries nothing: a ``429`` surfaces at once as ``SlackApiError`` (with its
``Retry-After``), and a dropped connection is not retried. :func:`check_token` turns a
refused token into :class:`SettingRefused`, naming the setting to change
(docs/deployment.md, "Inside the Slack transport").
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from slack_sdk.errors import SlackApiError
from slack_sdk.web.async_client import AsyncWebClient

from bridge.core.transport import TransportError

DEFAULT_RETRY_AFTER_S = 1.0

AUTH_ERRORS = frozenset(
    {
        "not_authed",
        "invalid_auth",
        "token_revoked",
        "token_expired",
        "account_inactive",
        "missing_scope",
        "no_permission",
        "not_allowed_token_type",
        "team_access_not_granted",
        "ekm_access_denied",
    }
)
"""The token (or the app's scopes) is refused: nothing can be posted anywhere
until an operator changes the app or the token and restarts, so no retry helps.
Retrying would also hold up every later answer of the room (the outbox
delivers a room's answers in order)."""


class SettingRefused(TransportError):
    """A setting cannot work as it is (a token Slack refuses, a port taken): no retry helps.

    The transport's connect loop lets it through instead of retrying, so a
    start-up fails at once with one line naming the setting.
    """


def error_code(exc: SlackApiError) -> str:
    """The ``error`` of a Web API answer (``invalid_auth``); ``unknown`` if it has none."""
    response: Any = exc.response
    try:
        return str(response.get("error", "unknown"))
    except AttributeError:
        return "unknown"


def check_token(exc: SlackApiError, setting: str, method: str) -> None:
    """Raise :class:`SettingRefused` naming ``setting`` if ``exc`` says its token is refused."""
    code = error_code(exc)
    if code in AUTH_ERRORS:
        # The code only: the answer never carries the token, but keep it that way.
        raise SettingRefused("slack", f"{setting} refused by Slack ({method}: {code})") from None


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
