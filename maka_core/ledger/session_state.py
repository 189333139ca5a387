"""A session's state as the ledger implies it: its tool calls as the Resolver classifies them, and
the state of its latest run (``derive_state``).

Pure functions of committed facts and run headers, shared by ``maka session status`` (through
``runtime.session_view``) and the session index the store keeps for ``maka session list``
(``store.session_index``), so the two answer the same for the same ledger by construction. Kept
below ``runtime`` and ``store``: the store imports it inside its writer transaction.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, get_args

from maka_core.facts.events import RuntimeEvent
from maka_core.facts.run_header import RunHeader
from maka_core.ledger.resolver import resolve
from maka_core.ledger.scanner import scan
from maka_core.runtime.contracts import PARK_REASONS, TURN_CANCELLED, SessionState
from maka_core.runtime.resolution import is_resolution_run

__all__ = [
    "SHOWN_STATES",
    "OperationView",
    "SETTLED_OPERATION_STATUSES",
    "ShownState",
    "derive_state",
    "latest_run",
    "operations",
    "turn_cancelled",
    "unresolved_park_reason",
]

#: The state ``maka session status`` and ``maka session list`` show: the session's own
#: (``SessionState``), or ``awaiting_approval`` while a running turn's request waits for an answer.
ShownState = Literal["idle", "running", "awaiting_approval", "parked", "failed"]
SHOWN_STATES: tuple[str, ...] = get_args(ShownState)

#: Resolver statuses that leave nothing for an operator: the call ran and its outcome is committed,
#: or it provably never ran.
SETTLED_OPERATION_STATUSES = frozenset({"completed", "definitely_not_dispatched"})


@dataclass(frozen=True)
class OperationView:
    operation_id: str | None
    tool_call_id: str
    tool_name: str | None
    run_id: str
    status: str
    reason: str
    is_error: bool
    call_event_id: str | None
    dispatch_event_id: str | None
    response_event_id: str | None
    canonical_args_hash: str | None

    def to_json(self) -> dict[str, Any]:
        return {
            "operationId": self.operation_id,
            "toolName": self.tool_name,
            "toolCallId": self.tool_call_id,
            "runId": self.run_id,
            "status": self.status,
            "reason": self.reason,
            "isError": self.is_error,
            "callEventId": self.call_event_id,
            "dispatchEventId": self.dispatch_event_id,
            "responseEventId": self.response_event_id,
            "canonicalArgsHash": self.canonical_args_hash,
        }


def latest_run(runs: list[RunHeader]) -> RunHeader | None:
    """The session's latest turn (an operator's resolution run is not a turn)."""
    turns = [r for r in runs if not is_resolution_run(r.run_id)]
    return max(turns, key=lambda r: (r.created_at, r.updated_at)) if turns else None


def derive_state(
    runs: list[RunHeader],
    ops: list[OperationView] | None = None,
    events: list[RuntimeEvent] | None = None,
) -> tuple[SessionState, str | None]:
    """The session state the ledger implies: that of its latest run.

    A run that ended while one of its operations is still unresolved (an old repair that did not
    recover it, an imported ledger) parks the session: the way forward is an operator's, and
    ``failed`` would invite a blind retry. A ``cancelled`` run is ``idle`` only when ``events``
    hold its terminal fact and that fact is a ``cancel_turn`` (:func:`turn_cancelled`).
    """
    last = latest_run(runs)
    if last is None:
        return "idle", None
    if last.status == "running":
        return "running", None
    if last.park_reason or last.status == "parked":
        return "parked", last.park_reason
    unresolved = next(
        (o for o in ops or () if o.run_id == last.run_id and o.status not in SETTLED_OPERATION_STATUSES),
        None,
    )
    if unresolved is not None:
        return "parked", unresolved_park_reason(unresolved.status, unresolved.reason)
    if last.status == "failed" or (last.status == "cancelled" and not turn_cancelled(last.run_id, events)):
        return "failed", None
    return "idle", None  # completed, or cancelled by ``cancel_turn``: the session takes the next message


def turn_cancelled(run_id: str, events: list[RuntimeEvent] | None) -> bool:
    """Whether run ``run_id`` ended by ``cancel_turn`` (its terminal fact's code is
    ``turn_cancelled``), not by an older writer's ``aborted``/``cancelled`` end."""
    end = next((e for e in reversed(events or ()) if e.run_id == run_id and e.is_terminal), None)
    return (
        end is not None and end.content is not None and getattr(end.content, "code", None) == TURN_CANCELLED
    )


def unresolved_park_reason(status: str, reason: str) -> str:
    """The park an unresolved operation means (as ``recovery.park_reason_for`` names it)."""
    if status == "corruption":
        return "ledger_corruption"
    if status == "parked":
        return reason if reason.startswith("reconcile_") else "recovery_parked"
    return reason if reason in PARK_REASONS else "dispatch_without_response"


def operations(events: list[RuntimeEvent]) -> list[OperationView]:
    """Every tool call of these events as the Resolver classifies it, in call order."""
    by_id = {e.id: e for e in events}
    views: list[OperationView] = []
    # A session holds many runs: judge each run's protocol marker on its own first event.
    for op in resolve(scan(events, protocol_scope="run")).operations:
        call = by_id.get(op.call_event_id or "")
        dispatch = by_id.get(op.dispatch_event_id or "")
        op_id = op.operation_id or (call.refs.operation_id if call is not None and call.refs else None)
        run_id = (call or dispatch).run_id if (call or dispatch) is not None else ""  # type: ignore[union-attr]
        args_hash = None
        if (
            dispatch is not None
            and dispatch.actions is not None
            and dispatch.actions.tool_dispatch is not None
        ):
            args_hash = dispatch.actions.tool_dispatch.canonical_args_hash
        views.append(
            OperationView(
                operation_id=op_id,
                tool_call_id=op.tool_call_id,
                tool_name=op.tool_name,
                run_id=run_id,
                status=op.status,
                reason=op.reason,
                is_error=bool(op.response_is_error),
                call_event_id=op.call_event_id,
                dispatch_event_id=op.dispatch_event_id,
                response_event_id=op.response_event_id,
                canonical_args_hash=args_hash,
            )
        )
    return views
