"""The nio client the transport drives, and how its error objects become exceptions.

nio returns error *objects* instead of raising; :func:`check` turns them into
exceptions at this boundary, so the rest of the transport reads as ordinary
control flow.
"""

from __future__ import annotations

from nio import AsyncClient, AsyncClientConfig, ErrorResponse

from bridge.core.transport import TransportError
from transports.matrix.settings import MatrixSettings

AUTH_ERRORS = frozenset({"M_UNKNOWN_TOKEN", "M_MISSING_TOKEN", "M_USER_DEACTIVATED"})
"""The credentials are gone: no request can succeed, so retrying is pointless."""
REFUSED = AUTH_ERRORS | {"M_FORBIDDEN"}
"""For a login or one send: this request will never be allowed."""


class Retryable(Exception):
    """An error response worth retrying; carries the response for the log."""

    def __init__(self, what: str, response: ErrorResponse) -> None:
        super().__init__(f"{what}: {response}")


def check(what: str, response: object, permanent: frozenset[str] = AUTH_ERRORS) -> None:
    """Turn an error object into an exception: ``permanent`` codes end the transport."""
    if isinstance(response, ErrorResponse):
        if response.status_code in permanent:
            raise TransportError("matrix", f"{what} refused: {response.status_code}")
        raise Retryable(what, response)


def new_client(settings: MatrixSettings) -> AsyncClient:
    """A client over ``store_path`` (device keys), not yet logged in."""
    store = settings.store_path
    store.mkdir(parents=True, exist_ok=True, mode=0o700)
    return AsyncClient(
        settings.homeserver,
        settings.user_id,
        store_path=str(store),
        config=AsyncClientConfig(
            # Surface connection errors and repeated rate limits to our
            # loop instead of nio retrying them forever out of sight.
            max_timeouts=0,
            max_limit_exceeded=3,
            encryption_enabled=True,
            store_sync_tokens=False,
            request_timeout=30,
        ),
    )
