"""The audit's checks: each compares one thing the ledger says with what the histories say.

Every check reads the ``AuditIndex`` and yields ``Finding``s; none writes anything. A check that
needs a history the server no longer has skips what it cannot see (``history_unavailable`` says
so once per execution) and never reports the gap as drift.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from maka_core.audit.findings import CheckId, Finding
from maka_core.audit.index import BEGINS, AuditIndex, Placed
from maka_core.audit.model import Execution
from maka_core.facts.events import RuntimeEvent
from maka_core.facts.run_header import header_status_for
from maka_core.ledger.scanner import OperationFacts
from maka_core.runtime.compaction import check_compactions
from maka_core.runtime.contracts import (
    EXECUTE_TOOL,
    EXECUTE_TOOL_LOCAL,
    FINISH_RUN,
    RECOVER_OPERATION,
    SUBAGENT_BEGIN,
)
from maka_core.runtime.settle import park_reason_of
from maka_core.runtime.workspace_continuity import session_bundles
from maka_core.store.rows import prefix_digest

#: Verify and corruption findings are capped: a broken ledger says enough in its first lines.
MAX_LEDGER_FINDINGS = 20
#: The activities that dispatch a call: the regular one, and a hybrid session's local attempt.
TOOL_TYPES = (EXECUTE_TOOL, EXECUTE_TOOL_LOCAL)


def _hosts(placed: Placed) -> bool:
    """The activity ran the call (a deferred local attempt handed it on before T1); a sub-agent's
    call is dispatched by ``maka.subagent_begin`` (its T1, then the child session)."""
    hosting = placed.fact.activity_type in (*TOOL_TYPES, SUBAGENT_BEGIN)
    return hosting and placed.fact.outcome != "deferred"


def check_histories(ix: AuditIndex) -> Iterator[Finding]:
    for execution in ix.executions:
        if not execution.history_available:
            yield Finding(
                "history_unavailable",
                f"history of {execution.run_id} is gone ({execution.unavailable_reason or 'not found'}): "
                "its runs are audited from the ledger alone",
                execution_run_id=execution.run_id,
            )


def check_runs(ix: AuditIndex) -> Iterator[Finding]:
    executions = ix.execution_ids
    for run_id, events in ix.run_events.items():
        header = ix.headers.get(run_id)
        if ix.operator_resolution(run_id) is not None or ix.workspace_transition(run_id) is not None:
            if header is None:
                yield Finding("run_header_missing", "the run has events but no header", run_id=run_id)
            continue  # an operator's fact, committed by the CLI: no execution hosts it
        if header is None:
            yield Finding("run_header_missing", "the run has events but no header", run_id=run_id)
        elif not header.workflow_run_id:
            yield Finding("run_execution_unnamed", "the header names no workflow run id", run_id=run_id)
        elif header.workflow_run_id not in executions:
            yield Finding(
                "run_execution_unknown",
                f"the header names execution {header.workflow_run_id}, which workflow "
                f"{header.workflow_id} never had",
                run_id=run_id,
                execution_run_id=header.workflow_run_id,
            )
        elif ix.available(header.workflow_run_id):
            begun = [
                p
                for p in ix.by_run.get(run_id, ())
                if p.fact.activity_type in BEGINS and p.execution.run_id == header.workflow_run_id
            ]
            if not begun:
                yield Finding(
                    "run_begin_missing",
                    "the hosting execution's history never began this run",
                    run_id=run_id,
                    execution_run_id=header.workflow_run_id,
                )
        yield from _run_finish(ix, run_id, events)
    for placed in (p for kind in BEGINS for p in ix.by_type.get(kind, ())):
        fact = placed.fact
        if fact.outcome == "completed" and fact.run_id and fact.run_id not in ix.run_events:
            yield Finding(
                "history_run_unknown",
                f"begin_run (activity {fact.activity_id}) began a run the ledger does not hold",
                run_id=fact.run_id,
                execution_run_id=placed.execution.run_id,
            )
    yield from _run_order(ix)


def _run_finish(ix: AuditIndex, run_id: str, events: list[RuntimeEvent]) -> Iterator[Finding]:
    terminal = next((e for e in reversed(events) if e.is_terminal), None)
    finishes = [p for p in ix.by_run.get(run_id, ()) if p.fact.activity_type == FINISH_RUN]
    done = [p for p in finishes if p.fact.outcome == "completed"]
    if done and terminal is None:
        yield Finding(
            "run_finish_missing",
            "finish_run completed in a history but the ledger has no terminal fact",
            run_id=run_id,
            execution_run_id=done[-1].execution.run_id,
        )
        return
    if terminal is None:
        return
    delta = terminal.actions.state_delta if terminal.actions is not None else None
    if not finishes:
        if isinstance(delta, dict) and delta.get("recovered") is True:
            yield Finding("run_repaired", f"terminal fact {terminal.id} came from repair", run_id=run_id)
        elif ix.fully_visible(run_id):
            yield Finding(
                "run_finish_missing",
                f"the ledger's terminal fact {terminal.id} has no finish_run in any history",
                run_id=run_id,
            )
        return
    if not done:
        return
    fact = done[-1].fact
    wanted = fact.inputs.get("status")
    status = header_status_for(terminal)
    if (wanted == "completed") != (status == "completed"):
        yield Finding(
            "run_status_mismatch",
            f"finish_run said {wanted}, the ledger's terminal fact says {status}",
            run_id=run_id,
            execution_run_id=done[-1].execution.run_id,
        )
    park = fact.inputs.get("park_reason")
    if park != park_reason_of(terminal):
        yield Finding(
            "park_mismatch",
            f"finish_run parked with {park}, the ledger's terminal fact with {park_reason_of(terminal)}",
            run_id=run_id,
            execution_run_id=done[-1].execution.run_id,
        )
    header = ix.headers.get(run_id)
    if header is not None and header.is_terminal and header.park_reason != park:
        yield Finding(
            "park_mismatch",
            f"finish_run parked with {park}, the run header with {header.park_reason}",
            run_id=run_id,
        )


def _run_order(ix: AuditIndex) -> Iterator[Finding]:
    history: list[str] = []
    for placed in sorted((p for kind in BEGINS for p in ix.by_type.get(kind, ())), key=lambda p: p.order):
        if placed.fact.outcome == "completed" and placed.fact.run_id and placed.fact.run_id not in history:
            history.append(placed.fact.run_id)
    shown = set(history)
    ledger = [r for r in ix.run_events if r in shown]
    history = [r for r in history if r in ix.run_events]
    if ledger != history:
        yield Finding(
            "run_order_mismatch",
            f"histories began runs in the order {history}, the ledger holds {ledger}",
        )


def check_tools(ix: AuditIndex) -> Iterator[Finding]:
    for key, placed_list in ix.by_call.items():
        for placed in placed_list:
            fact = placed.fact
            if fact.activity_type not in (*TOOL_TYPES, RECOVER_OPERATION):
                continue
            facts = ix.ops_by_call.get(key)
            if facts is None or (facts.operation_id not in (None, fact.operation_id)):
                yield Finding(
                    "tool_activity_unmapped",
                    f"{fact.activity_type} activity {fact.activity_id} names call {key[1]} "
                    f"(operation {fact.operation_id}), which the ledger does not hold",
                    run_id=key[0],
                    operation_id=fact.operation_id,
                    execution_run_id=placed.execution.run_id,
                )
            elif fact.activity_type in TOOL_TYPES and fact.outcome == "completed":
                yield from _outcome(ix, placed, facts)
            elif fact.outcome == "deferred":
                yield from _deferred(ix, placed, facts)
    for key, facts in ix.ops_by_call.items():
        op_id = facts.operation_id
        if op_id is None:
            continue
        ran = [p for p in ix.by_call.get(key, ()) if _hosts(p)]
        rows = ix.attempts_by_op.get(op_id, [])
        lost = bool(rows) and all(ix.lost_local(r) for r in rows)
        if not ran and not lost and ix.fully_visible(key[0]):
            yield Finding(
                "operation_unhosted",
                f"operation {op_id} ({facts.tool_name}) was dispatched but no execute_tool activity ran it",
                run_id=key[0],
                operation_id=op_id,
            )
        # An exact T1 retry records no row, so two rows are two dispatches (one attempt or two).
        t1 = [(r["workflow_run_id"], r["activity_id"], r["attempt"]) for r in rows if r["phase"] == "t1"]
        if len(t1) > 1:
            yield Finding(
                "duplicate_dispatch",
                f"operation {op_id} has {len(t1)} T1 rows, by activity attempts {sorted(set(t1))}",
                run_id=key[0],
                operation_id=op_id,
            )
        for row in rows:
            if ix.attempt_known(row) is False and ix.lost_local(row):
                yield Finding(
                    "local_attempt_unrecorded",
                    f"{row['phase']} of {op_id} was recorded by local attempt {row['activity_id']} of "
                    f"{row['workflow_run_id']}, whose marker was lost with a workflow task that never "
                    "completed: the ledger alone speaks for it",
                    run_id=key[0],
                    operation_id=op_id,
                    execution_run_id=row["workflow_run_id"],
                )
            elif ix.attempt_known(row) is False:
                yield Finding(
                    "dispatch_attempt_unknown" if row["phase"] == "t1" else "outcome_attempt_unknown",
                    f"{row['phase']} of {op_id} was recorded by activity {row['activity_id']} attempt "
                    f"{row['attempt']} of {row['workflow_run_id']}, which no history shows",
                    run_id=key[0],
                    operation_id=op_id,
                    execution_run_id=row["workflow_run_id"],
                )


def _deferred(ix: AuditIndex, placed: Placed, facts: OperationFacts) -> Iterator[Finding]:
    """A deferred local attempt handed its call on before T1: a T1 by it is drift, unless its
    execution lost a workflow task (an earlier run of the same attempt may have dispatched, its
    marker lost with the task, and the replay's re-run deferred: ``local_attempt_unrecorded``)."""
    fact = placed.fact
    for row in ix.attempts_by_op.get(facts.operation_id or "", []):
        if (
            row["phase"] != "t1"
            or row["activity_id"] != fact.activity_id
            or row["workflow_run_id"] != placed.execution.run_id
        ):
            continue
        if placed.execution.lost_workflow_tasks > 0:
            yield _f(
                "local_attempt_unrecorded",
                placed,
                (facts.run_id, facts.tool_call_id),
                f"local attempt {fact.activity_id} committed T1 for {facts.operation_id} in a workflow "
                "task that never completed (its marker lost); the replay's re-run deferred",
            )
            continue
        yield _f(
            "deferred_after_dispatch",
            placed,
            (facts.run_id, facts.tool_call_id),
            f"local attempt {fact.activity_id} deferred ({fact.result.get('deferred')}), but committed "
            f"T1 for {facts.operation_id}",
        )


def _outcome(ix: AuditIndex, placed: Placed, facts: OperationFacts) -> Iterator[Finding]:
    fact = placed.fact
    response = facts.response
    wanted = fact.result.get("response_event_id")
    if fact.result.get("status") == "awaiting_approval":
        return  # nothing ran: the call waits for its answer and claims no outcome
    if response is None:
        yield Finding(
            "outcome_missing",
            f"execute_tool activity {fact.activity_id} completed with outcome {wanted}, "
            "but the ledger holds no outcome for the operation",
            run_id=fact.run_id,
            operation_id=fact.operation_id,
            execution_run_id=placed.execution.run_id,
        )
    elif wanted is not None and wanted != response.id:
        yield Finding(
            "outcome_mismatch",
            f"execute_tool activity {fact.activity_id} returned outcome {wanted}, "
            f"the ledger holds {response.id}",
            run_id=fact.run_id,
            operation_id=fact.operation_id,
            execution_run_id=placed.execution.run_id,
        )


def check_recovery(ix: AuditIndex) -> Iterator[Finding]:
    for key, placed_list in ix.by_call.items():
        chain = sorted(
            (p for p in placed_list if p.fact.activity_type in (*TOOL_TYPES, RECOVER_OPERATION)),
            key=lambda p: p.order,
        )
        for i, placed in enumerate(chain):
            fact = placed.fact
            nxt = chain[i + 1] if i + 1 < len(chain) else None
            if fact.activity_type in TOOL_TYPES and fact.outcome in ("failed", "timed_out"):
                if nxt is not None and nxt.fact.activity_type in TOOL_TYPES:
                    yield _f(
                        "redispatch_without_recovery",
                        placed,
                        key,
                        f"execute_tool {fact.activity_id} {fact.outcome}; the next activity dispatched "
                        "the operation again without recover_operation",
                    )
                elif nxt is None and ix.fully_visible(key[0]) and ix.finished_in_history(key[0]):
                    yield _f(
                        "failed_tool_unrecovered",
                        placed,
                        key,
                        f"execute_tool {fact.activity_id} {fact.outcome} and no recover_operation followed",
                    )
            if fact.activity_type == RECOVER_OPERATION and fact.outcome == "completed":
                yield from _recovered(ix, placed, key, chain[:i])


def _recovered(
    ix: AuditIndex, placed: Placed, key: tuple[str, str], before: list[Placed]
) -> Iterator[Finding]:
    fact = placed.fact
    status = fact.result.get("status")
    decision = ix.decisions.get(key)
    facts = ix.ops_by_call.get(key)
    ledger_status = decision.status if decision is not None else "absent"
    if status == "completed":
        wanted = fact.result.get("response_event_id")
        if ledger_status != "completed" or (
            wanted is not None and decision is not None and decision.response_event_id != wanted
        ):
            yield _f(
                "recovery_mismatch",
                placed,
                key,
                f"recover_operation {fact.activity_id} completed with {wanted}; the ledger says "
                f"{ledger_status} ({decision.response_event_id if decision else None})",
            )
    elif status == "parked":
        if (
            decision is not None
            and decision.status == "completed"
            and decision.settlement_origin == "recovery_bundle"
        ):
            yield _f(
                "recovery_mismatch",
                placed,
                key,
                f"recover_operation {fact.activity_id} parked ({fact.result.get('reason')}); the ledger "
                "completed the operation by a recovery bundle",
            )
    elif status == "not_dispatched":
        op_id = facts.operation_id if facts is not None else None
        rows = ix.attempts_by_op.get(op_id or "", [])
        earlier = {
            (p.execution.run_id, p.fact.activity_id) for p in before if p.fact.activity_type in TOOL_TYPES
        }
        dispatched = [
            r for r in rows if r["phase"] == "t1" and (r["workflow_run_id"], r["activity_id"]) in earlier
        ]
        # A T1 committed only after recover_operation had closed cannot have been there to see: an
        # attempt frozen before its T1 (a SIGSTOPped worker) woke late. Any other is drift (a T1
        # inside the recovery's window counts: its read may have come after it).
        late = [
            r for r in dispatched if fact.closed_at is not None and int(r["recorded_at"]) > fact.closed_at
        ]
        seen = [r for r in dispatched if r not in late]
        if seen:
            row = seen[0]
            yield _f(
                "redispatch_after_dispatch",
                placed,
                key,
                f"recover_operation {fact.activity_id} said not_dispatched, but activity "
                f"{row['activity_id']} had already committed T1 for {op_id}",
            )
        elif late:
            row = late[0]
            yield _f(
                "late_dispatch_after_recovery",
                placed,
                key,
                f"recover_operation {fact.activity_id} said not_dispatched and closed; activity "
                f"{row['activity_id']} committed its T1 for {op_id} after that (a frozen attempt woke)",
            )


def _f(check: CheckId, placed: Placed, key: tuple[str, str], message: str) -> Finding:
    return Finding(
        check,
        message,
        run_id=key[0],
        operation_id=placed.fact.operation_id,
        execution_run_id=placed.execution.run_id,
    )


def check_continuations(ix: AuditIndex) -> Iterator[Finding]:
    executions = ix.execution_ids
    for run_id, events in ix.run_events.items():
        for event in events:
            start = event.actions.continuation_start if event.actions is not None else None
            if start is None:
                continue
            src = start.immediate_source
            claim = ix.ledger.claims.get(start.claim_id)
            if claim is None:
                yield Finding("continuation_claim_missing", f"no claim row {start.claim_id}", run_id=run_id)
            source_events = ix.run_events.get(src.run_id)
            if not source_events:
                yield Finding(
                    "continuation_source_missing",
                    f"source run {src.run_id} is not in the ledger",
                    run_id=run_id,
                )
                continue
            high_waters = {src.high_water} | ({claim.source_event_high_water} if claim else set())
            digests = {src.prefix_digest} | ({claim.source_prefix_digest} if claim else set())
            if len(high_waters) > 1 or src.high_water > len(source_events):
                yield Finding(
                    "continuation_high_water_mismatch",
                    f"high-water {sorted(high_waters)} vs source run's {len(source_events)} events",
                    run_id=run_id,
                )
                continue
            prefix = prefix_digest(source_events[: src.high_water])
            if len(digests) > 1 or prefix != src.prefix_digest:
                yield Finding(
                    "continuation_digest_mismatch",
                    f"prefix digest of source {src.run_id} is {prefix}, "
                    f"the continuation names {sorted(digests)}",
                    run_id=run_id,
                )
            yield from _started_after(ix, executions, run_id, src.run_id)


def _started_after(
    ix: AuditIndex, executions: dict[str, Execution], run_id: str, source_run: str
) -> Iterator[Finding]:
    target_h, source_h = ix.headers.get(run_id), ix.headers.get(source_run)
    if target_h is None or source_h is None:
        return
    target = executions.get(target_h.workflow_run_id or "")
    source = executions.get(source_h.workflow_run_id or "")
    if target is None or source is None or target is source:
        return
    if not (target.history_available and source.history_available):
        return  # the times are in the history that is gone (its notice says so)
    if source.close_ms is None or (target.start_ms is not None and target.start_ms < source.close_ms):
        yield Finding(
            "continuation_started_early",
            f"execution {target.run_id} started before the source's execution {source.run_id} closed",
            run_id=run_id,
            execution_run_id=target.run_id,
        )


def check_ledger(ix: AuditIndex) -> Iterator[Finding]:
    for problem in ix.ledger.verify_problems[:MAX_LEDGER_FINDINGS]:
        yield Finding("ledger_verify", problem)
    yield from _after_terminal(ix)
    yield from _compactions(ix)
    seen = 0
    for issue in ix.resolution.issues:
        if seen < MAX_LEDGER_FINDINGS:
            yield Finding(
                "ledger_corruption",
                f"{issue.code} at event {issue.event_id}",
                operation_id=issue.operation_id,
            )
            seen += 1
    for op in ix.resolution.operations:
        if op.status == "corruption" and seen < MAX_LEDGER_FINDINGS:
            yield Finding(
                "ledger_corruption", f"operation {op.operation_id}: {op.reason}", operation_id=op.operation_id
            )
            seen += 1


def _compactions(ix: AuditIndex) -> Iterator[Finding]:
    """Each compaction fact, re-derived from the session's events before it (``compaction``): what
    a step sent the model is recomputable from the ledger alone only if these hold."""
    by_session: dict[str, list[RuntimeEvent]] = {}
    for event in ix.ledger.events:
        by_session.setdefault(event.session_id, []).append(event)
    for events in by_session.values():
        runs = {e.id: e.run_id for e in events}
        for event_id, problem in check_compactions(events)[:MAX_LEDGER_FINDINGS]:
            yield Finding("compaction_mismatch", f"{event_id}: {problem}", run_id=runs.get(event_id))


def _after_terminal(ix: AuditIndex) -> Iterator[Finding]:
    """A run's terminal fact is its last: the live writers refuse anything after it
    (``run_already_terminal``), so what follows one came from an import or an older writer (a zombie
    attempt's T2 after a repair settled its run), and the run's story no longer holds together."""
    for run_id, events in ix.run_events.items():
        at = next((i for i, e in enumerate(events) if e.is_terminal), len(events))
        late = events[at + 1 :]
        if not late:
            continue
        ops = [e.refs.operation_id for e in late if e.refs is not None and e.refs.operation_id is not None]
        yield Finding(
            "event_after_terminal",
            f"{len(late)} event(s) after terminal fact {events[at].id}, first {late[0].id}",
            run_id=run_id,
            operation_id=ops[0] if ops else None,
        )


#: Every check, in report order.
def check_checkpoints(ix: AuditIndex) -> Iterator[Finding]:
    """Every checkpoint ref a committed boundary names must exist (a fact without its artifact)."""
    for ref, present in sorted(ix.ledger.checkpoint_refs.items()):
        if present is False:
            yield Finding("checkpoint_ref_missing", f"{ref} is named by a committed fact and missing")
        elif present is None:
            yield Finding("checkpoint_store_unavailable", f"{ref}: no Maka store for its workspace here")
    for event, bundle in session_bundles(ix.ledger.events):
        failed = bundle.no_checkpoint
        if failed is not None and failed.code == "checkpoint_capture_failed":
            yield Finding("checkpoint_capture_failed", failed.detail or failed.code, run_id=event.run_id)


CHECK_FUNCTIONS: tuple[Callable[[AuditIndex], Iterator[Finding]], ...] = (
    check_histories,
    check_runs,
    check_tools,
    check_recovery,
    check_continuations,
    check_ledger,
    check_checkpoints,
)
