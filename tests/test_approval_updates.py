"""Approvals as Temporal messages on a real dev server: the ``approve``/``deny`` Updates, their
validators' refusal codes (a refusal leaves no event in history), and the wait held by the workflow
(a condition and a timer at ``expiresAt``), which outlives the tool timeouts and a SIGKILLed worker.

Negative control: ``ActivityWait``, the session workflow as it was before the patch (the wait inside
the tool activity), loses an approval whose TTL is longer than three tool start-to-close timeouts.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
import time
from pathlib import Path
from typing import Any

import pytest
from temporalio import workflow
from temporalio.client import Client

from maka_core.errors import MakaError
from maka_core.runtime.runtime import RuntimeSettings
from maka_core.settings import MakaSettings
from maka_temporal.workers.client import turn_messages
from maka_temporal.workers.client.policy import session_policy
from maka_temporal.workflows.contracts import (
    APPROVE,
    SESSION_WORKFLOW,
    AnswerResult,
    SessionInput,
    SessionStatus,
    workflow_id_for,
)
from maka_temporal.workflows.session import SessionWorkflow
from tests.temporal_support import (
    WorkerProcess,
    in_process_worker,
    query_status,
    start,
    tool_step,
    wait_turn,
    write_script,
)

pytestmark = [pytest.mark.temporal, pytest.mark.asyncio(loop_scope="session")]

#: Short tool timeouts: three dispatches of a waiting activity end within ~10 s.
SHORT = RuntimeSettings(tool_start_to_close_timeout_s=2.0, tool_heartbeat_timeout_s=1.0)


@workflow.defn(name=SESSION_WORKFLOW, sandboxed=False)
class ActivityWait(SessionWorkflow):
    """Today's behaviour before the patch: the tool activity holds the approval wait."""

    @workflow.init
    def __init__(self, inp: SessionInput) -> None:
        super().__init__(inp)

    @workflow.run
    async def run(self, inp: SessionInput) -> SessionStatus:
        return await super().run(inp)

    def _holds_messages(self) -> bool:
        return False


def _policy(tmp: Path, ttl_ms: int) -> Path:
    path = tmp / f"policy-{ttl_ms}.json"
    path.write_text(json.dumps({"mutations": "confirm", "approvalTtlMs": ttl_ms}))
    return path


async def _governed_session(
    client: Client, tmp: Path, ws: Path, db: Path, queue: str, ttl_ms: int, script: Path
) -> str:
    """A session whose policy confirms every mutation, recorded as ``maka session start`` does."""
    governed = session_policy(MakaSettings(db=str(db)), None, _policy(tmp, ttl_ms), "human:alice", ())
    governed.record_in(MakaSettings(db=str(db)))
    session_id, _ = await start(client, ws, script, queue, "write it", session_id=governed.session_id)
    return session_id


async def _awaiting(client: Client, session_id: str, timeout: float = 60) -> Any:
    """The status once the running turn waits on an approval (the workflow holds it)."""
    deadline = time.monotonic() + timeout
    while True:
        status = await query_status(client, session_id)
        if status.awaiting_approval is not None:
            return status
        assert time.monotonic() < deadline, f"no approval awaited: {status}"
        await asyncio.sleep(0.1)


async def _events(client: Client, session_id: str) -> list[Any]:
    handle = client.get_workflow_handle(workflow_id_for(session_id))
    return [e async for e in handle.fetch_history_events()]


def _scheduled(events: list[Any], activity: str) -> int:
    return sum(
        1
        for e in events
        if e.HasField("activity_task_scheduled_event_attributes")
        and e.activity_task_scheduled_event_attributes.activity_type.name == activity
    )


def _write_script(tmp: Path, *paths: str) -> Path:
    steps: list[dict[str, Any]] = []
    for p in paths:
        steps += [tool_step(("write_file", {"path": p, "content": p})), {"text": f"after {p}"}]
    return write_script(tmp / "s.json", steps)


async def test_an_approval_outlives_three_tool_timeouts(
    temporal_client: Client, tmp_path: Path, ws_dir: Path, task_queue: str
) -> None:
    db = tmp_path / "ledger.sqlite"
    async with in_process_worker(temporal_client, db, task_queue, settings=SHORT):
        session = await _governed_session(
            temporal_client, tmp_path, ws_dir, db, task_queue, 600_000, _write_script(tmp_path, "a.txt")
        )
        status = await _awaiting(temporal_client, session)
        wait = status.awaiting_approval
        await asyncio.sleep(9)  # past three 2 s start-to-close timeouts of the tool activity
        status = await query_status(temporal_client, session)
        assert status.state == "running" and status.awaiting_approval == wait, status
        assert _scheduled(await _events(temporal_client, session), "maka.execute_tool") == 1
        began = time.monotonic()
        done = await turn_messages.approve(
            temporal_client, session, wait.approval_id, phrase=wait.phrase, by="bob"
        )
        answered = time.monotonic() - began
        assert done.decision == "allow" and done.operation_id == wait.operation_id
        final = await wait_turn(temporal_client, session, status.current_turn.run_id)
        settled = time.monotonic() - began
        print(f"approve Update answered in {answered:.3f} s; the turn settled {settled:.3f} s after it")
    assert final.state == "idle", final
    assert (ws_dir / "a.txt").read_text() == "a.txt"


async def test_negative_control_an_activity_held_wait_is_lost_after_three_tool_timeouts(
    temporal_client: Client, tmp_path: Path, ws_dir: Path, task_queue: str
) -> None:
    db = tmp_path / "ledger.sqlite"
    async with in_process_worker(temporal_client, db, task_queue, settings=SHORT, workflow=ActivityWait):
        session = await _governed_session(
            temporal_client, tmp_path, ws_dir, db, task_queue, 600_000, _write_script(tmp_path, "a.txt")
        )
        deadline = time.monotonic() + 60
        while (status := await query_status(temporal_client, session)).state == "running":
            assert time.monotonic() < deadline, status
            await asyncio.sleep(0.2)
    assert status.state == "parked", status  # the approval the policy allowed for 10 min was lost
    assert not (ws_dir / "a.txt").exists()


async def test_refusals_leave_no_event_and_deny_reaches_the_model(
    temporal_client: Client, tmp_path: Path, ws_dir: Path, task_queue: str
) -> None:
    db = tmp_path / "ledger.sqlite"
    async with in_process_worker(temporal_client, db, task_queue):
        session = await _governed_session(
            temporal_client, tmp_path, ws_dir, db, task_queue, 600_000, _write_script(tmp_path, "a.txt")
        )
        status = await _awaiting(temporal_client, session)
        wait = status.awaiting_approval
        before = len(await _events(temporal_client, session))
        refusals = [
            (
                turn_messages.approve(temporal_client, session, "appr-nope", phrase=wait.phrase),
                "approval_id_mismatch",
            ),
            (turn_messages.deny(temporal_client, session, "appr-nope"), "approval_id_mismatch"),
            (
                turn_messages.approve(
                    temporal_client, session, wait.approval_id, phrase="APPROVE 000000000000"
                ),
                "approval_phrase_mismatch",
            ),
        ]
        for call, code in refusals:
            with pytest.raises(MakaError) as refused:
                await call
            assert refused.value.code == code
        assert len(await _events(temporal_client, session)) == before  # a refused Update is not in history
        # What `temporal workflow update execute --name deny --input '{...}'` sends: camelCase JSON.
        handle = temporal_client.get_workflow_handle(workflow_id_for(session))
        denied = await handle.execute_update(
            "deny", {"approvalId": wait.approval_id, "by": "bob", "reason": "no"}, result_type=AnswerResult
        )
        assert denied.decision == "deny"
        final = await wait_turn(temporal_client, session, status.current_turn.run_id)
        assert final.state == "idle", final
        with pytest.raises(MakaError) as again:
            await turn_messages.approve(temporal_client, session, wait.approval_id, phrase=wait.phrase)
        assert again.value.code == "approval_not_pending"
    assert not (ws_dir / "a.txt").exists()
    with sqlite3.connect(db) as conn:
        (state,) = conn.execute(
            "SELECT state FROM tool_decisions WHERE approval_id = ?", (wait.approval_id,)
        ).fetchone()
    assert state == "denied"


async def test_expiry_is_a_workflow_timer_and_a_late_answer_is_approval_expired(
    temporal_client: Client, tmp_path: Path, ws_dir: Path, task_queue: str
) -> None:
    db = tmp_path / "ledger.sqlite"
    async with in_process_worker(temporal_client, db, task_queue):
        session = await _governed_session(
            temporal_client, tmp_path, ws_dir, db, task_queue, 3_000, _write_script(tmp_path, "a.txt")
        )
        status = await _awaiting(temporal_client, session)
        wait = status.awaiting_approval
        final = await wait_turn(temporal_client, session, status.current_turn.run_id)
        assert final.state == "idle", final
        events = await _events(temporal_client, session)
        assert _scheduled(events, "maka.close_approval") == 1
        assert any(e.HasField("timer_started_event_attributes") for e in events)
        with pytest.raises(MakaError) as late:
            await turn_messages.approve(temporal_client, session, wait.approval_id, phrase=wait.phrase)
        assert late.value.code == "approval_expired"
    assert not (ws_dir / "a.txt").exists()


async def test_an_edited_approval_is_refused_by_the_ledger_with_the_same_code(
    temporal_client: Client, tmp_path: Path, ws_dir: Path, task_queue: str
) -> None:
    """The validator cannot read the ledger: a challenge edited during the wait is refused by the
    handler's ledger check, with the validator's code, and the turn keeps waiting."""
    db = tmp_path / "ledger.sqlite"
    async with in_process_worker(temporal_client, db, task_queue):
        session = await _governed_session(
            temporal_client, tmp_path, ws_dir, db, task_queue, 600_000, _write_script(tmp_path, "a.txt")
        )
        wait = (await _awaiting(temporal_client, session)).awaiting_approval
        with sqlite3.connect(db) as conn:
            (raw,) = conn.execute(
                "SELECT decision_json FROM tool_decisions WHERE approval_id = ?", (wait.approval_id,)
            ).fetchone()
            decision = json.loads(raw)
            decision["challenge"]["actionDigest"] = "0" * 64
            conn.execute(
                "UPDATE tool_decisions SET decision_json = ? WHERE approval_id = ?",
                (json.dumps(decision), wait.approval_id),
            )
        with pytest.raises(MakaError) as refused:
            await turn_messages.approve(temporal_client, session, wait.approval_id, phrase=wait.phrase)
        assert refused.value.code == "approval_action_digest_mismatch"
        status = await query_status(temporal_client, session)
        assert status.state == "running" and status.awaiting_approval == wait
        await turn_messages.deny(temporal_client, session, wait.approval_id, reason="edited")
        await wait_turn(temporal_client, session, status.current_turn.run_id)
    assert not (ws_dir / "a.txt").exists()


@pytest.mark.slow
async def test_a_worker_sigkilled_during_the_wait_costs_nothing(
    temporal_server: Any, temporal_client: Client, tmp_path: Path, ws_dir: Path, task_queue: str
) -> None:
    """The wait is workflow state: the worker that held it dies (SIGKILL) well inside the TTL, the
    approval goes to the execution while no worker runs (the server keeps the Update until one
    polls), and a fresh worker wakes the turn: the tool runs once, dispatched twice in all."""
    home, db = tmp_path / "home", tmp_path / "ledger.sqlite"
    extra = {"MAKA_TOOL_START_TO_CLOSE_TIMEOUT": "2"}
    first = WorkerProcess(temporal_server, db, task_queue, home=home, extra_env=extra)
    try:
        first.wait_ready()
        session = await _governed_session(
            temporal_client, tmp_path, ws_dir, db, task_queue, 600_000, _write_script(tmp_path, "a.txt")
        )
        status = await _awaiting(temporal_client, session)
        first.proc.kill()
        first.proc.wait()
    finally:
        first.stop()
    wait = status.awaiting_approval
    await asyncio.sleep(7)  # past three tool start-to-close timeouts while no worker is up
    handle = temporal_client.get_workflow_handle(workflow_id_for(session))
    answer = asyncio.ensure_future(
        handle.execute_update(
            APPROVE,
            {"approvalId": wait.approval_id, "phrase": wait.phrase, "by": "bob"},
            result_type=AnswerResult,
        )
    )
    with WorkerProcess(temporal_server, db, task_queue, home=home, extra_env=extra) as fresh:
        fresh.wait_ready()
        done = await asyncio.wait_for(answer, 60)
        assert done.decision == "allow"
        final = await wait_turn(temporal_client, session, status.current_turn.run_id)
    assert final.state == "idle", final
    assert (ws_dir / "a.txt").read_text() == "a.txt"
    assert _scheduled(await _events(temporal_client, session), "maka.execute_tool") == 2


async def test_a_cancel_during_the_wait_closes_the_request_with_the_run(
    temporal_client: Client, tmp_path: Path, ws_dir: Path, task_queue: str
) -> None:
    db = tmp_path / "ledger.sqlite"
    async with in_process_worker(temporal_client, db, task_queue):
        session = await _governed_session(
            temporal_client, tmp_path, ws_dir, db, task_queue, 600_000, _write_script(tmp_path, "a.txt")
        )
        status = await _awaiting(temporal_client, session)
        wait = status.awaiting_approval
        done = await turn_messages.cancel_turn(temporal_client, session, reason="changed my mind")
        assert done.run_id == status.current_turn.run_id and done.cancelled_operations == []
        with pytest.raises(MakaError) as late:
            await turn_messages.approve(temporal_client, session, wait.approval_id, phrase=wait.phrase)
        assert late.value.code == "approval_expired"
        after = await query_status(temporal_client, session)
        assert after.state == "idle" and after.awaiting_approval is None, after
    with sqlite3.connect(db) as conn:
        (state,) = conn.execute(
            "SELECT state FROM tool_decisions WHERE approval_id = ?", (wait.approval_id,)
        ).fetchone()
        (header,) = conn.execute("SELECT status FROM agent_runs WHERE run_id = ?", (done.run_id,)).fetchone()
    assert (state, header) == ("expired", "cancelled")
    assert not (ws_dir / "a.txt").exists()
