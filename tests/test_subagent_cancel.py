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

Beside it: two sub-agents of one step side by side are both asked, both calls named by the cancel;
and an operator's cancel of the child itself ends the call ``tool_cancelled`` while the parent's
turn goes on and completes.

The golden histories ``subagent_cancel_parent``/``_child`` are the first drill's, captured once;
the parent's replays against the session workflow and not against the control's.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import pytest
from temporalio import activity, workflow
from temporalio.client import Client, WorkflowHistory
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import Replayer

from maka_core.runtime.runtime import Runtime, RuntimeSettings
from maka_core.settings import MakaSettings
from maka_core.store.writer import LedgerStore
from maka_core.tools.subagent import SubAgent, child_session_id
from maka_temporal import SessionClient
from maka_temporal.workers.client import turn_messages
from maka_temporal.workers.client.policy import session_policy
from maka_temporal.workflows.contracts import (
    SESSION_WORKFLOW,
    SUBAGENT_BEGIN,
    CancelTurn,
    SessionInput,
    SessionStatus,
)
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


def _napper(tmp_path: Path) -> tuple[Path, Path, SubAgent]:
    """The ledger, the shared workspace, and the sub-agent whose child naps 30 s, then (were it to
    go on) naps again (``after``) and replies."""
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
    return tmp_path / "ledger.sqlite", ws, SubAgent("napper", "Naps", script=str(child_script))


async def _until_napping(ws: Path, children: int) -> None:
    deadline = time.monotonic() + 30
    while _naps(ws).count("start long") < children:
        assert time.monotonic() < deadline, f"the children's naps never all started: {_naps(ws)}"
        await asyncio.sleep(0.05)


def _run_status(store: LedgerStore, session_id: str) -> str:
    """How the session's one run ended (its header)."""
    (run_id,) = {e.run_id for e in store.events(session_id=session_id)}
    header = store.get_run(run_id)
    assert header is not None
    return header.status


async def _drill(
    client: Client, tmp_path: Path, queue: str, variant: type | None
) -> tuple[str, str, Any, Any, Path, Path]:
    """Start the parent, cancel it while its child naps; return the parent's session id, its
    child's, the cancel's result, the parent's settled status, the workspace and the ledger."""
    db, ws, napper = _napper(tmp_path)
    parent = write_script(
        tmp_path / "parent.json",
        [tool_step(("agent__napper", {"task": "nap a while"})), {"text": "never"}],
    )
    async with in_process_worker(
        client, db, queue, settings=QUICK, make_runtime=runtime_with([napper]), workflow=variant
    ):
        sid, accepted = await start(client, ws, parent, queue, "go")
        await _until_napping(ws, 1)
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
        assert _run_status(store, child) == "cancelled"
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
        assert _run_status(store, child) == "completed"
        assert cancelled.cancelled_operations == [], cancelled


async def test_a_cancel_reaches_every_sub_agent_running_side_by_side(
    temporal_server: Any, temporal_client: Client, tmp_path: Path, task_queue: str
) -> None:
    """Two sub-agent calls of one step (item 2's calls side by side): the parent's cancel asks both
    children; each child's run ends cancelled, each call's T2 says ``tool_cancelled`` and the cancel
    names both."""
    db, ws, napper = _napper(tmp_path)
    two = tool_step(("agent__napper", {"task": "nap one"}), ("agent__napper", {"task": "nap two"}))
    parent = write_script(tmp_path / "parent.json", [two, {"text": "never"}])
    async with in_process_worker(
        temporal_client, db, task_queue, settings=QUICK, make_runtime=runtime_with([napper])
    ):
        sid, accepted = await start(temporal_client, ws, parent, task_queue, "go", max_parallel_tools=8)
        await _until_napping(ws, 2)
        cancelled = await turn_messages.cancel_turn(temporal_client, sid, reason="enough")
        status = await wait_turn(temporal_client, sid, accepted.run_id)
    assert status.state == "idle", status
    with LedgerStore.open(db) as store:
        assert _run_status(store, sid) == "cancelled"
        calls = responses(store, sid)
        assert sorted(cancelled.cancelled_operations) == sorted(calls), (cancelled, calls)
        for op, call in calls.items():
            assert call["result"]["code"] == "tool_cancelled", call
            assert call["result"]["outcome"] == "cancelled", call
            assert _run_status(store, child_session_id(sid, op)) == "cancelled"
    assert "start after" not in _naps(ws), _naps(ws)
    await audit_clean(db, temporal_server.address)


async def test_an_operators_cancel_of_the_child_ends_the_call_cancelled_and_the_parent_goes_on(
    temporal_server: Any, temporal_client: Client, tmp_path: Path, task_queue: str
) -> None:
    """``maka session cancel`` of the child itself: its run ends cancelled and the parent's call
    settles ``tool_cancelled``, but the parent's turn was not cancelled: its model reads the result
    and its turn completes."""
    db, ws, napper = _napper(tmp_path)
    parent = write_script(
        tmp_path / "parent.json",
        [tool_step(("agent__napper", {"task": "nap a while"})), {"text": "the napper was stopped"}],
    )
    async with in_process_worker(
        temporal_client, db, task_queue, settings=QUICK, make_runtime=runtime_with([napper])
    ):
        sid, accepted = await start(temporal_client, ws, parent, task_queue, "go")
        await _until_napping(ws, 1)
        with LedgerStore.open(db) as store:
            (op,) = [
                e.actions.tool_dispatch.operation_id
                for e in store.events(session_id=sid)
                if e.actions is not None and e.actions.tool_dispatch is not None
            ]
        child = child_session_id(sid, op)
        await turn_messages.cancel_turn(temporal_client, child, reason="stop it", by="bob")
        status = await wait_turn(temporal_client, sid, accepted.run_id)
    assert status.state == "idle", status
    with LedgerStore.open(db) as store:
        assert _run_status(store, sid) == "completed"
        assert _run_status(store, child) == "cancelled"
        call = responses(store, sid)[op]
        assert call["result"]["code"] == "tool_cancelled" and call["result"]["outcome"] == "cancelled", call
    assert "start after" not in _naps(ws), _naps(ws)
    await audit_clean(db, temporal_server.address)


def _slow_begin(marker: Path, subagents: list[SubAgent]) -> Any:
    """A runtime whose sub-agent admission (``maka.subagent_begin``) first waits 3 s, touching
    ``marker``: a cancel lands before the call's T1."""

    class SlowBegin(Runtime):
        async def on_ledger(self, fn: Any, *, attempt: Any = None) -> Any:
            begin = activity.in_activity() and activity.info().activity_type == SUBAGENT_BEGIN
            if begin and not marker.exists():
                marker.touch()
                await asyncio.sleep(3)
            return await super().on_ledger(fn, attempt=attempt)

    def make_runtime(store: LedgerStore, settings: RuntimeSettings) -> Runtime:
        made = runtime_with(subagents)(store, settings)
        return SlowBegin(store, settings=settings, tools=made.tools)

    return make_runtime


@pytest.mark.parametrize("variant", [None, AsksNothingOfChildren], ids=["asks", "control"])
async def test_a_cancel_while_the_call_is_admitted(
    temporal_server: Any, temporal_client: Client, tmp_path: Path, task_queue: str, variant: Any
) -> None:
    """The parent's cancel lands while ``maka.subagent_begin`` runs, before its T1. Since the patch
    the admission is let finish (its T1 commits) and no child starts: the call's T2 says
    ``tool_cancelled`` with ``started: false`` (as a lone call cancelled before it started), the
    cancel names it, the run ends cancelled, audit clean. Control (before the patch): the begin
    activity is abandoned (``TRY_CANCEL``): the run ends while it runs, and the call is left with
    neither T1 nor result."""
    db, ws, napper = _napper(tmp_path)
    marker = tmp_path / "begun"
    parent = write_script(
        tmp_path / "parent.json",
        [tool_step(("agent__napper", {"task": "nap a while"})), {"text": "never"}],
    )
    async with in_process_worker(
        temporal_client,
        db,
        task_queue,
        settings=QUICK,
        make_runtime=_slow_begin(marker, [napper]),
        workflow=variant,
    ):
        sid, accepted = await start(temporal_client, ws, parent, task_queue, "go")
        deadline = time.monotonic() + 30
        while not marker.exists():
            assert time.monotonic() < deadline, "the sub-agent's admission never began"
            await asyncio.sleep(0.02)
        cancelled = await turn_messages.cancel_turn(temporal_client, sid, reason="enough")
        status = await wait_turn(temporal_client, sid, accepted.run_id)
        if variant is not None:
            await asyncio.sleep(4)  # the control's abandoned admission ends meanwhile
    assert status.state == "idle", status
    with LedgerStore.open(db) as store:
        assert _run_status(store, sid) == "cancelled"
        calls = responses(store, sid)
        dispatched = [e for e in store.events(session_id=sid) if e.actions and e.actions.tool_dispatch]
        if variant is None:
            ((op, call),) = calls.items()
            assert len(dispatched) == 1 and cancelled.cancelled_operations == [op], (dispatched, cancelled)
            assert call["result"]["code"] == "tool_cancelled" and call["result"]["started"] is False, call
            assert call["result"]["state"] == "not_started", call
            assert store.events(session_id=child_session_id(sid, op)) == []  # no child ran
        else:
            assert calls == {} and dispatched == [] and cancelled.cancelled_operations == []
    assert _naps(ws) == []
    await audit_clean(db, temporal_server.address)


async def test_a_cancel_while_the_call_asks_its_approval_waits_for_no_answer(
    temporal_server: Any, temporal_client: Client, tmp_path: Path, task_queue: str
) -> None:
    """The parent's policy confirms mutations, so the sub-agent's admission asks an approval; the
    cancel lands while it does. The turn does not wait for an answer (were it to, the cancel would
    wait until the request expired): it ends cancelled with no T1, the request closed with the
    run, audit clean."""
    db, ws, napper = _napper(tmp_path)
    marker = tmp_path / "begun"
    confirm = tmp_path / "policy.json"
    confirm.write_text(json.dumps({"mutations": "confirm"}))
    governed = session_policy(MakaSettings(db=str(db)), None, confirm, "human:alice", ())
    governed.record_in(MakaSettings(db=str(db)))
    parent = write_script(
        tmp_path / "parent.json",
        [tool_step(("agent__napper", {"task": "nap a while"})), {"text": "never"}],
    )
    async with in_process_worker(
        temporal_client, db, task_queue, settings=QUICK, make_runtime=_slow_begin(marker, [napper])
    ):
        sid, accepted = await start(
            temporal_client, ws, parent, task_queue, "go", session_id=governed.session_id
        )
        deadline = time.monotonic() + 30
        while not marker.exists():
            assert time.monotonic() < deadline, "the sub-agent's admission never began"
            await asyncio.sleep(0.02)
        began = time.monotonic()
        cancelled = await turn_messages.cancel_turn(temporal_client, sid, reason="enough")
        status = await wait_turn(temporal_client, sid, accepted.run_id)
        took = time.monotonic() - began
    assert took < 20, f"the cancel took {took:.1f} s"
    assert status.state == "idle" and cancelled.cancelled_operations == [], (status, cancelled)
    with LedgerStore.open(db) as store:
        assert _run_status(store, sid) == "cancelled"
        assert not [e for e in store.events(session_id=sid) if e.actions and e.actions.tool_dispatch]
    raw = (await SessionClient(temporal_client, ledger=db).status(sid)).raw
    assert raw["pendingApprovals"] == [], raw["pendingApprovals"]
    await audit_clean(db, temporal_server.address)


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
