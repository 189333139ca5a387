"""A MELRA task that declared ``reconciliation`` predicates, interrupted after T1, is settled by
recovery from those predicates and never run again: all hold -> the recovery bundle completes the
call with a verified receipt; one does not -> it parks (``reconcile_diverged``), and one that cannot
be observed parks ``reconcile_unreadable``. The write is counted by the file's inode (the write
tool replaces a file atomically, so every write is a new inode). The negative control is a
recovery that re-runs the effect, built by the test: the count catches it. Real ledger files, a
real workspace, the one tool path."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any

import pytest

from maka_core.facts import canonical_json
from maka_core.governance import verify_receipts
from maka_core.runtime import melra, recovery, tool_admission
from maka_core.runtime.contracts import CallRef, RecoverInput, RecoverResult
from maka_core.runtime.runtime import Runtime, no_heartbeat
from maka_core.workspace import Workspace
from tests.test_governed_execution import result_of
from tests.test_melra_runtime import WRITE, Session
from tests.test_runtime import ATTEMPT, recover_input, run, tool_input

HELLO = hashlib.sha256(b"hello\n").hexdigest()
RECONCILE = [{"type": "file_hash", "path": "out.txt", "sha256": HELLO}]
EVIDENCE = [{"type": "file_exists", "path": "out.txt"}]


def interrupted(s: Session, ws: Workspace, reconciliation: list[dict[str, Any]]) -> tuple[str, CallRef, Any]:
    """A planned write task whose execute committed T1 and then the worker died."""
    planned = s.plan(WRITE, requiredEvidence=EVIDENCE, reconciliation=reconciliation)
    assert planned["executionGuarantee"] == "reconciliation-required", planned
    ref = s.ask("melra_execute", {"taskId": planned["taskId"]})
    admitted = tool_admission.admit_call(s.rt, tool_input(ws, ref), ATTEMPT)
    assert isinstance(admitted, tool_admission.Dispatched)
    return planned["taskId"], ref, admitted


def writes(path: Path) -> tuple[int, int] | None:
    """The file's identity: a different one means it was written again."""
    if not path.exists():
        return None
    st = os.stat(path)
    return st.st_ino, st.st_mtime_ns


def recover(rt: Runtime, inp: RecoverInput) -> RecoverResult:
    return run(recovery.recover_operation(rt, inp, ATTEMPT))  # type: ignore[no-any-return]


def rerunning_recover(rt: Runtime, inp: RecoverInput) -> RecoverResult:
    """The broken variant (negative control): runs the task's effect again, then settles."""
    ws = rt.workspace(inp.workspace)
    args = {"taskId": _task_of(rt, inp)}
    tool = melra.bind(rt, rt.tools["melra_execute"], inp.session_id, inp.call.operation_id)
    assert tool.preflight(args, ws) is None
    tool.run(args, ws, no_heartbeat)
    return recover(rt, inp)


def _task_of(rt: Runtime, inp: RecoverInput) -> str:
    held = rt.ledger.decision(inp.call.operation_id)
    assert held is not None
    return str(held["decision"]["melraTaskId"])


def land_effect(admitted: Any, ws: Workspace) -> None:
    """The first attempt's effect, exactly as it ran before the crash (between the effect and T2)."""
    assert not admitted.tool.run(admitted.args, ws, no_heartbeat).is_error


@pytest.mark.parametrize("recoverer", [recover, rerunning_recover], ids=["recovery", "control_rerun"])
def test_an_effect_that_landed_is_recovered_completed_and_not_written_again(
    rt: Runtime, ws: Workspace, recoverer: Any
) -> None:
    s = Session(rt, ws)
    task, ref, admitted = interrupted(s, ws, RECONCILE)
    land_effect(admitted, ws)
    before = writes(ws.root / "out.txt")
    settled = recoverer(rt, recover_input(ws, ref))
    assert (settled.status, settled.reason) == ("completed", "reconcile_matches_expected_state")
    if recoverer is rerunning_recover:
        # The control: the check below is what catches a recovery that repeats the effect.
        assert writes(ws.root / "out.txt") != before
        return
    assert writes(ws.root / "out.txt") == before  # the write happened once
    answer = result_of(rt, settled.response_event_id)
    assert (answer["taskId"], answer["status"]) == (task, "verified_success")
    assert answer["result"]["reconciled"] is True
    assert answer["result"]["reconciliation"][0]["type"] == "file_hash"
    assert answer["result"]["reconciliation"][0]["passed"] is True
    assert s.call("melra_task_status", {"taskId": task})["status"] == "verified_success"
    (receipt,) = s.call("melra_receipt", {"taskId": task})["receipts"]
    assert receipt["observedEffect"] == {"status": "verified_success"} and receipt["melraTaskId"] == task
    assert receipt["executionGuarantee"] == "reconciliation-required"
    assert verify_receipts([canonical_json.dumps(r) for r in rt.ledger.receipts("s1")]) == []
    again = s.call("melra_execute", {"taskId": task})
    assert again["code"] == "duplicate_attempt_prevented"
    # Recovery again (a second recoverer): the ledger's settlement stands, nothing runs.
    assert recover(rt, recover_input(ws, ref)).response_event_id == settled.response_event_id
    assert writes(ws.root / "out.txt") == before


def test_an_effect_that_did_not_land_is_parked_and_the_file_untouched(rt: Runtime, ws: Workspace) -> None:
    s = Session(rt, ws)
    task, ref, _ = interrupted(s, ws, RECONCILE)
    parked = recover(rt, recover_input(ws, ref))
    assert (parked.status, parked.reason) == ("parked", "reconcile_diverged")
    assert not (ws.root / "out.txt").exists()  # never run by recovery
    status = s.call("melra_task_status", {"taskId": task})
    assert status["status"] == "recovery_required", status
    assert s.call("melra_execute", {"taskId": task})["code"] == "duplicate_attempt_prevented"
    assert not (ws.root / "out.txt").exists()


def test_other_bytes_at_the_target_diverge_and_stay_as_they_are(rt: Runtime, ws: Workspace) -> None:
    s = Session(rt, ws)
    _, ref, _ = interrupted(s, ws, RECONCILE)
    (ws.root / "out.txt").write_text("someone else's\n")
    before = writes(ws.root / "out.txt")
    parked = recover(rt, recover_input(ws, ref))
    assert (parked.status, parked.reason) == ("parked", "reconcile_diverged")
    assert writes(ws.root / "out.txt") == before
    assert (ws.root / "out.txt").read_text() == "someone else's\n"


def test_a_predicate_that_cannot_be_observed_parks_unreadable(rt: Runtime, ws: Workspace) -> None:
    s = Session(rt, ws)
    _, ref, admitted = interrupted(s, ws, [*RECONCILE, {"type": "file_exists", "path": "../outside.txt"}])
    land_effect(admitted, ws)
    parked = recover(rt, recover_input(ws, ref))
    assert (parked.status, parked.reason) == ("parked", "reconcile_unreadable")


def test_without_reconciliation_the_task_still_parks_at_most_once(rt: Runtime, ws: Workspace) -> None:
    s = Session(rt, ws)
    planned = s.plan(WRITE, requiredEvidence=EVIDENCE)
    assert planned["executionGuarantee"] == "at-most-once"
    ref = s.ask("melra_execute", {"taskId": planned["taskId"]})
    admitted = tool_admission.admit_call(rt, tool_input(ws, ref), ATTEMPT)
    land_effect(admitted, ws)
    parked = recover(rt, recover_input(ws, ref))
    assert (parked.status, parked.reason) == ("parked", "dispatch_without_response")
