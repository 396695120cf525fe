"""Logging in: an access token, the device saved by an earlier password login, or a new one.

A password login creates a device (and its encryption keys); its token is
saved under ``store_path`` so every later start reuses that device.
"""

from __future__ import annotations

import asyncio
import logging

from nio import AsyncClient, ErrorResponse, WhoamiResponse

from bridge.core.transport import RateLimited, TransportError
from transports.backoff import Backoff, Sleep, retry
from transports.matrix.client import REFUSED, Retryable, check
from transports.matrix.settings import MatrixSettings
from transports.matrix.state import SavedSession, SessionFile

log = logging.getLogger(__name__)


async def log_in(
    client: AsyncClient,
    settings: MatrixSettings,
    backoff: Backoff,
    sleep: Sleep = asyncio.sleep,
) -> None:
    """Log ``client`` in, retrying with backoff until the server answers.

    Raises :class:`TransportError` when the server refuses the credentials,
    which no retry can fix.
    """
    session_file = SessionFile(settings.store_path)

    async def attempt() -> None:
        try:
            await _log_in_once(client, settings, session_file)
        except Retryable as exc:
            if exc.retry_after_s:
                # Wait as long as the server asks (retry() honours RateLimited).
                raise RateLimited("matrix", exc.retry_after_s, str(exc)) from exc
            raise

    await retry(
        attempt,
        what="matrix login",
        backoff=backoff,
        fatal=(TransportError,),
        sleep=sleep,
    )


async def _log_in_once(
    client: AsyncClient, settings: MatrixSettings, session_file: SessionFile
) -> None:
    token = settings.access_token.get_secret_value()
    if token:
        who = await _whoami(client, settings, token)
        if who is None:
            raise TransportError("matrix", "the access token was refused")
        client.restore_login(who.user_id, who.device_id, token)
        return
    saved = session_file.load(settings.user_id)
    if saved is not None:
        if await _whoami(client, settings, saved.access_token) is not None:
            client.restore_login(saved.user_id, saved.device_id, saved.access_token)
            return
        log.warning("matrix: the saved session was refused; logging in with a new device")
        session_file.forget()
    response = await client.login(
        settings.password.get_secret_value(), device_name=settings.device_name
    )
    check("login", response, REFUSED)
    session_file.save(SavedSession(response.user_id, response.device_id, response.access_token))


async def _whoami(
    client: AsyncClient, settings: MatrixSettings, token: str
) -> WhoamiResponse | None:
    """Who ``token`` belongs to; None if the server refuses it."""
    client.access_token = token
    response = await client.whoami()
    if isinstance(response, ErrorResponse):
        client.access_token = ""
        if response.status_code in REFUSED:
            return None
        raise Retryable("whoami", response)
    if response.user_id != settings.user_id:
        raise TransportError(
            "matrix", f"the token belongs to {response.user_id}, not {settings.user_id}"
        )
    return response
