"""Phase 0: may a committed prefix be replayed as it stands, and what is its legal history?

Pure reading, never a mutation (reference ``buildResumePlanFromRuntimeEvents``). The plan
takes the Resolver's decisions, projects the model-visible tool operations, turns every
non-completed tool state into the rejection reason ``dangling_tool_state`` with a diagnostic,
and builds the legal provider replay: partial and hidden events dropped, calls and responses
only as matched pairs, everything else (terminal facts included) kept. A prefix with an
indeterminate operation also carries a directive telling the model not to retry blindly.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final, Literal

from maka_core.facts.events import RuntimeEvent
from maka_core.ledger.resolver import RecoveryResolution, resolve

PlanKind = Literal["safe_replay", "blocked"]
OperationStatus = Literal["succeeded", "failed", "indeterminate", "not_dispatched", "parked", "corruption"]

INDETERMINATE_TOOL_RESULT_DIRECTIVE: Final[str] = " ".join(
    [
        "Tool execution was interrupted before a matching committed tool result was found.",
        "The side effects may or may not have occurred.",
        "Do not retry the tool call immediately.",
        "Use read-only inspection tools to verify the current state before deciding the next step.",
    ]
)

#: Diagnostic codes that roll up to the rejection reason ``dangling_tool_state``.
_DANGLING: Final[frozenset[str]] = frozenset(
    {
        "pending_tool_result",
        "tool_not_dispatched",
        "tool_recovery_parked",
        "tool_recovery_corruption",
        "tool_ledger_corruption",
        "duplicate_event_id",
        "semantic_lane_conflict",
        "protocol_marker_invalid",
        "unmatched_tool_result",
        "tool_name_mismatch",
    }
)

_ISSUE_MESSAGES: Final[dict[str, str]] = {
    "protocol_marker_invalid": "runtime protocol marker is only valid on the first canonical event",
    "duplicate_event_id": "immutable RuntimeEvent identity is duplicated",
    "semantic_lane_conflict": "RuntimeEvent claims more than one authoritative tool semantic lane",
}

_OPERATION_DIAGNOSTICS: Final[dict[str, tuple[str, str]]] = {
    "indeterminate": ("pending_tool_result", "function_call has no matching committed function_response"),
    "not_dispatched": (
        "tool_not_dispatched",
        "function_call did not cross the durable tool dispatch boundary",
    ),
    "corruption": ("tool_recovery_corruption", "tool recovery facts conflict"),
    "parked": ("tool_recovery_parked", "tool recovery reached a terminal parked decision"),
}


@dataclass(frozen=True)
class PlannedOperation:
    """One model-visible tool call as the plan sees it."""

    tool_call_id: str
    tool_name: str
    args: Any
    status: OperationStatus
    call_event_id: str
    response_event_id: str | None = None
    response_is_error: bool | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "toolCallId": self.tool_call_id,
            "toolName": self.tool_name,
            "args": self.args,
            "status": self.status,
            "callRuntimeEventId": self.call_event_id,
        }
        if self.response_event_id is not None:
            out["responseRuntimeEventId"] = self.response_event_id
        if self.response_is_error is not None:
            out["responseIsError"] = self.response_is_error
        return out


@dataclass(frozen=True)
class ResumePlan:
    """The Phase 0 verdict on a committed prefix."""

    kind: PlanKind
    rejection_reasons: tuple[str, ...]
    diagnostics: tuple[dict[str, Any], ...]
    requires_verification: bool
    directive: str | None
    operations: tuple[PlannedOperation, ...]
    replay_event_ids: tuple[str, ...]
    high_water: int
    expected_runtime_event_high_water: int | None
    recovery: RecoveryResolution | None = None

    def to_json(self) -> dict[str, Any]:
        """The reference oracle's ``resumePlan`` object."""
        return {
            "kind": self.kind,
            "rejectionReasons": list(self.rejection_reasons),
            "diagnostics": [dict(d) for d in self.diagnostics],
            "requiresVerification": self.requires_verification,
            "directive": self.directive,
            "operations": [op.to_json() for op in self.operations],
            "replayEventIds": list(self.replay_event_ids),
            "highWater": self.high_water,
            "expectedRuntimeEventHighWater": self.expected_runtime_event_high_water,
        }


def plan_resume(events: Sequence[RuntimeEvent], expected_high_water: int | None = None) -> ResumePlan:
    """Build the Phase 0 plan for one committed prefix (read as the reference reads it).

    Args:
        events: the committed prefix, in ledger order.
        expected_high_water: the runtime-event high-water a checkpoint recorded; a different
            actual count adds ``runtime_offset_mismatch``.
    """
    recovery = resolve(events)
    operations = _project_operations(events, recovery)
    hidden_indeterminate = _hidden_indeterminate(events, recovery)
    diagnostics = _diagnostics(events, operations, expected_high_water, recovery, hidden_indeterminate)
    reasons: list[str] = []
    for diagnostic in diagnostics:
        code = diagnostic["code"]
        reason = "runtime_offset_mismatch" if code == "runtime_offset_mismatch" else None
        if code in _DANGLING:
            reason = "dangling_tool_state"
        if reason is not None and reason not in reasons:
            reasons.append(reason)
    # Hidden nested calls stay out of the operation projection, but an unresolved one is still
    # a possible side effect and must block replay of the enclosing execution.
    requires_verification = any(op.status == "indeterminate" for op in operations) or bool(
        hidden_indeterminate
    )
    safe = not reasons and not requires_verification and not recovery.has_corruption
    return ResumePlan(
        kind="safe_replay" if safe else "blocked",
        rejection_reasons=tuple(reasons),
        diagnostics=tuple(diagnostics),
        requires_verification=requires_verification,
        directive=INDETERMINATE_TOOL_RESULT_DIRECTIVE if requires_verification else None,
        operations=tuple(operations),
        replay_event_ids=tuple(e.id for e in legal_replay(events)),
        high_water=len(events),
        expected_runtime_event_high_water=expected_high_water,
        recovery=recovery,
    )


def legal_replay(events: Sequence[RuntimeEvent]) -> list[RuntimeEvent]:
    """The legal provider history of a prefix.

    Partial and hidden events are dropped; a call or response is kept only when the call has a
    committed response of the same tool name (an unresolved call is never replayed, an orphan
    response never invents history); every other event is kept, terminal facts included.
    """
    calls: dict[str, str] = {}
    paired: set[str] = set()
    for event in events:
        content = event.content
        if event.partial or content is None:
            continue
        if content.kind == "function_call":
            calls[content.id] = content.name
        elif content.kind == "function_response" and calls.get(content.id) == content.name:
            paired.add(content.id)
    replay: list[RuntimeEvent] = []
    for event in events:
        if event.partial or event.hidden:
            continue
        content = event.content
        if content is not None and content.kind in ("function_call", "function_response"):
            if content.id in paired:
                replay.append(event)
            continue
        replay.append(event)
    return replay


def _project_operations(
    events: Sequence[RuntimeEvent], recovery: RecoveryResolution
) -> list[PlannedOperation]:
    calls = {
        e.id: e.content
        for e in events
        if e.content is not None and e.content.kind == "function_call" and not e.hidden
    }
    out: list[PlannedOperation] = []
    for decision in recovery.operations:
        if decision.call_event_id is None:
            continue
        call = calls.get(decision.call_event_id)
        if call is None or call.kind != "function_call":
            continue
        status: OperationStatus
        if decision.status == "completed":
            status = "failed" if decision.response_is_error else "succeeded"
        elif decision.status == "definitely_not_dispatched":
            status = "not_dispatched"
        else:
            status = decision.status
        out.append(
            PlannedOperation(
                tool_call_id=decision.tool_call_id,
                tool_name=call.name,
                args=call.args,
                status=status,
                call_event_id=decision.call_event_id,
                response_event_id=decision.response_event_id,
                response_is_error=decision.response_is_error,
            )
        )
    return out


def _hidden_indeterminate(events: Sequence[RuntimeEvent], recovery: RecoveryResolution) -> list[Any]:
    # The last event carrying an id is the one read (the reference's eventsById map).
    last_by_id = {e.id: e for e in events}
    return [
        d
        for d in recovery.operations
        if d.status == "indeterminate"
        and d.call_event_id in last_by_id
        and last_by_id[d.call_event_id].hidden
    ]


def _diagnostic(code: str, message: str, **fields: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"code": code, "message": message}
    out.update({k: v for k, v in fields.items() if v is not None})
    return out


def _diagnostics(
    events: Sequence[RuntimeEvent],
    operations: list[PlannedOperation],
    expected_high_water: int | None,
    recovery: RecoveryResolution,
    hidden_indeterminate: list[Any],
) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    if expected_high_water is not None and expected_high_water != len(events):
        out.append(
            _diagnostic(
                "runtime_offset_mismatch",
                "RuntimeEvent high-water does not match the expected checkpoint offset",
                detail={
                    "expectedRuntimeEventHighWater": expected_high_water,
                    "actualRuntimeEventHighWater": len(events),
                },
            )
        )
    for op in operations:
        entry = _OPERATION_DIAGNOSTICS.get(op.status)
        if entry is not None:
            out.append(
                _diagnostic(
                    entry[0],
                    entry[1],
                    eventId=op.call_event_id,
                    toolCallId=op.tool_call_id,
                    toolName=op.tool_name,
                )
            )
    for issue in recovery.issues:
        message = _ISSUE_MESSAGES.get(issue.code)
        if message is not None:
            out.append(_diagnostic(issue.code, message, eventId=issue.event_id))
        else:
            out.append(
                _diagnostic(
                    "tool_ledger_corruption",
                    f"immutable tool ledger is corrupt: {issue.code}",
                    eventId=issue.event_id,
                    detail={"issueCode": issue.code},
                )
            )
    for d in recovery.operations:
        if d.status != "corruption" or d.call_event_id is not None or d.reason == "orphan_response":
            continue
        out.append(
            _diagnostic(
                "tool_recovery_corruption",
                f"tool recovery fact is corrupt: {d.reason}",
                eventId=d.dispatch_event_id or d.response_event_id,
                toolCallId=d.tool_call_id,
                toolName=d.tool_name,
            )
        )
    for d in hidden_indeterminate:
        out.append(
            _diagnostic(
                "pending_tool_result",
                "hidden nested tool call has no matching committed function_response",
                eventId=d.call_event_id,
                toolCallId=d.tool_call_id,
                toolName=d.tool_name,
            )
        )
    by_call = {op.tool_call_id: op for op in operations}
    for event in events:
        content = event.content
        if event.partial or event.hidden or content is None or content.kind != "function_response":
            continue
        match = by_call.get(content.id)
        if match is None:
            out.append(
                _diagnostic(
                    "unmatched_tool_result",
                    "function_response has no prior matching function_call",
                    eventId=event.id,
                    toolCallId=content.id,
                    toolName=content.name,
                )
            )
        elif match.tool_name != content.name:
            out.append(
                _diagnostic(
                    "tool_name_mismatch",
                    "function_response tool name differs from matching function_call",
                    eventId=event.id,
                    toolCallId=content.id,
                    toolName=content.name,
                    detail={"callToolName": match.tool_name, "responseToolName": content.name},
                )
            )
    return out
