"""A worker stopped (SIGTERM, ``maka worker`` shutdown) while tool calls wait for a tool thread.

A call reserves its tool thread before T1 (``runtime.ToolSlots``). A stopping worker refuses the
calls still waiting, before their T1, so recovery on the next worker finds them not dispatched and
dispatches them again: every tool runs once and nothing parks. Real dev server, a real ``bash``,
the worker's own shutdown; the next worker is a real ``maka worker`` process.

Negative control: the runtime before the fix (T1 first, then a queue for the thread, the queue
cancelled at stop). The queued call's T1 is durable and its effect never ran; recovery cannot tell
it from a call that died mid-effect and parks it (``dispatch_without_response``).
"""

from __future__ import annotations

import asyncio
import io
import json
import sqlite3
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from maka_core.runtime.runtime import Runtime, RuntimeSettings, ToolSlots
from maka_core.store.writer import LedgerStore
from maka_core.tools.registry import default_tools
from maka_temporal.workers.host.serve import serve
from maka_temporal.workflows.contracts import workflow_id_for
from tests.drills import Sandbox, maka_cli, ready, settle, stop
from tests.temporal_support import start, write_script
from tests.test_hybrid_tools import local_attempts

pytestmark = [pytest.mark.temporal, pytest.mark.crash, pytest.mark.asyncio(loop_scope="session")]

#: Long enough that the first call is still running when the worker is told to stop, short enough
#: to finish within the worker's graceful timeout (5 s).
BASH = "sleep 2.5; echo ran >> effects.log"


class EagerT1Runtime(Runtime):
    """The runtime before the fix: no slot limit (T1 first, then a queue for the thread), and a
    stop that cancels the queue."""

    def __post_init__(self) -> None:
        super().__post_init__()
        self.tool_slots = ToolSlots(1_000)

    def stop_tools(self) -> None:
        self._tool_pool.shutdown(wait=False, cancel_futures=True)


def _t1s(db: Path) -> int:
    with sqlite3.connect(db) as conn:
        return int(conn.execute("SELECT count(*) FROM tool_attempts WHERE phase = 't1'").fetchone()[0])


async def _tool_started(client: Any, session_id: str) -> bool:
    description = await client.get_workflow_handle(workflow_id_for(session_id)).describe()
    return any(
        a.activity_type.name == "maka.execute_tool" and a.state == 2  # PENDING_ACTIVITY_STATE_STARTED
        for a in description.raw_description.pending_activities
    )


@pytest.mark.parametrize("runtime", [Runtime, EagerT1Runtime], ids=["slots", "eager_t1"])
async def test_a_stopping_worker_refuses_waiting_calls_before_t1_and_the_next_worker_runs_them_once(
    runtime: type[Runtime], temporal_server: Any, temporal_client: Any, tmp_path: Path
) -> None:
    box = Sandbox(temporal_server, tmp_path / "box")
    db = Path(box.db)

    def one_tool_thread(store: LedgerStore, settings: RuntimeSettings) -> Runtime:
        tools = default_tools(
            hidden_paths=settings.protected_paths, unsafe_no_sandbox=settings.unsafe_no_sandbox
        )
        return runtime(store, tools=tools, settings=settings, tool_threads=1)

    stopping, up = asyncio.Event(), asyncio.Event()
    first = asyncio.create_task(
        serve(
            temporal_client, db, box.queue, make_runtime=one_tool_thread, stop=stopping, ready=up,
            repair=False, out=io.StringIO(),
        )
    )  # fmt: skip
    await asyncio.wait_for(up.wait(), 60)
    sessions = []
    for name in ("a", "b"):
        ws = tmp_path / f"ws-{name}"
        ws.mkdir()
        script = write_script(
            tmp_path / f"{name}.json",
            [{"toolCalls": [{"name": "bash", "args": {"command": BASH}}]}, {"text": "done"}],
        )
        session_id, accepted = await start(
            temporal_client, ws, script, box.queue, session_id=f"{name}-{box.queue}"
        )
        sessions.append((session_id, accepted.run_id, ws))
    # Both tool activities have started: one holds the only tool thread, the other waits for it.
    deadline = time.monotonic() + 60
    while not all([await _tool_started(temporal_client, sid) for sid, _, _ in sessions]):
        assert time.monotonic() < deadline, f"tool activities not both started; T1s: {_t1s(db)}"
        await asyncio.sleep(0.05)
    # An activity is "started" before its T1 commits: wait for the T1s this runtime writes before
    # a stop (the running call's, and with eager T1 the waiting call's too).
    expected_t1s = 1 if runtime is Runtime else 2
    while _t1s(db) < expected_t1s:
        assert time.monotonic() < deadline, f"T1s before the stop: {_t1s(db)} < {expected_t1s}"
        await asyncio.sleep(0.05)
    assert not any((ws / "effects.log").exists() for _, _, ws in sessions), "a call ended before the stop"
    t1s_at_stop = _t1s(db)
    stopping.set()
    await asyncio.wait_for(first, 60)

    second = box.worker()
    await ready(second)
    try:
        settled = []
        for session_id, run_id, ws in sessions:
            status = await settle(temporal_client, session_id, run_id, timeout=120)
            log = ws / "effects.log"
            settled.append(
                (status.state, status.park_reason, log.read_text().count("ran") if log.exists() else 0)
            )
    finally:
        await stop(second)
    # Either way Temporal's histories and the ledger tell the same story (a refused attempt has
    # no T1, like a worker that died before it).
    audit = await asyncio.to_thread(
        subprocess.run,
        [*maka_cli(), "audit", "--all", "--db", str(db), "--address", temporal_server.address, "--json"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert audit.returncode == 0 and json.loads(audit.stdout)["ok"] is True, audit.stdout + audit.stderr
    if runtime is Runtime:
        assert t1s_at_stop == 1, "the waiting call committed T1 before it had a thread"
        assert settled == [("idle", None, 1), ("idle", None, 1)], settled
    else:
        assert t1s_at_stop == 2
        assert sorted(settled) == [("idle", None, 1), ("parked", "dispatch_without_response", 0)], settled


@pytest.mark.slow
async def test_hybrid_a_local_call_with_no_free_tool_thread_defers_and_runs_once_after_the_stop(
    temporal_server: Any, temporal_client: Any, tmp_path: Path
) -> None:
    """Hybrid mode, one tool thread held by session a's bash: session b's ``write_file`` local
    attempt finds no free thread and defers (``busy``) before T1 to the regular activity, which waits
    for the thread; the stopping worker refuses it before T1, and the next worker runs it once.
    Nothing parks, and the audit reads the deferred marker as a non-dispatch."""
    box = Sandbox(temporal_server, tmp_path / "box")
    db = Path(box.db)

    def one_tool_thread(store: LedgerStore, settings: RuntimeSettings) -> Runtime:
        tools = default_tools(
            hidden_paths=settings.protected_paths, unsafe_no_sandbox=settings.unsafe_no_sandbox
        )
        return Runtime(store, tools=tools, settings=settings, tool_threads=1)

    stopping, up = asyncio.Event(), asyncio.Event()
    first = asyncio.create_task(
        serve(
            temporal_client, db, box.queue, make_runtime=one_tool_thread, stop=stopping, ready=up,
            repair=False, out=io.StringIO(),
        )
    )  # fmt: skip
    await asyncio.wait_for(up.wait(), 60)
    steps = {
        "a": [{"toolCalls": [{"name": "bash", "args": {"command": BASH}}]}, {"text": "done"}],
        "b": [
            {"toolCalls": [{"name": "write_file", "args": {"path": "b.txt", "content": "b\n"}}]},
            {"text": "done"},
        ],
    }
    sessions = []
    for name, script_steps in steps.items():
        ws = tmp_path / f"ws-{name}"
        ws.mkdir()
        script = write_script(tmp_path / f"{name}.json", script_steps)
        session_id, accepted = await start(
            temporal_client, ws, script, box.queue, session_id=f"{name}-{box.queue}", tool_mode="hybrid"
        )
        sessions.append((session_id, accepted.run_id, ws))
        if name == "a":  # a's bash holds the only thread before b's call asks for one
            deadline = time.monotonic() + 60
            while not await _tool_started(temporal_client, session_id):
                assert time.monotonic() < deadline, "a's bash did not start"
                await asyncio.sleep(0.05)
    deadline = time.monotonic() + 60
    while not await _tool_started(temporal_client, sessions[1][0]):
        assert time.monotonic() < deadline, f"b's write never reached its regular activity; T1s {_t1s(db)}"
        await asyncio.sleep(0.05)
    history = await temporal_client.get_workflow_handle(workflow_id_for(sessions[1][0])).fetch_history()
    attempts = local_attempts(history)
    assert [r.get("deferred") for _, r in attempts] == ["busy"], attempts
    assert _t1s(db) == 1, "the deferred call committed T1"
    stopping.set()
    await asyncio.wait_for(first, 60)
    second = box.worker()
    await ready(second)
    try:
        settled = []
        for session_id, run_id, _ws in sessions:
            status = await settle(temporal_client, session_id, run_id, timeout=120)
            settled.append((status.state, status.park_reason))
    finally:
        await stop(second)
    assert settled == [("idle", None), ("idle", None)], settled
    assert (sessions[0][2] / "effects.log").read_text().count("ran") == 1
    assert box.file_effects() == {("write_file", str((sessions[1][2] / "b.txt").resolve())): 1}
    audit = await asyncio.to_thread(
        subprocess.run,
        [*maka_cli(), "audit", "--all", "--db", str(db), "--address", temporal_server.address, "--json"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert audit.returncode == 0 and json.loads(audit.stdout)["ok"] is True, audit.stdout + audit.stderr
