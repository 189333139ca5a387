"""An operator's approval through ``maka console`` in a real browser, against a real dev server and
worker: Debian's chromium (async Playwright) opens the page of a session whose turn waits on an
approval, types the challenge phrase and a name, presses approve, and the turn finishes; the write
ran once and the ledger's decision names the operator the form gave.

Negative control: the same form with a wrong phrase is refused on a page naming
``approval_phrase_mismatch``, and nothing runs (the turn still waits, the file is not written).
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from temporalio.client import Client

from maka_core.store.writer import LedgerStore
from tests.temporal_support import in_process_worker, query_status, wait_turn
from tests.test_approval_updates import _awaiting, _governed_session, _write_script
from tests.test_console_browser import ARGS, CHROMIUM, _serve

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
                await page.goto(f"{base}/sessions/{session}")
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
                await browser.close()
        finally:
            serving.close()  # the generator's ``finally`` kills the console
    assert (ws_dir / "a.txt").read_text() == "a.txt"
    with LedgerStore.open(f"sqlite:///{db}") as store:
        decided = [e for e in store.events(session_id=session) if e.actions and e.actions.permission_decision]
    assert len(decided) == 1 and "Ada Lovelace" in json.dumps(decided[0].model_dump(mode="json")), decided
