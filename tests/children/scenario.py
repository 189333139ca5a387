"""Event builders for the store tests and their child processes (importable on their own).

The shapes follow the reference examples (``shared/reference/maka-examples``): a user turn that
declares the tool-boundary protocol, a model function_call, the T1 dispatch, the bound T2
function_response, a terminal event, and the recovery bundle's reconcile/outcome/decision.
"""

from __future__ import annotations

from typing import Any

from maka_core.facts.codec import canonical_args_hash
from maka_core.facts.events import (
    Actions,
    FunctionCallContent,
    FunctionResponseContent,
    ReconcileResult,
    RecoveryDecision,
    Refs,
    RuntimeEvent,
    RuntimeProtocol,
    TextContent,
    ToolDispatch,
    ToolRecovery,
)

T0 = 1767225600000
DIGEST = "sha256:" + "ab" * 32


def ids(
    session: str = "sess-1", run: str = "run-1", inv: str = "inv-1", turn: str = "turn-1"
) -> dict[str, str]:
    return {"session_id": session, "run_id": run, "invocation_id": inv, "turn_id": turn}


def user(
    id: str = "evt-user-1", text: str = "list the files", *, protocol: bool = True, ts: int = T0, **kw: str
) -> RuntimeEvent:
    actions = (
        Actions(runtime_protocol=RuntimeProtocol(tool_boundary="t1_after_preflight_v1")) if protocol else None
    )
    return RuntimeEvent(
        id=id,
        **ids(**kw),
        ts=ts,
        partial=False,
        role="user",
        author="user",
        content=TextContent(text=text),
        actions=actions,
    )


def model_text(id: str, text: str = "done", *, ts: int = T0 + 5, **kw: str) -> RuntimeEvent:
    return RuntimeEvent(
        id=id, **ids(**kw), ts=ts, partial=False, role="model", author="agent", content=TextContent(text=text)
    )


def call(
    op: str = "op-1",
    call_id: str = "call-1",
    *,
    name: str = "Bash",
    args: dict[str, Any] | None = None,
    id: str | None = None,
    ts: int = T0 + 1,
    **kw: str,
) -> RuntimeEvent:
    return RuntimeEvent(
        id=id or f"evt-{call_id}",
        **ids(**kw),
        ts=ts,
        partial=False,
        role="model",
        author="agent",
        model_visibility="visible",
        origin="provider",
        content=FunctionCallContent(
            id=call_id, name=name, args=args if args is not None else {"command": "ls"}
        ),
        refs=Refs(operation_id=op, tool_call_id=call_id),
    )


def dispatch(
    op: str = "op-1",
    call_id: str = "call-1",
    *,
    name: str = "Bash",
    args: dict[str, Any] | None = None,
    mode: str = "reconcile",
    args_hash: str | None = None,
    id: str | None = None,
    ts: int = T0 + 1,
    **kw: str,
) -> RuntimeEvent:
    hash_ = args_hash or canonical_args_hash(name, args if args is not None else {"command": "ls"})
    return RuntimeEvent(
        id=id or f"{op}_dispatch",
        **ids(**kw),
        ts=ts,
        partial=False,
        role="system",
        author="system",
        model_visibility="visible",
        origin="provider",
        actions=Actions(
            tool_dispatch=ToolDispatch(
                operation_id=op,
                provider_tool_call_id=call_id,
                tool_name=name,
                canonical_args_hash=hash_,
                recovery_mode=mode,  # type: ignore[arg-type]
            )
        ),
        refs=Refs(operation_id=op, tool_call_id=call_id),
    )


def response(
    op: str | None = "op-1",
    call_id: str = "call-1",
    *,
    name: str = "Bash",
    result: Any = None,
    is_error: bool | None = None,
    id: str | None = None,
    ts: int = T0 + 2,
    **kw: str,
) -> RuntimeEvent:
    """A function_response; ``op=None`` gives an unbound (pre-T1 synthetic) response."""
    refs = Refs(operation_id=op, tool_call_id=call_id) if op is not None else Refs(tool_call_id=call_id)
    return RuntimeEvent(
        id=id or (f"{op}_response" if op else f"evt-{call_id}-response"),
        **ids(**kw),
        ts=ts,
        partial=False,
        role="tool",
        author="tool",
        model_visibility="visible",
        origin="provider",
        content=FunctionResponseContent(
            id=call_id,
            name=name,
            result=result if result is not None else {"kind": "text", "text": "README.md"},
            **({"is_error": is_error} if is_error is not None else {}),
        ),
        refs=refs,
    )


def terminal(
    id: str = "evt-terminal-1", *, status: str = "completed", ts: int = T0 + 3, **kw: str
) -> RuntimeEvent:
    return RuntimeEvent(
        id=id,
        **ids(**kw),
        ts=ts,
        partial=False,
        role="system",
        author="system",
        status=status,
        actions=Actions(end_invocation=True),
    )  # type: ignore[arg-type]


def reconcile(
    op: str = "op-1",
    call_id: str = "call-1",
    *,
    observation: str = "matches_expected_state",
    id: str | None = None,
    ts: int = T0 + 4,
    **kw: str,
) -> RuntimeEvent:
    return RuntimeEvent(
        id=id or f"{op}_reconcile",
        **ids(**kw),
        ts=ts,
        partial=False,
        role="system",
        author="system",
        actions=Actions(
            tool_recovery=ToolRecovery(
                kind="maka.tool.reconcile_result",
                payload=ReconcileResult(
                    operation_id=op,
                    observation=observation,  # type: ignore[arg-type]
                    observation_digest=DIGEST,
                ),
            )
        ),
        refs=Refs(operation_id=op, tool_call_id=call_id),
    )


PARK_REASON = {
    "matches_prior_state": "reconcile_matches_prior_state",
    "diverged": "reconcile_diverged",
    "unreadable": "reconcile_unreadable",
}


def decision(
    op: str = "op-1",
    call_id: str = "call-1",
    *,
    evidence: list[str],
    outcome_event_id: str | None = None,
    reason_code: str | None = None,
    id: str | None = None,
    ts: int = T0 + 4,
    **kw: str,
) -> RuntimeEvent:
    completed = outcome_event_id is not None
    extra = {"outcome_event_id": outcome_event_id} if completed else {}
    payload = RecoveryDecision(
        operation_id=op,
        disposition="completed" if completed else "parked",
        reason_code=reason_code
        or ("reconcile_matches_expected_state" if completed else "reconcile_diverged"),  # type: ignore[arg-type]
        evidence_event_ids=evidence,
        **extra,
    )
    return RuntimeEvent(
        id=id or f"{op}_decision",
        **ids(**kw),
        ts=ts,
        partial=False,
        role="system",
        author="system",
        actions=Actions(tool_recovery=ToolRecovery(kind="maka.tool.recovery_decision", payload=payload)),
        refs=Refs(operation_id=op, tool_call_id=call_id),
    )


def completed_bundle(
    op: str = "op-1", call_id: str = "call-1", *, suffix: str = "", **kw: Any
) -> tuple[RuntimeEvent, RuntimeEvent, RuntimeEvent]:
    """(reconcile, outcome, decision) settling a dispatched operation as completed."""
    rec = reconcile(op, call_id, id=f"{op}_reconcile{suffix}", **kw)
    out = response(op, call_id, id=f"{op}_recovered{suffix}", ts=T0 + 4, **kw)
    dec = decision(
        op,
        call_id,
        evidence=[f"evt-{call_id}", f"{op}_dispatch", rec.id, out.id],
        outcome_event_id=out.id,
        id=f"{op}_decision{suffix}",
        **kw,
    )
    return rec, out, dec


def parked_bundle(
    op: str = "op-1", call_id: str = "call-1", *, observation: str = "diverged", suffix: str = "", **kw: Any
) -> tuple[RuntimeEvent, RuntimeEvent]:
    """(reconcile, decision) parking a dispatched operation."""
    rec = reconcile(op, call_id, observation=observation, id=f"{op}_reconcile{suffix}", **kw)
    dec = decision(
        op,
        call_id,
        evidence=[f"evt-{call_id}", f"{op}_dispatch", rec.id],
        reason_code=PARK_REASON[observation],
        id=f"{op}_decision{suffix}",
        **kw,
    )
    return rec, dec
