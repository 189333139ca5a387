"""Operator resolution of a parked operation: an attested, append-only answer, never a blind retry.

A parked operation (a bash with T1 and no T2, a reconcile that found the prior state...) has no
outcome the runtime can prove. An operator who can (they looked at the target) records one of
``applied`` (the effect happened: it counts as done), ``not_applied`` (it did not: the model may
ask for it again as a NEW call; the runtime never re-runs it) or ``abandon`` (leave it; the
model is told so). The resolution is its own fact in its own run (``resolution-<uuid>``, one
terminal system event carrying ``stateDelta.operatorResolution``), so no existing fact is
rewritten and the parked run's prefix stays immutable; it names the parked fact it answers and
attests the parked run's prefix (digest and high-water) as the operator saw it. The planner then
settles that operation in its replay (``ledger.provider_replay``: the call followed by a result
stating the decision) and reports it as the diagnostic ``operation_resolved``; the model step's
history shows the same result (``resolved_history``).
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from typing import Any, Final, Literal, get_args

from maka_core.errors import MakaError
from maka_core.facts.bounds import OPERATOR_NAME, OPERATOR_REASON, TextBound
from maka_core.facts.clock import now_ms
from maka_core.facts.events import Actions, FunctionResponseContent, RuntimeEvent, TextContent
from maka_core.facts.run_header import RunHeader
from maka_core.ledger.digests import read_prefix
from maka_core.ledger.resolver import FOR_OPERATOR, OperationResolution, resolve

RESOLUTION_PREFIX: Final[str] = "resolution-"
RESOLUTION_KEY: Final[str] = "operatorResolution"
RESOLUTION_PROTOCOL: Final[str] = "maka.operator_resolution.v1"
Decision = Literal["applied", "not_applied", "abandon"]
DECISIONS: Final[tuple[str, ...]] = get_args(Decision)

_NOTES = {
    "applied": "The operator confirmed this call took effect; treat it as done.",
    "not_applied": "The operator confirmed this call did NOT take effect; call it again if still needed.",
    "abandon": "The operator abandoned this call; do not assume it took effect.",
}


#: Bounds on what an operator records: the name and the reason are one line of a transcript each
#: (declared once, in ``maka_core.facts.bounds``, with the Update inputs' ``by`` and ``reason``).
MAX_RESOLVED_BY: Final[int] = OPERATOR_NAME.max_chars
MAX_REASON: Final[int] = OPERATOR_REASON.max_chars


def check_resolution_text(text: str, option: str, bound: TextBound) -> str:
    """Refuse an operator's ``--by`` / ``--reason`` that could forge or hide a line: empty, longer
    than the bound, or not one printable line (a control character, newline and tab included, a
    surrogate from an argument that was not UTF-8, a line separator or a bidi control).

    Raises:
        MakaError: ``config_invalid``, naming the option.
    """
    why = bound.problem(text)
    if why is not None:
        raise MakaError("config_invalid", f"{option} {why}", option=option)
    return text


def unsettled_operations(events: Sequence[RuntimeEvent]) -> list[tuple[str, OperationResolution]]:
    """(run id, decision) of every operation the Resolver leaves indeterminate or parked."""
    by_run: dict[str, list[RuntimeEvent]] = {}
    for event in events:
        by_run.setdefault(event.run_id, []).append(event)
    return [
        (run_id, op)
        for run_id, run_events in by_run.items()
        for op in resolve(run_events).operations
        if op.status in FOR_OPERATOR
    ]


def operator_fact(
    session_id: str,
    *,
    name: str,
    key: str,
    payload: Mapping[str, Any],
    now: int,
    hidden: bool = False,
    note: str | None = None,
) -> tuple[RuntimeEvent, RunHeader]:
    """An operator's fact as a run of its own in the resolution lane (``resolution-<uuid>``, which
    no workflow begins): its one terminal event (``<run>_<name>``, ``state_delta`` ``{key:
    payload}``) and its header, for ``store.commit_terminal(event, header)``, one transaction (a
    kill between the fact and its header would leave ``run_header_missing``). ``hidden``: the
    model never sees it; ``note``: a host-authored user text the model's history holds instead."""
    run = f"{RESOLUTION_PREFIX}{uuid.uuid4()}"
    extra: dict[str, Any] = {}  # set only when given: an unset field is encoded as before
    if hidden:
        extra["model_visibility"] = "hidden"
    if note is not None:
        extra["content"] = TextContent(text=note)
    event = RuntimeEvent(
        id=f"{run}_{name}",
        session_id=session_id,
        invocation_id=f"inv-{run}",
        run_id=run,
        turn_id=f"turn-{run}",
        ts=now,
        partial=False,
        role="system" if note is None else "user",
        author="host",
        status="completed",
        actions=Actions(end_invocation=True, state_delta={key: dict(payload)}),
        **extra,
    )
    header = RunHeader(
        session_id=session_id,
        run_id=run,
        invocation_id=event.invocation_id,
        turn_id=event.turn_id,
        status="completed",
        created_at=now,
        updated_at=now,
    )
    return event, header


def is_resolution_run(run_id: str) -> bool:
    return run_id.startswith(RESOLUTION_PREFIX)


def resolution_payload(event: RuntimeEvent) -> dict[str, Any] | None:
    delta = event.actions.state_delta if event.actions is not None else None
    payload = delta.get(RESOLUTION_KEY) if isinstance(delta, Mapping) else None
    if isinstance(payload, Mapping) and payload.get("protocol") == RESOLUTION_PROTOCOL:
        return dict(payload)
    return None


def resolutions_of(events: Sequence[RuntimeEvent]) -> dict[str, dict[str, Any]]:
    """Operation id -> the replay view of its resolution (the first one stands)."""
    out: dict[str, dict[str, Any]] = {}
    for event in events:
        # The run id first: one prefix test per event, the payload only in an operator's run.
        if not is_resolution_run(event.run_id):
            continue
        payload = resolution_payload(event)
        if payload is None:
            continue
        op_id = payload.get("operationId")
        if isinstance(op_id, str) and op_id not in out:
            out[op_id] = {
                "decision": payload.get("decision"),
                "resolvedBy": payload.get("resolvedBy"),
                "reason": payload.get("reason"),
                "eventId": event.id,
                "ts": event.ts,
                "runId": payload.get("runId"),
                "parkedEventId": payload.get("parkedEventId"),
                "resolvedAt": payload.get("resolvedAt"),
            }
    return out


def resolve_operation(
    store: Any,
    session_id: str,
    operation_id: str,
    decision: str,
    resolved_by: str,
    reason: str,
) -> dict[str, Any]:
    """Record an operator's resolution of a parked operation; returns the recorded payload.

    Raises:
        MakaError: ``session_not_found``, ``operation_not_parked`` (unknown, settled, or its run
            has not ended), ``already_resolved``, ``config_invalid`` (decision; a name or reason that is
            empty, too long or not one printable line: ``check_resolution_text``).
    """
    if decision not in DECISIONS:
        raise MakaError("config_invalid", f"--decision must be one of {', '.join(DECISIONS)}")
    check_resolution_text(resolved_by, "--by", OPERATOR_NAME)
    check_resolution_text(reason, "--reason", OPERATOR_REASON)
    events = store.events(session_id=session_id)
    if not events:
        raise MakaError("session_not_found", f"no session {session_id}", sessionId=session_id)
    if operation_id in resolutions_of(events):
        raise MakaError(
            "already_resolved", f"operation {operation_id} is already resolved", operationId=operation_id
        )
    found = next(
        ((run_id, op) for run_id, op in unsettled_operations(events) if op.operation_id == operation_id), None
    )
    if found is None:
        raise MakaError(
            "operation_not_parked", f"operation {operation_id} is not parked", operationId=operation_id
        )
    run_id, op = found
    run_events = [e for e in events if e.run_id == run_id]
    terminal = next((e for e in reversed(run_events) if e.is_terminal), None)
    header = store.get_run(run_id)
    if terminal is None or header is None or not header.is_terminal:
        raise MakaError(
            "operation_not_parked",
            f"the run of operation {operation_id} has not ended (resume or repair it first)",
            operationId=operation_id,
        )
    prefix = read_prefix(run_events)
    now = now_ms()
    payload = {
        "protocol": RESOLUTION_PROTOCOL,
        "version": 1,
        "sessionId": session_id,
        "runId": run_id,
        "operationId": operation_id,
        "toolCallId": op.tool_call_id,
        "toolName": op.tool_name,
        "resolverStatus": op.status,
        "resolverReason": op.reason,
        "parkedEventId": terminal.id,
        "attestedPrefix": {"highWater": prefix.last_event_seq, "prefixDigest": prefix.digest},
        "decision": decision,
        "resolvedBy": resolved_by,
        "reason": reason,
        "resolvedAt": now,
    }
    event, header = operator_fact(session_id, name="resolution", key=RESOLUTION_KEY, payload=payload, now=now)
    store.commit_terminal(event, header)
    return {**payload, "resolutionEventId": event.id, "resolutionRunId": event.run_id}


def resolved_history(history: list[RuntimeEvent], events: Sequence[RuntimeEvent]) -> list[RuntimeEvent]:
    """The model step's history with each resolved call and a result stating the decision
    (in memory only; nothing here is committed). ``history`` is ``legal_replay(events)``."""
    resolved = resolutions_of(events)
    if not resolved:
        return history
    calls = {
        e.refs.operation_id: e
        for e in events
        if e.content is not None and e.content.kind == "function_call" and e.refs is not None
        and e.refs.operation_id in resolved
    }  # fmt: skip
    position = {e.id: i for i, e in enumerate(events)}
    present = {e.id for e in history}
    out = list(history)
    for op_id, call in calls.items():
        if call.id in present or call.content is None or call.content.kind != "function_call":
            continue
        r = resolved[op_id]
        note = f"{_NOTES.get(str(r['decision']), '')} Operator {r['resolvedBy']}: {r['reason']}"
        response = call.model_copy(
            update={
                "id": f"{r['eventId']}:result",
                "role": "tool",
                "author": "tool",
                "refs": None,
                "content": FunctionResponseContent(
                    id=call.content.id,
                    name=call.content.name,
                    result={"kind": "text", "text": note.strip()},
                    is_error=r["decision"] != "applied",
                ),
            }
        )
        # Where the call stood in the ledger: before the first later event the history keeps.
        at = next((i for i, e in enumerate(out) if position.get(e.id, -1) > position[call.id]), len(out))
        out[at:at] = [call, response]
    return out
