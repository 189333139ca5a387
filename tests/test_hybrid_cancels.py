"""Which cancel a local tool attempt finishes and which it abandons (``local_calls.AskedCancels``).

The SDK cancels a local attempt when its start-to-close passes, when core evicts its run (a lost
workflow-task lease) and when the worker stops, as well as when the workflow asks (``cancel_turn``).
Only the last is a cancel to finish: the tool is stopped and T2 commits ``tool_cancelled``. Any
other abandons the attempt, T1 without T2, and the workflow's recovery (on the host queue) settles
the call; should the abandoned attempt still commit its T2, recovery reports that committed
outcome (``recovery._settled``) instead of failing on ``duplicate_event_id``.

Drill: a read-only tool that claims a 5 s bound runs 34 s, past the local attempt's 30 s timeout.
Control: the same call in activity mode runs once and completes. Negative control: a runtime that
treats every cancel as asked for (the behaviour before the fix) commits ``tool_cancelled``.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
import time
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from maka_core.runtime.runtime import Runtime
from maka_core.store.writer import LedgerStore
from maka_core.tools.contract import ToolContext, tool
from maka_temporal.workers.client import turn_messages
from maka_temporal.workers.host.worker import default_runtime
from tests.temporal_support import in_process_worker, start, tool_step, wait_turn, write_script

pytestmark = [pytest.mark.temporal, pytest.mark.slow, pytest.mark.asyncio(loop_scope="session")]


class ProbeArgs(BaseModel):
    n: int = 0


RUNS: list[str] = []


@tool(guarantee="read-only", bound_s=5)
def slow_probe(args: ProbeArgs, ctx: ToolContext) -> str:
    """Reads something slowly (claims a 5 s bound, takes 34 s, heartbeating)."""
    RUNS.append(ctx.operation_id)
    for _ in range(68):
        ctx.heartbeat()
        time.sleep(0.5)
    return "finished"


class EveryCancelAsked(Runtime):
    """Negative control: every cancel of a local attempt counts as a ``cancel_turn`` (before the
    fix the local attempt's ``cancel_requested`` was ``lambda: True``)."""

    def local_cancel_asked(self, workflow_run_id: str, activity_id: str, *, gone: bool) -> bool:
        return True


def _runtime(every_cancel_asked: bool) -> Any:
    def make(store: LedgerStore, settings: Any) -> Runtime:
        runtime = default_runtime(store, settings, tools=[slow_probe])
        if every_cancel_asked:
            runtime.__class__ = EveryCancelAsked
        return runtime

    return make


def _probe_responses(db: Path) -> list[Any]:
    """The committed results of the probe's call (its T2, however it was settled)."""
    with sqlite3.connect(db) as conn:
        rows = conn.execute("select payload_json from runtime_events order by ledger_seq").fetchall()
    out = []
    for (payload,) in rows:
        content = json.loads(payload).get("content") or {}
        if content.get("kind") == "function_response" and content.get("name") == "slow_probe":
            out.append(content.get("result"))
    return out


async def _drill(
    temporal_client: Any, tmp_path: Path, task_queue: str, mode: str, *, every_cancel_asked: bool = False
) -> tuple[Any, list[Any]]:
    RUNS.clear()
    db = tmp_path / "ledger.sqlite"
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "f.txt").write_text("x")
    script = write_script(
        tmp_path / "s.json",
        [tool_step(("slow_probe", {"n": 1}), ("read_file", {"path": "f.txt"})), {"text": "done"}],
    )
    make = _runtime(every_cancel_asked)
    async with in_process_worker(temporal_client, db, task_queue, make_runtime=make):
        sid, acc = await start(temporal_client, ws, script, task_queue, "go", tool_mode=mode)
        status = await wait_turn(temporal_client, sid, acc.run_id, timeout=240)
    return status, _probe_responses(db)


@pytest.mark.parametrize("mode", ["hybrid", "activity"])
async def test_a_local_attempt_past_its_timeout_is_abandoned_to_recovery_not_cancelled(
    mode: str, temporal_client: Any, tmp_path: Path, task_queue: str
) -> None:
    status, responses = await _drill(temporal_client, tmp_path, task_queue, mode)
    assert status.state == "idle", (status, responses)
    assert len(responses) == 1 and "tool_cancelled" not in json.dumps(responses), responses
    assert "finished" in json.dumps(responses), responses
    # Activity mode runs it once; hybrid's abandoned attempt stopped at its heartbeat and
    # recovery re-read it (a read re-reads: no effect to repeat).
    assert len(RUNS) == (2 if mode == "hybrid" else 1), RUNS


async def test_negative_control_every_cancel_taken_as_asked_commits_tool_cancelled(
    temporal_client: Any, tmp_path: Path, task_queue: str
) -> None:
    status, responses = await _drill(temporal_client, tmp_path, task_queue, "hybrid", every_cancel_asked=True)
    # The same assertion as the drill's fails: T2 says the turn was cancelled, though nobody asked.
    assert "tool_cancelled" in json.dumps(responses), (status, responses)


STARTED: list[float] = []


@tool(guarantee="read-only", bound_s=5)
def probe12(args: ProbeArgs, ctx: ToolContext) -> str:
    """A slow read (12 s, heartbeating), well inside the local attempt's timeout."""
    STARTED.append(time.monotonic())
    for _ in range(24):
        ctx.heartbeat()
        time.sleep(0.5)
    return "finished"


class NoCancelAsked(Runtime):
    """Negative control: a runtime that never learns of an asked cancel."""

    def local_cancel_asked(self, workflow_run_id: str, activity_id: str, *, gone: bool) -> bool:
        return False


@pytest.mark.parametrize("control", [False, True])
async def test_cancel_turn_during_a_local_call_stops_it_and_commits_tool_cancelled(
    control: bool, temporal_client: Any, tmp_path: Path, task_queue: str
) -> None:
    """``cancel_turn`` 2 s into a local call: the tool stops, T2 commits ``tool_cancelled``, the
    run ends cancelled. Negative control: without the asked-cancel registry the attempt abandons
    its T1 and recovery re-reads it to its end (``finished``)."""
    STARTED.clear()
    db = tmp_path / "ledger.sqlite"
    ws = tmp_path / "ws"
    ws.mkdir()
    script = write_script(tmp_path / "s.json", [tool_step(("probe12", {"n": 1})), {"text": "done"}])

    def make(store: LedgerStore, settings: Any) -> Runtime:
        runtime = default_runtime(store, settings, tools=[probe12])
        if control:
            runtime.__class__ = NoCancelAsked
        return runtime

    async with in_process_worker(temporal_client, db, task_queue, make_runtime=make):
        sid, acc = await start(temporal_client, ws, script, task_queue, "go", tool_mode="hybrid")
        deadline = time.monotonic() + 60
        while not STARTED and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        assert STARTED, "the probe never started"
        await asyncio.sleep(2.0)
        await asyncio.wait_for(turn_messages.cancel_turn(temporal_client, sid, reason="x"), 90)
        await wait_turn(temporal_client, sid, acc.run_id, timeout=120)
    with sqlite3.connect(db) as conn:
        rows = conn.execute("select payload_json from runtime_events order by ledger_seq").fetchall()
    said = [json.loads(p).get("content") or {} for (p,) in rows]
    results = [c.get("result") for c in said if c.get("kind") == "function_response"]
    if control:
        assert "tool_cancelled" not in json.dumps(results), results
    else:
        assert len(results) == 1 and "tool_cancelled" in json.dumps(results), results
