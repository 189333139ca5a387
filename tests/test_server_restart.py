"""Killing the Temporal server itself mid-session: the session finishes, no side effect twice.

A dev server of its own, with a persistent database file (``--db-filename``, as ``maka dev`` runs
it), so that a SIGKILLed server comes back with its histories, timers and task queues. The worker
is a real ``maka worker`` process that stays up through the outage. The server dies while the turn's
``bash`` call is running (T1 committed, the command sleeping); the command finishes and commits its
T2 to the ledger while Temporal is down, since the ledger does not depend on Temporal. The server
comes back on the same port from the same file; the session must settle ``idle`` with every tool
run exactly once, and still accept a new message afterwards.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from maka_core.runtime.session_view import operations
from maka_core.store.writer import LedgerStore
from maka_temporal.workers.client.connect import connect
from maka_temporal.workers.host import devserver
from maka_temporal.workflows.contracts import EXECUTE_TOOL, RECOVER_OPERATION, workflow_id_for
from tests.drills import (
    DRILL_SCRIPT,
    NOTES_AFTER_TURN,
    TOOLS,
    Sandbox,
    open_session,
    ready,
    send,
    settle,
    stop,
)

pytestmark = [
    pytest.mark.slow,
    pytest.mark.temporal,
    pytest.mark.crash,
    pytest.mark.asyncio(loop_scope="session"),
]

OUTAGE_S = 3.0


def _slow_bash_script(path: Path) -> Path:
    steps = json.loads(DRILL_SCRIPT.read_text())["steps"]
    text = json.dumps(steps).replace("echo done >> effects.log", "sleep 2; echo done >> effects.log")
    path.write_text(json.dumps({"steps": json.loads(text)}))
    return path


def _bash_dispatched(db: Path, session_id: str) -> bool:
    if not db.exists():
        return False
    with LedgerStore.open(db) as store:
        return any(
            op.tool_name == "bash" and op.dispatch_event_id
            for op in operations(store.events(session_id=session_id))
        )


@pytest.mark.timeout(1200)
async def test_killing_the_temporal_server_mid_session_finishes_without_a_duplicate(
    tmp_path: Path, capsys: Any
) -> None:
    db_file = tmp_path / "temporal.db"
    server = devserver.start(ui=False, db_file=db_file, log_path=tmp_path / "temporal.log")
    box = Sandbox(server, tmp_path / "drill")
    script = _slow_bash_script(tmp_path / "script.json")
    session_id = "server-restart"
    try:
        client = await connect(server.address)
        worker = box.worker()
        try:
            await ready(worker)
            await open_session(client, box.ws, script, box.queue, session_id=session_id)
            accepted = await send(client, session_id, "go", update_id="turn-1")
            deadline = time.monotonic() + 60
            while not await asyncio.to_thread(_bash_dispatched, box.db, session_id):
                assert time.monotonic() < deadline, "bash was never dispatched"
                await asyncio.sleep(0.05)
            server.kill()  # SIGKILL the server: mid-tool, T1 committed, the command still running
            killed = time.monotonic()
            await asyncio.sleep(OUTAGE_S)
            assert worker.proc.poll() is None, (
                "the worker must survive a server outage:\n" + worker.log.read_text()
            )
            server = devserver.start(
                port=server.port, ui=False, db_file=db_file, log_path=tmp_path / "temporal.log"
            )
            restarted = time.monotonic()
            status = await settle(client, session_id, accepted.run_id, timeout=120)
            settled = time.monotonic()
            # The session is still usable: a second message starts and finishes a turn.
            second = await send(client, session_id, "again", update_id="turn-2")
            after = await settle(client, session_id, second.run_id, timeout=60)
            history = await client.get_workflow_handle(workflow_id_for(session_id)).fetch_history()
        finally:
            await stop(worker)
        clean, verify_output = await box.verify()
    finally:
        server.stop()

    with LedgerStore.open(box.db) as store:
        events = store.events(session_id=session_id)
    ops = {op.tool_name: (op.status, op.reason) for op in operations(events)}
    journal = box.file_effects()
    effects = {
        "write_file": sum(n for (t, _), n in journal.items() if t == "write_file"),
        "edit_file": sum(n for (t, _), n in journal.items() if t == "edit_file"),
        "bash": sum(box.log_lines().values()),
    }
    terminal = [e.run_id for e in events if e.is_terminal]
    scheduled = Counter(
        e.activity_task_scheduled_event_attributes.activity_type.name
        for e in history.events
        if e.HasField("activity_task_scheduled_event_attributes")
    )
    with capsys.disabled():
        print(
            f"\nServer restart: killed mid-bash, down {restarted - killed:.1f}s, "
            f"session settled {settled - restarted:.1f}s after the restart; state {status.state}; "
            f"effects W/E/B {'/'.join(str(effects[t]) for t in TOOLS)}; ops {ops}; "
            f"tool activities {scheduled[EXECUTE_TOOL]}, recovery activities {scheduled[RECOVER_OPERATION]}; "
            f"ledger verify {'clean' if clean else verify_output}\n"
        )
    assert status.state == "idle" and after.state == "idle", (status, after)
    assert effects == dict.fromkeys(TOOLS, 1)
    assert ops == {t: ("completed", "matching_response") for t in TOOLS}
    assert (box.ws / "notes.txt").read_text() == NOTES_AFTER_TURN
    assert sorted(terminal) == sorted([accepted.run_id, second.run_id])
    assert clean, verify_output
