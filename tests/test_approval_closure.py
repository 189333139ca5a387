"""No approval request outlives its run: a run that settles another way (it fails, is repaired or
cancelled while a request waits) closes each of its open requests with ``permissionClosureAccepted``
in the transaction of its terminal fact. Then ``maka session status`` lists no pending approval, the
continuation planner's ``pending_permission`` gate sees none, a late answer is refused with
``approval_expired``, and repairers racing over the run write one closure between them. Real
ledger files (PostgreSQL too when configured), no Temporal."""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any

import pytest

from maka_core.errors import LedgerRejection
from maka_core.facts.events import RuntimeEvent
from maka_core.runtime import approvals, tool_admission, turn
from maka_core.runtime.approvals import ApprovalRefused
from maka_core.runtime.contracts import CallRef, FinishRunInput
from maka_core.runtime.runtime import Runtime
from maka_core.runtime.settle import recovered_terminal_event, repair_run, settle_run
from maka_core.store.writer import LedgerStore
from maka_core.workspace import Workspace
from maka_temporal.workers.client.policy import governance_status
from tests.test_governed_execution import CONFIRM, with_policy
from tests.test_runtime import ATTEMPT, IDS, one_call, run, tool_input


def open_request(rt: Runtime, ws: Workspace) -> tuple[CallRef, dict[str, Any]]:
    """A call whose permission request is committed and unanswered (its waiter is gone)."""
    with_policy(rt, CONFIRM)
    ref = one_call(rt, ws, "write_file", {"path": "a.txt", "content": "x"})
    waiting = tool_admission.admit_call(rt, tool_input(ws, ref), ATTEMPT)
    assert isinstance(waiting, tool_admission.AwaitingApproval)
    (pending,) = approvals.pending(rt.ledger, "s1")
    return ref, pending


def unanswered(events: list[RuntimeEvent]) -> set[str]:
    """The requests the continuation planner's ``pending_permission`` gate would see."""
    open_: set[str] = set()
    for event in events:
        wire = event.actions.to_wire() if event.actions is not None else {}
        request = wire.get("permissionRequest")
        if isinstance(request, Mapping):
            open_.add(request["requestId"])
        for key in ("permissionDecision", "permissionAnswerAccepted", "permissionClosureAccepted"):
            closing = wire.get(key)
            if isinstance(closing, Mapping):
                open_.discard(closing["requestId"])
    return open_


def closures(store: Any) -> list[RuntimeEvent]:
    return [e for e in store.events(run_id="r1") if e.actions and e.actions.permission_closure_accepted]


def assert_closed(rt: Runtime, pending: dict[str, Any]) -> None:
    store = rt.ledger
    (closing,) = closures(store)
    assert closing.actions is not None and closing.actions.permission_closure_accepted is not None
    assert closing.actions.permission_closure_accepted.request_id == pending["approvalId"]
    events = store.events(run_id="r1")
    ids = [e.id for e in events]
    terminal = next(e for e in events if e.is_terminal)
    assert ids.index(closing.id) == ids.index(terminal.id) - 1  # closed just before the run ended
    assert approvals.pending(store, "s1") == [] and unanswered(events) == set()
    assert governance_status(store, "s1", "failed") == {"pendingApprovals": []}
    held = store.decision(pending["operationId"])
    assert held is not None and held["state"] == "expired"
    for allow in (True, False):
        with pytest.raises(ApprovalRefused) as late:
            approvals.answer(store, "s1", pending["approvalId"], allow=allow, phrase=pending["phrase"])
        assert late.value.code == "approval_expired" and "its run ended" in late.value.message


def test_a_repaired_run_closes_its_open_request(rt: Runtime, ws: Workspace) -> None:
    ref, pending = open_request(rt, ws)
    assert unanswered(rt.ledger.events(run_id="r1")) == {pending["approvalId"]}
    result = repair_run(rt.ledger, "r1")
    assert result.terminal_committed and result.header_status == "failed"
    assert_closed(rt, pending)
    assert not (ws.root / "a.txt").exists()
    # A waiter that outlived its run (a cancelled run's activity) finds the closure and writes
    # nothing after the run's terminal fact.
    with pytest.raises(LedgerRejection) as ended:
        tool_admission.admit_call(rt, tool_input(ws, ref), ATTEMPT)
    assert ended.value.code == "run_already_terminal"
    assert rt.ledger.events(run_id="r1")[-1].id == result.terminal_event_id
    # Repair again (a second worker at startup): the same terminal fact, nothing more to close.
    again = repair_run(rt.ledger, "r1")
    assert again.terminal_event_id == result.terminal_event_id and not again.terminal_committed
    assert len(closures(rt.ledger)) == 1


def test_a_run_that_fails_closes_its_open_request(rt: Runtime, ws: Workspace) -> None:
    _, pending = open_request(rt, ws)
    run(turn.finish_run(rt, FinishRunInput(ids=IDS, status="failed", ts=9, error="provider_failed")))
    assert_closed(rt, pending)


def test_a_cancelled_run_closes_its_open_request(rt: Runtime, ws: Workspace) -> None:
    _, pending = open_request(rt, ws)
    last = rt.ledger.events(run_id="r1")[-1]
    cancelled = recovered_terminal_event(last, "r1", "cancelled").model_copy(update={"status": "cancelled"})
    assert settle_run(rt.ledger, cancelled).header_status == "cancelled"
    assert_closed(rt, pending)


def test_negative_control_a_terminal_fact_without_the_closure_leaves_the_request_open(
    rt: Runtime, ws: Workspace
) -> None:
    """Built by the test: the run's terminal fact appended as a plain event, not through
    ``commit_terminal``; the checks above then see the dead request."""
    _, pending = open_request(rt, ws)
    last = rt.ledger.events(run_id="r1")[-1]
    rt.ledger.append([recovered_terminal_event(last, "r1", "process_crashed")])
    assert closures(rt.ledger) == []
    assert [p["approvalId"] for p in approvals.pending(rt.ledger, "s1")] == [pending["approvalId"]]
    assert unanswered(rt.ledger.events(run_id="r1")) == {pending["approvalId"]}


def test_an_answer_that_lands_first_wins_and_is_not_closed(rt: Runtime, ws: Workspace) -> None:
    _, pending = open_request(rt, ws)
    approvals.answer(rt.ledger, "s1", pending["approvalId"], allow=False, by="bob")
    repair_run(rt.ledger, "r1")
    assert closures(rt.ledger) == []
    held = rt.ledger.decision(pending["operationId"])
    assert held is not None and held["state"] == "denied"


def test_racing_repairers_converge_on_one_closure(rt: Runtime, ws: Workspace, store_url: str) -> None:
    if store_url == "sqlite://":
        pytest.skip("two handles on one in-memory database are two databases")
    _, pending = open_request(rt, ws)
    handles = [LedgerStore.open(store_url) for _ in range(4)]
    barrier = threading.Barrier(len(handles))
    results: list[Any] = [None] * len(handles)

    def repair(i: int) -> None:
        barrier.wait()
        try:
            results[i] = repair_run(handles[i], "r1")
        except BaseException as exc:  # reported below, with the others
            results[i] = exc

    threads = [threading.Thread(target=repair, args=(i,)) for i in range(len(handles))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    for h in handles:
        h.close()
    assert all(not isinstance(r, BaseException) for r in results), results
    assert len({r.terminal_event_id for r in results}) == 1
    assert sum(r.terminal_committed for r in results) == 1
    assert_closed(rt, pending)
