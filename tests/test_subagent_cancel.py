"""A parent's cancel reaches its sub-agents (issue 31 item 3, ``workflows.subagent_cancel``), on a
real dev server and worker, real SQLite ledger, scripted models.

A parent calls ``agent__napper``, whose child session naps 30 s, then (were it to go on) naps
again (``after``) and replies. ``maka session cancel`` of the parent while the child naps: the
child's turn ends cancelled, its nap's T2 says ``tool_cancelled``, the ``after`` nap never starts;
the parent's call's T2 says ``tool_cancelled`` (``outcome: cancelled``, naming the child), the
parent's cancel names the call, its run ends cancelled and it is idle; ``maka audit --all`` is
clean.

Negative control: the same drill under a session workflow whose calls ask nothing of their child
(``_child_cancel`` returns ``None``: the behaviour before the patch, Temporal's cancel of the child
workflow) leaves the child running: its nap ends ``tool_cancelled`` but its turn goes on, the
``after`` nap runs, and the parent's call settles from a completed child.

The golden histories ``subagent_cancel_parent``/``_child`` are the first drill's, captured once;
the parent's replays against the session workflow and not against the control's.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest
from temporalio import workflow
from temporalio.client import Client, WorkflowHistory
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import Replayer

from maka_core.runtime.runtime import RuntimeSettings
from maka_core.store.writer import LedgerStore
from maka_core.tools.subagent import SubAgent, child_session_id
from maka_temporal.workers.client import turn_messages
from maka_temporal.workflows.contracts import SESSION_WORKFLOW, CancelTurn, SessionInput, SessionStatus
from maka_temporal.workflows.session import SessionWorkflow
from tests.temporal_support import in_process_worker, start, tool_step, wait_turn, write_script
from tests.test_hybrid_tools import audit_clean
from tests.test_subagents import responses, runtime_with

pytestmark = [pytest.mark.temporal, pytest.mark.asyncio(loop_scope="session")]

#: A 1 s heartbeat timeout: a cancel reaches the child's running nap within about a second.
QUICK = RuntimeSettings(tool_heartbeat_timeout_s=1.0)


@workflow.defn(name=SESSION_WORKFLOW, sandboxed=False)
class AsksNothingOfChildren(SessionWorkflow):
    """The negative control: a cancel reaches a sub-agent's child as before the patch."""

    @workflow.init
    def __init__(self, inp: SessionInput) -> None:
        super().__init__(inp)

    @workflow.run
    async def run(self, inp: SessionInput) -> SessionStatus:
        return await super().run(inp)

    def _child_cancel(self) -> CancelTurn | None:
        return None


def _naps(ws: Path) -> list[str]:
    log = ws / "naps.log"
    return [" ".join(line.split()[:2]) for line in log.read_text().splitlines()] if log.exists() else []


async def _drill(
    client: Client, tmp_path: Path, queue: str, variant: type | None
) -> tuple[str, str, Any, Any, Path, Path]:
    """Start the parent, cancel it while its child naps; return the parent's session id, its
    child's, the cancel's result, the parent's settled status, the workspace and the ledger."""
    db = tmp_path / "ledger.sqlite"
    ws = tmp_path / "ws"
    ws.mkdir()
    child_script = write_script(
        tmp_path / "napper.json",
        [
            tool_step(("nap", {"label": "long", "seconds": 30})),
            tool_step(("nap", {"label": "after", "seconds": 0.2})),
            {"text": "woke"},
        ],
    )
    parent = write_script(
        tmp_path / "parent.json",
        [tool_step(("agent__napper", {"task": "nap a while"})), {"text": "never"}],
    )
    napper = SubAgent("napper", "Naps", script=str(child_script))
    async with in_process_worker(
        client, db, queue, settings=QUICK, make_runtime=runtime_with([napper]), workflow=variant
    ):
        sid, accepted = await start(client, tmp_path / "ws", parent, queue, "go")
        deadline = time.monotonic() + 30
        while "start long" not in _naps(ws):
            assert time.monotonic() < deadline, f"the child's nap never started: {_naps(ws)}"
            await asyncio.sleep(0.05)
        cancelled = await turn_messages.cancel_turn(client, sid, reason="enough", by="alice")
        status = await wait_turn(client, sid, accepted.run_id)
    with LedgerStore.open(db) as store:
        (op,) = responses(store, sid)
    return sid, child_session_id(sid, op), cancelled, status, ws, db


async def test_a_parents_cancel_cancels_its_childs_turn_and_the_call_says_cancelled(
    temporal_server: Any, temporal_client: Client, tmp_path: Path, task_queue: str
) -> None:
    began = time.monotonic()
    sid, child, cancelled, status, ws, db = await _drill(temporal_client, tmp_path, task_queue, None)
    assert time.monotonic() - began < 25, "the cancel waited for the child's 30 s nap"
    assert status.state == "idle" and status.last_turn.run_id == cancelled.run_id, status
    with LedgerStore.open(db) as store:
        header = store.get_run(cancelled.run_id)
        assert header is not None and header.status == "cancelled", header
        ((op, call),) = responses(store, sid).items()
        assert cancelled.cancelled_operations == [op], cancelled
        assert call["is_error"] and call["result"]["code"] == "tool_cancelled", call
        assert call["result"]["sessionId"] == child and call["result"]["outcome"] == "cancelled", call
        # The child's turn ended cancelled, by the parent's asker, its nap's T2 tool_cancelled.
        ((_, nap),) = responses(store, child).items()
        assert nap["name"] == "nap" and nap["result"]["code"] == "tool_cancelled", nap
        (child_run,) = {e.run_id for e in store.events(session_id=child)}
        child_header = store.get_run(child_run)
        assert child_header is not None and child_header.status == "cancelled", child_header
    assert "start after" not in _naps(ws) and "end long" not in _naps(ws), _naps(ws)
    await audit_clean(db, temporal_server.address)


async def test_control_a_cancel_that_asks_nothing_of_the_child_leaves_it_running(
    temporal_server: Any, temporal_client: Client, tmp_path: Path, task_queue: str
) -> None:
    sid, child, cancelled, status, ws, db = await _drill(
        temporal_client, tmp_path, task_queue, AsksNothingOfChildren
    )
    assert status.state == "idle", status
    # The child's nap was stopped, but its turn went on: the next nap ran and the turn completed.
    assert "start after" in _naps(ws) and "end after" in _naps(ws), _naps(ws)
    with LedgerStore.open(db) as store:
        ((_, call),) = responses(store, sid).items()
        assert call["result"]["outcome"] == "completed" and call["result"]["reply"] == "woke", call
        (child_run,) = {e.run_id for e in store.events(session_id=child)}
        child_header = store.get_run(child_run)
        assert child_header is not None and child_header.status == "completed", child_header
        assert cancelled.cancelled_operations == [], cancelled


@pytest.mark.asyncio(loop_scope="session")
async def test_the_golden_cancel_history_pins_the_ask_and_the_control_drifts() -> None:
    """``subagent_cancel_parent`` (the first drill's parent, under the patch: the call signals its
    child) replays against the session workflow (``test_replay``); against the control's workflow,
    whose cancel reaches the child as Temporal's cancel of it, it does not."""
    raw = (Path(__file__).parent / "golden_histories" / "subagent_cancel_parent.json").read_text()
    for variant, fails in ((SessionWorkflow, False), (AsksNothingOfChildren, True)):
        history = WorkflowHistory.from_json("golden", raw)
        replayer = Replayer(workflows=[variant], data_converter=pydantic_data_converter)
        result = await replayer.replay_workflow(history, raise_on_replay_failure=False)
        assert (result.replay_failure is not None) == fails, (variant, result.replay_failure)
