"""The console's pages: handlers that read (:mod:`bridge.web.reads`) and render (docs/web.md).

A page asked with ``X-Fragment: 1`` answers its ``<main>`` alone, which the
live pages swap in when the database changes.
"""

from __future__ import annotations

import hashlib
import time
import urllib.parse
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol

import jinja2
from aiohttp import web

from bridge.core.model import RunStatus
from bridge.core.transport import ApprovalChoice
from bridge.core.web_server import read_body
from bridge.store.base import Approval, AuditAction
from bridge.web.auth import CALLER, Caller, Gate
from bridge.web.reads import AuditQuery, Reads, RunQuery, SpendDay, conversation_name

NAV = (
    ("", "Now"),
    ("approvals", "Requests"),
    ("runs", "Runs"),
    ("spend", "Spend"),
    ("audit", "Audit"),
    ("cluster", "Cluster"),
)
MAX_REASON = 500
MAX_FORM_BYTES = 16 * 1024


class Actions(Protocol):
    """What the console may do besides reading: answer a request as a person of the chat."""

    def shown(self, approval: Approval) -> str:
        """The request as the room sees it (the whole input)."""

    async def answer(
        self, chat_ids: tuple[str, ...], approval_id: int, choice: ApprovalChoice, reason: str
    ) -> str:
        """Answer as the first of ``chat_ids`` that may; what to tell the person."""


def _ago(at: float | None) -> str:
    if at is None:
        return "–"
    seconds = max(0, int(time.time() - at))
    if seconds < 90:
        return f"{seconds}s ago"
    if seconds < 5400:
        return f"{seconds // 60}m ago"
    return f"{seconds // 3600}h ago"


def _utc(at: float | None) -> str:
    if at is None:
        return "–"
    return datetime.fromtimestamp(at, UTC).strftime("%Y-%m-%d %H:%M:%S")


def _money(value: float | None) -> str:
    return "unknown" if value is None else f"${value:.2f}"


def _seconds(value: float | None) -> str:
    return "–" if value is None else f"{value:.1f}s"


def environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.PackageLoader("bridge.web", "templates"),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
    )
    env.filters.update(
        ago=_ago, utc=_utc, money=_money, seconds=_seconds, conversation=conversation_name
    )
    return env


def digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


@dataclass(frozen=True, slots=True)
class Bar:
    day: str
    total: float
    x: float
    y: float
    w: float
    h: float


def chart(
    days: list[SpendDay], budget: float | None, width: int = 720, height: int = 160
) -> dict[str, Any]:
    top = max([d.total for d in days] + [budget or 0.0, 0.01])
    step = width / max(len(days), 1)
    bars = []
    for i, d in enumerate(days):
        h = height * d.total / top
        bars.append(Bar(d.day, d.total, i * step + step * 0.1, height - h, step * 0.8, h))
    budget_y = None if budget is None else height - height * budget / top
    return {"width": width, "height": height, "bars": bars, "budget_y": budget_y}


@dataclass(slots=True)
class Console:
    reads: Reads
    gate: Gate
    env: jinja2.Environment
    root: str
    actions: Actions
    activity: Callable[[str], str | None]
    cluster_text: Callable[[], Awaitable[str]]
    budgets: Callable[[], tuple[float | None, Mapping[str, float]]]
    """The service's daily budget, and each room's (by ``transport:room``)."""

    def _render(self, request: web.Request, name: str, title: str, **values: Any) -> web.Response:
        caller: Caller = request[CALLER]
        context = {
            "root": self.root,
            "nav": NAV,
            "title": title,
            "identity": caller.identity,
            "csrf": self.gate.csrf(caller),
            "live": values.pop("live", True),
            **values,
        }
        template = self.env.get_template(name)
        if request.headers.get("X-Fragment") == "1":
            html = "".join(template.blocks["main"](template.new_context(context)))
        else:
            html = template.render(context)
        return web.Response(text=html, content_type="text/html", headers=_NO_STORE)

    async def now(self, request: web.Request) -> web.Response:
        waiting = await self.reads.waiting()
        return self._render(request, "now.html", "Now", waiting=waiting, activity=self._activity)

    def _activity(self, run_id: str) -> str:
        return self.activity(run_id) or ""

    async def approvals(self, request: web.Request, notice: str = "") -> web.Response:
        requests = await self.reads.approvals()
        return self._render(
            request,
            "approvals.html",
            "Requests",
            requests=requests,
            shown=self.actions.shown,
            digest=lambda r: digest(self.actions.shown(r)),
            notice=notice,
            live=not notice,
        )

    async def answer(self, request: web.Request) -> web.Response:
        caller: Caller = request[CALLER]
        body = await read_body(request, MAX_FORM_BYTES)
        form = {k: v[0] for k, v in urllib.parse.parse_qs(body.decode(errors="replace")).items()}
        if not self.gate.form_ok(caller, request, str(form.get("csrf", ""))):
            raise web.HTTPForbidden(
                text="This form is not yours (CSRF check failed): reload the page."
            )
        try:
            approval_id = int(request.match_info["id"])
            choice = {"allow": ApprovalChoice.ALLOW, "deny": ApprovalChoice.DENY}[
                str(form.get("choice"))
            ]
        except (ValueError, KeyError):
            raise web.HTTPBadRequest(text="Answer with allow or deny.") from None
        reason = str(form.get("reason", ""))[:MAX_REASON]
        approval = await self.reads.approval(approval_id)
        if approval is None:
            notice = "No such request."
        elif digest(self.actions.shown(approval)) != str(form.get("digest", "")):
            notice = "The request is not the one you saw: it was not answered. Look again."
        else:
            chat_ids = self.gate.settings.chat_ids(caller.identity)
            notice = await self.actions.answer(chat_ids, approval_id, choice, reason)
        return await self.approvals(request, notice)

    async def runs(self, request: web.Request) -> web.Response:
        params = request.query
        q = RunQuery(
            text=params.get("q", "")[:200],
            conversation=params.get("conversation", "")[:300],
            status=params.get("status", "") if params.get("status") in set(RunStatus) else "",
            before_seq=_int(params.get("before")),
        )
        runs = await self.reads.runs(q)
        more = _older(
            {"q": q.text, "conversation": q.conversation, "status": q.status},
            runs[-1].seq if runs else None,
        )
        return self._render(
            request,
            "runs.html",
            "Runs",
            runs=runs,
            q=q,
            more=more,
            statuses=[s.value for s in RunStatus],
            retryable={s.value for s in RunStatus if s.retryable},
        )

    async def run(self, request: web.Request) -> web.Response:
        detail = await self.reads.run(request.match_info["id"])
        if detail is None:
            raise web.HTTPNotFound(text="No such run.")
        return self._render(
            request,
            "run.html",
            "Runs",
            d=detail,
            activity=self._activity,
            retryable={s.value for s in RunStatus if s.retryable},
        )

    async def spend(self, request: web.Request) -> web.Response:
        days = min(max(_int(request.query.get("days")) or 14, 1), 90)
        per_day = await self.reads.spend(days)
        service_budget, room_budgets = self.budgets()
        names = sorted({r for d in per_day for r in d.by_room} | set(room_budgets))
        today = per_day[-1] if per_day else None
        rooms = [
            {
                "name": name,
                "today": today.by_room.get(name, 0.0) if today else 0.0,
                "budget": room_budgets.get(name),
                "total": sum(d.by_room.get(name, 0.0) for d in per_day),
            }
            for name in names
        ]
        return self._render(
            request,
            "spend.html",
            "Spend",
            days=per_day,
            rooms=rooms,
            service_budget=service_budget,
            chart=chart(per_day, service_budget),
        )

    async def audit(self, request: web.Request) -> web.Response:
        params = request.query
        q = AuditQuery(
            action=params.get("action", "") if params.get("action") in set(AuditAction) else "",
            conversation=params.get("conversation", "")[:300],
            actor=params.get("actor", "")[:300],
            run_id=params.get("run", "")[:64],
            before_id=_int(params.get("before")),
        )
        rows = await self.reads.audit(q)
        more = _older(
            {
                "action": q.action,
                "conversation": q.conversation,
                "actor": q.actor,
                "run": q.run_id,
            },
            rows[-1].id if rows else None,
        )
        return self._render(
            request,
            "audit.html",
            "Audit",
            rows=rows,
            q=q,
            more=more,
            actions=[a.value for a in AuditAction],
        )

    async def cluster(self, request: web.Request) -> web.Response:
        return self._render(request, "cluster.html", "Cluster", status=await self.cluster_text())


_NO_STORE = {"Cache-Control": "no-store"}


def _older(filters: Mapping[str, str], before: int | None) -> str:
    """The query of the next, older page: the same filters, before the last row shown."""
    return urllib.parse.urlencode({**filters, "before": "" if before is None else before})


def _int(value: str | None) -> int | None:
    if value is None or not value.isascii() or not value.isdigit() or len(value) > 18:
        return None
    return int(value)
