"""The console's Starlette application: pages rendered from ``SessionClient``'s answers, the live
transcript as server-sent events over ``SessionClient.follow``, and the operators' actions
(approve, deny, resolve, cancel) as POSTs through the same client calls the CLI makes.

Everything a model, a tool or an operator wrote is shown inert: Jinja escapes HTML, and every
value passes ``maka_core.facts.printable`` first (terminal escapes, bidi overrides and other
invisible characters shown as escapes), cut at ``MAX_TEXT`` characters. Refusals are pages (and
statuses) naming the CLI's stable code.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import jinja2
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response, StreamingResponse
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.templating import Jinja2Templates

from maka_core.audit.html import render_html
from maka_core.facts.printable import printable
from maka_core.facts.usage import step_tokens
from maka_core.ledger.resolver import FOR_OPERATOR
from maka_core.ledger.session_state import SHOWN_STATES
from maka_temporal.workers.client.answers import SessionError
from maka_temporal.workers.client.session_api import SessionClient
from maka_temporal.workers.client.session_list import MAX_LIMIT
from maka_temporal.workers.console.guard import COOKIE, Guard, Refused
from maka_temporal.workers.console.park_words import park_words

__all__ = ["MAX_TEXT", "build_app"]

HERE = Path(__file__).resolve().parent
#: The most characters of one value a page shows (the rest is counted, not sent).
MAX_TEXT = 20_000
#: Refusal codes that mean "no such thing": 404; every other refusal is 400.
_NOT_FOUND = ("session_not_found", "run_not_found", "approval_not_found", "operation_not_found")
_RESOLUTIONS = ("applied", "not_applied", "abandon")

Handler = Callable[[Request], Awaitable[Response]]


def shown(value: Any) -> Any:
    """What a page prints of ``value``: text made printable and cut at ``MAX_TEXT``."""
    if value is None or isinstance(value, (bool, int, float)):
        return value
    text = printable(value)
    if len(text) > MAX_TEXT:
        return f"{text[:MAX_TEXT]}… ({len(text) - MAX_TEXT} more characters)"
    return text


def _templates() -> Jinja2Templates:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(HERE / "templates"), autoescape=True, finalize=shown
    )
    env.globals["tokens"] = lambda usage: "" if usage is None else step_tokens(usage)
    env.globals["park_words"] = park_words
    env.globals["for_operator"] = FOR_OPERATOR
    return Jinja2Templates(env=env)


def build_app(client: SessionClient, guard: Guard | None = None, operator: str | None = None) -> Starlette:
    """The console over ``client`` (ledger-only when its ``client.client`` is None: the actions
    that need Temporal then refuse with its code). ``operator``: the name every action records as
    who took it unless its form names another (``maka console --operator``); an action that names
    nobody is refused, so no decision is recorded as nobody's."""
    guard = guard or Guard()
    templates = _templates()

    def page(request: Request, name: str, http_status: int = 200, **context: Any) -> Response:
        context.update(read_only=guard.read_only, csrf=guard.csrf, states=SHOWN_STATES, operator=operator)
        return templates.TemplateResponse(request, name, context, status_code=http_status)

    def refused(request: Request, status: int, code: str, message: str) -> Response:
        return page(request, "error.html", status, code=code, message=message)

    def guarded(handler: Handler, *, action: bool = False) -> Handler:
        async def run(request: Request) -> Response:
            try:
                bearer = request.headers.get("authorization", "").removeprefix("Bearer ") or None
                remember = guard.admit(
                    query_token=request.query_params.get("token"),
                    cookie=request.cookies.get(COOKIE),
                    bearer=bearer,
                    host=request.headers.get("host", ""),
                )
                if action:
                    if request.method != "POST":
                        raise Refused(405, "method_not_allowed", "an action is a POST")
                    form = await request.form()
                    csrf = form.get("csrf")
                    guard.check_action(csrf if isinstance(csrf, str) else None)
                response = await handler(request)
            except Refused as exc:
                return refused(request, exc.status, exc.code, exc.message)
            except SessionError as exc:
                return refused(request, 404 if exc.code in _NOT_FOUND else 400, exc.code, exc.message)
            if remember:
                response.set_cookie(COOKIE, guard.token or "", httponly=True, samesite="strict")
            return response

        return run

    async def home(request: Request) -> Response:
        return RedirectResponse("/sessions", status_code=303)

    async def sessions(request: Request) -> Response:
        state = request.query_params.get("state") or None
        host = request.query_params.get("host") or None
        listed = await client.list(state=state, host=host)
        every = await client.list(host=host, limit=MAX_LIMIT)
        counts = Counter(s.state for s in every)
        return page(request, "sessions.html", sessions=listed, counts=counts, state=state, host=host)

    async def approvals(request: Request) -> Response:
        """Every approval waiting, across the sessions the index lists as waiting on one."""
        waiting = []
        for listed in await client.list(state="awaiting_approval", limit=MAX_LIMIT):
            status = await client.status(listed.session_id)
            waiting += [(listed.session_id, a) for a in status.pending_approvals]
        return page(request, "approvals.html", waiting=waiting)

    async def session(request: Request) -> Response:
        sid = request.path_params["sid"]
        status = await client.status(sid)
        transcript = await client.show(sid)
        return page(request, "session.html", sid=sid, status=status, transcript=transcript)

    async def audit(request: Request) -> Response:
        """``maka audit --html``'s page (its lineage drawn, its escaping), for one session."""
        report = await client.audit(request.path_params["sid"])
        return HTMLResponse(render_html(report.raw))

    async def follow(request: Request) -> Response:
        sid = request.path_params["sid"]
        await client.status(sid)  # session_not_found as a page, before the stream starts

        async def events() -> AsyncIterator[str]:
            async for line in client.follow(sid):
                yield f"data: {json.dumps({'kind': line.kind, 'text': shown(line.text)})}\n\n"
            yield "event: settled\ndata: {}\n\n"

        return StreamingResponse(
            events(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"}
        )

    def back(sid: str) -> Response:
        return RedirectResponse(f"/sessions/{sid}", status_code=303)

    async def field(request: Request, name: str) -> str | None:
        value = (await request.form()).get(name)
        return value.strip() or None if isinstance(value, str) else None

    async def who(request: Request) -> str:
        """The operator an action records: the form's name, else the console's ``--operator``."""
        by = await field(request, "by") or operator
        if by is None:
            needs = "an action needs the operator's name (or maka console --operator)"
            raise Refused(400, "config_invalid", needs)
        return by

    async def approve(request: Request) -> Response:
        sid, aid = request.path_params["sid"], request.path_params["aid"]
        by = await who(request)
        await client.approve(sid, aid, phrase=await field(request, "phrase") or "", by=by)
        return back(sid)

    async def deny(request: Request) -> Response:
        sid, aid = request.path_params["sid"], request.path_params["aid"]
        await client.deny(sid, aid, by=await who(request), reason=await field(request, "reason"))
        return back(sid)

    async def resolve(request: Request) -> Response:
        sid, op = request.path_params["sid"], request.path_params["op"]
        decision, reason = await field(request, "decision"), await field(request, "reason")
        if decision not in _RESOLUTIONS:
            raise Refused(400, "config_invalid", f"decision must be one of {', '.join(_RESOLUTIONS)}")
        if reason is None:
            raise Refused(400, "config_invalid", "a resolution needs a reason")
        by = await who(request)
        await client.resolve(sid, op, decision=decision, by=by, reason=reason)  # type: ignore[arg-type]
        return back(sid)

    async def cancel(request: Request) -> Response:
        sid = request.path_params["sid"]
        await client.cancel(sid, reason=await field(request, "reason"), by=await who(request))
        return back(sid)

    def action(path: str, handler: Handler) -> Route:
        return Route(path, guarded(handler, action=True), methods=["GET", "POST"])

    routes = [
        Route("/", guarded(home)),
        Route("/sessions", guarded(sessions)),
        Route("/approvals", guarded(approvals)),
        Route("/sessions/{sid}", guarded(session)),
        Route("/sessions/{sid}/follow", guarded(follow)),
        Route("/sessions/{sid}/audit", guarded(audit)),
        action("/sessions/{sid}/approvals/{aid}/approve", approve),
        action("/sessions/{sid}/approvals/{aid}/deny", deny),
        action("/sessions/{sid}/operations/{op}/resolve", resolve),
        action("/sessions/{sid}/cancel", cancel),
        Mount("/static", StaticFiles(directory=HERE / "static"), name="static"),
    ]
    return Starlette(routes=routes)
