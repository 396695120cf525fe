"""Who is asking: a bearer token, a browser session, or a trusted proxy's header (docs/web.md).

Every console request but sign-in and static files needs an identity listed
in ``[web] identities``; anything else gets 401 and learns nothing. Forms of
a browser session carry a CSRF token bound to the session's identity and its
nonce cookie; a bearer token is not sent by browsers on their own, so its
requests need none.
"""

from __future__ import annotations

import ipaddress
import secrets
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from enum import Enum

from aiohttp import web

from bridge.web.settings import WebSettings
from bridge.web.tokens import Signer

SESSION_COOKIE = "chatbridge_session"
NONCE_COOKIE = "chatbridge_nonce"
LOGIN = "login"
SESSION = "session"
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class Via(Enum):
    BEARER = "bearer"
    SESSION = "session"
    PROXY = "proxy"


@dataclass(frozen=True, slots=True)
class Caller:
    identity: str
    via: Via
    nonce: str
    """The browser's nonce cookie ("" for a bearer token)."""


CALLER = web.RequestKey("caller", Caller)
"""The request's signed-in person, set by the console's middleware."""


def _trusted(peer: str | None, proxies: tuple[str, ...]) -> bool:
    if peer is None:
        return False
    try:
        address = ipaddress.ip_address(peer)
    except ValueError:
        return False
    for entry in proxies:
        try:
            if address in ipaddress.ip_network(entry, strict=False):
                return True
        except ValueError:
            continue
    return False


@dataclass(slots=True)
class Gate:
    settings: WebSettings
    signer: Signer
    root: str
    """The path the console is mounted at: its cookies are sent there only."""
    clock: Callable[[], float] = time.time

    def caller(self, request: web.Request) -> Caller | None:
        """The known identity behind ``request``, or None."""
        now = self.clock()
        identity: str | None = None
        via = Via.BEARER
        scheme, _, token = request.headers.get("Authorization", "").partition(" ")
        if scheme.lower() == "bearer" and token:
            identity = self.signer.verify(LOGIN, token.strip(), now)
        elif (cookie := request.cookies.get(SESSION_COOKIE)) is not None:
            identity, via = self.signer.verify(SESSION, cookie, now), Via.SESSION
        elif self.settings.identity_header and _trusted(
            request.remote, self.settings.trusted_proxies
        ):
            # Two of them: one may be the client's, kept by a proxy that added its own.
            values = request.headers.getall(self.settings.identity_header, [])
            identity = values[0].strip() or None if len(values) == 1 else None
            via = Via.PROXY
        if identity is None or not self.settings.knows(identity):
            return None
        nonce = "" if via is Via.BEARER else request.cookies.get(NONCE_COOKIE, "")
        return Caller(identity, via, nonce)

    def csrf(self, caller: Caller) -> str:
        return "" if caller.via is Via.BEARER else self.signer.csrf(caller.identity, caller.nonce)

    def form_ok(self, caller: Caller, request: web.Request, token: str) -> bool:
        """A state-changing request of ``caller`` is their own, not a forged cross-site one."""
        if caller.via is Via.BEARER:
            return True
        origin = request.headers.get("Origin")
        if origin is not None and origin not in self._origins(request):
            return False
        if not caller.nonce or not token:
            return False
        return secrets.compare_digest(token, self.signer.csrf(caller.identity, caller.nonce))

    def _origins(self, request: web.Request) -> set[str]:
        """The console's own origins: as requested, and as a TLS proxy in front serves it
        (``secure_cookies``, or the ``X-Forwarded-Proto`` of a trusted proxy)."""
        schemes = {request.scheme}
        if self.settings.secure_cookies:
            schemes.add("https")
        if _trusted(request.remote, self.settings.trusted_proxies):
            forwarded = request.headers.get("X-Forwarded-Proto", "").strip().lower()
            if forwarded in ("http", "https"):
                schemes.add(forwarded)
        return {f"{scheme}://{request.host}" for scheme in schemes}

    def sign_in(self, response: web.StreamResponse, token: str) -> bool:
        """Exchange a login token for a session cookie; False if the token is no good."""
        now = self.clock()
        valid = self.signer.verified(LOGIN, token, now)
        if valid is None or not self.settings.knows(valid[0]):
            return False
        identity, token_expires = valid
        # Never longer than the link itself was good for (``web-token --hours``).
        expires = min(now + self.settings.token_ttl_s, token_expires)
        path = self.root
        session = self.signer.mint(SESSION, identity, expires)
        for name, value in ((SESSION_COOKIE, session), (NONCE_COOKIE, secrets.token_urlsafe(16))):
            response.set_cookie(
                name,
                value,
                path=path,
                max_age=max(1, int(expires - now)),
                httponly=True,
                samesite="Strict",
                secure=self.settings.secure_cookies,
            )
        return True

    def with_nonce(self, caller: Caller) -> tuple[Caller, str | None]:
        """A proxy-signed-in browser without a nonce cookie gets one (returned to set)."""
        if caller.via is not Via.PROXY or caller.nonce:
            return caller, None
        nonce = secrets.token_urlsafe(16)
        return Caller(caller.identity, caller.via, nonce), nonce

    def set_nonce(self, response: web.StreamResponse, nonce: str) -> None:
        response.set_cookie(
            NONCE_COOKIE,
            nonce,
            path=self.root,
            httponly=True,
            samesite="Strict",
            secure=self.settings.secure_cookies,
        )
