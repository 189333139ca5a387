"""RuntimeEvent builders for the turn protocol, in the reference's lane shapes.

Event ids are deterministic wherever a retry could re-commit the same fact (user event, model output,
dispatch, outcome, recovery bundle, terminal event), so a retried write is an exact, idempotent retry
rather than a second fact.
"""

from __future__ import annotations

from typing import Any

from maka_core.facts.events import (
    TOOL_BOUNDARY_PROTOCOL,
    Actions,
    ErrorContent,
    FunctionCallContent,
    FunctionResponseContent,
    Observation,
    ReconcileResult,
    RecoveryDecision,
    RecoveryMode,
    Refs,
    RuntimeEvent,
    RuntimeProtocol,
    TextContent,
    ToolDispatch,
    ToolRecovery,
)
from maka_core.runtime.contracts import TURN_CANCELLED, ParkReason, RunIds, TurnStatus


def _present(**fields: Any) -> dict[str, Any]:
    # Wire models refuse null for an absent key: leave unset fields out entirely.
    return {k: v for k, v in fields.items() if v is not None}


def _base(ids: RunIds, event_id: str, ts: int) -> dict[str, Any]:
    return {
        "id": event_id,
        "invocation_id": ids.invocation_id,
        "run_id": ids.run_id,
        "session_id": ids.session_id,
        "turn_id": ids.turn_id,
        "ts": ts,
        "partial": False,
    }


def user_event(ids: RunIds, text: str, ts: int) -> RuntimeEvent:
    """The run's first event: the user's message carrying the tool-boundary protocol marker."""
    return RuntimeEvent(
        **_base(ids, f"{ids.run_id}_user", ts),
        role="user",
        author="user",
        content=TextContent(text=text),
        actions=Actions(runtime_protocol=RuntimeProtocol(tool_boundary=TOOL_BOUNDARY_PROTOCOL)),
    )


def model_text(ids: RunIds, step_id: str, text: str, ts: int) -> RuntimeEvent:
    return RuntimeEvent(
        **_base(ids, f"{step_id}:text", ts),
        role="model",
        author="agent",
        content=TextContent(text=text),
        refs=Refs(step_id=step_id),
    )


def step_usage(ids: RunIds, step_id: str, usage: dict[str, Any], ts: int) -> RuntimeEvent:
    """A step's token usage: Maka's ``tokenUsage`` action alone on a model-invisible system event
    (a call event may carry no action but ``stateDelta``, and a call-only step has no text event),
    committed in the step's own transaction. Raises ``ValueError`` for a shape Maka refuses."""
    return RuntimeEvent(
        **_base(ids, f"{step_id}:usage", ts),
        role="system",
        author="system",
        model_visibility="hidden",
        actions=Actions(token_usage=usage),
        refs=Refs(step_id=step_id),
    )


def model_call(
    ids: RunIds,
    step_id: str,
    index: int,
    tool_call_id: str,
    name: str,
    args: dict[str, Any],
    op: str,
    ts: int,
    provider_options: dict[str, Any] | None = None,
) -> RuntimeEvent:
    """A step's function call; ``provider_options`` carries the vendor's own call id where the
    call's id is the runtime's (``runtime.step_output``)."""
    return RuntimeEvent(
        **_base(ids, f"{step_id}:call:{index}", ts),
        role="model",
        author="agent",
        content=FunctionCallContent(
            id=tool_call_id, name=name, args=args, **_present(provider_options=provider_options)
        ),
        refs=Refs(operation_id=op, tool_call_id=tool_call_id, step_id=step_id),
    )


def dispatch_event(
    ids: RunIds, op: str, tool_call_id: str, name: str, mode: RecoveryMode, args_hash: str, ts: int
) -> RuntimeEvent:
    """T1: model-invisible; refs exactly ``{operationId, toolCallId}``. ``args_hash`` is the
    committed call's canonicalArgsHash, computed once per dispatch by the caller."""
    return RuntimeEvent(
        **_base(ids, f"{op}_dispatch", ts),
        role="system",
        author="system",
        actions=Actions(
            tool_dispatch=ToolDispatch(
                operation_id=op,
                provider_tool_call_id=tool_call_id,
                tool_name=name,
                canonical_args_hash=args_hash,
                recovery_mode=mode,
            )
        ),
        refs=Refs(operation_id=op, tool_call_id=tool_call_id),
    )


def response_event(
    ids: RunIds,
    event_id: str,
    tool_call_id: str,
    name: str,
    result: Any,
    is_error: bool,
    ts: int,
    op: str | None,
) -> RuntimeEvent:
    """A function_response; bound to ``op`` (T2 / recovered outcome) or unbound (pre-T1 refusal)."""
    return RuntimeEvent(
        **_base(ids, event_id, ts),
        role="tool",
        author="tool",
        content=FunctionResponseContent(
            **_present(id=tool_call_id, name=name, result=result, is_error=is_error or None)
        ),
        refs=Refs(**_present(operation_id=op, tool_call_id=tool_call_id)),
    )


def reconcile_event(
    ids: RunIds, op: str, tool_call_id: str, observation: Observation, digest: str, ts: int
) -> RuntimeEvent:
    return RuntimeEvent(
        **_base(ids, f"{op}_reconcile", ts),
        role="system",
        author="system",
        actions=Actions(
            tool_recovery=ToolRecovery(
                kind="maka.tool.reconcile_result",
                payload=ReconcileResult(
                    operation_id=op,
                    observation=observation,
                    observation_digest=digest,
                ),
            )
        ),
        refs=Refs(operation_id=op, tool_call_id=tool_call_id),
    )


def decision_event(
    ids: RunIds,
    op: str,
    tool_call_id: str,
    reason_code: str,
    evidence_event_ids: list[str],
    outcome_event_id: str | None,
    ts: int,
) -> RuntimeEvent:
    return RuntimeEvent(
        **_base(ids, f"{op}_decision", ts),
        role="system",
        author="system",
        actions=Actions(
            tool_recovery=ToolRecovery(
                kind="maka.tool.recovery_decision",
                payload=RecoveryDecision(
                    **_present(
                        operation_id=op,
                        disposition="completed" if outcome_event_id else "parked",
                        reason_code=reason_code,
                        outcome_event_id=outcome_event_id,
                        evidence_event_ids=evidence_event_ids,
                    )
                ),
            )
        ),
        refs=Refs(operation_id=op, tool_call_id=tool_call_id),
    )


def parked_message(operation_id: str | None, park_reason: str) -> str:
    """A parked terminal fact's message: the operation it parked on, when it parked on one (a turn
    that ran out of steps or tokens parks on none)."""
    return f"parked on operation {operation_id}: {park_reason}" if operation_id else f"parked: {park_reason}"


def terminal_event(
    ids: RunIds,
    status: TurnStatus,
    ts: int,
    *,
    park_reason: ParkReason | None = None,
    operation_id: str | None = None,
    error: str | None = None,
) -> RuntimeEvent:
    """The run's terminal fact (``<runId>_end``): completed, cancelled, or failed with a reason."""
    if status == "completed":
        return RuntimeEvent(
            **_base(ids, f"{ids.run_id}_end", ts),
            role="system",
            author="system",
            status="completed",
            actions=Actions(end_invocation=True),
        )
    if status == "cancelled":
        # ``cancel_turn``: the header says ``cancelled``, the certificate ``CANCELLED``.
        return RuntimeEvent(
            **_base(ids, f"{ids.run_id}_end", ts),
            role="system",
            author="system",
            status="cancelled",
            content=ErrorContent(
                code=TURN_CANCELLED,
                message=f"the turn was cancelled: {error or 'cancelled'}",
                reason=TURN_CANCELLED,
            ),
            actions=Actions(end_invocation=True, state_delta={"failureClass": "cancelled"}),
        )
    code = park_reason or "run_failed"
    delta: dict[str, Any] = {"failureClass": "parked" if park_reason else "run_failed"}
    if park_reason:
        delta["parkReason"] = park_reason
    if operation_id:
        delta["operationId"] = operation_id
    message = (
        parked_message(operation_id, park_reason)
        if park_reason
        else f"the run failed: {error or 'unknown error'}"
    )
    return RuntimeEvent(
        **_base(ids, f"{ids.run_id}_end", ts),
        role="system",
        author="system",
        status="failed",
        content=ErrorContent(code=code, message=message, reason=code),
        actions=Actions(end_invocation=True, state_delta=delta),
    )
