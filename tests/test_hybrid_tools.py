"""Hybrid tool calls (``tool_mode="hybrid"``, ``runtime.local_calls``) on a real dev server.

A bounded call's first dispatch runs as the local activity ``maka.execute_tool_local`` with the
activity id ``lt:<operationId>``: history holds one marker for it and no scheduled activity, the
ledger records its T1/T2 under that id, and ``maka audit`` reads it back. ``bash`` stays a regular
activity. Control: the same script in ``activity`` mode schedules every call.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import subprocess
from collections import Counter
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from temporalio import workflow
from temporalio.api.enums.v1 import EventType

from maka_core.audit.model import read_ledger
from maka_core.audit.report import audit
from maka_core.runtime.local_calls import LOCAL_CHAIN_BOUND
from maka_core.settings import MakaSettings
from maka_core.store.writer import LedgerStore
from maka_temporal.workers.client.audit import audit_session, session_executions
from maka_temporal.workers.client.policy import session_policy
from maka_temporal.workflows.contracts import SESSION_WORKFLOW, SessionInput, SessionStatus, workflow_id_for
from maka_temporal.workflows.session import SessionWorkflow
from tests.drills import maka_cli
from tests.temporal_support import in_process_worker, start, tool_step, wait_turn, write_script

pytestmark = [pytest.mark.temporal, pytest.mark.asyncio(loop_scope="session")]


def _every_tool(path: Path) -> Path:
    return write_script(
        path,
        [
            tool_step(("write_file", {"path": "a.txt", "content": "alpha\n"})),
            tool_step(("read_file", {"path": "a.txt"}), ("list_dir", {"path": "."})),
            tool_step(("edit_file", {"path": "a.txt", "old_text": "alpha", "new_text": "beta"})),
            tool_step(("bash", {"command": "cat a.txt >> seen.log"})),
            {"text": "done"},
        ],
    )


async def _history(client: Any, session_id: str) -> Any:
    return await client.get_workflow_handle(workflow_id_for(session_id)).fetch_history()


def local_markers(history: Any) -> list[str]:
    """The activity ids of the local tool calls a history recorded (``core_local_activity``)."""
    ids = []
    for event in history.events:
        if event.event_type != EventType.EVENT_TYPE_MARKER_RECORDED:
            continue
        data = event.marker_recorded_event_attributes.details.get("data")
        if data is None or not data.payloads:
            continue
        meta = json.loads(data.payloads[0].data)
        if meta.get("activity_type") == "maka.execute_tool_local":
            ids.append(meta["activity_id"])
    return ids


def local_attempts(history: Any) -> list[tuple[str, dict[str, Any]]]:
    """Each local tool attempt a history recorded: its activity id and its result (``outcome`` or
    ``deferred``), decoded from the marker's JSON payload."""
    out = []
    for event in history.events:
        if event.event_type != EventType.EVENT_TYPE_MARKER_RECORDED:
            continue
        details = event.marker_recorded_event_attributes.details
        data = details.get("data")
        if data is None or not data.payloads:
            continue
        meta = json.loads(data.payloads[0].data)
        if meta.get("activity_type") != "maka.execute_tool_local":
            continue
        result = details.get("result")
        decoded = json.loads(result.payloads[0].data) if result is not None and result.payloads else {}
        out.append((meta["activity_id"], decoded))
    return out


def scheduled(history: Any) -> Counter[str]:
    return Counter(
        e.activity_task_scheduled_event_attributes.activity_type.name
        for e in history.events
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
    )


async def audit_clean(db: Path | str, address: str) -> None:
    audit = await asyncio.to_thread(
        subprocess.run,
        [*maka_cli(), "audit", "--all", "--db", str(db), "--address", address, "--json"],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert audit.returncode == 0 and json.loads(audit.stdout)["ok"] is True, audit.stdout + audit.stderr


async def audit_all_clean(dbs: list[Path], address: str, *, at_once: int = 4) -> None:
    """``audit_clean`` on every ledger, ``at_once`` ``maka audit`` processes at a time (a drill's
    cells audited one after another spent most of it starting interpreters)."""
    gate = asyncio.Semaphore(at_once)

    async def one(db: Path) -> None:
        async with gate:
            await audit_clean(db, address)

    await asyncio.gather(*(one(db) for db in dbs))


@pytest.mark.parametrize("mode", ["hybrid", "activity"])
async def test_bounded_calls_run_locally_in_hybrid_mode_and_bash_stays_regular(
    mode: str, temporal_server: Any, temporal_client: Any, tmp_path: Path, task_queue: str
) -> None:
    db = tmp_path / "ledger.sqlite"
    ws = tmp_path / "ws"
    ws.mkdir()
    script = _every_tool(tmp_path / "every.json")
    async with in_process_worker(temporal_client, db, task_queue):
        sid, acc = await start(temporal_client, ws, script, task_queue, "go", tool_mode=mode)
        status = await wait_turn(temporal_client, sid, acc.run_id)
        history = await _history(temporal_client, sid)
    assert status.state == "idle", status
    assert (ws / "a.txt").read_text() == "beta\n"
    assert (ws / "seen.log").read_text() == "beta\n"  # bash ran once
    markers = local_markers(history)
    tools = scheduled(history)
    if mode == "hybrid":
        assert len(markers) == 4 and all(m.startswith("lt:op") for m in markers), markers
        assert tools["maka.execute_tool"] == 1, tools  # bash only
    else:
        assert markers == [] and tools["maka.execute_tool"] == 5, (markers, tools)
    await audit_clean(db, temporal_server.address)


@workflow.defn(name=SESSION_WORKFLOW, sandboxed=False)
class UnboundedChain(SessionWorkflow):
    """Negative control: a hybrid execution that never yields its workflow task in a chain."""

    @workflow.init
    def __init__(self, inp: SessionInput) -> None:
        super().__init__(inp)

    @workflow.run
    async def run(self, inp: SessionInput) -> SessionStatus:
        return await super().run(inp)

    async def _bound_local_chain(self) -> None:
        return None


def _markers_per_completion(history: Any) -> list[int]:
    """Local-tool markers recorded with each workflow task completion, in order."""
    groups: list[int] = []
    for event in history.events:
        if event.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED:
            groups.append(0)
        elif event.event_type == EventType.EVENT_TYPE_MARKER_RECORDED and groups:
            data = event.marker_recorded_event_attributes.details.get("data")
            if data is not None and data.payloads and b"maka.execute_tool_local" in data.payloads[0].data:
                groups[-1] += 1
    return groups


@pytest.mark.slow
@pytest.mark.parametrize("workflow", [SessionWorkflow, UnboundedChain], ids=["bounded", "unbounded"])
async def test_a_500_call_turn_completes_its_workflow_task_every_k_local_calls(
    workflow: type, temporal_server: Any, temporal_client: Any, tmp_path: Path, task_queue: str
) -> None:
    db = tmp_path / "ledger.sqlite"
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "f.txt").write_text("x" * 100)
    script = write_script(
        tmp_path / "long.json",
        [tool_step(*[("read_file", {"path": "f.txt"})] * 500), {"text": "read them all"}],
    )
    # 500 calls in one step: past the default maxToolCallsPerStep (64), so the session's policy allows them.
    policy = tmp_path / "policy.json"
    policy.write_text(json.dumps({"maxToolCallsPerStep": 500}))
    governed = session_policy(MakaSettings(db=str(db)), None, policy, "human:ops", ())
    governed.record_in(MakaSettings(db=str(db)))
    async with in_process_worker(temporal_client, db, task_queue, workflow=workflow):
        sid, acc = await start(
            temporal_client, ws, script, task_queue, "go", tool_mode="hybrid",
            task_timeout=timedelta(seconds=10), session_id=governed.session_id,
        )  # fmt: skip
        status = await wait_turn(temporal_client, sid, acc.run_id, timeout=300)
        history = await _history(temporal_client, sid)
    assert status.state == "idle", status
    groups = _markers_per_completion(history)
    assert sum(groups) == 500, groups
    with LedgerStore.open(db) as store:
        dispatched = [e for e in store.events(session_id=sid) if e.actions and e.actions.tool_dispatch]
    assert len(dispatched) == 500, len(dispatched)  # every read ran: none refused before its T1
    if workflow is SessionWorkflow:
        assert max(groups) <= LOCAL_CHAIN_BOUND, groups
    else:
        assert max(groups) > LOCAL_CHAIN_BOUND, groups
    await audit_clean(db, temporal_server.address)


# --- the audit reads local calls ------------------------------------------------------------------


def _checks(report: Any) -> dict[str, str]:
    return {f.check: f.severity for f in report.findings}


async def test_the_audit_reads_local_markers_and_catches_a_deferred_attempt_that_dispatched(
    temporal_server: Any, temporal_client: Any, tmp_path: Path, task_queue: str
) -> None:
    """A real hybrid session audits clean from its markers; edited copies of its real history are
    the negative controls: a local attempt recorded as deferred that has a T1 is drift
    (``deferred_after_dispatch``); a lost marker is drift (``dispatch_attempt_unknown``) unless its
    execution lost a workflow task, where it is the notice ``local_attempt_unrecorded``."""
    db = tmp_path / "ledger.sqlite"
    ws = tmp_path / "ws"
    ws.mkdir()
    script = _every_tool(tmp_path / "every.json")
    async with in_process_worker(temporal_client, db, task_queue):
        sid, acc = await start(temporal_client, ws, script, task_queue, "go", tool_mode="hybrid")
        await wait_turn(temporal_client, sid, acc.run_id)
    store = LedgerStore.open(db)
    try:
        report = await audit_session(temporal_client, store, sid)
        ledger = read_ledger(store, sid)
    finally:
        store.close()
    assert report.ok, [f.to_json() for f in report.findings]
    (execution,) = await session_executions(temporal_client, sid)
    local = [f for f in execution.activities if f.activity_type == "maka.execute_tool_local"]
    assert len(local) == 4 and all(f.operation_id and f.result.get("response_event_id") for f in local)
    first = local[0]

    deferred = tuple(
        dataclasses.replace(f, outcome="deferred", result={"deferred": "busy"}) if f is first else f
        for f in execution.activities
    )
    drifted = audit(ledger, [dataclasses.replace(execution, activities=deferred)])
    assert _checks(drifted).get("deferred_after_dispatch") == "drift", _checks(drifted)

    lost = tuple(f for f in execution.activities if f is not first)
    unknown = audit(ledger, [dataclasses.replace(execution, activities=lost)])
    assert _checks(unknown).get("dispatch_attempt_unknown") == "drift", _checks(unknown)
    with_lost_task = audit(ledger, [dataclasses.replace(execution, activities=lost, lost_workflow_tasks=1)])
    assert _checks(with_lost_task) == {"local_attempt_unrecorded": "notice"}, _checks(with_lost_task)
    assert with_lost_task.ok
