"""Recovery, park and startup repair on a real dev server with real worker processes killed by SIGKILL.

Each drill: a ``maka worker`` child with ``MAKA_FAILPOINT`` dies at a crash boundary inside a tool
call; a fresh worker (short heartbeat timeout) picks the session up; the workflow's recovery activity
settles the operation from the ledger. The side effect must have happened at most once.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from temporalio.client import WorkflowUpdateFailedError

from maka_core.runtime.session_view import operations, session_view
from maka_core.store.writer import LedgerStore
from maka_temporal.workers.host.worker import startup_repair
from maka_temporal.workflows.contracts import workflow_id_for
from tests.temporal_support import WorkerProcess, send_message, start, tool_step, wait_turn, write_script

pytestmark = [pytest.mark.temporal, pytest.mark.crash, pytest.mark.asyncio(loop_scope="session")]


async def _drill(
    server: Any,
    client: Any,
    tmp_path: Path,
    ws: Path,
    queue: str,
    steps: list[dict[str, Any]],
    failpoint: str,
    tag: str | None,
    while_alive: Any = None,
    while_down: Any = None,
) -> tuple[str, Any, Path]:
    db = tmp_path / "ledger.sqlite"
    script = write_script(tmp_path / "s.json", steps)
    with WorkerProcess(server, db, queue, home=tmp_path, failpoint=failpoint, failpoint_tag=tag) as doomed:
        doomed.wait_ready()
        session_id, accepted = await start(client, ws, script, queue)
        assert await doomed.wait_exit() == -9
    if while_down is not None:  # no worker runs: an outside change before recovery sees the target
        while_down()
    with WorkerProcess(server, db, queue, home=tmp_path) as worker:
        worker.wait_ready()
        status = await wait_turn(client, session_id, accepted.run_id, timeout=60)
        if while_alive is not None:  # updates need a live worker to run the validator
            await while_alive(session_id)
    return session_id, status, db


def _one_op(db: Path, session_id: str) -> Any:
    with LedgerStore.open(db) as store:
        assert store.verify() == []
        ops = operations(store.events(session_id=session_id))
    assert len(ops) == 1
    return ops[0]


async def test_t1_without_t2_file_in_prior_state_is_redone_once_by_the_next_worker(
    temporal_server: Any, temporal_client: Any, tmp_path: Path, ws_dir: Path, task_queue: str
) -> None:
    steps = [tool_step(("write_file", {"path": "out.txt", "content": "new\n"})), {"text": "done"}]
    session_id, status, db = await _drill(
        temporal_server, temporal_client, tmp_path, ws_dir, task_queue, steps, "P2", "write_file"
    )
    # Still absent, as T1 recorded it: the guarded redo wrote it once (tools.redo), and the turn went on.
    assert status.state == "idle", status
    assert (ws_dir / "out.txt").read_text() == "new\n"
    assert sorted(p.name for p in ws_dir.iterdir() if ".maka-redo-" in p.name) == []
    op = _one_op(db, session_id)
    assert op.status == "completed" and op.reason == "recovery_bundle_completed"
    with LedgerStore.open(db) as store:
        phases = [a["phase"] for a in store.attempts(op.operation_id)]
    assert phases == ["t1", "recovery", "recovery"]  # T1, the redo recorded before it ran, its bundle


async def test_t1_without_t2_file_changed_while_down_parks_and_refuses_messages(
    temporal_server: Any, temporal_client: Any, tmp_path: Path, ws_dir: Path, task_queue: str
) -> None:
    steps = [tool_step(("write_file", {"path": "out.txt", "content": "new\n"})), {"text": "done"}]
    refusals: list[str] = []

    async def send_more(session_id: str) -> None:
        with pytest.raises(WorkflowUpdateFailedError) as refused:
            await asyncio.wait_for(send_message(temporal_client, session_id, "more"), 10)
        refusals.append(refused.value.cause.type)  # type: ignore[union-attr]

    def outside_write() -> None:
        (ws_dir / "out.txt").write_text("someone else's\n")

    session_id, status, db = await _drill(
        temporal_server,
        temporal_client,
        tmp_path,
        ws_dir,
        task_queue,
        steps,
        "P2",
        "write_file",
        send_more,
        outside_write,
    )
    reason = "reconcile_diverged"  # neither before nor after: never overwritten, never redone
    assert refusals == ["SessionParked"]
    assert status.state == "parked" and status.park_reason == reason
    assert (ws_dir / "out.txt").read_text() == "someone else's\n"
    op = _one_op(db, session_id)
    assert op.status == "parked" and op.reason == reason
    assert status.parked_operation_id == op.operation_id
    # Durable and visible: header, terminal fact, search attributes, and the validator.
    with LedgerStore.open(db) as store:
        (run,) = store.list_runs(session_id=session_id)
        view = session_view(store, session_id, workflow_id=workflow_id_for(session_id))
    assert run.status == "failed" and run.park_reason == reason
    assert view.state == "parked" and view.park_reason == reason
    desc = await temporal_client.get_workflow_handle(workflow_id_for(session_id)).describe()
    attrs = {k.name: v for k, v in ((p.key, p.value) for p in desc.typed_search_attributes)}
    assert attrs["MakaState"] == "parked" and attrs["MakaParkReason"] == reason


async def test_t1_without_t2_file_in_expected_state_is_finalized_without_a_second_write(
    temporal_server: Any, temporal_client: Any, tmp_path: Path, ws_dir: Path, task_queue: str
) -> None:
    (ws_dir / "cfg.txt").write_text("port=3000\n")
    steps = [
        tool_step(("edit_file", {"path": "cfg.txt", "old_text": "3000", "new_text": "4000"})),
        {"text": "ok"},
    ]
    session_id, status, db = await _drill(
        temporal_server, temporal_client, tmp_path, ws_dir, task_queue, steps, "P4", "edit_file"
    )
    assert status.state == "idle"
    assert (ws_dir / "cfg.txt").read_text() == "port=4000\n"
    op = _one_op(db, session_id)
    assert op.status == "completed" and op.reason == "recovery_bundle_completed"


async def test_bash_dispatched_without_outcome_parks_and_ran_once(
    temporal_server: Any, temporal_client: Any, tmp_path: Path, ws_dir: Path, task_queue: str
) -> None:
    steps = [tool_step(("bash", {"command": "echo line >> log.txt"})), {"text": "ok"}]
    session_id, status, db = await _drill(
        temporal_server, temporal_client, tmp_path, ws_dir, task_queue, steps, "P4", "bash"
    )
    assert status.state == "parked" and status.park_reason == "dispatch_without_response"
    assert (ws_dir / "log.txt").read_text() == "line\n"
    op = _one_op(db, session_id)
    assert op.status == "indeterminate" and op.reason == "dispatch_without_response"


async def test_crash_after_t2_completes_without_rerun(
    temporal_server: Any, temporal_client: Any, tmp_path: Path, ws_dir: Path, task_queue: str
) -> None:
    steps = [tool_step(("bash", {"command": "echo line >> log.txt"})), {"text": "ok"}]
    session_id, status, db = await _drill(
        temporal_server, temporal_client, tmp_path, ws_dir, task_queue, steps, "P5", "bash"
    )
    assert status.state == "idle"
    assert (ws_dir / "log.txt").read_text() == "line\n"
    assert _one_op(db, session_id).status == "completed"


async def test_crash_before_t1_runs_the_tool_once_after_restart(
    temporal_server: Any, temporal_client: Any, tmp_path: Path, ws_dir: Path, task_queue: str
) -> None:
    steps = [tool_step(("bash", {"command": "echo line >> log.txt"})), {"text": "ok"}]
    session_id, status, db = await _drill(
        temporal_server, temporal_client, tmp_path, ws_dir, task_queue, steps, "P0", None
    )
    assert status.state == "idle"
    assert (ws_dir / "log.txt").read_text() == "line\n"
    assert _one_op(db, session_id).status == "completed"


async def test_startup_repair_leaves_open_workflows_and_repairs_closed_ones(
    temporal_server: Any, temporal_client: Any, tmp_path: Path, ws_dir: Path, task_queue: str
) -> None:
    db = tmp_path / "ledger.sqlite"
    script = write_script(
        tmp_path / "s.json", [tool_step(("bash", {"command": "echo x >> log.txt"})), {"text": "ok"}]
    )
    with WorkerProcess(
        temporal_server, db, task_queue, home=tmp_path, failpoint="P2", failpoint_tag="bash"
    ) as doomed:
        doomed.wait_ready()
        session_id, accepted = await start(temporal_client, ws_dir, script, task_queue)
        assert await doomed.wait_exit() == -9
    with LedgerStore.open(db) as store:
        report = await startup_repair(temporal_client, store)
        assert report.left_to_workflow == [accepted.run_id] and report.repaired == []
        assert store.get_run(accepted.run_id).status == "running"  # type: ignore[union-attr]
        await temporal_client.get_workflow_handle(workflow_id_for(session_id)).terminate(
            "drill: execution lost"
        )
        # Two repairers at once converge on one terminal fact.
        first, second = await asyncio.gather(
            startup_repair(temporal_client, store), startup_repair(temporal_client, store)
        )
        assert accepted.run_id in first.repaired + second.repaired
        assert session_id in first.sessions_to_resume + second.sessions_to_resume
        events = store.events(run_id=accepted.run_id)
        assert [e.id for e in events if e.is_terminal] == [f"{accepted.run_id}_terminal"]
        assert store.get_run(accepted.run_id).status == "failed"  # type: ignore[union-attr]
    assert not (ws_dir / "log.txt").exists()
