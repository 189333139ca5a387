"""A tool call's admission, on the ledger thread: guard, preflight, policy, evidence, then T1.

The guard comes first and is absolute: an operation the ledger already settled returns its
committed outcome; an operation with a dispatch fact and no outcome is never run again from here
(``DispatchWithoutOutcome``: only recovery may settle it). Only a call the Resolver proves
``definitely_not_dispatched`` reaches preflight. Arguments are read from the committed call.
Policy is MELRA's decision (``runtime.governed``, ``runtime.approvals``): a denial commits an
ordinary ``policy_blocked`` result with its decision and receipt (``commit_refusal``);
``confirm`` commits a permission request and the call waits for its answer (``AwaitingApproval``);
an allowed call records its decision with T1 and is ``Dispatched``.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from maka_core.errors import MakaError
from maka_core.facts.clock import now_ms
from maka_core.governance.evidence import TaskStatus
from maka_core.ledger.lanes import args_hash_or_none
from maka_core.runtime import approvals, builders, governed, melra
from maka_core.runtime.call_state import (
    CallNotFound,
    DispatchWithoutOutcome,
    call_state,
    committed_args,
    settled_outcome,
)
from maka_core.runtime.cancellation import Abandoned
from maka_core.runtime.contracts import ApprovalWait, CallRef, RunIds, ToolInput, ToolOutcome
from maka_core.runtime.runtime import Attempt, Runtime
from maka_core.tools import Tool, ToolRefusal, ToolResult, bound_call, contract
from maka_core.tools.base import FileEvidence, GuardedWrite
from maka_core.workspace import Workspace


@dataclass(frozen=True)
class Dispatched:
    """A call past T1: what the effect needs, and the dispatch fact it runs under."""

    ids: RunIds
    tool: Tool
    args: dict[str, Any]
    ws: Workspace
    dispatch_event_id: str
    #: The recorded policy decision (None only for an operation dispatched before governance).
    decision: dict[str, Any] | None = None
    gov: governed.SessionGovernance | None = None
    started_ms: int = 0
    #: Which run of the effect this is, for a guarantee that may run it again (its receipt lists
    #: the runs); None for every other call.
    run_number: int | None = None


@dataclass(frozen=True)
class AwaitingApproval:
    """A ``confirm`` decision whose permission request is committed and not yet answered."""

    operation_id: str
    approval_id: str
    expires_at: datetime
    wait: ApprovalWait | None = None


#: A call that did not run here: settled or refused (its outcome), waiting for an approval, or
#: abandoned by a cancelled attempt.
NotRun = ToolOutcome | AwaitingApproval | Abandoned


def admit_call(
    rt: Runtime, inp: ToolInput, attempt: Attempt, loop: asyncio.AbstractEventLoop | None = None
) -> Dispatched | NotRun:
    """On the ledger thread: guard, preflight, policy, evidence and T1 (or a committed refusal)."""
    call = inp.call
    view = rt.ledger.view(inp.session_id)
    state = call_state(view, inp.session_id, inp.run_id, call.tool_call_id)
    if state is None:
        raise CallNotFound(message=f"no committed call {call.tool_call_id}", toolCallId=call.tool_call_id)
    op, ids = state.op, state.ids
    if op.status == "completed":
        return settled_outcome(op, call.operation_id, replayed=True)
    if not rt.guard.may_dispatch(op):
        raise DispatchWithoutOutcome(
            message=f"operation {call.operation_id} is {op.status} ({op.reason}); refusing to run it again",
            operationId=call.operation_id,
            status=op.status,
            reason=op.reason,
        )
    args = committed_args(state.facts)
    if not isinstance(args, dict):
        # The wire allows any JSON value as args; every tool here takes an object.
        invalid = ToolResult.error("invalid_arguments", "tool arguments must be a JSON object")
        return commit_refusal(rt, ids, call, invalid)
    tool = rt.tools.get(call.tool_name)
    if tool is None:
        return commit_refusal(
            rt, ids, call, ToolResult.error("tool_not_found", f"no tool named {call.tool_name!r}")
        )
    # ToolSetUnavailable (this worker lacks a tool the set names) is one worker's view, not the
    # call's outcome: it propagates, non-retryable, and the turn parks with nothing committed.
    offered = rt.offered(ids.session_id, inp.tool_set)
    if offered is not None and call.tool_name not in offered:
        # The model named a tool its request never held: refused like an unknown one, before T1.
        message = f"tool {call.tool_name!r} is not offered in this session"
        return commit_refusal(rt, ids, call, ToolResult.error("tool_not_offered", message))
    tool = melra.bind(rt, tool, ids.session_id, call.operation_id, offered)
    tool = bound_call.for_call(tool, bound_call.CallContext(ids.session_id, call.operation_id, loop=loop))
    try:
        ws = rt.workspace(inp.workspace)
    except MakaError as exc:
        return commit_refusal(rt, ids, call, ToolResult.error(exc.code, exc.message))
    if ws.identity != inp.workspace_identity:
        message = (
            f"the workspace at {inp.workspace} is {ws.identity}, not the session's {inp.workspace_identity}"
        )
        return commit_refusal(rt, ids, call, ToolResult.error("workspace_identity_mismatch", message))
    refusal = tool.preflight(args, ws)
    if refusal is None:
        limits = rt.policy.evaluate(tool, args)  # the worker's own switches come first
        refusal = None if limits.allowed else limits.to_result()
    if refusal is not None:
        return commit_refusal(rt, ids, call, refusal)
    gov = rt.session_governance(ids.session_id)
    admitted = approvals.admit(rt, gov, ids, call, tool, args)
    if isinstance(admitted, approvals.Refused):
        return commit_refusal(
            rt,
            ids,
            call,
            admitted.result,
            decision=admitted.record,
            gov=gov,
            args=args,
            fresh=admitted.fresh,
            status=admitted.status,
        )
    if isinstance(admitted, approvals.Waiting):
        return AwaitingApproval(
            call.operation_id, admitted.approval_id, admitted.expires_at, admitted.contract
        )
    record = admitted.record
    started = now_ms()
    try:
        tool = governed.bound_network(tool, record)  # the sandbox is built per call, from its decision
        evidence = tool.capture_evidence(args, ws)
        if isinstance(evidence, FileEvidence) and isinstance(tool, GuardedWrite):
            tool = tool.with_evidence(evidence)  # its write is conditional on this before-state
            # ... and on its call not taken over by recovery since (a worker frozen before it wrote)
            op_id = call.operation_id
            tool = tool.with_fence(lambda: not rt.from_tool_thread(lambda: rt.ledger.fenced(op_id)))
    except ToolRefusal as exc:  # the target changed after preflight, or a network grant this worker lacks
        return commit_refusal(rt, ids, call, exc.to_result())
    if op.dispatch_event_id is not None:
        # Only a broken guard admits a call that already has its dispatch fact (a second T1 would be
        # refused as a conflicting dispatch): it runs the effect again under the first one.
        return Dispatched(ids, tool, args, ws, op.dispatch_event_id, record, gov, started)
    committed = state.facts.call
    assert committed is not None and committed.content is not None
    args_hash = (
        view.scanner.call_args_hash(committed)
        if committed.content.kind == "function_call" and committed.content.name == call.tool_name
        else args_hash_or_none(call.tool_name, args)
    )
    assert args_hash is not None  # the call was admitted by the ledger, so its args are strict JSON
    dispatch = builders.dispatch_event(
        ids, call.operation_id, call.tool_call_id, call.tool_name, tool.recovery_mode, args_hash, now_ms()
    )
    rt.ledger.commit_tool_prepared(
        dispatch,
        evidence=None if evidence is None else evidence.to_json(),
        attempt=attempt.record,
        decision=record if admitted.fresh else None,
    )
    keyed = record.get("executionGuarantee") in contract.KEYED_GUARANTEES
    return Dispatched(ids, tool, args, ws, dispatch.id, record, gov, started, 1 if keyed else None)


def commit_refusal(
    rt: Runtime,
    ids: RunIds,
    call: CallRef,
    refusal: ToolResult,
    *,
    decision: dict[str, Any] | None = None,
    gov: governed.SessionGovernance | None = None,
    args: dict[str, Any] | None = None,
    fresh: bool = True,
    status: TaskStatus = "policy_blocked",
) -> ToolOutcome:
    """A pre-T1 refusal is an ordinary committed error result: the tool never ran. A policy
    refusal commits its decision and receipt in the same transaction."""
    response = builders.response_event(
        ids,
        f"{call.operation_id}_refused",
        call.tool_call_id,
        call.tool_name,
        refusal.result,
        True,
        now_ms(),
        None,  # pre-T1: unbound; no operation was dispatched
    )
    if decision is None or gov is None:
        rt.ledger.append([response])
    else:
        ts = now_ms()
        sealed = governed.receipt(
            operation_id=call.operation_id,
            gov=gov,
            record=decision,
            args=args or {},
            started_ms=ts,
            ended_ms=ts,
            status=status,
            error=refusal.error_code,
        )
        rt.ledger.commit_refusal(
            response, operation_id=call.operation_id, decision=decision if fresh else None, receipt=sealed
        )
    return ToolOutcome(
        operation_id=call.operation_id, status="refused", is_error=True, response_event_id=response.id
    )


__all__ = ["AwaitingApproval", "Dispatched", "NotRun", "admit_call", "commit_refusal"]
