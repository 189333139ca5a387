"""The one set of RuntimeEvent builders for every test, child process and benchmark.

Events come in Maka's exact shape with sensible defaults. Every builder takes the envelope
identity as keywords (``session_id``, ``invocation_id``, ``run_id``, ``turn_id``, ``ts``; ``ids``
spells the four ids briefly) and extra envelope fields (``model_visibility``, ``origin``,
``partial``...) through ``**envelope``. Ids default from the tool call id so a test reads like the
ledger it builds: ``call("c1")`` is event ``evt-c1``, its dispatch ``op-c1_dispatch``. A call
carries operation refs only when given ``operation_id`` (a T1 call; ``t1`` builds the pair);
without it, it is a pre-T1 (legacy) call. Every event defaults to the same ``ts``.

The child processes in ``tests/children`` import this module as ``tests.ledger_factory`` (they
run as ``python -m tests.children.X`` from the repository root), so it imports nothing from the
test modules.
"""

from __future__ import annotations

from typing import Any, Literal

from maka_core.facts.claims import ContinuationClaim
from maka_core.facts.codec import canonical_args_hash, digest
from maka_core.facts.events import (
    TOOL_BOUNDARY_PROTOCOL,
    Actions,
    ContinuationStart,
    ErrorContent,
    FunctionCallContent,
    FunctionResponseContent,
    ImmediateSource,
    ReconcileResult,
    RecoveryDecision,
    Refs,
    RuntimeEvent,
    RuntimeProtocol,
    TextContent,
    ToolDispatch,
    ToolRecovery,
)

SESSION = "sess-1"
INVOCATION = "inv-1"
RUN = "run-1"
TURN = "turn-1"
TS = 1767225600000
DEFAULT_ARGS: dict[str, Any] = {"command": "ls"}
DIGEST = "sha256:" + "ab" * 32  # a well-formed digest for fields whose value no check recomputes

_PARK_REASONS = {
    "matches_prior_state": "reconcile_matches_prior_state",
    "diverged": "reconcile_diverged",
    "unreadable": "reconcile_unreadable",
}


def event(event_id: str, *, role: str, author: str, **fields: Any) -> RuntimeEvent:
    """A RuntimeEvent with the default identity; ``fields`` override or extend the envelope."""
    envelope: dict[str, Any] = {
        "id": event_id,
        "invocation_id": INVOCATION,
        "run_id": RUN,
        "session_id": SESSION,
        "turn_id": TURN,
        "ts": TS,
        "partial": False,
        "role": role,
        "author": author,
    }
    envelope.update({k: v for k, v in fields.items() if v is not None})
    return RuntimeEvent(**envelope)


def ids(session: str = SESSION, run: str = RUN, inv: str = INVOCATION, turn: str = TURN) -> dict[str, str]:
    """The envelope identity keywords, for ``**ids(run="run-2")`` on any builder."""
    return {"session_id": session, "run_id": run, "invocation_id": inv, "turn_id": turn}


def _given(**fields: Any) -> dict[str, Any]:
    """Only the fields that were given: wire models refuse null for an absent key."""
    return {k: v for k, v in fields.items() if v is not None}


def op_id(call_id: str) -> str:
    """The default operation id of a tool call."""
    return f"op-{call_id}"


def user(
    text: str = "list the files",
    *,
    id: str = "evt-user-1",
    protocol: Literal["t1_after_preflight_v1"] | None = TOOL_BOUNDARY_PROTOCOL,
    **envelope: Any,
) -> RuntimeEvent:
    """A user message; by default the run's first event, declaring the T1 protocol."""
    actions = Actions(runtime_protocol=RuntimeProtocol(tool_boundary=protocol)) if protocol else None
    return event(
        id,
        role=envelope.pop("role", "user"),
        author=envelope.pop("author", "user"),
        content=TextContent(text=text),
        actions=actions,
        **envelope,
    )


def text(message: str = "done", *, id: str = "evt-model-1", **envelope: Any) -> RuntimeEvent:
    """A model text message."""
    return event(
        id,
        role=envelope.pop("role", "model"),
        author=envelope.pop("author", "agent"),
        content=TextContent(text=message),
        **envelope,
    )


def call(
    call_id: str = "call-1",
    name: str = "Bash",
    args: dict[str, Any] | None = None,
    *,
    id: str | None = None,
    operation_id: str | None = None,
    **envelope: Any,
) -> RuntimeEvent:
    """A model function_call; ``operation_id`` adds the refs a T1 call carries."""
    refs = Refs(operation_id=operation_id, tool_call_id=call_id) if operation_id else None
    content = FunctionCallContent(id=call_id, name=name, args=DEFAULT_ARGS if args is None else args)
    return event(
        id or f"evt-{call_id}",
        role=envelope.pop("role", "model"),
        author=envelope.pop("author", "agent"),
        content=content,
        refs=refs,
        **envelope,
    )


def dispatch(
    call_id: str = "call-1",
    name: str = "Bash",
    args: dict[str, Any] | None = None,
    *,
    operation_id: str | None = None,
    id: str | None = None,
    recovery_mode: str = "never_auto_retry",
    args_hash: str | None = None,
    refs: Refs | None = None,
    **envelope: Any,
) -> RuntimeEvent:
    """The T1 dispatch fact for a call (hash recomputed from ``args`` unless given)."""
    op = operation_id or op_id(call_id)
    fact = ToolDispatch(
        operation_id=op,
        provider_tool_call_id=call_id,
        tool_name=name,
        canonical_args_hash=args_hash or canonical_args_hash(name, DEFAULT_ARGS if args is None else args),
        recovery_mode=recovery_mode,  # type: ignore[arg-type]
    )
    return event(
        id or f"{op}_dispatch",
        role=envelope.pop("role", "system"),
        author=envelope.pop("author", "system"),
        actions=Actions(tool_dispatch=fact),
        refs=refs or Refs(operation_id=op, tool_call_id=call_id),
        **envelope,
    )


def response(
    call_id: str = "call-1",
    name: str = "Bash",
    result: Any = "ok",
    *,
    operation_id: str | None = None,
    bound: bool = True,
    id: str | None = None,
    is_error: bool | None = None,
    **envelope: Any,
) -> RuntimeEvent:
    """A function_response; bound to ``op-<call>`` (a T2 outcome) unless ``bound=False``."""
    op = operation_id or op_id(call_id)
    refs = Refs(operation_id=op, tool_call_id=call_id) if bound else None
    content = FunctionResponseContent(**_given(id=call_id, name=name, is_error=is_error), result=result)
    return event(
        id or (f"{op}_response" if bound else f"evt-{call_id}-response"),
        role=envelope.pop("role", "tool"),
        author=envelope.pop("author", "tool"),
        content=content,
        refs=refs,
        **envelope,
    )


def terminal(status: str = "completed", *, id: str = "evt-terminal-1", **envelope: Any) -> RuntimeEvent:
    """The run's terminal fact."""
    content = (
        ErrorContent(message="runtime process exited", code="process_crashed") if status == "failed" else None
    )
    return event(
        id,
        role=envelope.pop("role", "system"),
        author=envelope.pop("author", "system"),
        status=status,
        content=content,
        actions=Actions(end_invocation=True),
        **envelope,
    )


def reconcile(
    call_id: str = "call-1",
    observation: str = "matches_expected_state",
    *,
    operation_id: str | None = None,
    id: str | None = None,
    **envelope: Any,
) -> RuntimeEvent:
    """A reconcile observation for an operation."""
    op = operation_id or op_id(call_id)
    fact = ToolRecovery(
        kind="maka.tool.reconcile_result",
        payload=ReconcileResult(
            operation_id=op,
            observation=observation,  # type: ignore[arg-type]
            observation_digest=digest(f"{op}:{observation}"),
        ),
    )
    return event(
        id or f"{op}_reconcile",
        role=envelope.pop("role", "system"),
        author=envelope.pop("author", "system"),
        actions=Actions(tool_recovery=fact),
        refs=Refs(operation_id=op, tool_call_id=call_id),
        **envelope,
    )


def decision(
    call_id: str = "call-1",
    evidence: list[str] | None = None,
    *,
    disposition: str = "completed",
    reason_code: str | None = None,
    outcome_event_id: str | None = None,
    operation_id: str | None = None,
    id: str | None = None,
    **envelope: Any,
) -> RuntimeEvent:
    """A terminal recovery decision; the reason defaults from the disposition."""
    op = operation_id or op_id(call_id)
    reason = reason_code or (
        "reconcile_matches_expected_state" if disposition == "completed" else "reconcile_matches_prior_state"
    )
    if disposition == "completed" and outcome_event_id is None:
        # The decoder refuses a completed decision that names no outcome (tool-recovery-fact.ts).
        outcome_event_id = f"{op}_recovered"
    if evidence is None:
        evidence = [f"evt-{call_id}", f"{op}_dispatch", f"{op}_reconcile"]
        if disposition == "completed":
            evidence.append(outcome_event_id or "")
    payload = RecoveryDecision(
        **_given(outcome_event_id=outcome_event_id),
        operation_id=op,
        disposition=disposition,  # type: ignore[arg-type]
        reason_code=reason,  # type: ignore[arg-type]
        evidence_event_ids=evidence,
    )
    fact = ToolRecovery(kind="maka.tool.recovery_decision", payload=payload)
    return event(
        id or f"{op}_decision",
        role=envelope.pop("role", "system"),
        author=envelope.pop("author", "system"),
        actions=Actions(tool_recovery=fact),
        refs=Refs(operation_id=op, tool_call_id=call_id),
        **envelope,
    )


def t1(
    call_id: str = "call-1",
    name: str = "Bash",
    args: dict[str, Any] | None = None,
    *,
    recovery_mode: str = "never_auto_retry",
    operation_id: str | None = None,
    **envelope: Any,
) -> list[RuntimeEvent]:
    """A T1 pair: the call (with operation refs) and its dispatch."""
    op = operation_id or op_id(call_id)
    return [
        call(call_id, name, args, operation_id=op, **envelope),
        dispatch(call_id, name, args, operation_id=op, recovery_mode=recovery_mode, **envelope),
    ]


def completed_bundle(
    call_id: str = "call-1",
    name: str = "Bash",
    result: Any = "recovered",
    *,
    suffix: str = "",
    operation_id: str | None = None,
    **envelope: Any,
) -> list[RuntimeEvent]:
    """reconcile(matches_expected_state) + recovered outcome + completed decision."""
    op = operation_id or op_id(call_id)
    rec = reconcile(
        call_id, "matches_expected_state", operation_id=op, id=f"{op}_reconcile{suffix}", **envelope
    )
    out = response(call_id, name, result, operation_id=op, id=f"{op}_recovered{suffix}", **envelope)
    dec = decision(
        call_id,
        [f"evt-{call_id}", f"{op}_dispatch", rec.id, out.id],
        disposition="completed",
        outcome_event_id=out.id,
        operation_id=op,
        id=f"{op}_decision{suffix}",
        **envelope,
    )
    return [rec, out, dec]


def parked_bundle(
    call_id: str = "call-1",
    observation: str = "matches_prior_state",
    *,
    suffix: str = "",
    operation_id: str | None = None,
    **envelope: Any,
) -> list[RuntimeEvent]:
    """reconcile(observation) + parked decision with the matching reason."""
    op = operation_id or op_id(call_id)
    rec = reconcile(call_id, observation, operation_id=op, id=f"{op}_reconcile{suffix}", **envelope)
    dec = decision(
        call_id,
        [f"evt-{call_id}", f"{op}_dispatch", rec.id],
        disposition="parked",
        reason_code=_PARK_REASONS[observation],
        operation_id=op,
        id=f"{op}_decision{suffix}",
        **envelope,
    )
    return [rec, dec]


# --- continuation fixtures (headers and ledgers as the planner's JSON) ------------------------

CWD = "/work/app"
WORKSPACE = "workspace:v1:6f1c2d3e-0000-4000-8000-000000000001"


def run_header(
    run_id: str = RUN,
    *,
    invocation_id: str = INVOCATION,
    turn_id: str = TURN,
    session_id: str = SESSION,
    status: str = "completed",
    **fields: Any,
) -> dict[str, Any]:
    """A Maka AgentRunHeader JSON object (only what the planner reads, plus timestamps)."""
    header: dict[str, Any] = {
        "runId": run_id,
        "invocationId": invocation_id,
        "sessionId": session_id,
        "turnId": turn_id,
        "status": status,
        "cwd": CWD,
        "workspaceIdentity": WORKSPACE,
        "createdAt": TS,
        "updatedAt": TS,
    }
    header.update(fields)
    return header


def wire(events: list[RuntimeEvent]) -> list[dict[str, Any]]:
    """A ledger as the planner's INPUT carries it: RuntimeEvent JSON objects in seq order."""
    return [e.to_wire() for e in events]


def continuation_claim(
    high_water: int, prefix_digest: str, *, n: str = "1", target: str = "2", **fields: Any
) -> ContinuationClaim:
    """A claim that run-1 of sess-1 continues as ``run-<target>``, bound to the source prefix a
    store reported (``store.prefix(...)``): ``claim-<n>``, its boundary digest keyed by ``n``."""
    return ContinuationClaim(
        claim_id=f"claim-{n}",
        source_session_id=SESSION,
        source_invocation_id=INVOCATION,
        source_run_id=RUN,
        source_turn_id=TURN,
        source_event_high_water=high_water,
        source_prefix_digest=prefix_digest,
        boundary_digest=digest(f"boundary-{n}"),
        boundary_json={"highWater": high_water},
        provider_replay_digest=DIGEST,
        target_session_id=SESSION,
        target_invocation_id=f"inv-{target}",
        target_run_id=f"run-{target}",
        target_turn_id=f"turn-{target}",
        **fields,
    )


def continuation_start(
    claim: ContinuationClaim, *, id: str = "evt-start", high_water: int | None = None, **envelope: Any
) -> RuntimeEvent:
    """The continuation-start fact a runtime admits for ``claim``, in the claim's target run; its
    immediate source is the claimed prefix unless ``high_water`` says otherwise."""
    fields: dict[str, Any] = {
        "session_id": claim.target_session_id,
        "invocation_id": claim.target_invocation_id,
        "run_id": claim.target_run_id,
        "turn_id": claim.target_turn_id,
        **envelope,
    }
    start = ContinuationStart(
        provenance="runtime_admission",
        claim_id=claim.claim_id,
        boundary_digest=claim.boundary_digest,
        immediate_source=ImmediateSource(
            session_id=claim.source_session_id,
            invocation_id=claim.source_invocation_id,
            run_id=claim.source_run_id,
            turn_id=claim.source_turn_id,
            high_water=claim.source_event_high_water if high_water is None else high_water,
            prefix_digest=claim.source_prefix_digest,
        ),
        replay_manifest_digest=DIGEST,
        provider_replay_digest=DIGEST,
    )
    return event(id, role="system", author="system", actions=Actions(continuation_start=start), **fields)
