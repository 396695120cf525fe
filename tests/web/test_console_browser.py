"""The web console in a real browser (Debian's chromium, driven by Playwright) against a
real ``chatbridge run`` (docs/web.md): a run shown live, a request approved from the
web reaching claude, its audit row, and nothing shown to anyone not signed in."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import socket
import sqlite3
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from playwright.async_api import Browser, async_playwright

from tests.config_files import merged, write_toml
from tests.service_process import CHATBRIDGE, base_config, run_service

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
WAIT_MS = 30_000
SHOTS = os.environ.get("CHATBRIDGE_WEB_SHOTS")
"""A folder to save screenshots of the main pages in (docs/images is made so)."""

pytestmark = [pytest.mark.slow]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
async def browser() -> AsyncIterator[Browser]:
    if not Path(CHROMIUM).exists():
        if os.environ.get("CI"):
            pytest.fail("chromium is not installed (scripts/install-peers.sh installs it)")
        pytest.skip("chromium is not installed")
    async with async_playwright() as playwright:
        launched = await playwright.chromium.launch(
            executable_path=CHROMIUM,
            args=[
                "--no-sandbox",
                "--disable-gpu",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                "--no-first-run",
            ],
        )
        try:
            yield launched
        finally:
            await launched.close()


def config(tmp_path: Path, port: int) -> Path:
    table: dict[str, Any] = merged(
        base_config(tmp_path),
        {
            "console": {"enabled": True, "user": "ops"},
            "http": {"listen": f"127.0.0.1:{port}"},
            "dispatcher": {"coalesce_ms": 50},
            "defaults": {
                "approve_tools": True,
                "approvers": ["ops"],
                "allowed_users": ["ops"],
                "env": {
                    "FAKE_CLAUDE_ECHO": "1",
                    "FAKE_CLAUDE_TOOL_COMMAND": "make deploy",
                    "FAKE_CLAUDE_TOOL_LOG": str(tmp_path / "tools.jsonl"),
                },
            },
            "web": {"enabled": True, "identities": {"alice@example.com": ["ops"]}, "poll_s": 0.1},
        },
    )
    return write_toml(tmp_path / "chatbridge.toml", table)


def sign_in_link(path: Path) -> str:
    done = subprocess.run(
        [str(CHATBRIDGE), "web-token", "alice@example.com", "--config", str(path)],
        capture_output=True,
        text=True,
        check=True,
        cwd=path.parent,
    )
    return done.stdout.strip()


async def shot(page: Any, name: str) -> None:
    if SHOTS:
        Path(SHOTS).mkdir(parents=True, exist_ok=True)
        await page.screenshot(path=str(Path(SHOTS) / f"web-{name}.png"), full_page=True)


async def test_a_request_approved_in_the_browser_reaches_claude_and_is_audited(
    tmp_path: Path, browser: Browser
) -> None:
    port = free_port()
    path = config(tmp_path, port)
    async with run_service(path, {}, stdin=True) as service:
        assert service.process.stdin is not None
        link = sign_in_link(path)
        assert link.startswith(f"http://127.0.0.1:{port}/web/login?token=")
        context = await browser.new_context(viewport={"width": 1280, "height": 800})
        page = await context.new_page()
        await page.goto(link)
        await page.wait_for_selector("h1:has-text('Now')", timeout=WAIT_MS)
        assert "Nothing is running" in await page.inner_text("main")

        # A message in chat: the open page shows the run and its request without a reload.
        service.process.stdin.write(b"please deploy\n")
        await service.process.stdin.drain()
        await page.wait_for_selector("text=#1 Bash", timeout=WAIT_MS)
        await shot(page, "now")

        await page.click("text=Requests")
        await page.wait_for_selector("section.request", timeout=WAIT_MS)
        assert "make deploy" in await page.inner_text("section.request")
        await shot(page, "requests")
        await page.click("button:has-text('Allow once')")
        await page.wait_for_selector(".notice", timeout=WAIT_MS)
        notice = await page.inner_text(".notice")
        assert "Allowed" in notice or "allowed" in notice

        # The tool ran: claude was told "allow" with the input shown.
        log = tmp_path / "tools.jsonl"
        async with asyncio.timeout(WAIT_MS / 1000):
            while not log.exists() or "make deploy" not in log.read_text():
                await asyncio.sleep(0.05)
        await page.click("text=Runs")
        await page.wait_for_selector("td:has-text('please deploy')", timeout=WAIT_MS)
        await shot(page, "runs")
        await page.click("text=Audit")
        await page.wait_for_selector("td:has-text('approval_allowed')", timeout=WAIT_MS)
        await shot(page, "audit")
        await page.goto(f"http://127.0.0.1:{port}/web/spend")
        await shot(page, "spend")
        await context.close()

    with sqlite3.connect(tmp_path / "chatbridge.db") as db:
        rows = db.execute("select actor from audit where action = 'approval_allowed'").fetchall()
    assert rows == [("ops",)]
    [used] = [json.loads(line) for line in log.read_text().splitlines()]
    assert "make deploy" in json.dumps(used)


async def test_a_browser_not_signed_in_is_shown_nothing(tmp_path: Path, browser: Browser) -> None:
    port = free_port()
    path = config(tmp_path, port)
    async with run_service(path, {}, stdin=True) as service:
        assert service.process.stdin is not None
        service.process.stdin.write(b"a secret plan\n")
        await service.process.stdin.drain()
        context = await browser.new_context()
        page = await context.new_page()
        for where in ("", "runs", "approvals", "audit", "spend", "cluster"):
            response = await page.goto(f"http://127.0.0.1:{port}/web/{where}")
            assert response is not None
            assert response.status == 401
            text = await page.inner_text("body")
            assert "Sign in first" in text
            assert "secret plan" not in text
        await context.close()
    assert sys.executable  # the service ran under this interpreter's venv
