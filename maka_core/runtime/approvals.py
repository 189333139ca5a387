"""Policy before T1, and approval as a durable wait.

``admit`` decides a call (``governed.judge``) or resumes the decision the ledger already holds for
it. A ``confirm`` commits MELRA's challenge as a Maka ``permissionRequest`` fact (so the
continuation planner's ``pending_permission`` gate sees it) with the decision row awaiting its
answer. ``answer`` validates an answer in MELRA's order (id, phrase, expiry, the action digest
recomputed from the committed call) and commits a ``permissionDecision`` with the decision row's
one compare-and-swap move; an unanswered request is closed at ``expiresAt``
(``permissionClosureAccepted``), or, when its run ends first (fails, is repaired or cancelled), in
the transaction of the run's terminal fact (``settle_run`` -> ``commit_terminal``), so no request
outlives its run.

Who waits. The decision is a ledger fact first, always; what waits for it is the session
workflow (since the ``approval-wait-in-workflow`` patch): the tool activity returns
``awaiting_approval`` with the request (``Waiting.contract``), the workflow waits on a condition
and a timer at ``expiresAt``, the ``approve``/``deny`` Updates run ``answer`` in a ledger-only
activity (``maka.answer_approval``) and wake it, and the timer closes the request
(``maka.close_approval``, ``close``); the call is then dispatched again and ``_resume`` acts on the
answer. No thread is held, so a TTL of 24 h is honoured whatever the tool timeouts, and a worker
that dies during the wait costs nothing. An execution recorded before the patch waits inside the
activity as it always did (``tool_call._await_answer``, polling every ``POLL_S``), its wait carried
by the next dispatch of the call past a tool timeout (the workflow allows three).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from maka_core.errors import LedgerRejection, MakaError
from maka_core.facts.bounds import check_fields
from maka_core.facts.clock import now_ms
from maka_core.facts.events import Actions, RuntimeEvent
from maka_core.governance import action_digest, check_answer, issue_challenge
from maka_core.governance.challenge import ApprovalChallenge
from maka_core.governance.evidence import TaskStatus
from maka_core.runtime import governed
from maka_core.runtime.contracts import AnswerInput, AnswerResult, ApprovalWait, CallRef, RunIds
from maka_core.store.governance_rows import permission_closure_event
from maka_core.tools import Tool, ToolResult
from maka_core.tools.base import permission_reason

if TYPE_CHECKING:
    from maka_core.runtime.runtime import Runtime
    from maka_core.store.ledger import Ledger

POLL_S = 0.25


class ApprovalRefused(MakaError):
    """An approve/deny the ledger cannot take (a stable ``approval_*`` code)."""

    default_code = "approval_refused"


@dataclass(frozen=True)
class Refused:
    result: ToolResult
    record: dict[str, Any]
    #: False when the ledger already holds the call's decision (an answered request).
    fresh: bool = True
    #: The receipt's status: a MELRA task whose budget is spent ends ``budget_exhausted``.
    status: TaskStatus = "policy_blocked"


@dataclass(frozen=True)
class Waiting:
    approval_id: str
    expires_at: datetime
    #: What the workflow waits on (and its Update validators check).
    contract: ApprovalWait


@dataclass(frozen=True)
class Allowed:
    record: dict[str, Any]
    #: False when the ledger already holds this decision (an approved request): T1 records none.
    fresh: bool = True


def operation_of(tool_name: str, args: Any) -> dict[str, Any]:
    """What a challenge approves: the tool and its committed arguments (MELRA's ``operation``)."""
    return {"tool": tool_name, "args": args}


def _event(ids: RunIds, event_id: str, actions: Actions) -> RuntimeEvent:
    return RuntimeEvent(
        id=event_id,
        invocation_id=ids.invocation_id,
        run_id=ids.run_id,
        session_id=ids.session_id,
        turn_id=ids.turn_id,
        ts=now_ms(),
        partial=False,
        role="system",
        author="system",
        actions=actions,
    )


def admit(
    rt: Runtime, gov: governed.SessionGovernance, ids: RunIds, call: CallRef, tool: Tool, args: dict[str, Any]
) -> Allowed | Refused | Waiting:
    """The call's decision: a new one, or the answer to the request the ledger holds for it."""
    now = datetime.now(UTC)
    policy = gov.policy
    # Only a confirming policy ever leaves a request behind, and only a grant with maxOperations
    # needs the session's usage: every other call skips both reads.
    held = rt.ledger.decision(call.operation_id) if policy.mutations == "confirm" else None
    if held is not None and held["state"] != "decided":
        return _resume(rt, gov, held, tool, args, now)
    counted = any(g.max_operations is not None for g in policy.capabilities)
    decision = governed.judge(
        gov,
        tool,
        args,
        worker_forbidden=rt.policy.forbidden_effects,
        grant_usage=rt.ledger.grant_usage(ids.session_id) if counted else {},
        now=now,
    )
    record = governed.decision_record(
        decision,
        tool,
        policy.trusted_reads,
        network=governed.network_for(policy, tool),
        tool_guarantees=policy.tool_guarantees,
    )
    subject = governed.subject_of(tool)
    if subject is not None and subject.exhausted:
        # The task controller's stop, recorded like a decision so it is counted and receipted.
        spent = {**record, "outcome": "deny", "reason": "task_budget_exhausted", "step": "task_budget"}
        result = ToolResult.error(
            "task_budget_exhausted",
            f"task {subject.task_id} has spent its budget (maxSteps, maxDurationMs or maxRetries)",
            status="budget_exhausted",
            taskId=subject.task_id,
        )
        return Refused(result, spent, status="budget_exhausted")
    if decision.outcome == "deny":
        return Refused(governed.blocked_result(record), record)
    if decision.outcome == "allow":
        return Allowed(record)
    if subject is not None and subject.approval is not None:
        # melra_execute's ``approval`` argument answers the task's own challenge, checked in
        # MELRA's order against the digest of the planned operation as it is about to run.
        approval_id, phrase = subject.approval
        digest = action_digest(subject.task_id, subject.operation)
        refusal = check_answer(subject.challenge, approval_id, phrase, now, digest)
        if refusal is not None:
            return Refused(
                governed.blocked_result(record, refusal), {**record, "outcome": "deny", "reason": refusal}
            )
        return Allowed({**record, "presentedApprovalId": approval_id})
    challenge = issue_challenge(
        call.operation_id, operation_of(call.tool_name, args), now=now, ttl_ms=gov.policy.approval_ttl_ms
    )
    record = {
        **record,
        "challenge": challenge.model_dump(mode="json", by_alias=True),
        "toolName": call.tool_name,
        "runIds": ids.model_dump(),
    }
    request = _event(
        ids,
        f"{call.operation_id}_permission",
        Actions(
            permission_request={
                "kind": "tool_permission",
                "requestId": challenge.approval_id,
                "toolUseId": call.tool_call_id,
                "toolName": call.tool_name,
                "category": decision.classification.capability,
                "reason": permission_reason(tool),
                "args": args,
                "rememberForTurnAllowed": False,
                "hint": f"{challenge.phrase} (expires {challenge.expires_at})",
            }
        ),
    )
    rt.ledger.commit_permission_request(request, operation_id=call.operation_id, decision=record)
    return _waiting(challenge, call.operation_id, challenge.action_digest)


def _waiting(challenge: ApprovalChallenge, operation_id: str, committed_digest: str) -> Waiting:
    """``committed_digest``: the action digest recomputed from the committed call, so the
    ``approve`` validator refuses ``approval_action_digest_mismatch`` without reading the ledger."""
    contract = ApprovalWait(
        approval_id=challenge.approval_id,
        operation_id=operation_id,
        phrase=challenge.phrase,
        expires_at_ms=int(challenge.expires.timestamp() * 1000),
        digest_matches=committed_digest == challenge.action_digest,
    )
    return Waiting(challenge.approval_id, challenge.expires, contract)


def _resume(
    rt: Runtime,
    gov: governed.SessionGovernance,
    held: dict[str, Any],
    tool: Tool,
    args: dict[str, Any],
    now: datetime,
) -> Allowed | Refused | Waiting:
    record: dict[str, Any] = held["decision"]
    challenge = ApprovalChallenge.model_validate(record["challenge"])
    state = held["state"]
    if state == "awaiting_approval":
        digest = action_digest(held["operationId"], operation_of(str(record["toolName"]), args))
        return _waiting(challenge, str(held["operationId"]), digest)
    if state == "expired" and any(e.is_terminal for e in rt.ledger.events(run_id=held["runId"])):
        # Closed because its run ended (a waiter that outlived a cancelled run): nobody reads this
        # call's result any more, and nothing may follow the run's terminal fact.
        raise LedgerRejection(
            "run_already_terminal",
            f"the run of operation {held['operationId']} has ended; its request was closed",
            runId=held["runId"],
            operationId=held["operationId"],
        )
    if state in ("denied", "expired"):
        reason = "approval_denied" if state == "denied" else "approval_expired"
        return Refused(
            governed.blocked_result(record, reason),
            {**record, "outcome": "deny", "reason": reason},
            fresh=False,
        )
    # Approved: policy again (MELRA's execute re-runs it), and the approval must fit this action.
    again = governed.judge(
        gov,
        tool,
        args,
        worker_forbidden=rt.policy.forbidden_effects,
        grant_usage={},
        now=now,
    )
    if again.outcome == "deny":
        redecided = governed.decision_record(
            again,
            tool,
            gov.policy.trusted_reads,
            network=governed.network_for(gov.policy, tool),
            tool_guarantees=gov.policy.tool_guarantees,
        )
        return Refused(governed.blocked_result(redecided), redecided, fresh=False)
    if (
        action_digest(held["operationId"], operation_of(str(record["toolName"]), args))
        != challenge.action_digest
    ):
        reason = "approval_action_digest_mismatch"
        return Refused(
            governed.blocked_result(record, reason),
            {**record, "outcome": "deny", "reason": reason},
            fresh=False,
        )
    return Allowed(record, fresh=False)


def close_expired(ledger: Ledger, held: dict[str, Any]) -> None:
    """Close an unanswered request at its expiry (the waiting call does this itself)."""
    approval_id = str(held["approvalId"])
    event = permission_closure_event(held["decision"]["runIds"], held["operationId"], approval_id, now_ms())
    ledger.commit_approval_answer(event, approval_id, "expired")


def close(ledger: Any, session_id: str, approval_id: str) -> None:
    """``maka.close_approval``: the workflow's timer reached ``expiresAt``; close the request if
    nobody answered it (a no-op for an answered or closed one, so a retry is exact)."""
    held = ledger.decision_by_approval(approval_id)
    if held is None or held["sessionId"] != session_id or held["state"] != "awaiting_approval":
        return
    try:
        close_expired(ledger, held)
    except LedgerRejection as exc:
        if exc.code != "approval_not_pending":
            raise


def answer_from(ledger: Any, inp: AnswerInput) -> AnswerResult:
    """``maka.answer_approval``: ``answer``, exact under retry: an attempt that committed and died
    before it reported leaves the same decision, which its retry reports instead of refusing."""
    try:
        done = answer(
            ledger,
            inp.session_id,
            inp.approval_id,
            allow=inp.allow,
            phrase=inp.phrase,
            by=inp.by,
            reason=inp.reason,
        )
    except ApprovalRefused as exc:
        held = ledger.decision_by_approval(inp.approval_id)
        if exc.code != "approval_not_pending" or held is None:
            raise
        if held["state"] != ("approved" if inp.allow else "denied"):
            raise
        return AnswerResult(
            approval_id=inp.approval_id,
            operation_id=str(held["operationId"]),
            decision="allow" if inp.allow else "deny",
            tool_name=held["decision"].get("toolName"),
        )
    return AnswerResult(
        approval_id=inp.approval_id,
        operation_id=str(done["operationId"]),
        decision=done["decision"],
        tool_name=done["toolName"],
    )


def pending(ledger: Any, session_id: str) -> list[dict[str, Any]]:
    """``pendingApprovals`` as ``maka session status --json`` lists them (with their ``runId``)."""
    out = []
    for held in ledger.pending_approvals(session_id):
        challenge = held["decision"]["challenge"]
        out.append(
            {
                "approvalId": challenge["approvalId"],
                "operationId": held["operationId"],
                "toolName": held["decision"].get("toolName"),
                "phrase": challenge["phrase"],
                "actionDigest": challenge["actionDigest"],
                "expiresAt": challenge["expiresAt"],
                "runId": held["runId"],
            }
        )
    return out


def _committed_args(ledger: Any, held: dict[str, Any]) -> Any:
    for event in ledger.events(run_id=held["runId"]):
        content = event.content
        if (
            content is not None
            and content.kind == "function_call"
            and event.refs is not None
            and event.refs.operation_id == held["operationId"]
        ):
            return content.args
    raise ApprovalRefused("approval_action_digest_mismatch", "the approved call is not in the ledger")


def answer(
    ledger: Any,
    session_id: str,
    approval_id: str,
    *,
    allow: bool,
    phrase: str | None = None,
    by: str | None = None,
    reason: str | None = None,
    now: datetime | None = None,
) -> dict[str, Any]:
    """Validate and commit an approval (``allow``) or a denial; returns what was committed.

    Raises:
        InputInvalid: ``input_invalid``, an id, phrase, ``by`` or ``reason`` out of its bound (the
            Update's: ``maka_core.facts.bounds``), before anything is read.
        ApprovalRefused: ``approval_id_mismatch`` (no pending request of this session has the id),
            ``approval_phrase_mismatch``, ``approval_expired``, ``approval_action_digest_mismatch``
            (approve only), ``approval_expired`` also for a request closed unanswered (at its
            expiry or when its run ended), or ``approval_not_pending`` (answered meanwhile).
    """
    check_fields(
        AnswerInput(
            session_id=session_id, approval_id=approval_id, allow=allow, phrase=phrase, by=by, reason=reason
        )
    )
    when = now or datetime.now(UTC)
    held = ledger.decision_by_approval(approval_id)
    if held is None or held["sessionId"] != session_id:
        raise ApprovalRefused("approval_id_mismatch", f"session {session_id} has no approval {approval_id}")
    record = held["decision"]
    challenge = ApprovalChallenge.model_validate(record["challenge"])
    if held["state"] == "expired":
        # Closed unanswered: at its expiry, or when its run ended first (a run that settles closes
        # its waiting requests). Either way nothing waits for an answer any more.
        why = f"expired at {challenge.expires_at}"
        if challenge.expires > when:
            why = "was closed: its run ended"
        raise ApprovalRefused("approval_expired", f"approval {approval_id} {why}", approvalId=approval_id)
    if held["state"] != "awaiting_approval":
        raise ApprovalRefused("approval_not_pending", f"approval {approval_id} is already {held['state']}")
    if allow:
        digest = action_digest(
            held["operationId"], operation_of(str(record["toolName"]), _committed_args(ledger, held))
        )
        refusal = check_answer(challenge, approval_id, phrase, when, digest)
        if refusal is not None:
            raise ApprovalRefused(refusal, f"{refusal} for approval {approval_id}", approvalId=approval_id)
    elif challenge.expires <= when:
        raise ApprovalRefused("approval_expired", f"approval {approval_id} expired at {challenge.expires_at}")
    ids = RunIds.model_validate(record["runIds"])
    body = {
        "requestId": approval_id,
        "decision": "allow" if allow else "deny",
        "toolName": str(record["toolName"]),
        **({"reviewer": by} if by else {}),
        **({"rationale": reason} if reason else {}),
    }
    event = _event(ids, f"{held['operationId']}_permission_decision", Actions(permission_decision=body))
    try:
        ledger.commit_approval_answer(event, approval_id, "approved" if allow else "denied")
    except MakaError as exc:
        if exc.code == "approval_not_pending":
            raise ApprovalRefused("approval_not_pending", exc.message) from None
        raise
    return {
        "ok": True,
        "sessionId": session_id,
        "approvalId": approval_id,
        "operationId": held["operationId"],
        **body,
    }
