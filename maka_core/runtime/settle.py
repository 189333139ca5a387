"""Run headers (the operational envelope of one execution attempt) and startup repair.

A header says which Temporal execution hosted a Maka run and how it ended; it is never the
authority on outcomes. The terminal RuntimeEvent always commits before the terminal header, so a
crash between the two leaves a header that *lags* the ledger, which repair fixes from the event.
A run left with no terminal event at all gets one recovered terminal event first, built
deterministically (id ``<runId>_terminal``, ts of the run's last event) so that two processes
repairing the same run converge through exact-retry idempotency instead of racing.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

from maka_core.errors import LedgerRejection, StoreError
from maka_core.facts.clock import now_ms
from maka_core.facts.events import Actions, ErrorContent, RuntimeEvent
from maka_core.facts.run_header import RunHeader, RunStatus, header_status_for

if TYPE_CHECKING:
    from maka_core.store.ledger import Ledger

#: The recovered terminal event's user-visible message per repair reason.
_REPAIR_MESSAGES: dict[str, str] = {
    "process_crashed": "runtime process exited before the turn settled",
}


@dataclass(frozen=True)
class RepairResult:
    """What ``repair_run`` did: the terminal event it found or committed, and the header."""

    run_id: str
    terminal_event_id: str
    terminal_committed: bool
    header_status: RunStatus
    header_updated: bool


def recovered_terminal_event(last: RuntimeEvent, run_id: str, reason: str) -> RuntimeEvent:
    """The terminal event repair commits for a run that never settled (example 02's shape)."""
    return RuntimeEvent(
        id=f"{run_id}_terminal",
        invocation_id=last.invocation_id,
        run_id=run_id,
        session_id=last.session_id,
        turn_id=last.turn_id,
        ts=last.ts,
        partial=False,
        role="system",
        author="system",
        status="failed",
        content=ErrorContent(
            code=reason,
            message=_REPAIR_MESSAGES.get(reason, f"run repaired after it stopped: {reason}"),
            reason=reason,
        ),
        actions=Actions(
            end_invocation=True,
            state_delta={"failureClass": reason, "recovered": True, "recoveryReason": reason},
        ),
    )


def _header_anchor(header: RunHeader, run_id: str) -> RuntimeEvent:
    # A run whose header exists but which never committed an event: anchor the terminal event on
    # the header's identity and creation time.
    return RuntimeEvent(
        id=f"{run_id}_anchor",
        invocation_id=header.invocation_id,
        run_id=run_id,
        session_id=header.session_id,
        turn_id=header.turn_id,
        ts=header.created_at,
        partial=False,
        role="system",
        author="system",
    )


#: How many times a terminal fact is bound to the run's checkpoint before its commit gives up: a
#: binding goes stale only when another fact of the run lands in between
#: (``checkpoint_boundary_stale``).
BIND_ATTEMPTS: Final = 3


def park_reason_of(terminal: RuntimeEvent) -> str | None:
    """The park reason a terminal fact records (``stateDelta.parkReason``), if it is a park."""
    delta = terminal.actions.state_delta if terminal.actions is not None else None
    if not isinstance(delta, dict) or delta.get("failureClass") != "parked":
        return None
    reason = delta.get("parkReason")
    return reason if isinstance(reason, str) else None


def settle_run(
    store: Ledger,
    candidate: RuntimeEvent,
    *,
    existing: RuntimeEvent | None = None,
    between: Callable[[], None] | None = None,
) -> RepairResult:
    """Settle a run: its terminal RuntimeEvent first, then a header that follows that fact.

    The one way a run ends, shared by ``finish_run`` (the workflow's own terminal fact) and startup
    repair (a recovered one). ``candidate`` commits unless the run already has a terminal fact
    (``existing``, or one another process committed meanwhile: ``run_already_terminal``), in which
    case that fact stands and only the header follows it. ``between`` runs after the terminal fact
    and before the header (failpoint P9's place).
    """
    run_id = candidate.run_id
    committed = False
    terminal = existing
    if terminal is None:
        try:
            committed = store.commit_terminal(candidate).created
            terminal = candidate
        except LedgerRejection as exc:
            if exc.code != "run_already_terminal":
                raise
            terminal = next(e for e in reversed(store.events(run_id=run_id)) if e.is_terminal)
    if between is not None:
        between()
    status, park = header_status_for(terminal), park_reason_of(terminal)
    header = store.get_run(run_id)
    updated = False
    if header is None:
        store.put_run(
            RunHeader(
                session_id=terminal.session_id,
                run_id=run_id,
                invocation_id=terminal.invocation_id,
                turn_id=terminal.turn_id,
                status=status,
                park_reason=park,
                created_at=terminal.ts,
                updated_at=now_ms(),
            )
        )
        updated = True
    elif (header.status, header.park_reason) != (status, park):
        # A header lags its terminal fact after a crash between the two; it never leads it.
        store.put_run(
            header.model_copy(update={"status": status, "park_reason": park, "updated_at": now_ms()})
        )
        updated = True
    return RepairResult(
        run_id=run_id,
        terminal_event_id=terminal.id,
        terminal_committed=committed,
        header_status=status,
        header_updated=updated,
    )


def repair_run(store: Ledger, run_id: str, reason: str = "process_crashed") -> RepairResult:
    """Settle one run after a crash: a recovered terminal fact unless it has one, then the header.

    Raises:
        StoreError: the ledger cannot be read (nothing is written), or the run is unknown.
    """
    header = store.get_run(run_id)
    events = store.events(run_id=run_id)  # a StoreError here leaves everything untouched
    if header is None and not events:
        raise StoreError("run_not_found", f"no header and no events for run {run_id}", runId=run_id)
    existing = next((e for e in reversed(events) if e.is_terminal), None)
    anchor = events[-1] if events else _header_anchor(header, run_id)  # type: ignore[arg-type]
    return settle_run(store, recovered_terminal_event(anchor, run_id, reason), existing=existing)


def repair_all(
    store: Ledger,
    is_open: Callable[[RunHeader], bool] = lambda run: False,
    reason: str = "process_crashed",
) -> list[RepairResult]:
    """Repair every running run whose hosting workflow is not still running (worker startup).

    Parked runs are left alone: a park is an operator's decision point and its reason must
    survive until someone resolves it (``repair_run`` by id still settles one explicitly).
    Runs with events but no header are not visible here; they are repaired when found by id.
    """
    results: list[RepairResult] = []
    for run in store.list_runs(nonterminal=True):
        if run.status != "running" or is_open(run):
            continue
        results.append(repair_run(store, run.run_id, reason))
    return results
