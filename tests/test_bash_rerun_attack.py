"""Issue 23, 1.1 end to end: ``ls a#b; echo ran >> log.txt``, killed at P4, must not run twice.

A real ``maka worker`` runs the scripted call under the default policy and SIGKILLs itself at P4
(the line ran, T2 not committed); a fresh worker recovers the session. Under today's derivation a
``bash`` call is ``at-most-once``, so the session parks ``dispatch_without_response`` and
``log.txt`` holds one line. Negative control: the same drill with workers that derive the guarantee
as before (``tests/children/shlex_worker.py``: the ``shlex`` parse called the line a read, so the
call was ``read-only``) runs the line again: two lines, and the session goes on ``idle``.

A ledger written by such a worker is recovered by today's: the recorded ``read-only`` of a command
line holds only while today's derivation agrees (``governed.recovery_guarantee``), so the line
parks with one run (its negative control: the old worker recovering, above).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from maka_core.runtime.session_view import operations
from maka_core.store.writer import LedgerStore
from tests.temporal_support import WorkerProcess, start, tool_step, wait_turn, write_script

pytestmark = [pytest.mark.temporal, pytest.mark.crash, pytest.mark.asyncio(loop_scope="session")]

ATTACK = "ls a#b; echo ran >> log.txt"
TODAY = ("-m", "maka_temporal", "worker")
SHLEX_DERIVATION = ("-m", "tests.children.shlex_worker")


async def _killed_at_p4_and_recovered(
    server: Any,
    client: Any,
    tmp_path: Path,
    ws: Path,
    queue: str,
    entry: tuple[str, ...],
    recovered_by: tuple[str, ...] | None = None,
) -> tuple[Any, Any, str]:
    db = tmp_path / "ledger.sqlite"
    script = write_script(tmp_path / "s.json", [tool_step(("bash", {"command": ATTACK})), {"text": "ok"}])
    kw: dict[str, Any] = {"home": tmp_path, "entry": entry}
    with WorkerProcess(server, db, queue, failpoint="P4", failpoint_tag="bash", **kw) as doomed:
        doomed.wait_ready()
        session_id, accepted = await start(client, ws, script, queue)
        assert await doomed.wait_exit() == -9, "the armed worker did not die at P4"
    kw["entry"] = recovered_by or entry
    with WorkerProcess(server, db, queue, **kw) as worker:
        worker.wait_ready()
        status = await wait_turn(client, session_id, accepted.run_id, timeout=60)
    with LedgerStore.open(db) as store:
        assert store.verify() == []
        (op,) = operations(store.events(session_id=session_id))
        held = store.decision(op.operation_id)
    assert held is not None
    return status, op, held["decision"]["executionGuarantee"]


async def test_the_attack_line_killed_at_p4_parks_and_ran_once(
    temporal_server: Any, temporal_client: Any, tmp_path: Path, ws_dir: Path, task_queue: str
) -> None:
    status, op, guarantee = await _killed_at_p4_and_recovered(
        temporal_server, temporal_client, tmp_path, ws_dir, task_queue, TODAY
    )
    assert guarantee == "at-most-once"
    assert (status.state, status.park_reason) == ("parked", "dispatch_without_response")
    assert (op.status, op.reason) == ("indeterminate", "dispatch_without_response")
    assert (ws_dir / "log.txt").read_text() == "ran\n"


async def test_negative_control_the_parse_derived_guarantee_runs_it_twice(
    temporal_server: Any, temporal_client: Any, tmp_path: Path, ws_dir: Path, task_queue: str
) -> None:
    status, op, guarantee = await _killed_at_p4_and_recovered(
        temporal_server, temporal_client, tmp_path, ws_dir, task_queue, SHLEX_DERIVATION
    )
    assert guarantee == "read-only"
    assert status.state == "idle" and op.status == "completed"
    assert (ws_dir / "log.txt").read_text() == "ran\nran\n"  # the effect ran twice


async def test_a_read_only_recorded_by_the_old_derivation_does_not_buy_a_second_run(
    temporal_server: Any, temporal_client: Any, tmp_path: Path, ws_dir: Path, task_queue: str
) -> None:
    status, op, guarantee = await _killed_at_p4_and_recovered(
        temporal_server, temporal_client, tmp_path, ws_dir, task_queue, SHLEX_DERIVATION, recovered_by=TODAY
    )
    assert guarantee == "read-only"  # what the old worker recorded with T1
    assert (status.state, status.park_reason) == ("parked", "dispatch_without_response")
    assert op.reason == "dispatch_without_response"
    assert (ws_dir / "log.txt").read_text() == "ran\n"
