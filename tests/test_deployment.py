"""compose.yaml and the Dockerfile cannot run here (no container engine): check
what can be checked - they parse, name only what exists, set only real settings."""

from __future__ import annotations

import re
import shlex
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import BaseModel

from bridge.config import RoomDefaults, Settings

ROOT = Path(__file__).parents[1]


def setting_exists(name: str) -> bool:
    """``CHATBRIDGE_RUNNER__CLAUDE_BIN`` -> Settings.runner.claude_bin exists."""
    if name == "CHATBRIDGE_CONFIG":
        return True
    parts = name.removeprefix("CHATBRIDGE_").lower().split("__")
    model: Any = Settings
    for part in parts:
        fields = model.model_fields
        if part not in fields:
            return False
        annotation = fields[part].annotation
        candidates = [a for a in getattr(annotation, "__args__", (annotation,))]
        models = [c for c in candidates if isinstance(c, type) and issubclass(c, BaseModel)]
        model = models[0] if models else None
        if model is None and part != parts[-1]:
            return False
    return True


def test_setting_exists_can_say_no() -> None:
    assert setting_exists("CHATBRIDGE_RUNNER__CLAUDE_BIN")
    assert setting_exists("CHATBRIDGE_MATRIX__ACCESS_TOKEN")
    assert not setting_exists("CHATBRIDGE_RUNNER__CLAUDE")
    assert not setting_exists("CHATBRIDGE_NOPE__X")
    assert "cwd" in RoomDefaults.model_fields


def dockerfile() -> list[tuple[str, str]]:
    text = (ROOT / "Dockerfile").read_text().replace("\\\n", " ")
    out = []
    for raw in text.splitlines():
        line = raw.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def test_dockerfile_copies_what_exists_and_runs_as_non_root() -> None:
    instructions = dockerfile()
    words = [w for w, _ in instructions]
    assert words[0] == "FROM"
    assert "slim" in instructions[0][1]
    for word, rest in instructions:
        if word == "COPY":
            *sources, _dest = shlex.split(rest)
            for source in sources:
                assert (ROOT / source).exists(), source
    users = [rest for word, rest in instructions if word == "USER"]
    assert users
    assert users[-1] not in ("root", "0")
    entry = yaml.safe_load(next(rest for word, rest in instructions if word == "ENTRYPOINT"))
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    # chatbridge never runs as PID 1: tini reaps orphans and forwards signals.
    assert entry[:2] == ["tini", "--"]
    assert entry[2] in scripts
    health = next(rest for word, rest in instructions if word == "HEALTHCHECK")
    assert "/healthz" in health


def test_dockerfile_installs_tini() -> None:
    installs = [rest for word, rest in dockerfile() if word == "RUN" and "apt-get install" in rest]
    assert any(re.search(r"\btini\b", rest) for rest in installs)


def test_dockerfile_sets_only_real_settings() -> None:
    for word, rest in dockerfile():
        if word == "ENV":
            for name in re.findall(r"(CHATBRIDGE_[A-Z_]+)=", rest):
                assert setting_exists(name), name


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    data = yaml.safe_load((ROOT / "compose.yaml").read_text())
    assert isinstance(data, dict)
    return data


def test_compose_services(compose: dict[str, Any]) -> None:
    services = compose["services"]
    assert {"chatbridge", "postgres", "synapse"} <= set(services)
    bridge = services["chatbridge"]
    assert bridge["build"] == "."
    assert bridge["depends_on"]["postgres"]["condition"] == "service_healthy"
    assert "healthcheck" in bridge
    assert "healthcheck" in services["postgres"]
    assert services["synapse"]["profiles"] == ["dev"]
    # The web console only behind a signing-in proxy, and only its /web/ paths.
    console = services["console"]
    assert console["profiles"] == ["web"]
    assert "--upstream=http://chatbridge:8080/web/" in console["command"]
    assert "127.0.0.1:4180:4180" in console["ports"]
    assert bridge["env_file"] == ".env"
    assert bridge["init"] is True
    # Replicas: three by default, coordinating through PostgreSQL, each with its own
    # state directory (not on a shared volume) and the Matrix store shared.
    assert bridge["deploy"]["replicas"] == 3
    env = bridge["environment"]
    assert env["CHATBRIDGE_CLUSTER__ENABLED"] == "true"
    assert env["CHATBRIDGE_DATABASE__URL"].startswith("postgresql+asyncpg://")
    state_dir = env["CHATBRIDGE_RUNNER__STATE_DIR"]
    mounts = [v.split(":")[1] for v in bridge["volumes"]]

    def under(path: str, mount: str) -> bool:
        return path == mount or path.startswith(mount.rstrip("/") + "/")

    assert not any(under(state_dir, m) for m in mounts), (state_dir, mounts)
    assert any(under(env["CHATBRIDGE_MATRIX__STORE_PATH"], m) for m in mounts)
    assert "ports" not in bridge  # replicas cannot share a host port; the lb has it
    lb = services["lb"]
    assert "./deploy/haproxy.cfg" in lb["volumes"][0]
    haproxy = (ROOT / "deploy" / "haproxy.cfg").read_text()
    assert "server-template" in haproxy
    assert "chatbridge:3001" in haproxy
    named = set(compose["volumes"])
    for service in services.values():
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            if source.startswith("./"):
                continue  # bind mounts are the operator's files (chatbridge.toml)
            assert source in named, source


def test_compose_sets_only_real_settings(compose: dict[str, Any]) -> None:
    env = compose["services"]["chatbridge"]["environment"]
    for name in env:
        assert setting_exists(name), name
    example = (ROOT / "deploy" / "env.example").read_text()
    for name in re.findall(r"^(CHATBRIDGE_[A-Z_]+)=", example, flags=re.M):
        assert setting_exists(name), name
