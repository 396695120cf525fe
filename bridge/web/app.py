"""The web console as an aiohttp application, mounted at ``/web/`` (docs/web.md).

:func:`web_app` takes everything the pages need; the service builds it when
``[web] enabled`` and mounts it on the private HTTP listener. The live
watcher is the application's own task: started and cancelled with it.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from pathlib import Path

from aiohttp import web
from sqlalchemy.ext.asyncio import AsyncEngine

from bridge.web.auth import CALLER, Gate
from bridge.web.events import Watcher, stream
from bridge.web.reads import Reads
from bridge.web.settings import WebSettings
from bridge.web.tokens import Signer
from bridge.web.views import Actions, Console, environment

ROOT = "/web/"
STATIC = Path(__file__).with_name("static")
OPEN = ("/web/login", "/web/static/")
SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; frame-ancestors 'none'; form-action 'self'",
    "X-Content-Type-Options": "nosniff",
    # Not no-referrer: with it browsers send "Origin: null" on the console's own forms.
    "Referrer-Policy": "same-origin",
    "X-Frame-Options": "DENY",
}


def web_app(
    settings: WebSettings,
    signer: Signer,
    engine: AsyncEngine,
    actions: Actions,
    *,
    activity: Callable[[str], str | None],
    cluster_text: Callable[[], Awaitable[str]],
    budgets: Callable[[], tuple[float | None, Mapping[str, float]]],
) -> web.Application:
    gate = Gate(settings, signer, ROOT)
    reads = Reads(engine)
    console = Console(reads, gate, environment(), ROOT, actions, activity, cluster_text, budgets)
    watcher = Watcher(reads.fingerprint, settings.poll_s)

    @web.middleware
    async def authenticate(
        request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        if request.path.startswith(OPEN):
            response = await handler(request)
        else:
            caller = gate.caller(request)
            if caller is None:
                response = _signin(401, "Sign in first: this console shows nothing without it.")
            else:
                caller, new_nonce = gate.with_nonce(caller)
                request[CALLER] = caller
                response = await handler(request)
                if new_nonce is not None:
                    gate.set_nonce(response, new_nonce)
        for name, value in SECURITY_HEADERS.items():
            response.headers.setdefault(name, value)
        return response

    async def login(request: web.Request) -> web.StreamResponse:
        # The sign-in token is in this address: it goes nowhere from here.
        response = web.Response(
            status=303, headers={"Location": ROOT, "Referrer-Policy": "no-referrer"}
        )
        if not gate.sign_in(response, request.query.get("token", "")):
            return _signin(401, "That sign-in link is not valid (expired, or for no known person).")
        return response

    async def events(request: web.Request) -> web.StreamResponse:
        return await stream(request, watcher)

    async def watching(app: web.Application) -> AsyncIterator[None]:
        task = asyncio.create_task(watcher.run(), name="web-console-watcher")
        yield
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    app = web.Application(middlewares=[authenticate], client_max_size=64 * 1024)
    app.cleanup_ctx.append(watching)
    app.router.add_get("/login", login)
    app.router.add_static("/static/", STATIC, follow_symlinks=False)
    app.router.add_get("/", console.now)
    app.router.add_get("/approvals", console.approvals)
    app.router.add_post("/approvals/{id}", console.answer)
    app.router.add_get("/runs", console.runs)
    app.router.add_get("/runs/{id}", console.run)
    app.router.add_get("/spend", console.spend)
    app.router.add_get("/audit", console.audit)
    app.router.add_get("/cluster", console.cluster)
    app.router.add_get("/events", events)
    return app


def _signin(status: int, message: str) -> web.Response:
    html = environment().get_template("signin.html").render(message=message)
    return web.Response(status=status, text=html, content_type="text/html")
