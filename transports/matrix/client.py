"""The nio client the transport drives, and how its error objects become exceptions.

nio returns error *objects* instead of raising; :func:`check` turns them into
exceptions at this boundary, so the rest of the transport reads as ordinary
control flow.
"""

from __future__ import annotations

from nio import AsyncClient, AsyncClientConfig, ErrorResponse

from bridge.core.private import DIR_MODE, narrow, private_dirs
from bridge.core.transport import TransportError
from transports.matrix.settings import MatrixSettings

AUTH_ERRORS = frozenset({"M_UNKNOWN_TOKEN", "M_MISSING_TOKEN", "M_USER_DEACTIVATED"})
"""The credentials are gone: no request can succeed, so retrying is pointless."""
REFUSED = AUTH_ERRORS | {"M_FORBIDDEN"}
"""For a login or one send: this request will never be allowed."""
RATE_LIMITED = frozenset({"M_LIMIT_EXCEEDED", 429})
"""How nio reports a rate limit (the error code, or the bare HTTP status)."""


class Retryable(Exception):
    """An error response worth retrying; carries the response for the log."""

    def __init__(self, what: str, response: ErrorResponse) -> None:
        super().__init__(f"{what}: {response}")
        retry_after_ms = getattr(response, "retry_after_ms", None)
        self.retry_after_s = retry_after_ms / 1000 if retry_after_ms else 0.0
        """How long the server asked to wait (a rate limit), else 0."""


def check(what: str, response: object, permanent: frozenset[str] = AUTH_ERRORS) -> None:
    """Turn an error object into an exception: ``permanent`` codes end the transport."""
    if isinstance(response, ErrorResponse):
        if response.status_code in permanent:
            raise TransportError("matrix", f"{what} refused: {response.status_code}")
        raise Retryable(what, response)


def new_client(settings: MatrixSettings) -> AsyncClient:
    """A client over ``store_path`` (device keys), not yet logged in."""
    store = settings.store_path
    # The device keys: 0700 whatever the umask, an earlier laxer one narrowed.
    private_dirs(store)
    narrow(store, DIR_MODE)
    return AsyncClient(
        settings.homeserver,
        settings.user_id,
        store_path=str(store),
        config=AsyncClientConfig(
            # Surface connection errors and rate limits to our code instead
            # of nio retrying them out of sight: a send reports a rate limit
            # to the outbox, the sync loop waits as long as the server asks.
            max_timeouts=0,
            max_limit_exceeded=0,
            encryption_enabled=True,
            store_sync_tokens=False,
            request_timeout=30,
        ),
    )
