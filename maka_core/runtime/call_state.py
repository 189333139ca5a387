"""A tool call as the committed ledger knows it, and the guard's refusals.

The orchestrator names a call by its ids; everything else (its run's identities, the Resolver's
decision on its operation, its arguments) is read from the committed view here, never carried.
``CallNotFound`` and ``DispatchWithoutOutcome`` are the guard's answers when the ledger does not
hold the call, or holds its dispatch fact without an outcome (only recovery may settle it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from maka_core.errors import MakaError
from maka_core.ledger.committed import CommittedView
from maka_core.ledger.resolver import OperationResolution
from maka_core.ledger.scanner import OperationFacts
from maka_core.runtime.contracts import RunIds, ToolOutcome


class CallNotFound(MakaError):
    """The orchestrator names a call the ledger does not hold (the model step never committed it)."""

    default_code = "call_not_found"


class DispatchWithoutOutcome(MakaError):
    """The call has a dispatch fact and no outcome: running it again could repeat its effect."""

    default_code = "dispatch_without_outcome"



@dataclass(frozen=True)
class CallState:
    """A call as the committed ledger knows it: identities, the Resolver's decision, its facts."""

    ids: RunIds
    op: OperationResolution
    facts: OperationFacts


def run_ids(view: CommittedView, session_id: str, run_id: str) -> RunIds | None:
    """The run's ids as its first event committed them (None: the ledger does not hold the run)."""
    first = view.first_of_run.get(run_id)
    if first is None:
        return None
    return RunIds(
        session_id=session_id, turn_id=first.turn_id, run_id=run_id, invocation_id=first.invocation_id
    )


def call_state(view: CommittedView, session_id: str, run_id: str, tool_call_id: str) -> CallState | None:
    """Look a call up in the committed view (None: the ledger does not hold it)."""
    ids = run_ids(view, session_id, run_id)
    if ids is None:
        return None
    found = view.call(ids.invocation_id, tool_call_id)
    if found is None:
        return None
    op, facts = found
    return CallState(ids, op, facts)


def settled_outcome(op: OperationResolution, operation_id: str, *, replayed: bool) -> ToolOutcome:
    return ToolOutcome(
        operation_id=op.operation_id or operation_id,
        status="refused" if op.settlement_origin == "pre_t1_synthetic" else "completed",
        is_error=bool(op.response_is_error) or None,
        dispatch_event_id=op.dispatch_event_id,
        response_event_id=op.response_event_id,
        replayed=replayed or None,
    )


def committed_args(facts: OperationFacts) -> Any:
    """The arguments of the committed call (any JSON value on the wire)."""
    call = facts.call
    assert call is not None and call.content is not None and call.content.kind == "function_call"
    return call.content.args



__all__ = [
    "CallNotFound",
    "CallState",
    "DispatchWithoutOutcome",
    "call_state",
    "committed_args",
    "run_ids",
    "settled_outcome",
]
