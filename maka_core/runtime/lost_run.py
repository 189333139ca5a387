"""A run whose workflow execution is lost is settled, not abandoned.

Startup repair and ``maka resume`` close a run whose hosting execution is closed or gone. Before
its terminal fact, every operation of the run goes through the same recovery as the live path
(``recovery.recover_operation``): a read-only call with T1 and no T2 is read again, a file tool is
reconciled from its committed evidence (one atomic bundle), and a tool without a reconciler
parks. The terminal fact then records the first park (``failureClass: parked``), so the session
shows ``parked`` with a stable reason, never ``failed``.

The session's own settings (workspace, its identity, its ``SessionConfig``) ride on each run's user event
as ``stateDelta.makaSession`` (``session_record``), so the ledger alone can carry a session whose
Temporal history is gone.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Final

from maka_core import failpoints
from maka_core.errors import LedgerRejection, StoreError
from maka_core.facts.events import Actions, ErrorContent, RuntimeEvent
from maka_core.ledger.resolver import resolve
from maka_core.ledger.scanner import scan
from maka_core.runtime import builders
from maka_core.runtime.contracts import CallRef, ParkReason, RecoverInput
from maka_core.runtime.recovery import park_reason_for, recover_operation
from maka_core.runtime.runtime import Attempt, Runtime

# Re-exported: their home is ``session_record`` (the store's session index reads them too).
from maka_core.runtime.session_record import SESSION_KEY as SESSION_KEY
from maka_core.runtime.session_record import SessionRecord as SessionRecord
from maka_core.runtime.session_record import session_record as session_record
from maka_core.runtime.settle import (
    BIND_ATTEMPTS,
    RepairResult,
    _header_anchor,
    recovered_terminal_event,
    settle_run,
)

#: Operation statuses that need no recovery (the Resolver settled them, or they never ran).
_SETTLED: Final[frozenset[str]] = frozenset({"completed", "definitely_not_dispatched"})

#: What a recovered terminal fact carries before it commits: the host binds the workspace's
#: checkpoint (``workspace_continuity.bind_terminal_async``, artifact first, then the fact).
Binder = Callable[[Runtime, RuntimeEvent], Awaitable[RuntimeEvent]]


async def unbound(rt: Runtime, terminal: RuntimeEvent) -> RuntimeEvent:
    """A terminal fact as it is: no workspace binding (a repair without a workspace host)."""
    return terminal


def in_flight_operations(events: list[RuntimeEvent]) -> list[str]:
    """Operations of a run with T1 and no outcome: their tool may still be running somewhere (a
    zombie attempt of a closed execution), so the run is settled only once it cannot be
    (``workers.host.attempt_fence``)."""
    return [
        op.operation_id
        for op in resolve(scan(events)).operations
        if op.operation_id is not None
        and op.status == "indeterminate"
        and op.reason == "dispatch_without_response"
    ]


@dataclass(frozen=True)
class LostRunResult:
    """What settling a lost run did: the repair, and the park it recorded (if any)."""

    repair: RepairResult
    park_reason: ParkReason | None
    parked_operation_id: str | None
    recovered: tuple[str, ...]


def parked_terminal_event(
    last: RuntimeEvent, run_id: str, reason: ParkReason, operation_id: str | None
) -> RuntimeEvent:
    """The recovered terminal fact of a lost run that parks (deterministic id, like repair's)."""
    base = recovered_terminal_event(last, run_id, "process_crashed")
    delta: dict[str, Any] = {
        "failureClass": "parked",
        "parkReason": reason,
        "recovered": True,
        "recoveryReason": "execution_lost",
    }
    if operation_id:
        delta["operationId"] = operation_id
    return base.model_copy(
        update={
            "content": ErrorContent(
                code=reason, message=builders.parked_message(operation_id, reason), reason=reason
            ),
            "actions": Actions(end_invocation=True, state_delta=delta),
        }
    )


async def settle_lost_run(
    rt: Runtime,
    run_id: str,
    record: SessionRecord | None,
    *,
    untrusted: ParkReason | None = None,
    bind: Binder = unbound,
) -> LostRunResult:
    """Recover every unsettled operation of ``run_id``, then commit its terminal fact and header.

    A run that already has a terminal fact only gets its header brought in line. Recovery never
    re-runs a side effect; without a session record (no workspace to observe) an unsettled
    operation parks with ``workspace_unavailable``. ``untrusted``: the session's facts cannot be
    trusted (``ledger_chain_broken``): no operation is recovered, the run parks with this reason.
    ``bind``: what the recovered terminal fact carries (the workspace host binds its checkpoint, so
    a run lost mid-turn gets the same content gate as one that ended).

    Raises:
        StoreError: ``run_not_found`` (no header and no events), or the ledger cannot be read.
    """
    store = rt.ledger
    header, events = await rt.on_ledger(lambda: (store.get_run(run_id), store.events(run_id=run_id)))
    if header is None and not events:
        raise StoreError("run_not_found", f"no header and no events for run {run_id}", runId=run_id)
    existing = next((e for e in reversed(events) if e.is_terminal), None)
    park: ParkReason | None = untrusted
    parked_op: str | None = None
    recovered: list[str] = []
    if existing is None and events and untrusted is None:
        session_id = events[0].session_id
        for op in resolve(scan(events)).operations:
            if op.status in _SETTLED:
                continue
            if op.status in ("parked", "corruption") or record is None or op.operation_id is None:
                reason: ParkReason = park_reason_for(op) if record is not None else "workspace_unavailable"
                park, parked_op = park or reason, parked_op or op.operation_id
                continue
            try:
                result = await recover_operation(
                    rt,
                    RecoverInput(
                        session_id=session_id,
                        run_id=run_id,
                        call=CallRef(
                            tool_call_id=op.tool_call_id,
                            operation_id=op.operation_id,
                            tool_name=op.tool_name or "",
                        ),
                        workspace=record.workspace,
                        workspace_identity=record.workspace_identity,
                    ),
                    Attempt(),
                )
            except LedgerRejection as exc:
                if exc.code != "run_already_terminal":
                    raise
                break  # another repairer settled the run meanwhile: its terminal fact stands
            if result.status == "completed":
                recovered.append(op.operation_id)
            elif result.status == "parked" and park is None:
                park, parked_op = result.park_reason, op.operation_id
        events = await rt.on_ledger(lambda: store.events(run_id=run_id))
        existing = next((e for e in reversed(events) if e.is_terminal), None)
    anchor = events[-1] if events else _header_anchor(header, run_id)  # type: ignore[arg-type]
    candidate = (
        parked_terminal_event(anchor, run_id, park, parked_op)
        if park is not None
        else recovered_terminal_event(anchor, run_id, "process_crashed")
    )
    binds = existing is None and untrusted is None  # nothing read from broken facts is acted on

    def between() -> None:
        failpoints.hit("checkpoint_repair_committed")

    def settle(fact: RuntimeEvent) -> RepairResult:
        try:
            return settle_run(store, fact, existing=existing, between=between)
        except LedgerRejection as exc:  # another repairer settled it differently: its fact stands
            if exc.code not in ("duplicate_event_id", "run_already_terminal"):
                raise
            stood = next(e for e in reversed(store.events(run_id=run_id)) if e.is_terminal)
            return settle_run(store, fact, existing=stood)

    for left in range(BIND_ATTEMPTS - 1, -1, -1):
        fact = candidate
        if binds:  # the run's waiting requests close first, so the bound prefix holds them
            await rt.on_ledger(functools.partial(store.close_waiting_requests, candidate))
            fact = await bind(rt, candidate)
            failpoints.hit("checkpoint_repair_captured")
        try:
            repair = await rt.on_ledger(functools.partial(settle, fact))
            break
        except LedgerRejection as exc:  # a late outcome landed after the binding: bind again
            if exc.code != "checkpoint_boundary_stale" or not left:
                raise
    return LostRunResult(repair, park, parked_op, tuple(recovered))
