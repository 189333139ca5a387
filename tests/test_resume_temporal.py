"""``maka resume`` on Temporal: real dev server, real ``maka worker`` processes, real SIGKILL.

Each drill loses a session's execution the way an operator meets it (the worker SIGKILLed at a
crash point, then the execution terminated while no worker runs), starts a fresh worker (its
startup repair settles the lost run through recovery), and resumes through the real CLI. Must
hold: a safe boundary continues and finishes the turn with exactly one real effect per tool; a
bash with T1 and no T2 parks and never runs again; concurrent resumes make one continuation; the
worker resumes by itself with ``MAKA_RUNTIME_SAFE_BOUNDARY_RESUME=1`` and never with ``=0``.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from pathlib import Path
from typing import Any

import pytest

from maka_core.store.writer import LedgerStore
from maka_temporal.workflows.contracts import workflow_id_for
from tests.drills import Kill, Sandbox, maka_cli, ready, stop
from tests.temporal_support import start, write_script

pytestmark = [pytest.mark.temporal, pytest.mark.crash, pytest.mark.asyncio(loop_scope="session")]

BASH = "echo ran >> effects.log"


def _script(path: Path) -> Path:
    return write_script(
        path,
        [
            {"toolCalls": [{"name": "write_file", "args": {"path": "a.txt", "content": "A\n"}}]},
            {"toolCalls": [{"name": "bash", "args": {"command": BASH}}]},
            {"text": "done"},
        ],
    )


async def cli(box: Sandbox, *args: str, env: dict[str, str] | None = None) -> tuple[int, dict[str, Any], str]:
    """Run ``maka ARGS --db <ledger> --json`` for real; (exit code, JSON output, stderr)."""
    full = {**os.environ, "MAKA_HOME": str(box.root), "TEMPORAL_ADDRESS": box.server.address, **(env or {})}
    for key in ("MAKA_FAILPOINT", "MAKA_FAILPOINT_TAG", "MAKA_FAILPOINT_SKIP"):
        full.pop(key, None)
    proc = await asyncio.create_subprocess_exec(
        *maka_cli(), *args, "--db", str(box.db), "--json",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=full,
    )  # fmt: skip
    out, err = await proc.communicate()
    text = out.decode()
    try:
        doc = json.loads(text) if text.strip() else {}
    except ValueError:
        doc = {"raw": text}
    return proc.returncode or 0, doc, err.decode()


async def lose_execution(client: Any, box: Sandbox, kill: Kill, script: Path) -> str:
    """Start a session on a worker armed with ``kill``; once it died, terminate the execution."""
    worker = box.worker(kill)
    await ready(worker)
    session_id, _ = await start(client, box.ws, script, box.queue, session_id=f"resume-{box.queue}")
    assert await worker.wait_exit(90) != 0
    await client.get_workflow_handle(workflow_id_for(session_id)).terminate("operator: execution lost")
    return session_id


def _writes(box: Sandbox) -> int:
    return box.file_effects()[("write_file", str((box.ws / "a.txt").resolve()))]


def _continuations(box: Sandbox, session_id: str) -> list[str]:
    with LedgerStore.open(box.db) as store:
        return [r.run_id for r in store.list_runs(session_id=session_id) if r.continuation_source]


def _provider_calls(log: Path) -> list[str]:
    return log.read_text().splitlines() if log.exists() else []


async def test_a_turn_lost_at_a_safe_boundary_continues_and_finishes_with_one_effect_per_tool(
    temporal_server: Any, temporal_client: Any, tmp_path: Path
) -> None:
    box = Sandbox(temporal_server, tmp_path / "safe")
    script = _script(tmp_path / "script.json")
    # P7: the write_file result is committed and delivered; the next provider step never started.
    session_id = await lose_execution(temporal_client, box, Kill("P7"), script)
    lost_at = time.monotonic()
    calls = tmp_path / "provider-calls.log"
    # A fresh worker: its startup repair settles the lost run through recovery.
    worker = _worker_with_env(box, {"MAKA_PROVIDER_CALL_LOG": str(calls)})
    await ready(worker)
    try:
        code, status, _ = await cli(box, "session", "status", session_id)
        assert code == 0 and status["state"] != "running"  # the closed execution's Query is not asked
        assert status["executionStatus"] == "terminated"
        resumed_at = time.monotonic()
        resuming = asyncio.create_task(cli(box, "resume", session_id, "--wait"))
        while not _provider_calls(calls) and not resuming.done():
            await asyncio.sleep(0.005)
        first_call_at = time.monotonic()
        code, out, err = await resuming
        first_call = next(iter(_provider_calls(calls)), None)
        print(
            f"resume latency: lost execution -> first new provider call {first_call_at - lost_at:.2f}s "
            f"(of which `maka resume` -> first call {first_call_at - resumed_at:.2f}s)"
        )
        assert code == 0, (out, err)
        assert out["decision"] == "continue" and out["state"] == "idle" and out["parkReason"] is None
        assert set(out) == {
            "ok", "sessionId", "workflowId", "decision", "parkReason", "rejectionReasons", "diagnostics",
            "sourceRunId", "continuationRunId", "highWater", "state",
        }  # fmt: skip
        assert first_call is not None and first_call.startswith(out["continuationRunId"])
        latency = time.monotonic() - lost_at
        print(f"resume latency (lost execution -> continued turn settled): {latency:.2f}s")
        assert _writes(box) == 1
        assert box.log_lines()["ran"] == 1
        assert len(_continuations(box, session_id)) == 1
        # The session lives on in its new execution: a second resume is refused, nothing written.
        code, again, _ = await cli(box, "resume", session_id)
        assert code == 2 and again["code"] == "session_busy"
        assert len(_continuations(box, session_id)) == 1
        clean, report = await box.verify()
        assert clean, report
        # The auditor's view of the same story: the terminated execution, the repaired source run,
        # the claim, the continuation start and the new execution agree with the ledger.
        code, audit, err = await cli(box, "audit", session_id)
        assert code == 0 and audit["ok"], (audit.get("findings"), err)
        assert len(audit["executions"]) >= 2
    finally:
        await stop(worker)


def _worker_with_env(box: Sandbox, env: dict[str, str]) -> Any:
    from tests.temporal_support import WorkerProcess

    return WorkerProcess(
        box.server, box.db, box.queue, home=box.root, heartbeat_timeout=2.0,
        extra_env={"MAKA_EFFECT_LOG": str(box.journal), **env},
        log=box.root / f"worker-env-{time.time_ns()}.log",
    )  # fmt: skip


async def test_resume_refuses_an_open_execution_and_an_unknown_session(
    temporal_server: Any, temporal_client: Any, tmp_path: Path
) -> None:
    box = Sandbox(temporal_server, tmp_path / "busy")
    script = write_script(tmp_path / "script.json", [{"text": "hello"}])
    worker = box.worker()
    await ready(worker)
    try:
        session_id, _ = await start(
            temporal_client, box.ws, script, box.queue, session_id=f"busy-{box.queue}"
        )
        code, out, _ = await cli(box, "session", "status", session_id)
        before = out["eventCount"]
        code, out, err = await cli(box, "resume", session_id)
        assert code == 2 and out.get("code") == "session_busy", (code, out, err)
        code, out, err = await cli(box, "resume", "no-such-session")
        assert code == 2 and out.get("code") == "session_not_found", (code, out, err)
        code, out, _ = await cli(box, "session", "status", session_id)
        assert out["eventCount"] == before  # nothing written
    finally:
        await stop(worker)


async def test_resume_of_a_session_parked_in_its_open_execution_wakes_it_and_names_the_call(
    temporal_server: Any, temporal_client: Any, tmp_path: Path
) -> None:
    """The common case after a worker crash: the bash parked, the execution stays open; resume
    wakes it (issue 32), the ledger says the bash is unsettled, so it stays parked (nothing
    claimed) and the answer names the call the operator resolves (``maka session resolve``)."""
    box = Sandbox(temporal_server, tmp_path / "parked-open")
    script = _script(tmp_path / "script.json")
    armed = box.worker(Kill("P4", tag="bash"))
    await ready(armed)
    session_id, _ = await start(temporal_client, box.ws, script, box.queue, session_id=f"po-{box.queue}")
    assert await armed.wait_exit(90) != 0
    worker = box.worker()
    await ready(worker)
    try:
        deadline = time.monotonic() + 90
        while True:
            code, status, _ = await cli(box, "session", "status", session_id)
            if status.get("state") == "parked" or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.5)
        assert status["state"] == "parked" and status["executionStatus"] == "running", status
        code, out, _ = await cli(box, "resume", session_id)
        assert code == 1 and out["decision"] == "park" and out["woken"], out
        assert out["state"] == "parked" and out["parkReason"] == "dispatch_without_response"
        assert len(out["unsettledOperations"]) == 1
        assert _continuations(box, session_id) == []
    finally:
        await stop(worker)


async def test_a_lost_bash_with_t1_and_no_t2_parks_and_never_runs_again(
    temporal_server: Any, temporal_client: Any, tmp_path: Path
) -> None:
    box = Sandbox(temporal_server, tmp_path / "bash")
    script = _script(tmp_path / "script.json")
    session_id = await lose_execution(temporal_client, box, Kill("P4", tag="bash"), script)
    worker = box.worker()
    await ready(worker)
    try:
        code, out, err = await cli(box, "resume", session_id)
        assert code == 1, (out, err)
        assert out["decision"] == "park" and out["parkReason"] == "source_run_unreadable"
        assert out["rejectionReasons"] == ["runtime_ledger_unreadable"]
        blocking = [d for d in out["diagnostics"] if d["code"] == "pending_tool_result"]
        assert blocking and blocking[0]["toolName"] == "bash"
        assert blocking[0]["detail"]["status"] == "indeterminate"
        assert out["state"] == "parked"
        code, status, _ = await cli(box, "session", "status", session_id)
        assert status["state"] == "parked" and status["parkReason"] == "dispatch_without_response"
        assert box.log_lines()["ran"] == 1  # P4: the effect happened once, and never again
        assert _continuations(box, session_id) == []
        code, sent, _ = await cli(box, "session", "send", session_id, "again")
        assert code == 2 and sent["code"] == "resume_required"
    finally:
        await stop(worker)


#: What a resume that lost the race to another may answer: never a park of the healthy session.
RACE_REFUSALS = frozenset({"continuation_already_exists", "session_busy", "resume_not_needed"})


def race_answers(results: list[tuple[int, dict[str, Any], str]]) -> list[tuple[int, Any, Any]]:
    """(exit code, decision, code or park reason) per resume; asserts each is a continue (0) or
    a refusal from ``RACE_REFUSALS`` (2), never a park (1)."""
    answers = [
        (code, out.get("decision"), out.get("parkReason") or out.get("code")) for code, out, _ in results
    ]
    for (code, decision, reason), (_, out, err) in zip(answers, results, strict=True):
        assert (code, decision) == (0, "continue") or (code == 2 and reason in RACE_REFUSALS), (
            answers,
            out,
            err,
        )
    return answers


async def _wait_terminal(box: Sandbox, run_id: str) -> Any:
    deadline = time.monotonic() + 60
    header = None
    while time.monotonic() < deadline:
        with LedgerStore.open(box.db) as store:
            header = store.get_run(run_id)
        if header is not None and header.is_terminal:
            break
        await asyncio.sleep(0.2)
    return header


@pytest.mark.parametrize("count", [4, pytest.param(10, marks=pytest.mark.slow)])
async def test_concurrent_resumes_make_exactly_one_continuation_and_no_answer_parks(
    count: int, temporal_server: Any, temporal_client: Any, tmp_path: Path
) -> None:
    box = Sandbox(temporal_server, tmp_path / "race")
    script = _script(tmp_path / "script.json")
    session_id = await lose_execution(temporal_client, box, Kill("P7"), script)
    worker = box.worker()
    await ready(worker)
    try:
        results = await asyncio.gather(*(cli(box, "resume", session_id) for _ in range(count)))
        answers = race_answers(results)
        print(f"race result: {answers}")
        assert len(_continuations(box, session_id)) == 1
        assert any(code == 0 for code, _, _ in answers)
        continuation = _continuations(box, session_id)[0]
        for _, out, _ in results:  # every answer that names a continuation names the one
            assert out.get("continuationRunId") in (None, continuation), out
        header = await _wait_terminal(box, continuation)
        assert header is not None and header.status == "completed"
        assert box.log_lines()["ran"] == 1 and _writes(box) == 1
        with LedgerStore.open(box.db) as store:
            assert [r for r in store.list_runs(session_id=session_id) if r.park_reason] == []
    finally:
        await stop(worker)


async def test_a_resume_beside_a_winner_between_its_claim_and_its_start_waits_and_continues_it(
    temporal_server: Any, temporal_client: Any, tmp_path: Path
) -> None:
    """The window ten concurrent resumes met: the winner's claim committed, its continuation's
    header and start not yet. A resume then must wait for the winner, not park the session."""
    import sys

    from maka_core.settings import load_settings
    from maka_temporal.workers.host.resume import resume_lost_session
    from maka_temporal.workers.host.worker import default_runtime

    box = Sandbox(temporal_server, tmp_path / "window")
    script = _script(tmp_path / "script.json")
    session_id = await lose_execution(temporal_client, box, Kill("P7"), script)
    worker = box.worker()
    await ready(worker)
    winner = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "tests.children.slow_claimer", str(box.db), session_id,
        workflow_id_for(session_id), "6",
        stdout=asyncio.subprocess.PIPE, cwd=Path(__file__).resolve().parent.parent,
    )  # fmt: skip
    try:
        assert winner.stdout is not None
        claimed = (await asyncio.wait_for(winner.stdout.readline(), 60)).decode().split()
        assert claimed[:1] == ["CLAIMED"], claimed
        # Negative control: today's resume, which does not wait for a claim in flight, parks
        # the healthy session with continuation_repair_required.
        with LedgerStore.open(box.db) as store:
            rt = default_runtime(store, load_settings().runtime_settings())
            try:
                today = await resume_lost_session(
                    temporal_client, rt, session_id, task_queue=box.queue, claim_wait_s=0
                )
            finally:
                rt.close()
        assert (today["decision"], today["parkReason"]) == ("park", "continuation_repair_required"), today
        results = [await cli(box, "resume", session_id)]
        race_answers(results)
        code, out, err = results[0]
        assert code == 0 and out["continuationRunId"] == claimed[1], (out, err)
        decided = (await asyncio.wait_for(winner.stdout.readline(), 60)).decode().split()
        assert decided[:2] == ["DECISION", "continue"], decided
        assert len(_continuations(box, session_id)) == 1
        header = await _wait_terminal(box, claimed[1])
        assert header is not None and header.status == "completed"
        assert box.log_lines()["ran"] == 1 and _writes(box) == 1
    finally:
        if winner.returncode is None:
            winner.kill()
        await winner.wait()
        await stop(worker)


@pytest.mark.parametrize("setting", ["1", "0"])
async def test_worker_auto_resume_follows_the_setting(
    setting: str, temporal_server: Any, temporal_client: Any, tmp_path: Path
) -> None:
    box = Sandbox(temporal_server, tmp_path / f"auto-{setting}")
    script = _script(tmp_path / "script.json")
    session_id = await lose_execution(temporal_client, box, Kill("P7"), script)
    plain = box.worker()  # repairs the lost run but does not resume it (the setting is unset)
    await ready(plain)
    await stop(plain)
    assert _continuations(box, session_id) == []
    worker = _worker_with_env(box, {"MAKA_RUNTIME_SAFE_BOUNDARY_RESUME": setting})
    await ready(worker)
    try:
        deadline = time.monotonic() + (60 if setting == "1" else 5)
        state = None
        while time.monotonic() < deadline:
            code, status, _ = await cli(box, "session", "status", session_id)
            state = status.get("state")
            if setting == "1" and state == "idle":
                break
            await asyncio.sleep(0.5)
        if setting == "1":
            assert state == "idle" and len(_continuations(box, session_id)) == 1
            assert box.log_lines()["ran"] == 1
            assert "execution_started" in worker.log.read_text()
        else:  # negative control: no continuation, and resume is disabled altogether
            assert _continuations(box, session_id) == []
            code, out, _ = await cli(
                box, "resume", session_id, env={"MAKA_RUNTIME_SAFE_BOUNDARY_RESUME": "0"}
            )
            assert code == 1 and out["parkReason"] == "resume_feature_disabled"
    finally:
        await stop(worker)


@pytest.mark.slow
async def test_a_continuation_lost_again_resumes_as_a_second_generation_replaying_both_segments(
    temporal_server: Any, temporal_client: Any, tmp_path: Path
) -> None:
    box = Sandbox(temporal_server, tmp_path / "gen2")
    script = _script(tmp_path / "script.json")
    session_id = await lose_execution(temporal_client, box, Kill("P7"), script)
    # The first continuation runs bash, then its worker dies before the next provider step.
    armed = box.worker(Kill("P7"))
    await ready(armed)
    code, first, err = await cli(box, "resume", session_id, "--task-queue", box.queue)
    assert code == 0, (first, err)
    assert await armed.wait_exit(90) != 0
    await temporal_client.get_workflow_handle(workflow_id_for(session_id)).terminate("lost again")
    worker = box.worker()
    await ready(worker)
    try:
        code, second, err = await cli(box, "resume", session_id, "--wait")
        assert code == 0 and second["state"] == "idle", (second, err)
        assert second["sourceRunId"] == first["continuationRunId"]
        with LedgerStore.open(box.db) as store:
            claims = store.session_claims(session_id)
        segments = [
            c.boundary_json["segments"] for c in claims if c.target_run_id == second["continuationRunId"]
        ]
        assert [s["identity"]["runId"] for s in segments[0]] == [
            first["sourceRunId"],
            first["continuationRunId"],
        ]
        assert box.log_lines()["ran"] == 1 and _writes(box) == 1  # one dispatch per tool, two generations
    finally:
        await stop(worker)


@pytest.mark.slow
async def test_a_workflow_stuck_on_an_incompatible_deploy_is_reported_then_terminated_and_resumed(
    temporal_server: Any, temporal_client: Any, tmp_path: Path
) -> None:
    from tests.temporal_support import WorkerProcess

    box = Sandbox(temporal_server, tmp_path / "nondet")
    script = _script(tmp_path / "script.json")
    worker = box.worker(Kill("P7"))
    await ready(worker)
    session_id, _ = await start(temporal_client, box.ws, script, box.queue, session_id=f"nondet-{box.queue}")
    assert await worker.wait_exit(90) != 0
    bad = WorkerProcess(
        box.server, box.db, box.queue, home=box.root, entry=("-m", "tests.children.incompatible_worker"),
        log=box.root / "incompatible.log",
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 90
        status: dict[str, Any] = {}
        while time.monotonic() < deadline:
            code, status, err = await cli(box, "session", "status", session_id)
            if status.get("workflowTaskFailing"):
                break
            await asyncio.sleep(1)
        assert status.get("workflowTaskFailing") is True, status
        assert "keeps failing" in err
        code, busy, _ = await cli(box, "resume", session_id)
        assert code == 2 and busy["code"] == "session_busy"  # open, though stuck: the operator terminates
    finally:
        bad.stop()
    await temporal_client.get_workflow_handle(workflow_id_for(session_id)).terminate("bad deploy")
    good = box.worker()
    await ready(good)
    try:
        code, out, err = await cli(box, "resume", session_id, "--wait")
        assert code == 0 and out["state"] == "idle", (out, err)
        assert box.log_lines()["ran"] == 1 and _writes(box) == 1
    finally:
        await stop(good)


@pytest.mark.slow
async def test_the_ledger_alone_carries_a_session_whose_server_database_was_deleted(tmp_path: Path) -> None:
    from maka_temporal.workers.client.connect import connect
    from maka_temporal.workers.host import devserver

    db_file = tmp_path / "temporal.db"
    server = devserver.start(ui=False, db_file=db_file, log_path=tmp_path / "temporal.log")
    try:
        client = await connect(server.address)
        box = Sandbox(server, tmp_path / "dbloss")
        script = _script(tmp_path / "script.json")
        worker = box.worker(Kill("P7"))
        await ready(worker)
        session_id, _ = await start(client, box.ws, script, box.queue, session_id=f"dbloss-{box.queue}")
        assert await worker.wait_exit(90) != 0
        server.stop()
        # Every execution, history and search attribute is gone: the database with its WAL and
        # shared-memory files (a WAL left behind would hand the new database the old pages).
        for part in tmp_path.glob(f"{db_file.name}*"):
            part.unlink()
        server = devserver.start(
            port=server.port, ui=False, db_file=db_file, log_path=tmp_path / "temporal.log"
        )
        box.server = server
        fresh = box.worker()
        await ready(fresh)
        try:
            code, status, _ = await cli(box, "session", "status", session_id)
            assert status["executionStatus"] == "not_found" and status["state"] != "running"
            code, out, err = await cli(box, "resume", session_id, "--wait")
            assert code == 0 and out["state"] == "idle", (out, err)
            assert box.log_lines()["ran"] == 1 and _writes(box) == 1
        finally:
            await stop(fresh)
    finally:
        server.stop()


@pytest.mark.slow
@pytest.mark.parametrize("point", ["after_terminal_event_committed", "after_terminal_header_committed"])
async def test_a_worker_killed_at_a_continuation_terminal_point_leaves_the_reference_code(
    point: str, temporal_server: Any, temporal_client: Any, tmp_path: Path
) -> None:
    from maka_core import failpoints
    from maka_core.ledger.continuation import id_source
    from maka_core.runtime.continuation import plan_for
    from maka_core.runtime.inspect import inspect_host
    from maka_core.tools.registry import default_tools

    box = Sandbox(temporal_server, tmp_path / point)
    script = _script(tmp_path / "script.json")
    session_id = await lose_execution(temporal_client, box, Kill("P7"), script)
    armed = box.worker(Kill(point, tag="continuation"))
    await ready(armed)
    code, out, err = await cli(box, "resume", session_id, "--task-queue", box.queue)
    assert code == 0, (out, err)
    assert await armed.wait_exit(90) != 0
    observed = inspect_host(str(box.ws), default_tools().keys())
    with LedgerStore.open(box.db) as store:
        plan = plan_for(store, session_id, out["sourceRunId"], observed, id_source())  # type: ignore[arg-type]
    assert plan.rejection_reasons == (failpoints.CONTINUATION[point],)
    await temporal_client.get_workflow_handle(workflow_id_for(session_id)).terminate("crash drill")
    worker = box.worker()
    await ready(worker)
    try:
        code, after, err = await cli(box, "resume", session_id)
        # The continuation finished its turn: nothing to resume, never a second continuation.
        assert code == 2 and after["code"] == "resume_not_needed", (after, err)
        assert len(_continuations(box, session_id)) == 1
        assert box.log_lines()["ran"] == 1 and _writes(box) == 1
    finally:
        await stop(worker)


@pytest.mark.slow
async def test_after_a_workflow_reset_the_replayed_turn_hands_off_and_resume_finishes_it_once(
    temporal_server: Any, temporal_client: Any, tmp_path: Path
) -> None:
    import uuid

    from temporalio.api.common.v1 import WorkflowExecution
    from temporalio.api.enums.v1 import EventType
    from temporalio.api.workflowservice.v1 import ResetWorkflowExecutionRequest

    box = Sandbox(temporal_server, tmp_path / "reset")
    script = _script(tmp_path / "script.json")
    worker = box.worker(Kill("P7"))
    await ready(worker)
    session_id, _ = await start(temporal_client, box.ws, script, box.queue, session_id=f"reset-{box.queue}")
    assert await worker.wait_exit(90) != 0
    handle = temporal_client.get_workflow_handle(workflow_id_for(session_id))
    history = [e async for e in handle.fetch_history_events()]
    first_task = next(
        e.event_id for e in history if e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED
    )
    desc = await handle.describe()
    # `temporal workflow reset` to the first workflow task: the message is reapplied and the
    # turn replays in a NEW execution over a ledger that already holds it.
    await temporal_client.workflow_service.reset_workflow_execution(
        ResetWorkflowExecutionRequest(
            namespace=temporal_client.namespace,
            workflow_execution=WorkflowExecution(workflow_id=handle.id, run_id=desc.run_id),
            reason="operator reset",
            workflow_task_finish_event_id=first_task,
            request_id=str(uuid.uuid4()),
        )
    )
    fresh = box.worker()
    await ready(fresh)
    try:
        deadline = time.monotonic() + 60
        while (await handle.describe()).status is not None and time.monotonic() < deadline:
            if (await handle.describe()).status.name != "RUNNING":
                break
            await asyncio.sleep(0.2)
        assert (await handle.describe()).status.name == "COMPLETED"  # handed off, nothing re-run
        code, out, err = await cli(box, "resume", session_id, "--wait")
        assert code == 0 and out["state"] == "idle", (out, err)
        assert box.log_lines()["ran"] == 1 and _writes(box) == 1
        with LedgerStore.open(box.db) as store:
            users = [e for e in store.events(session_id=session_id) if e.role == "user"]
        assert len(users) == 1  # the user message is never duplicated
    finally:
        await stop(fresh)


async def test_an_operator_resolution_then_resume_finishes_the_turn_without_re_running_the_bash(
    temporal_server: Any, temporal_client: Any, tmp_path: Path
) -> None:
    box = Sandbox(temporal_server, tmp_path / "resolve")
    script = _script(tmp_path / "script.json")
    session_id = await lose_execution(temporal_client, box, Kill("P4", tag="bash"), script)
    worker = box.worker()
    await ready(worker)
    try:
        code, parked, _ = await cli(box, "resume", session_id)
        assert code == 1
        (blocking,) = [d for d in parked["diagnostics"] if d["code"] == "pending_tool_result"]
        op = blocking["detail"]["operationId"]
        code, resolved, err = await cli(
            box, "session", "resolve", session_id, "--operation", op, "--decision", "applied",
            "--by", "alice", "--reason", "effects.log has the line",
        )  # fmt: skip
        assert code == 0 and resolved["decision"] == "applied", (resolved, err)
        code, out, err = await cli(box, "resume", session_id, "--wait")
        assert code == 0 and out["state"] == "idle", (out, err)
        assert [d["code"] for d in out["diagnostics"]] == ["operation_resolved"]
        assert box.log_lines()["ran"] == 1  # applied once, before the loss; never again
        code, status, _ = await cli(box, "session", "status", session_id)
        assert status["state"] == "idle" and status["resolutions"][op]["resolvedBy"] == "alice"
        # The resolution is the operator's fact, not drift: the audit agrees with the histories.
        code, report, err = await cli(box, "audit", session_id)
        drift = [f for f in report.get("findings", []) if f["severity"] == "drift"]
        assert code == 0 and report["ok"] and drift == [], (report.get("findings"), err)
        assert [r["operatorResolution"]["decision"] for r in report["runs"] if "operatorResolution" in r] == [
            "applied"
        ]
    finally:
        await stop(worker)


async def test_an_imported_session_without_run_headers_is_refused_alike_by_resume_and_status(
    temporal_server: Any, tmp_path: Path
) -> None:
    """``ledger import`` writes events, not run headers: ``status`` lists the session, so
    ``resume`` must not call it unknown; both name ``session_runs_missing``."""
    box = Sandbox(temporal_server, tmp_path / "imported")
    ledger = Path(__file__).parent / "fixtures" / "maka_examples" / "01-complete-call-dispatch-response.jsonl"
    code, out, err = await cli(box, "ledger", "import", str(ledger))
    assert code == 0, (out, err)
    code, out, err = await cli(box, "resume", "sess-1")
    assert (code, out["code"], out["eventCount"]) == (2, "session_runs_missing", 5), (out, err)
    code, status, err = await cli(box, "session", "status", "sess-1")
    assert code == 0 and status["eventCount"] == 5 and status["turns"] == [], (status, err)
    assert status["resume"]["code"] == "session_runs_missing" and "session_runs_missing" in err
    # Negative control: a session the ledger does not hold at all is still unknown to both.
    code, out, _ = await cli(box, "resume", "sess-2")
    assert (code, out["code"]) == (2, "session_not_found")
    code, out, _ = await cli(box, "session", "status", "sess-2")
    assert (code, out["code"]) == (2, "session_not_found")


async def test_the_cli_and_session_client_resume_answer_the_same(
    temporal_server: Any, temporal_client: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``maka resume`` is ``SessionClient.resume``: the same park, the same refusals, by code."""
    from maka_temporal import SessionClient, SessionError

    box = Sandbox(temporal_server, tmp_path / "same")
    monkeypatch.setenv("MAKA_HOME", str(box.root))  # as ``cli`` gives the CLI process
    sessions = SessionClient(temporal_client, ledger=box.db)
    script = _script(tmp_path / "s.json")
    session_id = await lose_execution(temporal_client, box, Kill("P4", tag="bash"), script)
    worker = box.worker()
    await ready(worker)
    try:
        code, by_cli, err = await cli(box, "resume", session_id)
        assert code == 1 and by_cli["decision"] == "park", (by_cli, err)
        by_api = await sessions.resume(session_id)
        assert by_api.raw == by_cli  # the second resume plans the same park
        assert (by_api.decision, by_api.state, by_api.park_reason) == ("park", "parked", by_cli["parkReason"])
        both: dict[str, Any] = {"restore": "isolated", "rebaseline": True}
        for args, kwargs, want in (
            (("resume", session_id, "--restore", "isolated", "--rebaseline"), both, "config_invalid"),
            (("resume", "no-such-session"), {}, "session_not_found"),
        ):
            code, refused, _ = await cli(box, *args)
            assert code == 2 and refused["code"] == want, refused
            with pytest.raises(SessionError) as caught:
                await sessions.resume(args[1], **kwargs)
            assert caught.value.code == want
    finally:
        await stop(worker)


@pytest.mark.parametrize(
    ("tools", "ledger", "want"),
    [("no_such_module_xyz", True, "tools_invalid"), ("", False, "ledger_not_found")],
)
async def test_resume_names_a_local_fault_before_an_unreachable_server(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, tools: str, ledger: bool, want: str
) -> None:
    """Bad ``MAKA_TOOLS`` (or no ledger) and no Temporal: the CLI and ``SessionClient.resume`` both
    name the local fault, checked before connecting (as ``maka resume`` always did)."""
    from maka_temporal import SessionClient, SessionError

    db = tmp_path / "ledger.sqlite"
    if ledger:
        LedgerStore.open(db).close()
    env = {**os.environ, "MAKA_HOME": str(tmp_path / "home"), "MAKA_TOOLS": tools}
    proc = await asyncio.create_subprocess_exec(
        *maka_cli(), "resume", "s1", "--json", "--db", str(db), "--address", "127.0.0.1:1",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=env,
    )  # fmt: skip
    out, err = await asyncio.wait_for(proc.communicate(), 120)
    assert proc.returncode == 2 and json.loads(out)["code"] == want, (out, err)
    monkeypatch.setenv("MAKA_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("MAKA_TOOLS", tools)
    with pytest.raises(SessionError) as caught:
        await SessionClient(None, ledger=db).resume("s1")
    assert caught.value.code == want


async def test_session_client_resume_checks_the_catalog_against_the_tools_it_is_given(
    temporal_server: Any, temporal_client: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A library fleet serves its tools through ``MakaPlugin(tools=...)``, not ``MAKA_TOOLS``:
    ``SessionClient(tools=...)`` resumes with them. Control: the same client without them checks
    the lost run's catalog against the built-ins alone and parks ``tool_catalog_mismatch``."""
    from examples.own_tool.tools import word_count
    from maka_temporal import SessionClient

    box = Sandbox(temporal_server, tmp_path / "catalog")
    monkeypatch.setenv("MAKA_HOME", str(box.root))
    monkeypatch.setenv("MAKA_TOOLS", "examples.own_tool.tools")  # the lost worker served it
    script = write_script(
        tmp_path / "s.json",
        [{"toolCalls": [{"name": "word_count", "args": {"text": "a b"}}]}, {"text": "done"}],
    )  # P7: the word_count result committed, the next model step never began
    session_id = await lose_execution(temporal_client, box, Kill("P7"), script)
    monkeypatch.delenv("MAKA_TOOLS")
    without = await SessionClient(temporal_client, ledger=box.db, task_queue=box.queue).resume(session_id)
    assert without.decision == "park", without.raw
    assert without.raw["rejectionReasons"] == ["tool_catalog_mismatch"], without.raw
    given = SessionClient(temporal_client, ledger=box.db, task_queue=box.queue, tools=[word_count])
    resumed = await given.resume(session_id)
    assert resumed.decision == "continue", resumed.raw


async def test_resume_wait_timeout_gives_up_waiting_and_keeps_the_continued_session(
    temporal_server: Any, temporal_client: Any, tmp_path: Path
) -> None:
    """``maka resume --wait --wait-timeout S`` as ``session start`` takes it: the continuation starts,
    no worker polls, so the wait ends with ``wait_timeout`` after S seconds (not MAKA_WAIT_TIMEOUT's
    600, set in the environment: the flag wins) and the session goes on once a worker is back.
    Control: ``--wait-timeout 0`` is refused ``config_invalid`` before anything is written."""
    box = Sandbox(temporal_server, tmp_path / "wait-timeout")
    script = _script(tmp_path / "script.json")
    session_id = await lose_execution(temporal_client, box, Kill("P7"), script)
    repair = box.worker()  # its startup repair settles the lost run; then no worker polls
    await ready(repair)
    await stop(repair)
    env = {"MAKA_WAIT_TIMEOUT": "600"}
    code, out, err = await cli(box, "resume", session_id, "--wait", "--wait-timeout", "0", env=env)
    assert code == 2 and out.get("code") == "config_invalid", (code, out, err)
    assert _continuations(box, session_id) == []
    began = time.monotonic()
    code, out, err = await cli(box, "resume", session_id, "--wait", "--wait-timeout", "3", env=env)
    took = time.monotonic() - began
    print(f"resume --wait --wait-timeout 3 with no worker polling: gave up after {took:.1f}s")
    assert code == 2 and out.get("code") == "wait_timeout", (code, out, err)
    assert 3 <= took < 120, took
    assert len(_continuations(box, session_id)) == 1  # the continued session was kept
    worker = box.worker()
    await ready(worker)
    try:
        deadline = time.monotonic() + 90
        while True:
            code, status, _ = await cli(box, "session", "status", session_id)
            if status.get("state") == "idle" or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.5)
        assert status["state"] == "idle", status
        assert _writes(box) == 1 and box.log_lines()["ran"] == 1
    finally:
        await stop(worker)
