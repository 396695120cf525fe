"""The ``chatbridge`` MCP server of a run's claude: one tool, ``send_file``.

An SDK server (no process): claude sends each JSON-RPC message in an ``mcp_message`` control
request, and the run's supervisor answers with :class:`Server`, attached bridge or not. The
tool only checks the path (:func:`check_sendable`, applied again by the bridge) and answers
``queued <name>``. Imported by the supervisor at start: standard library only, ``os`` and
``stat`` at import (docs/files.md, "The tool" and "Why our own server").
"""

from __future__ import annotations

import os
import stat

TYPE_CHECKING = False
"""As ``typing.TYPE_CHECKING`` (mypy takes either), without importing ``typing`` at each start."""

if TYPE_CHECKING:
    from pathlib import Path
    from typing import Any

SERVER_NAME = "chatbridge"
TOOL_NAME = "send_file"
QUALIFIED_TOOL = f"mcp__{SERVER_NAME}__{TOOL_NAME}"
"""The tool's name as claude reports and permits it."""
PROTOCOL_VERSION = "2025-06-18"
"""The MCP revision answered when the client asks for one this server does not know."""
KNOWN_VERSIONS = frozenset({"2024-11-05", "2025-03-26", "2025-06-18", "2025-11-25"})

TOOL_DESCRIPTION = (
    "Post a file from the working directory to the chat room this conversation comes"
    " from. The path is relative to the working directory (or absolute inside it);"
    " files outside it, directories and files over the size limit are refused."
)


class NotSendable(Exception):
    """The path may not be sent; the message says why, for claude and the room."""


class Sendable:
    """A file that passed :func:`check_sendable`."""

    __slots__ = ("path", "size")

    def __init__(self, path: Path, size: int) -> None:
        self.path = path
        """Resolved (symlinks followed), inside the resolved working directory."""
        self.size = size


def check_sendable(cwd: Path, path: str, max_bytes: int) -> Sendable:
    """``path`` (relative to ``cwd``, or absolute) if it may be posted; else NotSendable.

    Symlinks are resolved before the containment check, so neither ``..``
    nor an absolute path nor a link can reach outside ``cwd``. Only regular
    files of at most ``max_bytes`` bytes pass (no device, FIFO or directory).
    """
    if not path or "\0" in path:
        raise NotSendable("no path given")
    root = cwd.resolve()
    try:
        target = (root / path).resolve()
    except (OSError, RuntimeError, ValueError) as exc:  # a symlink loop; a lone surrogate
        raise NotSendable(f"{path}: no such file") from exc
    # Before looking at the file: whether something exists outside is not told.
    if not target.is_relative_to(root):
        raise NotSendable(f"{path}: outside the working directory")
    try:
        info = target.stat()
    except OSError as exc:
        raise NotSendable(f"{path}: no such file") from exc
    if not stat.S_ISREG(info.st_mode):
        raise NotSendable(f"{path}: not a regular file")
    if info.st_size > max_bytes:
        raise NotSendable(f"{path}: {info.st_size} bytes, over the limit of {max_bytes}")
    if not os.access(target, os.R_OK):
        raise NotSendable(f"{path}: cannot be read")
    return Sendable(target, info.st_size)


def _tool() -> dict[str, Any]:
    return {
        "name": TOOL_NAME,
        "description": TOOL_DESCRIPTION,
        "inputSchema": {
            "type": "object",
            "properties": {
                "path": {"type": "string", "description": "The file to post."},
                "comment": {"type": "string", "description": "A message to post with it."},
            },
            "required": ["path"],
        },
    }


class Server:
    """Answers one JSON-RPC message at a time for the run in ``cwd``."""

    __slots__ = ("cwd", "max_bytes")

    def __init__(self, cwd: str, max_bytes: int) -> None:
        self.cwd = cwd
        self.max_bytes = max_bytes

    def handle(self, message: dict[str, Any]) -> dict[str, Any] | None:
        """The response to ``message``; None for a notification (no ``id``)."""
        if "id" not in message:
            return None
        request_id = message["id"]
        method = message.get("method")
        params = message.get("params") or {}
        if not isinstance(params, dict):
            error = {"code": -32602, "message": "params must be an object"}
            return {"jsonrpc": "2.0", "id": request_id, "error": error}
        if method == "initialize":
            asked = params.get("protocolVersion")
            known = isinstance(asked, str) and asked in KNOWN_VERSIONS
            result: dict[str, Any] = {
                "protocolVersion": asked if known else PROTOCOL_VERSION,
                "capabilities": {"tools": {}},
                "serverInfo": {"name": SERVER_NAME, "version": "1"},
            }
        elif method == "ping":
            result = {}
        elif method == "tools/list":
            result = {"tools": [_tool()]}
        elif method == "tools/call":
            result = self._call(params)
        else:
            error = {"code": -32601, "message": f"method not found: {method}"}
            return {"jsonrpc": "2.0", "id": request_id, "error": error}
        return {"jsonrpc": "2.0", "id": request_id, "result": result}

    def _call(self, params: dict[str, Any]) -> dict[str, Any]:
        if params.get("name") != TOOL_NAME:
            return _text(f"unknown tool {params.get('name')!r}", error=True)
        arguments = params.get("arguments") or {}
        path = arguments.get("path") if isinstance(arguments, dict) else None
        if not isinstance(path, str):
            return _text("path must be a string", error=True)
        from pathlib import Path  # only now: a run that sends no file never loads it

        try:
            sendable = check_sendable(Path(self.cwd), path, self.max_bytes)
        except NotSendable as exc:
            return _text(f"not sent: {exc}", error=True)
        return _text(f"queued {sendable.path.name}")


def _text(text: str, *, error: bool = False) -> dict[str, Any]:
    return {"content": [{"type": "text", "text": text}], "isError": error}
