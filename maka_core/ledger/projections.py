"""The tool projections (``tool_operations``, ``tool_journal_events``) as pure functions of facts.

The store calls the same functions after each writer transaction and in a rebuild, so the
online projection and the rebuilt one agree by construction. Only operations with a T1 dispatch
fact are projected (a pre-T1 call has no operation row). Journal identities are derived here,
never taken from callers: ``<op>_prepared`` for T1, ``<op>_outcome`` for the bound outcome and
``<eventId>_journal`` for each recovery fact, whose ``metadata_json`` is the canonical
``toolRecovery`` JSON.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from maka_core.facts import canonical_json
from maka_core.facts.events import RecoveryDecision, RuntimeEvent
from maka_core.ledger.scanner import LedgerScanner, OperationFacts, OperationState

JournalState = Literal[
    "prepared", "reconcile_observed", "outcome_committed", "recovery_completed", "recovery_parked"
]


@dataclass(frozen=True)
class OperationRow:
    """One ``tool_operations`` row."""

    operation_id: str
    invocation_id: str
    run_id: str
    turn_id: str
    provider_tool_call_id: str
    tool_name: str
    canonical_args_hash: str
    recovery_mode: str
    current_state: OperationState
    call_event_id: str | None
    dispatch_event_id: str
    result_event_id: str | None
    version: int


@dataclass(frozen=True)
class JournalRow:
    """One ``tool_journal_events`` row (``committed_at`` is the store's own column)."""

    journal_event_id: str
    operation_id: str
    invocation_id: str
    run_id: str
    turn_id: str
    state: JournalState
    runtime_event_id: str
    canonical_args_hash: str
    recovery_mode: str
    external_handle: str | None
    metadata_json: str | None


def _tail(facts: OperationFacts) -> list[tuple[RuntimeEvent, JournalState]]:
    """Journal-worthy events after T1, in the order they appear in the operation's facts.

    Recovery rows come only from the first reconcile and decision: a ledger with more is corrupt
    and the store refuses to project it.
    """
    items: list[tuple[RuntimeEvent, JournalState]] = []
    if facts.reconcile is not None:
        items.append((facts.reconcile, "reconcile_observed"))
    if facts.response is not None:
        items.append((facts.response, "outcome_committed"))
    decision = facts.decision
    if decision is not None:
        payload = (
            decision.actions.tool_recovery.payload
            if decision.actions and decision.actions.tool_recovery
            else None
        )
        parked = isinstance(payload, RecoveryDecision) and payload.disposition == "parked"
        items.append((decision, "recovery_parked" if parked else "recovery_completed"))
    # This is ledger order for every admissible ledger: a valid bundle commits reconcile <
    # outcome < decision, and a normal T2 outcome has no recovery tail.
    return items


def operation_row(facts: OperationFacts) -> OperationRow | None:
    """The ``tool_operations`` row for an operation, or None before T1."""
    dispatch = facts.dispatch
    if dispatch is None or dispatch.actions is None or dispatch.actions.tool_dispatch is None:
        return None
    td = dispatch.actions.tool_dispatch
    state = facts.state
    assert state is not None
    return OperationRow(
        operation_id=td.operation_id,
        invocation_id=dispatch.invocation_id,
        run_id=dispatch.run_id,
        turn_id=dispatch.turn_id,
        provider_tool_call_id=td.provider_tool_call_id,
        tool_name=td.tool_name,
        canonical_args_hash=td.canonical_args_hash,
        recovery_mode=td.recovery_mode,
        current_state=state,
        call_event_id=facts.call.id if facts.call is not None else None,
        dispatch_event_id=dispatch.id,
        result_event_id=facts.response.id if facts.response is not None else None,
        version=1 + len(_tail(facts)),
    )


def journal_rows(facts: OperationFacts) -> list[JournalRow]:
    """The ``tool_journal_events`` rows for an operation, in journal order."""
    dispatch = facts.dispatch
    if dispatch is None or dispatch.actions is None or dispatch.actions.tool_dispatch is None:
        return []
    td = dispatch.actions.tool_dispatch
    op_id = td.operation_id

    def row(event: RuntimeEvent, state: JournalState, journal_id: str) -> JournalRow:
        recovery = event.actions.tool_recovery if event.actions is not None else None
        return JournalRow(
            journal_event_id=journal_id,
            operation_id=op_id,
            invocation_id=event.invocation_id,
            run_id=event.run_id,
            turn_id=event.turn_id,
            state=state,
            runtime_event_id=event.id,
            canonical_args_hash=td.canonical_args_hash,
            recovery_mode=td.recovery_mode,
            external_handle=None,
            metadata_json=canonical_json.dumps(recovery.to_wire()) if recovery is not None else None,
        )

    rows = [row(dispatch, "prepared", f"{op_id}_prepared")]
    for event, state in _tail(facts):
        journal_id = f"{op_id}_outcome" if state == "outcome_committed" else f"{event.id}_journal"
        rows.append(row(event, state, journal_id))
    return rows


def project(scanner: LedgerScanner) -> tuple[list[OperationRow], list[JournalRow]]:
    """Every projected row of a scanned ledger (operations in ledger order)."""
    operations: list[OperationRow] = []
    journal: list[JournalRow] = []
    for facts in scanner.operations():
        op = operation_row(facts)
        if op is None:
            continue
        operations.append(op)
        journal.extend(journal_rows(facts))
    # Journal order is commit order (the online writer appends each batch's rows as it commits),
    # which for an admitted ledger is the ledger order of the events the rows follow.
    positions = scanner.positions
    journal.sort(key=lambda row: positions.get(row.runtime_event_id, -1))
    return operations, journal
