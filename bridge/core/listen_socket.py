"""A listening TCP socket for ``host:port``, bound with the standard library only.

Binding is cheap and is where a setting fails (a port taken, a host that does
not resolve): the service binds its HTTP listeners at start-up and leaves
importing the server (aiohttp) until the rest is ready; connections made in
between wait in the kernel's queue (docs/operations.md, "The HTTP listeners").
A host that resolves to several addresses is bound on the first.
"""

from __future__ import annotations

import socket

from bridge.core.hostport import HostPort

BACKLOG = 128
"""Connections the kernel queues before they are accepted."""


def bind(listen: HostPort, backlog: int = BACKLOG) -> socket.socket:
    """A non-blocking socket listening on ``listen`` (port 0: any). Raises :class:`OSError`."""
    family, kind, proto, _, address = socket.getaddrinfo(
        listen.host or None, listen.port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
    )[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if family == socket.AF_INET6:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        sock.bind(address)
        sock.listen(backlog)
        sock.setblocking(False)
    except OSError:
        sock.close()
        raise
    return sock


def port_of(sock: socket.socket) -> int:
    return int(sock.getsockname()[1])
