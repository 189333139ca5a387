"""The joined view the checks read: ledger runs and operations beside the history facts naming them."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Any

from maka_core.audit.model import ActivityFact, Execution, LedgerFacts
from maka_core.facts.events import RuntimeEvent
from maka_core.facts.run_header import RunHeader
from maka_core.ledger.resolver import OperationResolution, RecoveryResolution, resolve
from maka_core.ledger.scanner import LedgerScanner, OperationFacts, scan
from maka_core.runtime.contracts import (
    BEGIN_CONTINUATION,
    BEGIN_RUN,
    EXECUTE_TOOL_LOCAL,
    FINISH_RUN,
    LOCAL_TOOL_ID_PREFIX,
)
from maka_core.runtime.resolution import is_resolution_run, resolution_payload
from maka_core.runtime.usage_limits import raise_payload
from maka_core.runtime.workspace_continuity import transition_of

#: A resumed session's first run is begun by ``maka.begin_continuation`` instead of ``maka.begin_run``
#: (its run was claimed by resume).
BEGINS: tuple[str, ...] = (BEGIN_RUN, BEGIN_CONTINUATION)


@dataclass(frozen=True)
class Placed:
    """An activity fact with its execution's position in the lineage (for ordering across it)."""

    execution: Execution
    index: int
    fact: ActivityFact

    @property
    def order(self) -> tuple[int, int]:
        return (self.index, self.fact.seq)


@dataclass
class AuditIndex:
    ledger: LedgerFacts
    executions: list[Execution]
    scanner: LedgerScanner
    resolution: RecoveryResolution
    run_events: dict[str, list[RuntimeEvent]]
    headers: dict[str, RunHeader]
    ops_by_call: dict[tuple[str, str], OperationFacts]
    decisions: dict[tuple[str, str], OperationResolution]
    attempts_by_op: dict[str, list[dict[str, Any]]]
    by_type: dict[str, list[Placed]] = field(default_factory=dict)
    by_run: dict[str, list[Placed]] = field(default_factory=dict)
    by_call: dict[tuple[str, str], list[Placed]] = field(default_factory=dict)
    known_attempts: dict[tuple[str, str], ActivityFact] = field(default_factory=dict)

    @cached_property
    def execution_ids(self) -> dict[str, Execution]:
        return {e.run_id: e for e in self.executions}

    def available(self, run_id: str | None) -> bool:
        execution = self.execution_ids.get(run_id or "")
        return execution is not None and execution.history_available

    @cached_property
    def all_available(self) -> bool:
        return bool(self.executions) and all(e.history_available for e in self.executions)

    def finished_in_history(self, run_id: str) -> bool:
        return any(p.fact.outcome == "completed" for p in self.by_run.get(run_id, ()) if _is(p, FINISH_RUN))

    def fully_visible(self, run_id: str) -> bool:
        """Every execution that may have hosted this run's activities has a history to read."""
        if self.all_available:
            return True
        header = self.headers.get(run_id)
        return (
            header is not None and self.available(header.workflow_run_id) and self.finished_in_history(run_id)
        )

    def operator_resolution(self, run_id: str) -> dict[str, Any] | None:
        """The resolution a run records when it is an operator's (``maka session resolve``, or a
        limit raise: ``maka session raise-limit``), else None.

        Such a run is written by the CLI, not by a workflow: no execution hosts it and no history
        begins or finishes it. Only a run made of resolution facts alone counts, so a run that merely
        borrows the id prefix is still audited like any other.
        """
        events = self.run_events.get(run_id, [])
        if not events or not is_resolution_run(run_id):
            return None
        # A limit raise (``maka session raise-limit``) is an operator's run of the same shape.
        payloads = [resolution_payload(e) or raise_payload(e) for e in events]
        if any(p is None for p in payloads):
            return None
        return payloads[-1]

    def workspace_transition(self, run_id: str) -> dict[str, Any] | None:
        """The workspace transition (isolated restore, rebaseline) an operator's run records, else None."""
        events = self.run_events.get(run_id, [])
        payloads = [transition_of(e) for e in events]
        if not events or any(p is None for p in payloads):
            return None
        return payloads[-1]
    def lost_local(self, row: dict[str, Any]) -> bool:
        """A row by a local tool attempt in an execution that lost a workflow task: its marker may
        have been lost with that task (the ledger alone speaks for it)."""
        execution = self.execution_ids.get(str(row.get("workflow_run_id") or ""))
        return (
            execution is not None
            and execution.lost_workflow_tasks > 0
            and is_local_tool_attempt(row.get("activity_id"))
        )

    def attempt_known(self, row: dict[str, Any]) -> bool | None:
        """Whether a history shows the activity attempt a ledger row names (None: cannot tell)."""
        run_id = row.get("workflow_run_id")
        if not run_id or not self.available(run_id):
            return None
        fact = self.known_attempts.get((run_id, str(row.get("activity_id"))))
        if fact is None:
            return False
        attempt = row.get("attempt") or 1
        return fact.outcome == "pending" or attempt <= fact.attempt


def is_local_tool_attempt(activity_id: object) -> bool:
    """An activity id of a local tool attempt (``lt:<operationId>``, unique per execution: only a
    call's first dispatch is local, and a replay's re-run carries the same id)."""
    return isinstance(activity_id, str) and activity_id.startswith(LOCAL_TOOL_ID_PREFIX)


def _is(placed: Placed, activity_type: str) -> bool:
    return placed.fact.activity_type == activity_type


def build_index(ledger: LedgerFacts, executions: Sequence[Execution]) -> AuditIndex:
    ordered = sorted(executions, key=lambda e: (e.start_ms is None, e.start_ms or 0, e.run_id))
    scanner = scan(ledger.events, protocol_scope="run")
    resolution = resolve(scanner)
    run_events: dict[str, list[RuntimeEvent]] = {}
    for event in ledger.events:
        run_events.setdefault(event.run_id, []).append(event)
    ops_by_call = {(f.run_id, f.tool_call_id): f for f in scanner.operations()}
    invocation_run = {f.invocation_id: f.run_id for f in scanner.operations()}
    decisions = {(invocation_run.get(d.invocation_id, ""), d.tool_call_id): d for d in resolution.operations}
    attempts_by_op: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for row in ledger.attempts:
        attempts_by_op[row["operation_id"]].append(dict(row))
    index = AuditIndex(
        ledger=ledger,
        executions=ordered,
        scanner=scanner,
        resolution=resolution,
        run_events=run_events,
        headers={h.run_id: h for h in ledger.headers},
        ops_by_call=ops_by_call,
        decisions=decisions,
        attempts_by_op=dict(attempts_by_op),
    )
    by_operation = {f.operation_id: f for f in scanner.operations() if f.operation_id}
    for i, execution in enumerate(ordered):
        for fact in execution.activities:
            local = fact.activity_type == EXECUTE_TOOL_LOCAL
            call = by_operation.get(fact.operation_id or "") if local else None
            if call is not None:
                # A local tool call's marker names its operation only (``lt:<operationId>``).
                fact = replace(fact, run_id=call.run_id, tool_call_id=call.tool_call_id)
            placed = Placed(execution, i, fact)
            index.by_type.setdefault(fact.activity_type, []).append(placed)
            if fact.run_id:
                index.by_run.setdefault(fact.run_id, []).append(placed)
                if fact.tool_call_id:
                    index.by_call.setdefault((fact.run_id, fact.tool_call_id), []).append(placed)
            if not fact.local or is_local_tool_attempt(fact.activity_id):
                index.known_attempts[(execution.run_id, fact.activity_id)] = fact
    return index
