"""``maka console``'s web app (``workers.console``) over a real ledger, through ``SessionClient``
(ledger-only here: no Temporal server), served by Starlette's test client over real HTTP requests.

What is pinned: the sessions page lists the ledger's sessions with counts by state and its filters;
a session page shows its state, park reason and transcript; content from the ledger renders inert
(HTML escaped, terminal escapes and bidi overrides shown as escapes, huge text cut); refusals are
pages with the CLI's stable codes (``session_not_found`` 404); every action is a POST with the CSRF
token (``csrf_invalid`` 403 without it or with a wrong one, negative control: the right token gets
past the guard to the client's own refusal); ``--read-only`` shows no form that posts and refuses
every action (``console_read_only`` 403); off loopback the access token is required
(``console_token_required`` 401) and a ``?token=`` becomes an HttpOnly cookie; an action records
the operator's name (the form's, else ``--operator``) and one that names nobody is refused
(``config_invalid``); a parked session's reason is said in plain words, one entry per park reason.
"""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import pytest
from starlette.testclient import TestClient

from maka_core.runtime import model_step
from maka_core.runtime.contracts import PARK_REASONS, ModelStepInput
from maka_core.runtime.runtime import Runtime
from maka_core.store.writer import LedgerStore
from maka_core.workspace import Workspace
from maka_temporal.workers.client.session_api import SessionClient
from maka_temporal.workers.console.app import MAX_TEXT, build_app, shown
from maka_temporal.workers.console.guard import COOKIE, Guard, is_loopback
from maka_temporal.workers.console.park_words import PARK_WORDS
from tests.test_session_list import _begin, _finish, _ids, make_sessions

HOSTILE = "<script>alert(1)</script>\x1b[31mred\u202eevil"


@pytest.fixture
def ledger(store: LedgerStore, store_url: str, tmp_path: Path) -> str:
    if store_url == "sqlite://":
        pytest.skip("an in-memory ledger is its one connection's: the console opens its own")
    root = tmp_path / "ws"
    root.mkdir(exist_ok=True)
    ws = Workspace.open(root)
    rt = Runtime(store)
    try:
        make_sessions(rt, ws)
        _begin(rt, ws, _ids("hostile", 1), 1800, host=HOSTILE)
        _finish(rt, _ids("hostile", 1), 1801, "failed", park="max_steps_exceeded")
        spent = _ids("spent", 1)  # a turn whose one model step reported its tokens
        _begin(rt, ws, spent, 1900)
        said = {"kind": "script", "steps": [{"text": "ok", "usage": {"input": 30, "output": 12}}]}
        asyncio.run(
            model_step.model_step(
                rt, ModelStepInput(ids=spent, step=0, workspace=str(ws.root), provider=said)
            )
        )
        _finish(rt, spent, 1901)
    finally:
        rt.close()
    return store_url


def _client(ledger: str, guard: Guard | None = None, operator: str | None = None) -> TestClient:
    app = build_app(SessionClient(None, ledger=ledger), guard, operator=operator)
    return TestClient(app, base_url="http://127.0.0.1:8580", follow_redirects=False)


def _csrf(html: str) -> str:
    found = re.search(r'name="csrf" value="([0-9a-f]+)"', html)
    assert found, "no CSRF field in the page"
    return found.group(1)


def test_sessions_page_lists_counts_and_filters(ledger: str) -> None:
    web = _client(ledger)
    assert web.get("/").headers["location"] == "/sessions"
    page = web.get("/sessions")
    assert page.status_code == 200, page.text
    for sid in ("idle", "twice", "failed", "parked", "running", "hostpark", "cancelled", "hostile"):
        assert f'href="/sessions/{sid}"' in page.text, sid
    assert re.search(r'class="state parked">parked <b>3</b>', page.text), (
        page.text
    )  # parked, hostpark, hostile
    parked = web.get("/sessions", params={"state": "parked"}).text
    assert 'href="/sessions/hostpark"' in parked and 'href="/sessions/idle"' not in parked
    alpha = web.get("/sessions", params={"host": "alpha"}).text
    assert 'href="/sessions/idle"' in alpha and 'href="/sessions/twice"' not in alpha
    bad = web.get("/sessions", params={"state": "sleeping"})
    assert bad.status_code == 400 and '<code id="code">config_invalid</code>' in bad.text


def test_hostile_content_renders_inert(ledger: str, store: LedgerStore) -> None:
    # The control: the ledger really holds the hostile host, raw.
    assert any(r.host == HOSTILE for r in store.list_sessions(limit=100))
    web = _client(ledger)
    for path in ("/sessions", "/sessions/hostile"):
        html = web.get(path).text
        assert "<script>alert" not in html and "\x1b" not in html and "\u202e" not in html, path
        assert "&lt;script&gt;alert(1)&lt;/script&gt;\\x1b[31mred\\u202eevil" in html, path
    huge = shown("x" * (MAX_TEXT + 5))
    assert len(huge) < MAX_TEXT + 40 and huge.endswith("(5 more characters)")


def test_session_page_shows_state_and_transcript(ledger: str) -> None:
    web = _client(ledger)
    page = web.get("/sessions/parked")
    assert page.status_code == 200, page.text
    assert '<b class="state parked" id="state">parked</b>' in page.text
    assert '<span id="park-reason">max_steps_exceeded</span>' in page.text
    assert '<span class="line">' in page.text  # the transcript's lines
    missing = web.get("/sessions/nobody")
    assert missing.status_code == 404 and '<code id="code">session_not_found</code>' in missing.text


def test_actions_need_a_post_with_the_csrf_token(ledger: str) -> None:
    web = _client(ledger, Guard())
    running = web.get("/sessions/running").text
    token = _csrf(running)
    url = "/sessions/running/approvals/nope/deny"
    for form in ({}, {"csrf": "0" * 64}):
        refused = web.post(url, data=form)
        assert refused.status_code == 403 and "csrf_invalid" in refused.text, form
    assert web.get(url).status_code == 405
    # The negative control: the right token passes the guard and reaches the client's own refusal.
    passed = web.post(url, data={"csrf": token, "reason": "no", "by": "ops"})
    assert passed.status_code in (400, 404) and "csrf_invalid" not in passed.text, passed.text


def test_read_only_shows_no_buttons_and_refuses_every_action(ledger: str) -> None:
    web = _client(ledger, Guard(read_only=True))
    for path in ("/sessions/running", "/sessions/parked"):
        assert 'method="post"' not in web.get(path).text, path
    writable = _client(ledger, Guard()).get("/sessions/running").text
    assert 'method="post"' in writable  # the control: the same page read-write has its cancel form
    for url in (
        "/sessions/running/cancel",
        "/sessions/running/approvals/a/approve",
        "/sessions/parked/operations/o/resolve",
    ):
        refused = web.post(url, data={"csrf": Guard().csrf})
        assert refused.status_code == 403 and "console_read_only" in refused.text, url


def test_on_loopback_a_request_must_name_a_loopback_host(ledger: str) -> None:
    """No token on loopback, so a site whose name resolves to 127.0.0.1 (DNS rebinding) must not be
    served: its pages would carry the CSRF token to that site's script."""
    web = _client(ledger)
    for host in ("evil.example", "evil.example:8580", "10.0.0.1"):
        refused = web.get("/sessions", headers={"host": host})
        assert refused.status_code == 403 and "console_host_refused" in refused.text, host
    for host in ("127.0.0.1:8580", "localhost:8580", "[::1]:8580", "localhost"):  # control
        assert web.get("/sessions", headers={"host": host}).status_code == 200, host
    # With a token (off loopback) the token is the gate, whatever name the request uses.
    tokened = _client(ledger, Guard(token="t" * 24))
    assert tokened.get("/sessions?token=" + "t" * 24, headers={"host": "console.example"}).status_code == 200


def test_off_loopback_the_access_token_is_required(ledger: str) -> None:
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("192.168.1.4")
    web = _client(ledger, Guard(token="t" * 24))
    refused = web.get("/sessions")
    assert refused.status_code == 401 and "console_token_required" in refused.text
    assert web.get("/sessions", params={"token": "wrong"}).status_code == 401
    admitted = web.get("/sessions", params={"token": "t" * 24})
    assert admitted.status_code == 200 and COOKIE in admitted.headers["set-cookie"]
    assert "httponly" in admitted.headers["set-cookie"].lower()
    assert web.get("/sessions").status_code == 200  # the cookie now
    bearer = _client(ledger, Guard(token="t" * 24)).get(
        "/sessions", headers={"Authorization": "Bearer " + "t" * 24}
    )
    assert bearer.status_code == 200


def test_follow_streams_the_transcript_as_server_sent_events(ledger: str) -> None:
    web = _client(ledger)
    with web.stream("GET", "/sessions/parked/follow") as stream:
        assert stream.headers["content-type"].startswith("text/event-stream")
        body = "".join(stream.iter_text())
    data = [line for line in body.splitlines() if line.startswith("data: {")]
    assert any('"text": "user: hi"' in line for line in data), body
    assert body.rstrip().endswith("event: settled\ndata: {}"), body
    assert web.get("/sessions/nobody/follow").status_code == 404  # refused before the stream starts


def test_every_park_reason_has_plain_words_and_a_parked_page_says_them() -> None:
    assert set(PARK_WORDS) == PARK_REASONS
    assert all(len(words) > 40 and words.endswith(".") for words in PARK_WORDS.values())


def test_a_parked_page_says_its_reason_in_plain_words(ledger: str) -> None:
    page = _client(ledger).get("/sessions/parked").text
    assert '<span id="park-reason">max_steps_exceeded</span>' in page
    words = re.search(r'<p class="note" id="park-words">([^<]+)</p>', page)
    assert words and words.group(1) == PARK_WORDS["max_steps_exceeded"].replace("'", "&#39;"), page
    assert 'id="park-words"' not in _client(ledger).get("/sessions/running").text  # not parked


def test_an_action_records_the_operators_name_and_one_that_names_nobody_is_refused(ledger: str) -> None:
    web = _client(ledger)
    page = web.get("/sessions/running").text
    assert 'name="by" placeholder="your name" value=""' in page
    url = "/sessions/running/approvals/nope/deny"
    nobody = web.post(url, data={"csrf": _csrf(page), "reason": "no"})
    assert nobody.status_code == 400 and '<code id="code">config_invalid</code>' in nobody.text, nobody.text
    # Named by the console's operator: the name check passes and the client's own refusal answers.
    named = _client(ledger, operator="Ada Lovelace")
    page = named.get("/sessions/running").text
    assert 'name="by" placeholder="your name" value="Ada Lovelace"' in page
    passed = named.post(url, data={"csrf": _csrf(page), "reason": "no"})
    assert passed.status_code in (400, 404) and "config_invalid" not in passed.text, passed.text


def test_a_session_page_shows_its_tokens_per_turn_and_the_session(ledger: str) -> None:
    web = _client(ledger)
    page = web.get("/sessions/spent").text
    assert '<b id="session-tokens">42</b>' in page, page
    rows = re.findall(r'<td class="tokens">([^<]*)</td>', page)
    assert rows == ["42"], rows
    # The control: a session whose steps reported nothing says so, one row per turn.
    twice = web.get("/sessions/twice").text
    assert '<b id="session-tokens">none reported</b>' in twice
    assert re.findall(r'<td class="tokens">([^<]*)</td>', twice) == ["", ""]


def test_the_audit_page_needs_temporal_and_says_so_without_it(ledger: str) -> None:
    """Ledger-only here: the audit compares with Temporal's histories, so it is refused with the
    CLI's code (the browser flow, ``test_console_flow``, draws one against a real server)."""
    web = _client(ledger)
    assert 'href="/sessions/parked/audit"' in web.get("/sessions/parked").text
    refused = web.get("/sessions/parked/audit")
    assert refused.status_code == 400 and '<code id="code">temporal_unavailable</code>' in refused.text, (
        refused.text
    )


def test_the_approvals_page_says_when_none_waits(ledger: str) -> None:
    page = _client(ledger).get("/approvals")
    assert page.status_code == 200 and '<td colspan="4" id="none-waiting">' in page.text, page.text
