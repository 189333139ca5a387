"""The RecoveryResolver: the one classification of every tool operation after a crash.

It reads immutable facts only (through the shared scanner) and answers, per tool call, one of
``completed``, ``definitely_not_dispatched``, ``indeterminate``, ``parked`` or ``corruption``
with the reference's reason vocabulary (facts §2 decision table). "Definitely not dispatched"
needs the ``t1_after_preflight_v1`` marker on the run's first event: without it a call with no
dispatch fact may predate the T1 protocol, so it is indeterminate, never proven safe.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from maka_core.facts.events import FunctionResponseContent, Refs, RuntimeEvent
from maka_core.ledger.recovery_bundle import interpret_recovery
from maka_core.ledger.scanner import LedgerIssue, LedgerScanner, OperationFacts, scan

Status = Literal["completed", "parked", "definitely_not_dispatched", "indeterminate", "corruption"]
SettlementOrigin = Literal["normal_t2", "pre_t1_synthetic", "recovery_bundle"]
#: The statuses that wait for an operator's word (``maka session resolve`` accepts a call in one).
FOR_OPERATOR: tuple[Status, ...] = ("indeterminate", "parked")

#: When one operation carries several issues, the reason reported is the first of these present.
_CORRUPTION_PRIORITY: tuple[str, ...] = (
    "duplicate_call",
    "duplicate_operation",
    "duplicate_dispatch",
    "duplicate_response",
    "orphan_response",
    "canonical_args_hash_conflict",
    "identity_conflict",
    "event_order_conflict",
)


@dataclass(frozen=True)
class OperationResolution:
    """The Resolver's decision for one tool call."""

    tool_call_id: str
    tool_name: str | None
    operation_id: str | None
    status: Status
    reason: str
    settlement_origin: SettlementOrigin | None
    requires_reconciliation: bool
    call_event_id: str | None
    dispatch_event_id: str | None
    response_event_id: str | None
    response_is_error: bool | None
    invocation_id: str = ""

    def to_json(self) -> dict[str, Any]:
        return {
            "toolCallId": self.tool_call_id,
            "toolName": self.tool_name,
            "operationId": self.operation_id,
            "status": self.status,
            "reason": self.reason,
            "settlementOrigin": self.settlement_origin,
            "requiresReconciliation": self.requires_reconciliation,
            "callRuntimeEventId": self.call_event_id,
            "dispatchRuntimeEventId": self.dispatch_event_id,
            "responseRuntimeEventId": self.response_event_id,
            "responseIsError": self.response_is_error,
        }


@dataclass(frozen=True)
class RecoveryResolution:
    """Every operation's decision plus the ledger-wide verdict."""

    tool_boundary_protocol: str | None
    has_corruption: bool
    requires_reconciliation: bool
    issues: tuple[LedgerIssue, ...]
    operations: tuple[OperationResolution, ...]

    def to_json(self) -> dict[str, Any]:
        """The reference oracle's ``recovery`` object (issues as ``{code, eventId}``)."""
        return {
            "toolBoundaryProtocol": self.tool_boundary_protocol,
            "hasCorruption": self.has_corruption,
            "requiresReconciliation": self.requires_reconciliation,
            "issues": [{"code": i.code, "eventId": i.event_id} for i in self.issues],
            "operations": [op.to_json() for op in self.operations],
        }

    def __post_init__(self) -> None:
        by_op = {op.operation_id: op for op in reversed(self.operations) if op.operation_id is not None}
        by_call = {(op.invocation_id, op.tool_call_id): op for op in reversed(self.operations)}
        object.__setattr__(self, "_by_operation", by_op)
        object.__setattr__(self, "_by_call", by_call)

    def for_operation(self, operation_id: str) -> OperationResolution | None:
        """The decision for an operation id (None if no dispatch named it)."""
        found: OperationResolution | None = self.__dict__["_by_operation"].get(operation_id)
        return found

    def for_call(self, invocation_id: str, tool_call_id: str) -> OperationResolution | None:
        """The decision for a provider tool call of one invocation."""
        found: OperationResolution | None = self.__dict__["_by_call"].get((invocation_id, tool_call_id))
        return found


def resolve(events: Sequence[RuntimeEvent] | LedgerScanner) -> RecoveryResolution:
    """Classify every tool operation in a committed prefix.

    Args:
        events: one run's committed events (read exactly as the reference Resolver reads a
            prefix: the protocol is the first event's marker), or a scanner already folded over
            a session ledger (protocol judged per run).
    """
    scanner = events if isinstance(events, LedgerScanner) else scan(events, protocol_scope="ledger")
    issues = (*scanner.protocol_issues, *scanner.issues)
    decisions = tuple(decide(facts, scanner) for facts in scanner.operations())
    has_corruption = bool(issues) or any(d.status == "corruption" for d in decisions)
    return RecoveryResolution(
        tool_boundary_protocol=scanner.ledger_protocol,
        has_corruption=has_corruption,
        requires_reconciliation=not has_corruption and any(d.status == "indeterminate" for d in decisions),
        issues=issues,
        operations=decisions,
    )


def decide(facts: OperationFacts, scanner: LedgerScanner) -> OperationResolution:
    """The Resolver's decision for one tool call, read from a scanner that has folded its ledger."""
    status: Status
    origin: SettlementOrigin | None = None
    if scanner.protocol(facts.run_id) is not None:
        status, reason = "definitely_not_dispatched", "new_protocol_before_dispatch"
    else:
        status, reason = "indeterminate", "legacy_dispatch_unknown"
    codes = {issue.code for issue in facts.issues}
    corruption = next((code for code in _CORRUPTION_PRIORITY if code in codes), None)

    if facts.call is None and facts.dispatch is not None:
        status, reason = "corruption", "orphan_dispatch"
    elif facts.call is None and facts.response is not None:
        status, reason = "corruption", "orphan_response"
    elif corruption is not None:
        status, reason = "corruption", corruption
    else:
        if facts.response is not None:
            status, reason = "completed", "matching_response"
            origin = "normal_t2" if facts.dispatch is not None else "pre_t1_synthetic"
        elif facts.dispatch is not None:
            status, reason = "indeterminate", "dispatch_without_response"
        # The reference orders facts by each id's last position (its eventOrder map), so a
        # repeated id can break an otherwise valid bundle's causal order.
        recovery = interpret_recovery(facts, scanner.last_positions)
        if recovery.kind == "corruption":
            status, reason, origin = "corruption", "recovery_fact_corruption", None
        elif recovery.kind == "valid":
            assert recovery.decision is not None
            origin = "recovery_bundle"
            if recovery.decision.disposition == "completed":
                status, reason = "completed", "recovery_bundle_completed"
            else:
                status, reason = "parked", recovery.decision.reason_code

    response = facts.response
    is_error: bool | None = None
    if response is not None:
        content = response.content
        is_error = bool(content is not None and content.kind == "function_response" and content.is_error)
    return OperationResolution(
        tool_call_id=facts.tool_call_id,
        # The reference reports these only when truthy: an empty name or id reads as absent.
        tool_name=facts.tool_name or None,
        operation_id=facts.operation_id or None,
        status=status,
        reason=reason,
        settlement_origin=origin,
        requires_reconciliation=status == "indeterminate",
        call_event_id=facts.call.id if facts.call is not None else None,
        dispatch_event_id=facts.dispatch.id if facts.dispatch is not None else None,
        response_event_id=response.id if response is not None else None,
        response_is_error=is_error,
        invocation_id=facts.invocation_id,
    )


CODE_MODE_INTERRUPTED_MESSAGE = "Code Mode execution was interrupted by runtime recovery."


def interrupted_code_mode_outcomes(
    events: Sequence[RuntimeEvent], now: int, tool_mode: Literal["code_mode", "direct"]
) -> list[RuntimeEvent]:
    """T2 outcomes that settle an interrupted Code Mode ``exec`` as an error.

    Code Mode's outer ``exec`` only orchestrates nested calls, each with its own T1/T2, so an
    interrupted one is settled as ``interrupted`` rather than left indeterminate. Only the outer,
    model-visible ``exec`` in ``dispatch_without_response`` qualifies, and only in Code Mode: a
    direct-mode tool that happens to be named ``exec`` may have side effects of its own.

    Returns:
        The function_response events to commit through T2 (journal ``<op>_outcome``).
    """
    if tool_mode != "code_mode":
        return []
    recovery = resolve(events)
    by_id = {e.id: e for e in events}
    out: list[RuntimeEvent] = []
    for decision in recovery.operations:
        if (
            decision.status != "indeterminate"
            or decision.reason != "dispatch_without_response"
            or decision.operation_id is None
            or decision.call_event_id is None
        ):
            continue
        call_event = by_id.get(decision.call_event_id)
        content = call_event.content if call_event is not None else None
        if (
            call_event is None
            or content is None
            or content.kind != "function_call"
            or content.name != "exec"
            or call_event.origin == "code_mode"
            or call_event.hidden
        ):
            continue
        out.append(
            RuntimeEvent(
                id=f"{decision.operation_id}_response",
                invocation_id=call_event.invocation_id,
                run_id=call_event.run_id,
                session_id=call_event.session_id,
                turn_id=call_event.turn_id,
                ts=now,
                partial=False,
                role="tool",
                author="tool",
                origin="provider",
                model_visibility="visible",
                content=FunctionResponseContent(
                    id=content.id,
                    name=content.name,
                    result={
                        "kind": "json",
                        "value": {
                            "kind": "code_mode",
                            "status": "interrupted",
                            "message": CODE_MODE_INTERRUPTED_MESSAGE,
                        },
                    },
                    is_error=True,
                ),
                refs=Refs(operation_id=decision.operation_id, tool_call_id=content.id),
            )
        )
    return out
