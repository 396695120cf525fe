"""``chatbridge``: run the bridge, check its configuration, migrate its database."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import sys
from collections.abc import Coroutine, Sequence
from importlib.metadata import version
from pathlib import Path
from typing import Any

from bridge.config import Settings, load_settings
from bridge.core.transport import TransportError
from bridge.errors import ChatbridgeError, ConfigError
from bridge.logs import setup_logging
from bridge.store.base import StoreError

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_CONFIG = 2

log = logging.getLogger("bridge")


def _parser() -> argparse.ArgumentParser:
    config_help = "TOML configuration file (default: $CHATBRIDGE_CONFIG; none: embedded defaults)"
    parser = argparse.ArgumentParser(
        prog="chatbridge",
        description="Bridge team chat (Matrix, Slack, console) to Claude Code.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {version('chatbridge')}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, text in (
        ("run", "run the bridge until SIGTERM/SIGINT (or end of console input)"),
        ("check-config", "validate the configuration and print it, secrets redacted"),
        ("migrate", "upgrade the database schema to the latest version"),
    ):
        cmd = sub.add_parser(name, help=text, description=text)
        cmd.add_argument("--config", type=Path, metavar="PATH", help=config_help)
    return parser


def _config_path(arg: Path | None) -> Path | None:
    if arg is not None:
        return arg
    env = os.environ.get("CHATBRIDGE_CONFIG")
    return Path(env) if env else None


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        settings = load_settings(_config_path(args.config))
    except ConfigError as exc:
        print(f"chatbridge: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    setup_logging(settings.logging)
    match args.command:
        case "check-config":
            print(json.dumps(settings.redacted(), indent=2, sort_keys=True))
            return EXIT_OK
        case "migrate":
            return _run(_migrate(settings))
        case _:
            return _run(_serve(settings))


async def _migrate(settings: Settings) -> None:
    from bridge.store.migrate import migrate

    await migrate(settings.database.url)
    log.info("database is up to date")


async def _serve(settings: Settings) -> None:
    from bridge.service import run_service

    await run_service(settings)


_EXPECTED = (ChatbridgeError, StoreError, TransportError)
"""Failures with a message meant for the operator: logged without a traceback."""


def _run(coro: Coroutine[Any, Any, None]) -> int:
    try:
        asyncio.run(coro)
    except _EXPECTED as exc:
        log.error("%s", exc)
        return EXIT_FAILURE
    except BaseExceptionGroup as group:
        # What fails inside the service's task group arrives wrapped.
        expected, rest = group.split(_EXPECTED)
        if rest is not None or expected is None:
            raise
        for leaf in _leaves(expected):
            log.error("%s", leaf)
        return EXIT_FAILURE
    return EXIT_OK


def _leaves(group: BaseExceptionGroup[BaseException]) -> list[BaseException]:
    out: list[BaseException] = []
    for exc in group.exceptions:
        out.extend(_leaves(exc) if isinstance(exc, BaseExceptionGroup) else [exc])
    return out
