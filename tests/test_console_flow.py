"""An operator's actions through ``maka console`` in a real browser, against a real dev server and
worker: Debian's chromium (async Playwright).

- **Approve:** the approvals page lists the session whose turn waits on an approval, whose page
  the browser opens; it types the
  challenge phrase (the operator's name is filled in by ``--operator``) and presses approve, and the
  turn finishes; the write ran once and the ledger's decision names the operator. Negative control:
  the same form with a wrong phrase is refused on a page naming ``approval_phrase_mismatch``, and
  nothing runs (the turn still waits, the file is not written). The session's audit page then
  draws its lineage and finds the ledger and Temporal agreeing.
- **Resolve:** a session whose bash parked in its open execution (a real ``maka worker`` SIGKILLed
  after the bash's effect, P4); the page says why in plain words; the browser resolves the call
  ``applied`` with what the operator checked, and the same execution finishes the turn (``wake``):
  the session is ``idle``, the bash ran once, the resolution names the operator. Negative control: a
  resolution without the operator's name is refused (``config_invalid``) and the session stays
  parked.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from temporalio.client import Client

from maka_core.runtime.resolution import resolutions_of
from maka_core.store.writer import LedgerStore
from maka_temporal.workers.console.park_words import PARK_WORDS
from tests.drills import Sandbox, ready, stop
from tests.temporal_support import in_process_worker, query_status, wait_turn
from tests.test_approval_updates import _awaiting, _governed_session, _write_script
from tests.test_console_browser import ARGS, CHROMIUM, _serve
from tests.test_session_wake_temporal import _parked, _script, _settled, _wait_parked

pytestmark = [pytest.mark.slow, pytest.mark.temporal, pytest.mark.asyncio(loop_scope="session")]


async def test_an_operator_approves_in_the_browser_and_the_turn_finishes(
    temporal_server: Any, temporal_client: Client, tmp_path: Path, ws_dir: Path, task_queue: str
) -> None:
    if not CHROMIUM.exists():
        pytest.skip("no /usr/bin/chromium (scripts/test installs it with apt-get as root)")
    async_api = pytest.importorskip("playwright.async_api")
    db = tmp_path / "ledger.sqlite"
    script = _write_script(tmp_path, "a.txt")
    async with in_process_worker(temporal_client, db, task_queue):
        session = await _governed_session(temporal_client, tmp_path, ws_dir, db, task_queue, 600_000, script)
        waiting = await _awaiting(temporal_client, session)
        run_id = waiting.current_turn.run_id
        serving = _serve(db, "--operator", "Ada Lovelace", address=temporal_server.address)
        base = await asyncio.to_thread(next, serving)
        try:
            async with async_api.async_playwright() as p:
                browser = await p.chromium.launch(executable_path=str(CHROMIUM), args=ARGS)
                page = await browser.new_page()
                await page.goto(f"{base}/approvals")  # every approval waiting, across sessions
                await page.click(f'#approvals a[href^="/sessions/{session}"]')
                approval = page.locator(".approval")
                assert await approval.count() == 1, await page.content()
                phrase = await approval.locator("code.phrase").inner_text()
                assert await approval.locator('input[name="by"]').first.input_value() == "Ada Lovelace"

                # The control: a wrong phrase is refused with its code, and nothing runs.
                await approval.locator('input[name="phrase"]').fill(phrase + "x")
                await approval.locator("button.approve").click()
                assert await page.inner_text("#code") == "approval_phrase_mismatch", await page.content()
                still = await query_status(temporal_client, session)
                assert still.awaiting_approval is not None and not (ws_dir / "a.txt").exists(), still

                await page.goto(f"{base}/sessions/{session}")
                approval = page.locator(".approval")
                await approval.locator('input[name="phrase"]').fill(phrase)
                await approval.locator("button.approve").click()
                final = await wait_turn(temporal_client, session, run_id)
                assert final.state == "idle", final
                await page.goto(f"{base}/sessions/{session}")
                assert await page.inner_text("#state") == "idle"
                assert await page.locator(".approval").count() == 0
                # The session's audit, its lineage drawn: the ledger and Temporal agree.
                await page.click("a#audit")
                assert await page.locator('svg[aria-label="lineage timeline"]').count() == 1
                assert await page.inner_text(".verdict") == "ledger and Temporal agree", await page.content()
                await browser.close()
        finally:
            serving.close()  # the generator's ``finally`` kills the console
    assert (ws_dir / "a.txt").read_text() == "a.txt"
    with LedgerStore.open(f"sqlite:///{db}") as store:
        decided = [e for e in store.events(session_id=session) if e.actions and e.actions.permission_decision]
    assert len(decided) == 1 and "Ada Lovelace" in json.dumps(decided[0].model_dump(mode="json")), decided


async def test_an_operator_resolves_a_parked_call_in_the_browser_and_the_session_goes_on(
    temporal_server: Any, temporal_client: Client, tmp_path: Path
) -> None:
    if not CHROMIUM.exists():
        pytest.skip("no /usr/bin/chromium (scripts/test installs it with apt-get as root)")
    async_api = pytest.importorskip("playwright.async_api")
    box = Sandbox(temporal_server, tmp_path / "resolve")
    session_id, _ = await _parked(temporal_client, box, _script(tmp_path / "script.json"), "console")
    worker = box.worker()
    await ready(worker)
    try:
        op = await _wait_parked(temporal_client, box, session_id)
        serving = _serve(Path(box.db), address=temporal_server.address)
        base = await asyncio.to_thread(next, serving)
        try:
            async with async_api.async_playwright() as p:
                browser = await p.chromium.launch(executable_path=str(CHROMIUM), args=ARGS)
                page = await browser.new_page()
                await page.goto(f"{base}/sessions/{session_id}")
                assert await page.inner_text("#state") == "parked"
                words = PARK_WORDS["dispatch_without_response"]
                assert await page.inner_text("#park-words") == words
                form = page.locator("form.resolve")
                assert await form.count() == 1, await page.content()
                await form.locator('select[name="decision"]').select_option("applied")
                await form.locator('input[name="reason"]').fill("effects.log has the line")

                # The control: no name (no --operator here), refused; the session stays parked.
                await form.locator('input[name="by"]').evaluate("e => e.removeAttribute('required')")
                await form.locator("button").click()
                assert await page.inner_text("#code") == "config_invalid", await page.content()
                still = await query_status(temporal_client, session_id)
                assert still.state == "parked", still

                await page.goto(f"{base}/sessions/{session_id}")
                form = page.locator("form.resolve")
                await form.locator('select[name="decision"]').select_option("applied")
                await form.locator('input[name="reason"]').fill("effects.log has the line")
                await form.locator('input[name="by"]').fill("Grace Hopper")
                await form.locator("button").click()
                status = await _settled(temporal_client, session_id)
                assert status.state == "idle", status
                await page.goto(f"{base}/sessions/{session_id}")
                assert await page.inner_text("#state") == "idle"
                await browser.close()
        finally:
            serving.close()
    finally:
        await stop(worker)
    assert box.log_lines()["ran"] == 1  # the bash ran once, before the kill; never again
    with LedgerStore.open(box.db) as store:
        resolved = resolutions_of(store.events(session_id=session_id))
    assert list(resolved) == [op] and resolved[op]["resolvedBy"] == "Grace Hopper", resolved
    assert resolved[op]["decision"] == "applied", resolved
