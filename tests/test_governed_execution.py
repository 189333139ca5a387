"""Governed execution on the tool path, without Temporal: a session's policy decides every call
before T1, evidence decides success before T2, receipts and certificates land in the ledger with
the facts they describe, approval waits durably, and recovery obeys the recorded guarantee.

Real ledger files, a real workspace, real bash; the decision steps' reason codes end to end.
"""

from __future__ import annotations

import asyncio
import hashlib
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import update

from maka_core.facts import canonical_json
from maka_core.governance import GovernancePolicy, parse_policy, verify_receipts
from maka_core.governance.policy_file import Identity, Principal
from maka_core.policy import Policy
from maka_core.runtime import approvals, recovery, tool_admission, tool_call, turn
from maka_core.runtime.approvals import ApprovalRefused
from maka_core.runtime.contracts import CallRef, FinishRunInput
from maka_core.runtime.governed import SessionGovernance, decision_record, judge
from maka_core.runtime.runtime import Runtime
from maka_core.store.schema import tool_decisions
from maka_core.store.writer import LedgerStore
from maka_core.workspace import Workspace
from tests.test_runtime import (
    ATTEMPT,
    IDS,
    one_call,
    op_status,
    prepare_only,
    recover_input,
    run,
    script,
    step,
    tool_input,
)


def with_policy(rt: Runtime, policy: dict[str, Any], principal: str = "agent:local") -> SessionGovernance:
    gov = SessionGovernance(parse_policy(policy), Identity(principal=Principal.parse(principal)))
    record = gov.to_record()
    rt.ledger.put_session_policy(  # type: ignore[attr-defined]
        IDS.session_id,
        policy=record["policy"],
        version=record["version"],
        digest=record["digest"],
        identity=record["identity"],
    )
    return gov


def call(rt: Runtime, ws: Workspace, name: str, args: dict[str, Any]) -> tuple[CallRef, dict[str, Any]]:
    """One call through execute_tool; returns its ref and the committed result value."""
    ref = one_call(rt, ws, name, args)
    outcome = run(tool_call.execute_tool(rt, tool_input(ws, ref), ATTEMPT))
    return ref, result_of(rt, outcome.response_event_id)


def result_of(rt: Runtime, event_id: str | None) -> dict[str, Any]:
    event = next(e for e in rt.ledger.events(session_id="s1") if e.id == event_id)
    assert event.content is not None and event.content.kind == "function_response"
    result: dict[str, Any] = event.content.result  # type: ignore[assignment]
    return result.get("value", result)


def receipts(rt: Runtime) -> list[dict[str, Any]]:
    return rt.ledger.receipts("s1")  # type: ignore[attr-defined,no-any-return]


# --- decision before T1 --------------------------------------------------------------------------


def test_default_policy_runs_a_write_verified_with_a_receipt_and_a_certificate(
    rt: Runtime, ws: Workspace
) -> None:
    ref, result = call(rt, ws, "write_file", {"path": "a.txt", "content": "x"})
    assert result["path"] == "a.txt" and "verification" not in result
    held = rt.ledger.decision(ref.operation_id)
    assert held is not None and held["state"] == "decided"
    assert held["decision"]["reason"] == "mutations_allowed_by_policy"
    assert held["decision"]["executionGuarantee"] == "reconciliation-required"
    (receipt,) = receipts(rt)
    assert receipt["taskId"] == ref.operation_id and receipt["success"] is True
    assert receipt["observedEffect"] == {"status": "verified_success"}
    assert [e["type"] for e in receipt["evidence"]] == ["file_exists"]  # MELRA's default evidence
    run(turn.finish_run(rt, FinishRunInput(ids=IDS, status="completed", ts=9)))
    lines = [canonical_json.dumps(r) for r in receipts(rt)]
    assert lines[-1].find('"VERIFIED_SUCCESS"') > 0 and verify_receipts(lines) == []
    tampered = lines[0].replace('"success":true', '"success":false')
    assert [p.code for p in verify_receipts([tampered, *lines[1:]])] == ["receipt_digest_mismatch"]


BASH_EVIDENCE: dict[str, Any] = {
    "mutations": "allow",
    "defaultEvidence": {"bash": [{"type": "exit_code", "value": 0}]},
}


@pytest.mark.parametrize(
    ("policy", "worker", "name", "args", "reason"),
    [
        ({}, Policy(forbidden_effects=frozenset({"mutate"})), "write_file", {"path": "a", "content": "x"},
         "effect_forbidden_by_request"),
        ({"capabilities": [{"id": "g1", "capability": "file.read", "effects": ["read"]}]}, Policy(),
         "write_file", {"path": "a", "content": "x"}, "capability_not_granted:file.write"),
        ({"deniedTraits": ["package-install"], "mutations": "allow"}, Policy(), "bash",
         {"command": "pip install requests"}, "trait_denied:package-install"),
        ({"allowedCommands": ["ls"], "mutations": "allow"}, Policy(), "bash", {"command": "cat a"},
         "command_not_allowlisted"),
        ({"mutations": "allow"}, Policy(), "bash", {"command": "touch b"}, "mutation_requires_evidence"),
        ({"mutations": "deny"}, Policy(), "write_file", {"path": "a", "content": "x"}, "mutations_disabled"),
        # issue 23: lines the shlex parser called reads are unanalysable mutations of unknown target
        ({"allowedCommands": ["ls"], **BASH_EVIDENCE}, Policy(), "bash", {"command": "ls a#b; touch b"},
         "command_not_allowlisted"),
        ({"forbiddenEffects": ["destructive"], **BASH_EVIDENCE}, Policy(), "bash",
         {"command": "ls a#b; touch b"}, "effect_forbidden_by_request"),
        ({**BASH_EVIDENCE, "mutations": "deny"}, Policy(), "bash", {"command": "ls a#b; touch b"},
         "mutations_disabled"),
        ({**BASH_EVIDENCE, "mutations": "deny"}, Policy(), "bash",
         {"command": "x=\\$\\(touch\\ b\\); ls ${x@P}"}, "mutations_disabled"),
        ({**BASH_EVIDENCE, "mutations": "deny"}, Policy(), "bash",
         {"command": "x=b\\[\\$\\(touch\\ b\\)\\]; ls ${a[x]}"}, "mutations_disabled"),
    ],
)  # fmt: skip
def test_each_denial_is_a_committed_policy_blocked_result(
    rt: Runtime,
    ws: Workspace,
    policy: dict[str, Any],
    worker: Policy,
    name: str,
    args: dict[str, Any],
    reason: str,
) -> None:
    rt.policy = worker
    gov = with_policy(rt, policy)
    ref, result = call(rt, ws, name, args)
    assert result["code"] == "policy_blocked" and result["reason"] == reason
    assert (
        result["policyVersion"] == gov.policy.policy_version and result["policyDigest"] == gov.policy.digest
    )
    assert op_status(rt, ref)[0] == "completed"  # settled before T1: nothing ran
    assert not (ws.root / "a").exists() and not (ws.root / "b").exists()
    (receipt,) = receipts(rt)
    assert (
        receipt["policyDecision"]["outcome"] == "deny"
        and receipt["observedEffect"]["status"] == "policy_blocked"
    )


@pytest.mark.parametrize(
    ("policy", "name", "args", "reason"),
    [
        ({"unhinged": True, "mutations": "deny"}, "bash", {"command": "touch b"},
         "unhinged_mode_no_guardrails"),
        ({"mutations": "deny"}, "read_file", {"path": "r.txt"}, "read_only_operation"),
        ({"mutations": "allow"}, "write_file", {"path": "b", "content": "x"}, "mutations_allowed_by_policy"),
    ],
)  # fmt: skip
def test_allowing_steps_record_their_reason(
    rt: Runtime, ws: Workspace, policy: dict[str, Any], name: str, args: dict[str, Any], reason: str
) -> None:
    (ws.root / "r.txt").write_text("r")
    with_policy(rt, policy)
    ref, _ = call(rt, ws, name, args)
    held = rt.ledger.decision(ref.operation_id)
    assert held is not None and held["decision"]["reason"] == reason


# --- evidence decides success --------------------------------------------------------------------


def test_a_failing_predicate_makes_a_succeeded_tool_partial_and_the_model_is_told(
    rt: Runtime, ws: Workspace
) -> None:
    wrong = "0" * 64
    with_policy(
        rt,
        {
            "mutations": "allow",
            "defaultEvidence": {"write_file": [{"type": "file_hash", "path": "{{path}}", "sha256": wrong}]},
        },
    )
    _, result = call(rt, ws, "write_file", {"path": "a.txt", "content": "x"})
    assert (ws.root / "a.txt").read_text() == "x"  # the effect happened
    assert result["verification"]["status"] == "partial"
    assert result["verification"]["failedEvidence"][0]["type"] == "file_hash"
    (receipt,) = receipts(rt)
    assert receipt["success"] is False and receipt["observedEffect"] == {"status": "partial"}


def test_a_matching_predicate_is_verified_success(rt: Runtime, ws: Workspace) -> None:
    right = hashlib.sha256(b"x").hexdigest()
    with_policy(
        rt,
        {
            "mutations": "allow",
            "defaultEvidence": {"write_file": [{"type": "file_hash", "path": "{{path}}", "sha256": right}]},
        },
    )
    _, result = call(rt, ws, "write_file", {"path": "a.txt", "content": "x"})
    assert "verification" not in result
    assert receipts(rt)[0]["observedEffect"] == {"status": "verified_success"}


def test_bash_exit_code_is_its_default_evidence(rt: Runtime, ws: Workspace) -> None:
    _, result = call(rt, ws, "bash", {"command": "echo hi > out.txt; exit 3"})
    assert result["exitCode"] == 3
    (receipt,) = receipts(rt)
    assert receipt["observedEffect"] == {"status": "failed"} and receipt["evidence"][0]["passed"] is False


# --- the guarantee, recorded and obeyed ------------------------------------------------------------


@pytest.mark.parametrize(("recorded", "status"), [("read-only", "completed"), ("at-most-once", "parked")])
def test_recovery_obeys_the_recorded_guarantee(
    rt: Runtime, ws: Workspace, recorded: str, status: str
) -> None:
    (ws.root / "r.txt").write_text("r")
    ref = one_call(rt, ws, "read_file", {"path": "r.txt"})
    prepare_only(rt, ws, ref, {"path": "r.txt"})
    # The decision as T1 would have recorded it; the negative control records a stricter guarantee.
    tool = rt.tools["read_file"]
    gov = rt.session_governance("s1")
    decided = judge(
        gov, tool, {"path": "r.txt"}, worker_forbidden=frozenset(), grant_usage={}, now=datetime.now(UTC)
    )
    record = {**decision_record(decided, tool), "executionGuarantee": recorded}
    with rt.ledger.engine.begin() as conn:  # type: ignore[attr-defined]
        conn.execute(
            tool_decisions.insert().values(
                operation_id=ref.operation_id, session_id="s1", run_id="r1", state="decided",
                decision_json=canonical_json.dumps(record), recorded_at=1, updated_at=1,
            )
        )  # fmt: skip
    result = run(recovery.recover_operation(rt, recover_input(ws, ref), ATTEMPT))
    assert result.status == status


@pytest.mark.parametrize(
    ("policy", "line", "guarantee"),
    [
        ({}, "ls -la | wc -l", "at-most-once"),  # the default policy trusts no bash line
        ({"trustedReadCommands": ["ls", "wc"]}, "ls -la | wc -l", "read-only"),
        ({"trustedReadCommands": ["ls"]}, "ls -la | wc -l", "at-most-once"),
        ({"trustedReadCommands": ["ls"]}, "ls a#b; echo ran >> log.txt", "at-most-once"),
    ],
)
def test_a_bash_read_is_read_only_only_when_the_policy_trusts_it(
    rt: Runtime, ws: Workspace, policy: dict[str, Any], line: str, guarantee: str
) -> None:
    evidence = {"defaultEvidence": {"bash": [{"type": "exit_code", "value": 0}]}}
    with_policy(rt, {"mutations": "allow", **evidence, **policy})
    ref, _ = call(rt, ws, "bash", {"command": line})
    held = rt.ledger.decision(ref.operation_id)
    assert held is not None and held["decision"]["executionGuarantee"] == guarantee


@pytest.mark.parametrize(
    ("trusted", "line", "status"),
    [
        (["ls", "wc"], "ls -la | wc -l; pwd >/dev/null", "parked"),  # pwd is not trusted
        (["ls", "wc", "pwd"], "ls -la | wc -l; pwd >/dev/null", "completed"),
        (["ls", "cat"], "ls a#b; echo ran >> log.txt", "parked"),
        ([], "ls -la", "parked"),
    ],
)
def test_recovery_reruns_a_bash_line_only_when_it_is_a_trusted_read(
    rt: Runtime, ws: Workspace, trusted: list[str], line: str, status: str
) -> None:
    with_policy(rt, {"mutations": "allow", "trustedReadCommands": trusted})
    ref = one_call(rt, ws, "bash", {"command": line})
    prepare_only(rt, ws, ref, {"command": line})  # T1, no decision recorded: derived at recovery
    result = run(recovery.recover_operation(rt, recover_input(ws, ref), ATTEMPT))
    assert result.status == status
    assert result.reason == ("replay_safe_reread" if status == "completed" else "dispatch_without_response")
    assert not (ws.root / "log.txt").exists()  # the T1 "crash" came before the effect; none since


# --- approval as a durable wait --------------------------------------------------------------------

CONFIRM = {"mutations": "confirm", "approvalTtlMs": 60_000}


async def _until_pending(rt: Runtime) -> dict[str, Any]:
    for _ in range(200):
        pending = await asyncio.to_thread(approvals.pending, rt.ledger, "s1")
        if pending:
            return pending[0]  # type: ignore[no-any-return]
        await asyncio.sleep(0.05)
    raise AssertionError("no pending approval")


def _approve_while_waiting(rt: Runtime, ws: Workspace, ref: CallRef, answer: Any) -> Any:
    async def main() -> Any:
        task = asyncio.create_task(tool_call.execute_tool(rt, tool_input(ws, ref), ATTEMPT))
        pending = await _until_pending(rt)
        assert not task.done()
        await asyncio.to_thread(answer, pending)
        return await asyncio.wait_for(task, 10)

    return run(main())


def test_confirm_waits_for_the_exact_phrase_then_runs_once(rt: Runtime, ws: Workspace) -> None:
    with_policy(rt, CONFIRM)
    ref = one_call(rt, ws, "write_file", {"path": "a.txt", "content": "x"})
    refusals: list[str] = []

    def answer(pending: dict[str, Any]) -> None:
        assert pending["phrase"] == "APPROVE " + pending["actionDigest"][:12]
        assert pending["operationId"] == ref.operation_id and pending["toolName"] == "write_file"
        for approval_id, phrase in (
            ("nope", pending["phrase"]),
            (pending["approvalId"], "APPROVE 000000000000"),
        ):
            with pytest.raises(ApprovalRefused) as info:
                approvals.answer(rt.ledger, "s1", approval_id, allow=True, phrase=phrase)
            refusals.append(info.value.code)
        assert not (ws.root / "a.txt").exists()
        approvals.answer(
            rt.ledger, "s1", pending["approvalId"], allow=True, phrase=pending["phrase"], by="alice"
        )
        with pytest.raises(ApprovalRefused) as again:
            approvals.answer(rt.ledger, "s1", pending["approvalId"], allow=True, phrase=pending["phrase"])
        refusals.append(again.value.code)

    outcome = _approve_while_waiting(rt, ws, ref, answer)
    assert refusals == ["approval_id_mismatch", "approval_phrase_mismatch", "approval_not_pending"]
    assert outcome.status == "completed" and (ws.root / "a.txt").read_text() == "x"
    (receipt,) = receipts(rt)
    assert receipt["policyDecision"]["outcome"] == "confirm" and receipt["policyDecision"]["approvalId"]
    kinds = [
        sorted(e.actions.to_wire()) for e in rt.ledger.events(run_id="r1") if e.actions and e.role == "system"
    ]
    assert kinds == [["permissionRequest"], ["permissionDecision"], ["toolDispatch"]]  # answered before T1


def test_deny_is_policy_blocked_approval_denied(rt: Runtime, ws: Workspace) -> None:
    with_policy(rt, CONFIRM)
    ref = one_call(rt, ws, "write_file", {"path": "a.txt", "content": "x"})

    def answer(pending: dict[str, Any]) -> None:
        approvals.answer(rt.ledger, "s1", pending["approvalId"], allow=False, by="bob", reason="no")

    outcome = _approve_while_waiting(rt, ws, ref, answer)
    assert outcome.status == "refused" and not (ws.root / "a.txt").exists()
    result = result_of(rt, outcome.response_event_id)
    assert (result["code"], result["reason"]) == ("policy_blocked", "approval_denied")


def test_an_unanswered_request_closes_at_expiry(rt: Runtime, ws: Workspace) -> None:
    with_policy(rt, {"mutations": "confirm", "approvalTtlMs": 1000})
    ref = one_call(rt, ws, "write_file", {"path": "a.txt", "content": "x"})
    outcome = run(tool_call.execute_tool(rt, tool_input(ws, ref), ATTEMPT))
    result = result_of(rt, outcome.response_event_id)
    assert (result["code"], result["reason"]) == ("policy_blocked", "approval_expired")
    closing = [
        e for e in rt.ledger.events(run_id="r1") if e.actions and e.actions.permission_closure_accepted
    ]
    assert len(closing) == 1 and not (ws.root / "a.txt").exists()
    held = rt.ledger.decision(ref.operation_id)
    assert held is not None and held["state"] == "expired"


def test_approval_checks_expiry_and_the_action_digest(rt: Runtime, ws: Workspace) -> None:
    with_policy(rt, CONFIRM)
    ref = one_call(rt, ws, "write_file", {"path": "a.txt", "content": "x"})

    async def main() -> dict[str, Any]:
        task = asyncio.create_task(tool_call.execute_tool(rt, tool_input(ws, ref), ATTEMPT))
        pending = await _until_pending(rt)
        task.cancel()
        return pending

    pending = run(main())
    later = datetime.now(UTC) + timedelta(minutes=2)
    with pytest.raises(ApprovalRefused) as expired:
        approvals.answer(
            rt.ledger, "s1", pending["approvalId"], allow=True, phrase=pending["phrase"], now=later
        )
    # The challenge names another action than the committed call: the digest recomputed from the
    # ledger's call cannot match it.
    held = rt.ledger.decision(ref.operation_id)
    assert held is not None
    record = held["decision"]
    record["challenge"]["actionDigest"] = "f" * 64
    with rt.ledger.engine.begin() as conn:  # type: ignore[attr-defined]
        conn.execute(
            update(tool_decisions)
            .where(tool_decisions.c.operation_id == ref.operation_id)
            .values(decision_json=canonical_json.dumps(record))
        )
    with pytest.raises(ApprovalRefused) as mismatch:
        approvals.answer(rt.ledger, "s1", pending["approvalId"], allow=True, phrase=pending["phrase"])
    assert (expired.value.code, mismatch.value.code) == (
        "approval_expired",
        "approval_action_digest_mismatch",
    )


def test_a_new_attempt_resumes_the_same_request_and_the_tool_runs_once(
    rt: Runtime, ws: Workspace, store: LedgerStore
) -> None:
    """The first attempt dies while waiting (its task is cancelled, as a killed worker's is); a
    fresh runtime picks the call up, finds the same request, and runs the tool once approved."""
    with_policy(rt, {**CONFIRM, "defaultEvidence": {"bash": [{"type": "exit_code", "value": 0}]}})
    ref = one_call(rt, ws, "bash", {"command": "echo ran >> log.txt"})

    async def first() -> dict[str, Any]:
        task = asyncio.create_task(tool_call.execute_tool(rt, tool_input(ws, ref), ATTEMPT))
        pending = await _until_pending(rt)
        task.cancel()
        return pending

    pending = run(first())
    fresh = Runtime(store)
    try:
        approvals.answer(store, "s1", pending["approvalId"], allow=True, phrase=pending["phrase"])
        outcome = run(tool_call.execute_tool(fresh, tool_input(ws, ref), ATTEMPT))
        again = run(tool_call.execute_tool(fresh, tool_input(ws, ref), ATTEMPT))
    finally:
        fresh.close()
    assert outcome.status == "completed" and again.replayed
    assert (ws.root / "log.txt").read_text() == "ran\n"
    assert len([e for e in store.events(run_id="r1") if e.actions and e.actions.permission_request]) == 1


def test_policy_per_session_is_recorded_once(rt: Runtime) -> None:
    gov = with_policy(rt, {"mutations": "deny"})
    assert with_policy(rt, {"mutations": "deny"}).policy.digest == gov.policy.digest
    with pytest.raises(Exception) as info:
        with_policy(rt, {"mutations": "allow"})
    assert getattr(info.value, "code", None) == "session_policy_conflict"
    assert isinstance(gov.policy, GovernancePolicy)


@pytest.mark.parametrize(
    ("found", "status"), [("x", "verified_success"), (None, "verified_success"), ("y", "recovery_required")]
)
def test_an_operation_settled_by_recovery_gets_its_receipt_in_the_bundle(
    rt: Runtime, ws: Workspace, found: str | None, status: str
) -> None:
    ref = one_call(rt, ws, "write_file", {"path": "a.txt", "content": "x"})
    # T1 with its decision, then a crash
    admitted = tool_admission.admit_call(rt, tool_input(ws, ref), ATTEMPT)
    assert isinstance(admitted, tool_admission.Dispatched) and admitted.decision is not None
    if found is not None:  # "x": the effect ran; "y": an outside write; None: still absent
        (ws.root / "a.txt").write_text(found)
    result = run(recovery.recover_operation(rt, recover_input(ws, ref), ATTEMPT))
    assert result.status == ("parked" if found == "y" else "completed")
    (receipt,) = receipts(rt)
    effect = receipt["observedEffect"]
    assert effect["status"] == status and receipt["success"] is (status == "verified_success")
    if found is None:  # still in its before-state: redone once by recovery (tools.redo), and it says so
        assert effect["attempts"] == [1, 2] and effect["redo"]["outcome"] == "created"
    else:
        assert effect == {"status": status}


def test_a_waiting_call_resumes_its_one_request(rt: Runtime, ws: Workspace) -> None:
    with_policy(rt, CONFIRM)
    ref = one_call(rt, ws, "write_file", {"path": "a.txt", "content": "x"})
    admitted = tool_admission.admit_call(rt, tool_input(ws, ref), ATTEMPT)
    assert isinstance(admitted, tool_admission.AwaitingApproval)
    # the same request, resumed
    assert tool_admission.admit_call(rt, tool_input(ws, ref), ATTEMPT) == admitted
    (request,) = [e for e in rt.ledger.events(run_id="r1") if e.actions and e.actions.permission_request]
    assert request.actions is not None and request.actions.permission_request is not None
    assert request.actions.permission_request["requestId"] == admitted.approval_id


def test_max_operations_bounds_a_grant(rt: Runtime, ws: Workspace) -> None:
    grant = {"id": "once", "capability": "file.write", "effects": ["mutate"], "maxOperations": 1}
    with_policy(rt, {"mutations": "allow", "capabilities": [grant]})
    _, first = call(rt, ws, "write_file", {"path": "a.txt", "content": "x"})
    spec = script(
        *[{"toolCalls": [{"name": "write_file", "args": {"path": p, "content": "y"}}]} for p in "ab"]
    )
    (ref,) = step(rt, ws, 1, spec).calls
    outcome = run(tool_call.execute_tool(rt, tool_input(ws, ref), ATTEMPT))
    second = result_of(rt, outcome.response_event_id)
    assert "code" not in first and second["reason"] == "capability_exhausted:once"
    assert not (ws.root / "b").exists()
