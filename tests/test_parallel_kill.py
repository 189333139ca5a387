"""The kill matrix's parallel column (issue 31 item 2): a real ``maka worker`` SIGKILLed while three
calls of different guarantees run side by side, then a fresh worker recovers the session.

One step: ``nap_alone`` (a read declared not parallel: 0.5 s), then ``append_entry``
(at-most-once, a lone call), ``nap`` (read-only, sleeps 3 s) and ``lookup`` (read-only), then
``put_note`` (reconciliation-required, a lone call: it waits for
``append_entry``). The worker dies at ``append_entry``'s failpoint, P3 (T1 committed, the effect not
begun) or P4 (the effect done, T2 not committed), while the nap sleeps beside it. Each call's
outcome is then as its guarantee says: the at-most-once entry is never written twice and its call
parks the turn (``dispatch_without_response``); the nap, a read, runs again and completes; the
lookup completes; ``put_note``, after the parked call in the lone lane, never starts. The ledger
verifies and ``maka audit`` is clean. The negative control of a call that skips its own T1 in the
batch is ``test_parallel_commit.test_a_call_that_skips_its_own_t1_in_the_batch_is_caught``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from maka_core.runtime.session_view import operations
from maka_core.store.writer import LedgerStore
from tests.temporal_support import WorkerProcess, start, tool_step, wait_turn, write_script
from tests.test_hybrid_tools import audit_clean

pytestmark = [
    pytest.mark.temporal,
    pytest.mark.crash,
    pytest.mark.slow,
    pytest.mark.asyncio(loop_scope="session"),
]

MODULES = "tests.user_tools_pkg.effects,tests.user_tools_pkg.naps"
CALLS = [
    ("nap_alone", {"label": "first", "seconds": 0.5}),
    ("append_entry", {"text": "pay"}),
    ("nap", {"label": "beside", "seconds": 3}),
    ("lookup", {"name": "ada"}),
    ("put_note", {"name": "n1", "text": "hello"}),
]


def lines(ws: Path, name: str) -> list[str]:
    path = ws / name
    return path.read_text().splitlines() if path.exists() else []


@pytest.mark.parametrize("point", ["P3", "P4"])
async def test_a_kill_while_calls_run_side_by_side_settles_each_call_by_its_guarantee(
    temporal_server: Any, temporal_client: Any, tmp_path: Path, ws_dir: Path, task_queue: str, point: str
) -> None:
    db = tmp_path / "ledger.sqlite"
    script = write_script(tmp_path / "s.json", [tool_step(*CALLS), {"text": "ok"}])
    kw: dict[str, Any] = {"home": tmp_path, "extra_env": {"MAKA_TOOLS": MODULES}}
    with WorkerProcess(
        temporal_server, db, task_queue, failpoint=point, failpoint_tag="append_entry", **kw
    ) as doomed:
        doomed.wait_ready()
        session_id, accepted = await start(temporal_client, ws_dir, script, task_queue, max_parallel_tools=8)
        assert await doomed.wait_exit() == -9, (
            f"the armed worker did not die at {point}: {doomed.log.read_text()[-2000:]}"
        )
    at_kill = lines(ws_dir, "naps.log")
    beside = [x.split()[0] for x in at_kill if " beside " in x]
    assert beside == ["start"], f"the nap was not running beside the killed call: {at_kill}"
    with WorkerProcess(temporal_server, db, task_queue, **kw) as worker:
        worker.wait_ready()
        status = await wait_turn(temporal_client, session_id, accepted.run_id, timeout=120)
    assert (status.state, status.park_reason) == ("parked", "dispatch_without_response"), status
    with LedgerStore.open(db) as store:
        assert store.verify() == []
        ops = {op.tool_name: op for op in operations(store.events(session_id=session_id))}
    assert status.parked_operation_id == ops["append_entry"].operation_id
    assert lines(ws_dir, "journal.log") == ([] if point == "P3" else ["pay"])  # never twice
    assert (ops["append_entry"].status, ops["append_entry"].reason) == (
        "indeterminate",
        "dispatch_without_response",
    )
    naps = lines(ws_dir, "naps.log")
    assert [x.split()[0] for x in naps].count("end") >= 1 and ops["nap"].status == "completed", (
        naps,
        ops["nap"],
    )
    assert ops["lookup"].status == "completed" and 1 <= len(lines(ws_dir, "lookups.log")) <= 2
    # After the parked call in the lone lane: never dispatched (no T1), never run.
    assert ops["put_note"].status == "definitely_not_dispatched", ops["put_note"]
    assert lines(ws_dir, "note_writes.log") == []
    await audit_clean(db, temporal_server.address)
