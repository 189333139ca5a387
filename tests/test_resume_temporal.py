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
from tests.drills import Kill, Sandbox, maka_cli, ready, stop
from tests.temporal_support import start, write_script
from workflows.contracts import workflow_id_for

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
        code, out, err = await cli(box, "resume", session_id, "--wait")
        first_call = next(iter(_provider_calls(calls)), None)
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
        code, out, _ = await cli(box, "resume", session_id)
        assert code == 2 and out["code"] == "session_busy"
        code, out, _ = await cli(box, "resume", "no-such-session")
        assert code == 2 and out["code"] == "session_not_found"
        code, out, _ = await cli(box, "session", "status", session_id)
        assert out["eventCount"] == before  # nothing written
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


async def test_four_concurrent_resumes_make_exactly_one_continuation(
    temporal_server: Any, temporal_client: Any, tmp_path: Path
) -> None:
    box = Sandbox(temporal_server, tmp_path / "race")
    script = _script(tmp_path / "script.json")
    session_id = await lose_execution(temporal_client, box, Kill("P7"), script)
    worker = box.worker()
    await ready(worker)
    try:
        results = await asyncio.gather(*(cli(box, "resume", session_id) for _ in range(4)))
        decisions = [
            (code, out.get("decision"), out.get("parkReason") or out.get("code")) for code, out, _ in results
        ]
        print(f"race result: {decisions}")
        assert len(_continuations(box, session_id)) == 1
        assert any(code == 0 for code, _, _ in decisions)
        allowed = {
            "continuation_already_exists",
            "continuation_started_indeterminate",
            "continuation_repair_required",
            "session_busy",
        }
        for code, _decision, reason in decisions:
            assert code == 0 or reason in allowed, decisions
        continuation = _continuations(box, session_id)[0]
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            with LedgerStore.open(box.db) as store:
                header = store.get_run(continuation)
            if header is not None and header.is_terminal:
                break
            await asyncio.sleep(0.2)
        assert header is not None and header.status == "completed"
        assert box.log_lines()["ran"] == 1 and _writes(box) == 1
    finally:
        await stop(worker)


@pytest.mark.parametrize("setting", ["1", "0"])
async def test_worker_auto_resume_follows_the_setting(
    setting: str, temporal_server: Any, temporal_client: Any, tmp_path: Path
) -> None:
    box = Sandbox(temporal_server, tmp_path / f"auto-{setting}")
    script = _script(tmp_path / "script.json")
    session_id = await lose_execution(temporal_client, box, Kill("P7"), script)
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
