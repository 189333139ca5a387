"""T1: a call's admission committed, on the ledger thread, in the same hop that computed it.

The admission (``runtime.admission``: guard, arguments, offer, preflight, policy decision and
approval, network, evidence, guarantee) is one value, computed once; ``commit`` writes it: an
``Admission`` as the dispatch fact with its decision (when new) and its evidence, and the call is
``Dispatched`` to its effect (``runtime.tool_effect``); a ``Refusal`` as an ordinary error result,
with its decision and receipt when policy refused (``commit_refusal``). A call the ledger settled
before returns its committed outcome, and a ``confirm`` is ``AwaitingApproval`` (its permission
request committed by the policy step): neither commits anything here.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from maka_core.facts.clock import now_ms
from maka_core.governance.evidence import TaskStatus
from maka_core.runtime import builders, governed, verification
from maka_core.runtime.admission.pipeline import Verdict, admit
from maka_core.runtime.admission.verdicts import Admission, AwaitingApproval, Refusal
from maka_core.runtime.call_state import DispatchWithoutOutcome
from maka_core.runtime.cancellation import Abandoned
from maka_core.runtime.contracts import CallRef, RunIds, ToolInput, ToolOutcome
from maka_core.runtime.runtime import Attempt, Runtime
from maka_core.tools import Tool, ToolResult
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


#: A call that did not run here: settled or refused (its outcome), waiting for an approval, or
#: abandoned by a cancelled attempt.
NotRun = ToolOutcome | AwaitingApproval | Abandoned


def admit_call(
    rt: Runtime, inp: ToolInput, attempt: Attempt, loop: asyncio.AbstractEventLoop | None = None
) -> Dispatched | NotRun:
    """On the ledger thread, in one hop: the call's admission (``admission.admit``), then T1."""
    return commit(rt, admit(rt, inp, loop), attempt)


def commit(rt: Runtime, verdict: Verdict, attempt: Attempt) -> Dispatched | NotRun:
    """T1: an ``Admission`` commits its dispatch fact (with its decision and evidence) and is
    ``Dispatched``; a ``Refusal`` commits its error result; anything else commits nothing here."""
    if isinstance(verdict, Refusal):
        return commit_refusal(
            rt,
            verdict.ids,
            verdict.call,
            verdict.result,
            decision=verdict.decision,
            gov=verdict.gov,
            args=verdict.args,
            fresh=verdict.fresh,
            status=verdict.status,
        )
    if not isinstance(verdict, Admission):
        return verdict  # settled before, or waiting for an approval
    adm = verdict
    if adm.dispatch_event_id is not None:
        # Only a broken guard admits a call that already has its dispatch fact (a second T1 would be
        # refused as a conflicting dispatch): it runs the effect again under the first one.
        return Dispatched(
            adm.ids, adm.tool, adm.args, adm.ws, adm.dispatch_event_id, adm.decision, adm.gov, adm.started_ms
        )
    call = adm.call
    dispatch = builders.dispatch_event(
        adm.ids,
        call.operation_id,
        call.tool_call_id,
        call.tool_name,
        adm.tool.recovery_mode,
        adm.args_hash,
        now_ms(),
    )
    committed = rt.ledger.commit_tool_prepared(
        dispatch, evidence=adm.evidence, attempt=attempt.record, decision=adm.decision if adm.fresh else None
    )
    if not committed.created:
        # The very same dispatch fact was already there: a twin attempt, admitted beside this one
        # before either committed, dispatched the call first. Its effect is that attempt's to run.
        raise DispatchWithoutOutcome(
            message=f"operation {call.operation_id} was dispatched by another attempt; not running it again",
            operationId=call.operation_id,
            status="dispatched",
            reason="dispatched_by_another_attempt",
        )
    return Dispatched(
        adm.ids,
        adm.tool,
        adm.args,
        adm.ws,
        dispatch.id,
        adm.decision,
        adm.gov,
        adm.started_ms,
        adm.run_number,
    )


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
        sealed = verification.receipt(
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


__all__ = ["AwaitingApproval", "Dispatched", "NotRun", "admit_call", "commit", "commit_refusal"]
