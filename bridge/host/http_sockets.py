"""The HTTP listeners' sockets, bound at start-up (bridge/host/http.py serves them once ready).

Binding first, serving later keeps a setting's failure (a port taken, a host
that does not resolve) a start-up error naming it, while the import of the
server (aiohttp) waits until the rest is ready; clients that connect in
between wait in the kernel's queue. The same address for both listeners is
one socket.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass

from bridge.core.hostport import HostPort
from bridge.core.listen_socket import bind, port_of
from bridge.errors import StartupError


@dataclass(frozen=True, slots=True)
class HttpSockets:
    private: socket.socket | None
    """``[http] listen``: /healthz, /readyz, /metrics."""
    public: socket.socket | None
    """``[http] public_listen``: the webhooks; ``private`` itself when they share an address."""

    @property
    def private_port(self) -> int | None:
        return None if self.private is None else port_of(self.private)

    @property
    def public_port(self) -> int | None:
        return None if self.public is None else port_of(self.public)

    def close(self) -> None:
        for sock in (self.private, self.public):
            if sock is not None:
                sock.close()


def bind_http(listen: HostPort | None, public_listen: HostPort | None) -> HttpSockets:
    """Both listeners' sockets; a :class:`StartupError` naming the setting that cannot listen."""
    private = _bind("listen", listen)
    try:
        public = private if public_listen == listen else _bind("public_listen", public_listen)
    except StartupError:
        if private is not None:
            private.close()
        raise
    return HttpSockets(private, public)


def _bind(setting: str, address: HostPort | None) -> socket.socket | None:
    if address is None:
        return None
    try:
        return bind(address)
    except OSError as exc:
        raise StartupError(f"http.{setting} = {address}: cannot listen: {_reason(exc)}") from None


def _reason(exc: OSError) -> str:
    """The one line the operator sees after the setting and the address."""
    if isinstance(exc, socket.gaierror):
        return exc.strerror or str(exc)  # its errno is getaddrinfo's, unknown to os.strerror
    return os.strerror(exc.errno) if exc.errno else str(exc)
