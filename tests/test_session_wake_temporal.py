"""One command per decision (issue 32): resolving a parked call lets the session go on, in the same
execution. Real dev server, a real ``maka worker`` SIGKILLed after a bash's effect (P4: T1, the
effect, no T2), the real CLI.

The bash is at-most-once, so recovery parks the turn (``dispatch_without_response``) and the
execution stays open. Must hold: ``maka session resolve`` alone moves the session on: the same
Temporal run (same run id, still open) runs the continuation's turn, which ends ``idle``; the model
saw the resolution (its next call writes the result it was shown into ``seen.txt``); the bash ran
once; ``maka audit`` is clean. ``maka resume`` of the parked open execution, before the resolution,
stays parked and names the call; after a resolution whose CLI died before its Signal (the ledger
written directly), ``maka resume`` wakes it, and two resumes at once make one continuation.
Negative control: a worker whose workflow lacks the wake wait (``NoWake``, injected into the
in-process worker: the loop of before, as older code runs it) receives the same Signal and stays
parked, nothing claimed; after the upgrade (a real ``maka worker``) the replayed, dropped wake leaves
the execution unwakeable (``wakes`` unset) and ``maka resume`` still moves the session on.
"""

from __future__ import annotations

import asyncio
import os
import sqlite3
import time
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest
from temporalio import workflow
from temporalio.api.enums.v1 import EventType

from maka_core.runtime.resolution import resolve_operation, unsettled_operations
from maka_core.runtime.runtime import RuntimeSettings
from maka_core.runtime.wake import continue_parked
from maka_core.store.writer import LedgerStore
from maka_core.tools import tool_catalog
from maka_core.tools.registry import default_tools
from maka_temporal.workers.client.session_client import describe_execution, query_status
from maka_temporal.workflows.contracts import SESSION_WORKFLOW, SessionInput, SessionStatus, workflow_id_for
from maka_temporal.workflows.session import SessionWorkflow
from tests.drills import HEARTBEAT_S, Kill, Sandbox, ready, stop
from tests.mcp_support import calls, stdio_counter, write_config
from tests.temporal_support import WorkerProcess, in_process_worker, start, tool_step, write_script
from tests.test_resume_temporal import cli

pytestmark = [
    pytest.mark.temporal,
    pytest.mark.crash,
    pytest.mark.slow,
    pytest.mark.asyncio(loop_scope="session"),
]

BASH = "echo ran >> effects.log"
#: A library's own tools (``maka worker --tools``): ``append_entry`` is at-most-once.
USER_TOOLS = "tests.user_tools_pkg.effects"
#: What the model is shown for a bash the operator resolved ``applied`` (``runtime.resolution``).
APPLIED = "The operator confirmed this call took effect; treat it as done."


def _script(path: Path) -> Path:
    # Step k is the session's k-th model step: the continuation's first step is step 2, which writes
    # the result it was shown for the bash (``call-1-0``) into seen.txt.
    return write_script(
        path,
        [
            {"toolCalls": [{"name": "write_file", "args": {"path": "a.txt", "content": "A\n"}}]},
            {"toolCalls": [{"name": "bash", "args": {"command": BASH}}]},
            {
                "toolCalls": [
                    {
                        "name": "write_file",
                        "args": {"path": "seen.txt", "content": "{{result:call-1-0:text}}"},
                    }
                ]
            },
            {"text": "done"},
        ],
    )


@workflow.defn(name=SESSION_WORKFLOW, sandboxed=False)
class NoWake(SessionWorkflow):
    """The loop of before: between turns it waits for a message or a continue-as-new only."""

    @workflow.init
    def __init__(self, inp: SessionInput) -> None:
        super().__init__(inp)

    @workflow.run
    async def run(self, inp: SessionInput) -> SessionStatus:
        return await super().run(inp)

    async def _wait_for_work(self) -> SessionStatus | None:
        await workflow.wait_condition(lambda: self._pending is not None or self._should_continue())
        return None


async def _until(what: str, probe: Any, timeout: float = 60.0) -> Any:
    deadline = time.monotonic() + timeout
    seen = None
    while time.monotonic() < deadline:
        seen = await probe()
        if seen:
            return seen
        await asyncio.sleep(0.2)
    raise AssertionError(f"{what}: not within {timeout:.0f} s (last seen: {seen!r})")


async def _parked(client: Any, box: Sandbox, script: Path, name: str) -> tuple[str, str]:
    """A session whose bash parked in its open execution (the armed worker SIGKILLed at P4);
    returns (session id, the parked operation id). The caller starts the worker that recovers it."""
    armed = box.worker(Kill("P4", tag="bash"))
    await ready(armed)
    session_id, _ = await start(client, box.ws, script, box.queue, session_id=f"{name}-{box.queue}")
    assert await armed.wait_exit(90) != 0
    return session_id, ""


async def _wait_parked(client: Any, box: Sandbox, session_id: str, *, tool: str = "bash") -> str:
    async def parked() -> Any:
        status = await query_status(client, session_id)
        return status if status.state == "parked" else None

    status = await _until("the bash parks", parked, 90)
    assert status.park_reason == "dispatch_without_response", status
    with LedgerStore.open(box.db) as store:
        ((_, op),) = unsettled_operations(store.events(session_id=session_id))
    assert op.tool_name == tool
    return op.operation_id


def _continuations(box: Sandbox, session_id: str) -> list[Any]:
    with LedgerStore.open(box.db) as store:
        return [r for r in store.list_runs(session_id=session_id) if r.continuation_source]


async def _settled(client: Any, session_id: str) -> SessionStatus:
    async def idle() -> Any:
        status = await query_status(client, session_id)
        return status if status.state != "running" and status.state != "parked" else None

    return await _until("the continued turn settles", idle)  # type: ignore[no-any-return]


async def test_resolve_alone_lets_the_same_execution_finish_the_turn(
    temporal_server: Any, temporal_client: Any, tmp_path: Path
) -> None:
    box = Sandbox(temporal_server, tmp_path / "wake")
    script = _script(tmp_path / "script.json")
    session_id, _ = await _parked(temporal_client, box, script, "wake")
    worker = box.worker()
    await ready(worker)
    try:
        op = await _wait_parked(temporal_client, box, session_id)
        before = await describe_execution(temporal_client, session_id)
        # Before any resolution: resume wakes it, the ledger says the bash is unsettled, it stays.
        code, out, err = await cli(box, "resume", session_id)
        assert code == 1 and out["decision"] == "park" and out["woken"], (out, err)
        assert out["unsettledOperations"] == [op] and out["parkReason"] == "dispatch_without_response"
        assert out["rejectionReasons"] == ["pending_tool_result"] and _continuations(box, session_id) == []
        started = time.monotonic()
        code, resolved, err = await cli(
            box, "session", "resolve", session_id, "--operation", op, "--decision", "applied",
            "--by", "alice", "--reason", "effects.log has the line",
        )  # fmt: skip
        assert code == 0 and resolved["decision"] == "applied" and resolved["wake"] == "sent", (resolved, err)
        status = await _settled(temporal_client, session_id)
        took = time.monotonic() - started
        assert status.state == "idle" and status.last_wake is not None, status
        assert status.last_wake.decision == "continue" and status.wakes == 2
        after = await describe_execution(temporal_client, session_id)
        assert after.open and after.run_id == before.run_id  # the same execution, still open
        (continued,) = _continuations(box, session_id)
        assert continued.run_id == status.last_wake.continuation_run_id
        assert continued.workflow_run_id == before.run_id and continued.status == "completed"
        assert (box.ws / "seen.txt").read_text().startswith(APPLIED)  # the model saw the resolution
        assert box.log_lines()["ran"] == 1  # once, before the kill; never again
        code, report, err = await cli(box, "audit", session_id)
        drift = [f for f in report.get("findings", []) if f["severity"] == "drift"]
        assert code == 0 and report["ok"] and drift == [], (report.get("findings"), err)
        print(f"resolve -> idle in the same execution: {took:.2f} s")
    finally:
        await stop(worker)


async def test_a_resolution_whose_signal_was_lost_is_woken_by_resume_once(
    temporal_server: Any, temporal_client: Any, tmp_path: Path
) -> None:
    """The CLI died after the resolution committed, before its Signal: the ledger holds the
    resolution and the execution sleeps on. Two ``maka resume`` at once wake it: one continuation."""
    box = Sandbox(temporal_server, tmp_path / "lost-signal")
    script = _script(tmp_path / "script.json")
    session_id, _ = await _parked(temporal_client, box, script, "lost")
    worker = box.worker()
    await ready(worker)
    try:
        op = await _wait_parked(temporal_client, box, session_id)
        before = await describe_execution(temporal_client, session_id)
        with LedgerStore.open(box.db) as store:
            resolve_operation(store, session_id, op, "applied", "alice", "checked")  # no Signal
        assert (await query_status(temporal_client, session_id)).state == "parked"
        results = await asyncio.gather(
            cli(box, "resume", session_id, "--wait"), cli(box, "resume", session_id, "--wait")
        )
        answers = [(code, out.get("decision"), out.get("code")) for code, out, _ in results]
        assert all(a[:2] == (0, "continue") or a[2] == "session_busy" for a in answers), results
        assert any(a[:2] == (0, "continue") for a in answers), results
        for code, out, _ in results:
            if code == 0:
                assert out["state"] == "idle" and out["woken"], out
        (continued,) = _continuations(box, session_id)  # one continuation, whatever the race
        assert continued.workflow_run_id == before.run_id
        assert (await describe_execution(temporal_client, session_id)).run_id == before.run_id
        assert box.log_lines()["ran"] == 1
    finally:
        await stop(worker)


async def test_a_worker_start_wakes_a_session_resolved_while_its_signal_was_lost(
    temporal_server: Any, temporal_client: Any, tmp_path: Path
) -> None:
    """The resolution committed, its Signal never left; the worker restarts (a deploy): its startup
    check wakes the open execution, which finishes the turn with no operator command."""
    box = Sandbox(temporal_server, tmp_path / "startup")
    script = _script(tmp_path / "script.json")
    session_id, _ = await _parked(temporal_client, box, script, "startup")
    worker = box.worker()
    await ready(worker)
    try:
        op = await _wait_parked(temporal_client, box, session_id)
        before = await describe_execution(temporal_client, session_id)
        with LedgerStore.open(box.db) as store:
            resolve_operation(store, session_id, op, "not_applied", "alice", "no line")  # no Signal
    finally:
        await stop(worker)
    assert _continuations(box, session_id) == []  # the resolution alone moved nothing
    worker = box.worker()
    await ready(worker)
    try:
        status = await _settled(temporal_client, session_id)
        assert status.state == "idle" and status.last_wake is not None, status
        assert "wake_sent" in worker.log.read_text()
        after = await describe_execution(temporal_client, session_id)
        assert after.run_id == before.run_id
        (continued,) = _continuations(box, session_id)
        assert continued.workflow_run_id == before.run_id
        seen = (box.ws / "seen.txt").read_text()
        assert seen.startswith("The operator confirmed this call did NOT take effect"), seen
    finally:
        await stop(worker)


async def test_a_library_tool_session_goes_on_with_the_worker_s_catalog(
    temporal_server: Any, temporal_client: Any, tmp_path: Path
) -> None:
    """Issue 32: ``maka resume`` planned with the CLI's catalog, which lacks a library's tools unless
    the operator also sets ``MAKA_TOOLS``, parks ``tool_catalog_mismatch``. The wake-up plans on a
    worker of the session's queue, with its own catalog: the CLI with no ``MAKA_TOOLS`` moves it on.
    Negative control: the same plan with the CLI's catalog parks on the mismatch, writing nothing."""
    box = Sandbox(temporal_server, tmp_path / "library")
    script = write_script(
        tmp_path / "script.json", [tool_step(("append_entry", {"text": "pay"})), {"text": "ok"}]
    )
    kw: dict[str, Any] = {"home": box.root, "extra_env": {"MAKA_TOOLS": USER_TOOLS}}
    doomed = WorkerProcess(box.server, box.db, box.queue, failpoint="P4", failpoint_tag="append_entry", **kw)
    with doomed:
        doomed.wait_ready()
        session_id, _ = await start(temporal_client, box.ws, script, box.queue, session_id=f"lib-{box.queue}")
        assert await doomed.wait_exit() == -9, doomed.log.read_text()[-2000:]
    with WorkerProcess(box.server, box.db, box.queue, heartbeat_timeout=HEARTBEAT_S, **kw) as worker:
        worker.wait_ready()
        op = await _wait_parked(temporal_client, box, session_id, tool="append_entry")
        before = await describe_execution(temporal_client, session_id)
        with LedgerStore.open(box.db) as store:
            resolve_operation(store, session_id, op, "applied", "alice", "the entry is there")
            cli_view = continue_parked(
                store,
                session_id,
                workflow_id=workflow_id_for(session_id),
                catalog=tool_catalog(default_tools()),
                maka_home=box.root,
            )
        assert cli_view.decision == "park" and "tool_catalog_mismatch" in cli_view.rejection_reasons, cli_view
        assert _continuations(box, session_id) == []
        assert "MAKA_TOOLS" not in os.environ
        code, out, err = await cli(box, "resume", session_id, "--wait")
        assert code == 0 and out["decision"] == "continue" and out["state"] == "idle", (out, err)
        after = await describe_execution(temporal_client, session_id)
        assert out["woken"] and after.run_id == before.run_id
        assert (box.ws / "journal.log").read_text().count("pay") == 1  # once, before the kill


async def test_an_mcp_session_goes_on_after_resolve_with_the_worker_s_mcp_catalog(
    temporal_server: Any, temporal_client: Any, tmp_path: Path
) -> None:
    """The MCP case of issue 32: a plain MCP tool (at-most-once) of a real stdio server parks at P4;
    ``maka session resolve`` from a CLI with no ``MAKA_MCP_CONFIG`` moves the session on, because
    the worker that answers the wake plans with its started servers' catalog. The server saw one
    call. Negative control: the plan with the CLI's catalog parks ``tool_catalog_mismatch``."""
    box = Sandbox(temporal_server, tmp_path / "mcp")
    state = tmp_path / "state"
    config = write_config(tmp_path / "servers.json", {"counter": stdio_counter(state, trustAnnotations=True)})
    kw: dict[str, Any] = {"home": box.root, "extra_env": {"MAKA_MCP_CONFIG": str(config)}}
    script = write_script(tmp_path / "script.json", [tool_step(("mcp__counter__bump", {})), {"text": "ok"}])
    tag = "mcp__counter__bump"
    with WorkerProcess(box.server, box.db, box.queue, failpoint="P4", failpoint_tag=tag, **kw) as doomed:
        doomed.wait_ready()
        session_id, _ = await start(temporal_client, box.ws, script, box.queue, session_id=f"mcp-{box.queue}")
        assert await doomed.wait_exit() == -9, doomed.log.read_text()[-2000:]
    with WorkerProcess(box.server, box.db, box.queue, **kw) as worker:
        worker.wait_ready()
        op = await _wait_parked(temporal_client, box, session_id, tool=tag)
        before = await describe_execution(temporal_client, session_id)
        # Negative control, on a copy of the ledger resolved the same way: the CLI's catalog parks.
        copy = tmp_path / "copy.sqlite"
        with closing(sqlite3.connect(box.db)) as src, closing(sqlite3.connect(copy)) as dst:
            src.backup(dst)
        with LedgerStore.open(copy) as store:
            resolve_operation(store, session_id, op, "applied", "alice", "the counter moved")
            cli_view = continue_parked(
                store,
                session_id,
                workflow_id=workflow_id_for(session_id),
                catalog=tool_catalog(default_tools()),
                maka_home=box.root,
            )
            assert store.session_claims(session_id) == []  # a park writes nothing
        assert cli_view.decision == "park" and "tool_catalog_mismatch" in cli_view.rejection_reasons, cli_view
        assert "MAKA_MCP_CONFIG" not in os.environ
        code, resolved, err = await cli(
            box, "session", "resolve", session_id, "--operation", op, "--decision", "applied",
            "--by", "alice", "--reason", "the counter moved",
        )  # fmt: skip
        assert code == 0 and resolved["wake"] == "sent", (resolved, err)
        status = await _settled(temporal_client, session_id)
        assert status.state == "idle", status
        assert (await describe_execution(temporal_client, session_id)).run_id == before.run_id
        assert [c["tool"] for c in calls(state)] == ["bump"]  # once, before the kill
        (continued,) = _continuations(box, session_id)
        assert continued.workflow_run_id == before.run_id


async def test_negative_control_a_workflow_without_the_wake_wait_stays_parked(
    temporal_server: Any, temporal_client: Any, tmp_path: Path
) -> None:
    box = Sandbox(temporal_server, tmp_path / "nowake")
    script = _script(tmp_path / "script.json")
    session_id, _ = await _parked(temporal_client, box, script, "nowake")
    settings = RuntimeSettings(tool_heartbeat_timeout_s=HEARTBEAT_S)
    async with in_process_worker(
        temporal_client, Path(box.db), box.queue, settings=settings, workflow=NoWake
    ):
        op = await _wait_parked(temporal_client, box, session_id)
        code, resolved, err = await cli(
            box, "session", "resolve", session_id, "--operation", op, "--decision", "applied",
            "--by", "alice", "--reason", "effects.log has the line",
        )  # fmt: skip
        assert code == 0 and resolved["wake"] == "sent", (resolved, err)
        handle = temporal_client.get_workflow_handle(workflow_id_for(session_id))

        async def signal_handled() -> bool:
            kinds = [e.event_type async for e in handle.fetch_history_events()]
            if EventType.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED not in kinds:
                return False
            at = kinds.index(EventType.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED)
            return EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED in kinds[at:]

        await _until("the wake Signal's workflow task completes", signal_handled)
        status = await query_status(temporal_client, session_id)
        assert status.state == "parked" and status.park_reason == "dispatch_without_response"
        assert status.last_wake is None and _continuations(box, session_id) == []
        before = await describe_execution(temporal_client, session_id)
    # The upgrade: today's worker replays the wake the old loop dropped; the patch (asked there,
    # with no marker in history) stays off for this execution, which says it cannot be woken.
    # ``maka resume`` then closes it (the ledger settles the bash) and continues the session.
    worker = box.worker()
    await ready(worker)
    try:
        status = await query_status(temporal_client, session_id)
        assert status.state == "parked" and status.wakes is None, status
        code, out, err = await cli(box, "resume", session_id, "--wait")
        assert code == 0 and out["decision"] == "continue" and out["state"] == "idle", (out, err)
        assert "woken" not in out
        after = await describe_execution(temporal_client, session_id)
        assert after.run_id != before.run_id  # a new execution, as resume of a lost one starts
        (continued,) = _continuations(box, session_id)
        assert continued.workflow_run_id == after.run_id
        assert (box.ws / "seen.txt").read_text().startswith(APPLIED)
        assert box.log_lines()["ran"] == 1
    finally:
        await stop(worker)
