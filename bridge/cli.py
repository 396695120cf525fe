"""``chatbridge``: run the bridge, check its configuration, migrate its database.

Imports are deferred to the command that needs them: ``--version`` and
``--help`` load argparse alone, and ``run`` loads only the parts its
configuration uses (tests/bridge/test_startup.py holds that line).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Coroutine, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from logging import Logger
    from pathlib import Path

    from bridge.config import Settings

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_CONFIG = 2
EXIT_INTERRUPTED = 130
"""128 + SIGINT, as a shell reports a command that Ctrl-C ended."""


def _log() -> Logger:
    import logging

    return logging.getLogger("bridge")


class _VersionAction(argparse.Action):
    """``--version`` from ``bridge.__version__``: importlib.metadata alone costs ~100 ms."""

    def __init__(self, option_strings: Sequence[str], dest: str, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, nargs=0, help="show the version and exit")

    def __call__(self, parser: argparse.ArgumentParser, *args: Any, **kwargs: Any) -> None:
        from bridge import __version__

        print(f"{parser.prog} {__version__}")
        parser.exit()


def _parser() -> argparse.ArgumentParser:
    config_help = "TOML configuration file (default: $CHATBRIDGE_CONFIG; none: embedded defaults)"
    parser = argparse.ArgumentParser(
        prog="chatbridge",
        description="Bridge team chat (Matrix, Slack, console) to Claude Code.",
    )
    parser.add_argument("--version", action=_VersionAction)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, text in (
        ("run", "run the bridge until SIGTERM/SIGINT (or end of console input)"),
        ("check-config", "validate the configuration and print it, secrets redacted"),
        ("migrate", "upgrade the database schema to the latest version"),
        ("status", "print the replicas, leases, runs and inbox lag the database records"),
    ):
        cmd = sub.add_parser(name, help=text, description=text)
        cmd.add_argument("--config", metavar="PATH", help=config_help)
    text = "print a sign-in link for the web console (docs/web.md)"
    cmd = sub.add_parser("web-token", help=text, description=text)
    cmd.add_argument("--config", metavar="PATH", help=config_help)
    cmd.add_argument("identity", help="a person listed in [web] identities")
    cmd.add_argument(
        "--hours", type=float, default=None, help="how long it lasts (default: [web] token_ttl_s)"
    )
    return parser


def _config_path(arg: str | None) -> Path | None:
    from pathlib import Path

    path = arg if arg is not None else os.environ.get("CHATBRIDGE_CONFIG")
    return Path(path) if path else None


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    from bridge.config import load_settings
    from bridge.errors import ConfigError
    from bridge.host.logs import setup_logging

    try:
        settings = load_settings(_config_path(args.config))
    except ConfigError as exc:
        print(f"chatbridge: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    setup_logging(settings.logging)
    match args.command:
        case "check-config":
            return _check_config(settings)
        case "migrate":
            return _run(_migrate(settings))
        case "status":
            return _run(_status(settings))
        case "web-token":
            return _web_token(settings, args.identity, args.hours)
        case _:
            return _run(_serve(settings))


def _check_config(settings: Settings) -> int:
    """The effective configuration on stdout; on stderr the claude binary runs would use."""
    import json

    from bridge.host.claude_check import check_binary, credentials_warning

    print(json.dumps(settings.redacted(), indent=2, sort_keys=True))
    binary = check_binary(settings.runner.claude_bin, os.environ)
    print(binary.describe(), file=sys.stderr)
    warning = credentials_warning(settings, os.environ)
    if warning is not None:
        print(f"warning: {warning}", file=sys.stderr)
    return EXIT_OK if binary.problem is None else EXIT_FAILURE


def _web_token(settings: Settings, identity: str, hours: float | None) -> int:
    """A login token for ``identity``, and the link that signs a browser in with it."""
    import time

    from bridge.web.tokens import Signer, load_secret

    if not settings.web.knows(identity):
        print(f"chatbridge: {identity!r} is not in [web] identities", file=sys.stderr)
        return EXIT_CONFIG
    ttl = settings.web.token_ttl_s if hours is None else hours * 3600
    if not 0 < ttl < 10 * 365 * 86400:  # also false for nan; inf would crash the minting
        print("chatbridge: --hours must be more than 0 and less than ten years", file=sys.stderr)
        return EXIT_CONFIG
    signer = Signer(load_secret(settings.web_secret_file))
    token = signer.mint("login", identity, time.time() + ttl)
    listen = settings.http.listen
    where = f"http://{listen.host}:{listen.port}" if listen is not None else ""
    print(f"{where}/web/login?token={token}")
    print(f"Bearer token (for scripts): {token}", file=sys.stderr)
    return EXIT_OK


async def _migrate(settings: Settings) -> None:
    from bridge.errors import StartupError
    from bridge.store.base import StoreError
    from bridge.store.migrate import migrate

    try:
        await migrate(settings.database.url)
    except StoreError as exc:
        # As at start-up: the setting, then the first line of the driver's message.
        raise StartupError(f"database.url: {str(exc).splitlines()[0]}") from exc
    _log().info("database is up to date")


async def _status(settings: Settings) -> None:
    from bridge.cluster.status_report import status_text

    print(await status_text(settings))


async def _serve(settings: Settings) -> None:
    from bridge.service import run_service

    await run_service(settings)


def _expected() -> tuple[type[Exception], ...]:
    """Failures with a message meant for the operator: logged without a traceback."""
    from bridge.core.transport import TransportError
    from bridge.errors import ChatbridgeError
    from bridge.store.base import StoreError

    return (ChatbridgeError, StoreError, TransportError)


def _run(coro: Coroutine[Any, Any, None]) -> int:
    import asyncio

    operator_errors = _expected()
    try:
        asyncio.run(coro)
    except KeyboardInterrupt:
        # Ctrl-C before the service's own signal handlers are in place (while
        # the store opens): asyncio.run cancelled the start-up, nothing to add.
        _log().info("interrupted while starting")
        return EXIT_INTERRUPTED
    except operator_errors as exc:
        _log().error("%s", exc)
        return EXIT_FAILURE
    except BaseExceptionGroup as group:
        # What fails inside the service's task group arrives wrapped.
        expected, rest = group.split(operator_errors)
        if rest is not None or expected is None:
            raise
        # A part that failed and the start-up it failed can carry one message twice.
        for line in dict.fromkeys(str(leaf) for leaf in _leaves(expected)):
            _log().error("%s", line)
        return EXIT_FAILURE
    return EXIT_OK


def _leaves(group: BaseExceptionGroup[BaseException]) -> list[BaseException]:
    out: list[BaseException] = []
    for exc in group.exceptions:
        out.extend(_leaves(exc) if isinstance(exc, BaseExceptionGroup) else [exc])
    return out
