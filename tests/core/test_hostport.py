"""One ``host:port`` type for every listener (HTTP endpoints, Slack events)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import BaseModel, ValidationError

from bridge.config import HttpSettings
from bridge.core.hostport import HostPort
from transports.slack.settings import SlackSettings


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("127.0.0.1:8080", HostPort("127.0.0.1", 8080)),
        ("localhost:0", HostPort("localhost", 0)),
        ("0.0.0.0:65535", HostPort("0.0.0.0", 65535)),
        ("[::1]:8080", HostPort("::1", 8080)),
        ("[::]:3001", HostPort("::", 3001)),
        ("[fe80::1%eth0]:80", HostPort("fe80::1%eth0", 80)),
    ],
)
def test_parse(text: str, expected: HostPort) -> None:
    assert HostPort.parse(text) == expected
    assert str(expected) == text


@pytest.mark.parametrize(
    "text",
    [
        "",
        "localhost",
        ":8080",
        "localhost:",
        "localhost:http",
        "localhost:-1",
        "localhost:65536",
        "localhost:99999",
        "::1:8080",  # the last colon could be the address's
        "[]:8080",
        "[localhost]:8080",  # brackets are for IPv6 only
        "[::1]8080",
    ],
)
def test_parse_rejects(text: str) -> None:
    with pytest.raises(ValueError, match="host:port"):
        HostPort.parse(text)


@given(
    host=st.one_of(
        st.from_regex(r"[a-z][a-z0-9.-]{0,20}", fullmatch=True),
        st.ip_addresses().map(str),
    ),
    port=st.integers(0, 65535),
)
def test_text_round_trips(host: str, port: int) -> None:
    address = HostPort(host, port)
    assert HostPort.parse(str(address)) == address


class _Model(BaseModel):
    at: HostPort


def test_a_settings_field_takes_and_prints_the_text() -> None:
    model = _Model.model_validate({"at": "[::1]:9"})
    assert model.at == HostPort("::1", 9)
    assert model.model_dump(mode="json") == {"at": "[::1]:9"}
    assert _Model.model_validate_json('{"at": "h:1"}').at == HostPort("h", 1)
    assert _Model(at=HostPort("h", 2)).at.port == 2
    with pytest.raises(ValidationError, match="host:port"):
        _Model.model_validate({"at": "::1:9"})


def test_http_listen_empty_disables() -> None:
    assert HttpSettings(listen="").listen is None
    assert HttpSettings().listen == HostPort("127.0.0.1", 8080)


def test_http_and_slack_parse_alike() -> None:
    """Both listeners take IPv6 in brackets and refuse it without."""
    slack = {"bot_token": "b", "app_token": "a"}
    assert HttpSettings(listen="[::1]:0").listen == HostPort("::1", 0)
    assert SlackSettings(**slack, listen="[::1]:0").listen == HostPort("::1", 0)
    with pytest.raises(ValidationError, match="brackets"):
        HttpSettings(listen="::1:0")
    with pytest.raises(ValidationError, match="brackets"):
        SlackSettings(**slack, listen="::1:0")
