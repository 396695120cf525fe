"""Where the console may be served (docs/web.md, "Turning it on"): never on the listener
that serves webhooks to the internet."""

from __future__ import annotations

from pathlib import Path

import pytest

from bridge.config import load_settings
from bridge.errors import ConfigError
from tests.bridge.harness import write_config

REFUSED = r"web\.enabled: the console is served on \[http\] listen"


def test_a_console_on_the_public_listeners_address_is_refused(tmp_path: Path) -> None:
    shared = {
        "http": {"listen": "0.0.0.0:8080", "public_listen": "0.0.0.0:8080"},
        "web": {"enabled": True, "identities": {"alice": ["U0ALICE"]}},
    }
    with pytest.raises(ConfigError, match=REFUSED):
        load_settings(write_config(tmp_path, shared))


def test_a_console_without_a_private_listener_is_refused(tmp_path: Path) -> None:
    config = {"http": {"listen": ""}, "web": {"enabled": True, "identities": {"a": ["U1"]}}}
    with pytest.raises(ConfigError, match=REFUSED):
        load_settings(write_config(tmp_path, config))


def test_a_console_beside_a_separate_public_listener_is_accepted(tmp_path: Path) -> None:
    config = {
        "http": {"listen": "127.0.0.1:8080", "public_listen": "0.0.0.0:8443"},
        "web": {"enabled": True, "identities": {"alice": ["U0ALICE"]}},
    }
    assert load_settings(write_config(tmp_path, config)).web.enabled
