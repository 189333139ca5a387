"""The MELRA tools on the one tool path, without Temporal: plan never executes, execute runs the
planned operation through T1/T2 with the task's evidence and a receipt tagged with the task,
status and receipt read the ledger, approvals by argument and by the operator, budgets end a
task ``budget_exhausted``, a crashed plan re-runs into the task it persisted, and an old ledger
upgrades. Real ledger files, a real workspace, real bash."""

from __future__ import annotations

import asyncio
import sqlite3
import time
from pathlib import Path
from typing import Any

from maka_core.facts import canonical_json
from maka_core.governance import verify_receipts
from maka_core.governance.tasks import executions_from, task_id_for, task_status
from maka_core.runtime import approvals, recovery, tool_admission, tool_call, turn
from maka_core.runtime.contracts import CallRef, FinishRunInput
from maka_core.runtime.runtime import Runtime
from maka_core.store.schema import SCHEMA_VERSION
from maka_core.store.writer import LedgerStore
from maka_core.workspace import Workspace
from tests.test_governed_execution import result_of, with_policy
from tests.test_runtime import (
    ATTEMPT,
    IDS,
    begin,
    op_status,
    prepare_only,
    recover_input,
    run,
    step,
    tool_input,
)

WRITE = {"kind": "file", "action": "write", "path": "out.txt", "content": "hello\n"}


class Session:
    """One run whose k-th model step asks for one call; each call goes through execute_tool."""

    def __init__(self, rt: Runtime, ws: Workspace) -> None:
        self.rt, self.ws, self.k = rt, ws, 0
        begin(rt, ws)

    def ask(self, name: str, args: dict[str, Any]) -> CallRef:
        steps: list[dict[str, Any]] = [{"text": "."}] * self.k
        steps.append({"toolCalls": [{"name": name, "args": args}]})
        (ref,) = step(self.rt, self.ws, self.k, {"kind": "script", "steps": steps}).calls
        self.k += 1
        return ref  # type: ignore[no-any-return]

    def call(self, name: str, args: dict[str, Any]) -> dict[str, Any]:
        ref = self.ask(name, args)
        outcome = run(tool_call.execute_tool(self.rt, tool_input(self.ws, ref), ATTEMPT))
        return result_of(self.rt, outcome.response_event_id)

    def plan(self, operation: dict[str, Any], **extra: Any) -> dict[str, Any]:
        return self.call("melra_plan", {"goal": "write the greeting", "operation": operation, **extra})


def test_plan_never_executes_and_the_negative_control_shows_the_same_task_would_write(
    rt: Runtime, ws: Workspace
) -> None:
    s = Session(rt, ws)
    planned = s.plan(WRITE)
    assert planned["status"] == "planned" and planned["reason"] == "mutations_allowed_by_policy"
    assert not (ws.root / "out.txt").exists()  # planning wrote nothing
    assert s.call("melra_task_status", {"taskId": planned["taskId"]})["status"] == "planned"
    # Control: the very task, executed, does write; so the check above could fail.
    done = s.call("melra_execute", {"taskId": planned["taskId"]})
    assert done["status"] == "verified_success" and (ws.root / "out.txt").read_text() == "hello\n"


def test_plan_execute_status_receipt_and_the_receipts_verify(rt: Runtime, ws: Workspace) -> None:
    s = Session(rt, ws)
    planned = s.plan(WRITE, requiredEvidence=[{"type": "file_exists", "path": "out.txt"}])
    task = planned["taskId"]
    done = s.call("melra_execute", {"taskId": task})
    assert done["taskId"] == task and done["status"] == "verified_success"
    assert done["evidence"] == [{"type": "file_exists", "passed": True, "summary": "file exists"}]
    status = s.call("melra_task_status", {"taskId": task})
    assert status["status"] == "verified_success" and status["budget"]["stepsUsed"] == 1
    assert [e["receiptId"] for e in status["executions"]] == [done["receiptId"]]
    receipts = s.call("melra_receipt", {"taskId": task})["receipts"]
    assert [r["receiptId"] for r in receipts] == [done["receiptId"]]
    assert receipts[0]["melraTaskId"] == task and receipts[0]["capability"] == "file.write"
    assert s.call("melra_receipt", {"receiptId": done["receiptId"]})["taskId"] == task
    again = s.call("melra_execute", {"taskId": task})
    assert again["code"] == "duplicate_attempt_prevented"  # a mutation runs at most once
    lines = [canonical_json.dumps(r) for r in rt.ledger.receipts("s1")]
    assert verify_receipts(lines) == []
    assert s.call("melra_receipt", {})["code"] == "task_or_receipt_required"
    assert s.call("melra_task_status", {"taskId": task_id_for("nope")})["code"] == "task_not_found"
    assert s.call("melra_receipt", {"receiptId": "rcpt-nope"})["code"] == "receipt_not_found"


def test_a_terminal_task_runs_its_command_with_exit_code_evidence(rt: Runtime, ws: Workspace) -> None:
    s = Session(rt, ws)
    op = {"kind": "terminal", "action": "run", "command": "touch", "args": ["made.txt"]}
    assert s.plan(op)["reason"] == "mutation_requires_evidence"
    planned = s.plan(op, requiredEvidence=[{"type": "exit_code", "value": 0}])
    done = s.call("melra_execute", {"taskId": planned["taskId"]})
    assert done["status"] == "verified_success" and (ws.root / "made.txt").exists()


def test_approval_through_the_execute_argument_is_checked_against_the_plans_challenge(
    rt: Runtime, ws: Workspace
) -> None:
    with_policy(rt, {"mutations": "confirm"})
    s = Session(rt, ws)
    planned = s.plan(WRITE)
    assert planned["status"] == "awaiting_approval"
    challenge = planned["challenge"]
    wrong = s.call(
        "melra_execute",
        {
            "taskId": planned["taskId"],
            "approval": {"approvalId": challenge["approvalId"], "phrase": "APPROVE 0"},
        },
    )
    assert (wrong["status"], wrong["reason"]) == ("policy_blocked", "approval_phrase_mismatch")
    assert not (ws.root / "out.txt").exists()
    answer = {"approvalId": challenge["approvalId"], "phrase": challenge["phrase"]}
    done = s.call("melra_execute", {"taskId": planned["taskId"], "approval": answer})
    assert done["status"] == "verified_success" and (ws.root / "out.txt").read_text() == "hello\n"
    receipt = s.call("melra_receipt", {"receiptId": done["receiptId"]})["receipts"][0]
    assert receipt["policyDecision"] == {
        "outcome": "confirm",
        "policyVersion": "maka-policy/v1",
        "policyDigest": receipt["policyDecision"]["policyDigest"],
        "approvalId": challenge["approvalId"],
    }


def test_approval_by_the_operator_while_execute_waits(rt: Runtime, ws: Workspace) -> None:
    with_policy(rt, {"mutations": "confirm"})
    s = Session(rt, ws)
    planned = s.plan(WRITE)
    ref = s.ask("melra_execute", {"taskId": planned["taskId"]})

    async def main() -> Any:
        task = asyncio.create_task(tool_call.execute_tool(rt, tool_input(ws, ref), ATTEMPT))
        for _ in range(200):
            pending = await asyncio.to_thread(approvals.pending, rt.ledger, "s1")
            if pending:
                break
            await asyncio.sleep(0.05)
        assert pending and not task.done() and not (ws.root / "out.txt").exists()
        status = await asyncio.to_thread(s.rt.ledger.melra_executions, "s1", planned["taskId"])
        assert [e["state"] for e in status] == ["awaiting_approval"]
        (p,) = pending
        await asyncio.to_thread(
            approvals.answer, rt.ledger, "s1", p["approvalId"], allow=True, phrase=p["phrase"]
        )
        return await asyncio.wait_for(task, 10)

    outcome = run(main())
    assert result_of(rt, outcome.response_event_id)["status"] == "verified_success"
    assert (ws.root / "out.txt").read_text() == "hello\n"


def test_steps_budget_ends_the_task_budget_exhausted_and_constraints_block_at_execute(
    rt: Runtime, ws: Workspace
) -> None:
    s = Session(rt, ws)
    planned = s.plan(WRITE, constraints=["only on Tuesdays"], budget={"maxSteps": 1})
    assert planned["reason"] == "freeform_constraints_not_enforceable"
    first = s.call("melra_execute", {"taskId": planned["taskId"]})  # policy runs again, and denies again
    assert (first["status"], first["reason"]) == ("policy_blocked", "freeform_constraints_not_enforceable")
    second = s.call("melra_execute", {"taskId": planned["taskId"]})
    assert (second["code"], second["status"]) == ("task_budget_exhausted", "budget_exhausted")
    assert s.call("melra_task_status", {"taskId": planned["taskId"]})["status"] == "budget_exhausted"
    assert not (ws.root / "out.txt").exists()
    statuses = [r["observedEffect"]["status"] for r in rt.ledger.receipts("s1") if r.get("melraTaskId")]
    assert statuses == ["policy_blocked", "budget_exhausted"]


def test_duration_budget_counts_from_the_plan(rt: Runtime, ws: Workspace) -> None:
    s = Session(rt, ws)
    planned = s.plan(WRITE, budget={"maxDurationMs": 100})
    time.sleep(0.3)
    late = s.call("melra_execute", {"taskId": planned["taskId"]})
    assert late["status"] == "budget_exhausted" and not (ws.root / "out.txt").exists()


def test_a_failed_read_is_retried_only_within_max_retries(rt: Runtime, ws: Workspace) -> None:
    s = Session(rt, ws)
    planned = s.plan({"kind": "file", "action": "read", "path": "later.txt"}, budget={"maxRetries": 1})
    assert planned["status"] == "planned" and planned["executionGuarantee"] == "read-only"
    assert s.call("melra_execute", {"taskId": planned["taskId"]})["status"] == "failed"
    assert s.call("melra_execute", {"taskId": planned["taskId"]})["status"] == "failed"  # the one retry
    assert s.call("melra_execute", {"taskId": planned["taskId"]})["status"] == "budget_exhausted"
    # A mutation that ran and failed is never run again, whatever maxRetries says.
    op = {"kind": "terminal", "action": "run", "command": "false"}
    failing = s.plan(op, requiredEvidence=[{"type": "exit_code", "value": 0}], budget={"maxRetries": 5})
    assert s.call("melra_execute", {"taskId": failing["taskId"]})["status"] == "failed"
    assert s.call("melra_execute", {"taskId": failing["taskId"]})["code"] == "duplicate_attempt_prevented"


def test_a_plan_interrupted_after_its_row_reruns_into_the_same_task(rt: Runtime, ws: Workspace) -> None:
    s = Session(rt, ws)
    args = {"goal": "g", "operation": WRITE}
    ref = s.ask("melra_plan", args)
    prepare_only(rt, ws, ref, args)  # T1, then the worker died after persisting the row, before T2
    from maka_core.runtime import melra

    bound = melra.bind(rt, rt.tools["melra_plan"], "s1", ref.operation_id)
    first = bound.run(args, ws, lambda: None).result["value"]
    recovered = run(recovery.recover_operation(rt, recover_input(ws, ref), ATTEMPT))
    assert (recovered.status, recovered.reason) == ("completed", "replay_safe_reread")
    assert op_status(rt, ref)[0] == "completed"
    assert result_of(rt, recovered.response_event_id) == first
    assert first["taskId"] == task_id_for(ref.operation_id)
    assert not (ws.root / "out.txt").exists()


def test_unsupported_kinds_are_refused_before_a_task_exists(rt: Runtime, ws: Workspace) -> None:
    s = Session(rt, ws)
    refused = s.plan({"kind": "browser", "action": "navigate", "url": "https://example.com"})
    assert (
        refused["code"] == "operation_kind_not_supported"
        and "only 'file' and 'terminal'" in refused["message"]
    )


def test_a_v3_ledger_upgrades_to_the_task_table(tmp_path: Path) -> None:
    db = tmp_path / "ledger.sqlite"
    LedgerStore.open(db).close()
    conn = sqlite3.connect(db)
    conn.execute("drop table melra_tasks")
    conn.execute("pragma user_version=3")
    conn.commit()
    conn.close()
    with LedgerStore.open(db) as store:
        stored = store.put_melra_task(
            "t", session_id="s", plan_operation_id="op", request={"goal": "g"}, plan={"status": "planned"},
            planned_at=1,
        )  # fmt: skip
        again = store.put_melra_task(
            "t", session_id="s", plan_operation_id="op", request={}, plan={}, planned_at=2
        )
        assert stored == again and again["plan"] == {"status": "planned"}  # the first write wins
    conn = sqlite3.connect(db)
    assert conn.execute("pragma user_version").fetchone()[0] == SCHEMA_VERSION == 7
    conn.close()


def test_a_script_passes_the_planned_task_id_to_execute(rt: Runtime, ws: Workspace) -> None:
    begin(rt, ws)
    steps = [
        {"toolCalls": [{"name": "melra_plan", "args": {"goal": "g", "operation": WRITE}}]},
        {"toolCalls": [{"name": "melra_execute", "args": {"taskId": "{{result:call-0-0:taskId}}"}}]},
    ]
    spec = {"kind": "script", "steps": steps}
    (plan_ref,) = step(rt, ws, 0, spec).calls
    planned = result_of(
        rt, run(tool_call.execute_tool(rt, tool_input(ws, plan_ref), ATTEMPT)).response_event_id
    )
    (exec_ref,) = step(rt, ws, 1, spec).calls
    calls = [e.content for e in rt.ledger.events(session_id="s1") if e.content is not None]
    (committed,) = [c for c in calls if c.kind == "function_call" and c.id == exec_ref.tool_call_id]
    assert committed.args == {"taskId": planned["taskId"]}  # type: ignore[union-attr]
    done = result_of(rt, run(tool_call.execute_tool(rt, tool_input(ws, exec_ref), ATTEMPT)).response_event_id)
    assert done["status"] == "verified_success"


def test_an_execute_interrupted_after_t1_is_parked_never_run_again(rt: Runtime, ws: Workspace) -> None:
    s = Session(rt, ws)
    planned = s.plan(WRITE)
    ref = s.ask("melra_execute", {"taskId": planned["taskId"]})
    # T1 and its decision; then the crash
    admitted = tool_admission.admit_call(rt, tool_input(ws, ref), ATTEMPT)
    assert isinstance(admitted, tool_admission.Dispatched)
    parked = run(recovery.recover_operation(rt, recover_input(ws, ref), ATTEMPT))
    assert (parked.status, parked.reason) == ("parked", "dispatch_without_response")
    assert not (ws.root / "out.txt").exists()  # at-most-once: the write is not repeated by recovery
    again = s.call("melra_execute", {"taskId": planned["taskId"]})
    assert (again["code"], again["status"]) == ("duplicate_attempt_prevented", "running")
    # Control: a read task interrupted the same way is read again by recovery.
    (ws.root / "r.txt").write_text("r")
    read = s.plan({"kind": "file", "action": "read", "path": "r.txt"})
    read_ref = s.ask("melra_execute", {"taskId": read["taskId"]})
    read = tool_admission.admit_call(rt, tool_input(ws, read_ref), ATTEMPT)
    assert isinstance(read, tool_admission.Dispatched)
    reread = run(recovery.recover_operation(rt, recover_input(ws, read_ref), ATTEMPT))
    assert (reread.status, reread.reason) == ("completed", "replay_safe_reread")
    assert result_of(rt, reread.response_event_id)["status"] == "verified_success"
    # The workflow parks the run: the park commits no receipt, and the task says an operator must
    # settle it. The run is over (nothing may follow its terminal fact), so the status is read as a
    # later run's melra_task_status reads it (after `maka resume`, say): from the ledger.
    finish = FinishRunInput(
        ids=IDS,
        status="failed",
        ts=9,
        park_reason="dispatch_without_response",
        parked_operation_id=ref.operation_id,
    )
    run(turn.finish_run(rt, finish))
    executions = executions_from(rt.ledger.melra_executions(IDS.session_id, planned["taskId"]))
    assert task_status(planned["status"], executions) == "recovery_required"
    assert not (ws.root / "out.txt").exists()
