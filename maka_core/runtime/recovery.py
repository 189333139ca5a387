"""Settle a tool call whose attempt failed or timed out: from the ledger, never by running it again
unless its guarantee says a second run is safe.

The orchestrator only knows the attempt ended badly; the ledger knows where it stopped:

- completed (T2 or a bundle committed) -> continue with the committed outcome;
- definitely not dispatched (new protocol, no T1) -> the tool never ran; it may be dispatched again;
- dispatched without outcome -> what the call's execution guarantee allows, as recorded with its
  T1 decision (``runtime.governed.guarantee_of`` derives it, once; an operation dispatched before
  decisions were recorded gets the same derivation now, and a command line's recorded
  ``read-only`` holds only while that derivation agrees, ``governed.recovery_guarantee``):
  ``read-only`` reads again and commits T2; ``provider-idempotent`` and ``at-least-once`` (a
  contract tool's declaration) run again with the idempotency key recorded with T1, each run
  recorded (``record_rerun``) before it starts and listed in the receipt;
  ``reconciliation-required`` observes the target against the evidence committed with T1 (a
  contract tool: its own JSON, handed to its ``reconcile`` hook; a MELRA
  task: against its declared reconciliation predicates, ``runtime.melra.reconcile_task``) and
  commits one atomic recovery bundle (finalize-only: completed when it holds the expected state,
  parked otherwise; a file write found in its before-state is first redone once through the
  guarded replacement, recorded with ``record_rerun`` before it starts, ``tools.redo``);
  ``at-most-once`` (bash, and any tool declaring it) parks with ``dispatch_without_response``;
- parked or corrupt -> park.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from maka_core import failpoints
from maka_core.errors import LedgerRejection, MakaError
from maka_core.facts.clock import now_ms
from maka_core.facts.events import RuntimeEvent
from maka_core.governance import EvidenceItem, TaskStatus
from maka_core.ledger.resolver import OperationResolution
from maka_core.runtime import builders, governed, melra, verification
from maka_core.runtime.call_state import CallState, call_state, committed_args
from maka_core.runtime.contracts import PARK_REASONS, ParkReason, RecoverInput, RecoverResult
from maka_core.runtime.runtime import Attempt, Runtime
from maka_core.runtime.tool_admission import Dispatched
from maka_core.runtime.tool_effect import run_and_commit_outcome
from maka_core.tools import ToolResult, bound_call
from maka_core.tools.base import FileEvidence, GuardedWrite, Reconciliation, parse_evidence
from maka_core.tools.contract import KEYED_GUARANTEES
from maka_core.tools.guarded_replace import wait_for_folder
from maka_core.tools.melra import execution_view
from maka_core.tools.redo import held_by_attempt

#: A reconciler's observation -> the park it means (``matches_expected_state`` completes instead).
_OBSERVATION_PARKS: dict[str, ParkReason] = {
    "matches_prior_state": "reconcile_matches_prior_state",
    "diverged": "reconcile_diverged",
    "unreadable": "reconcile_unreadable",
}


def park_reason_for(op: OperationResolution) -> ParkReason:
    """The park an unsettleable Resolver decision means (its own code stays on the operation)."""
    if op.status == "corruption":
        return "ledger_corruption"
    if op.status == "parked":
        return op.reason if op.reason in _OBSERVATION_PARKS.values() else "recovery_parked"  # type: ignore[return-value]
    if op.reason in PARK_REASONS:
        return op.reason  # type: ignore[return-value]
    return "dispatch_without_response"


def _parked(inp: RecoverInput, reason: ParkReason) -> RecoverResult:
    return RecoverResult(operation_id=inp.call.operation_id, status="parked", reason=reason)


def _completed(op_id: str, reason: str, response: RuntimeEvent) -> RecoverResult:
    content = response.content
    is_error = content is not None and content.kind == "function_response" and bool(content.is_error)
    return RecoverResult(
        operation_id=op_id,
        status="completed",
        reason=reason,
        is_error=is_error,
        response_event_id=response.id,
    )


def _settled(rt: Runtime, inp: RecoverInput) -> RecoverResult | None:
    """On the ledger thread, after a commit was refused: what the ledger now says of the call when
    another writer settled it first (completed or parked), else None (the refusal stands)."""
    settled = call_state(rt.ledger.view(inp.session_id), inp.session_id, inp.run_id, inp.call.tool_call_id)
    if settled is None or settled.op.status not in ("completed", "parked"):
        return None
    if settled.op.status == "parked":
        return _parked(inp, park_reason_for(settled.op))
    return RecoverResult(
        operation_id=inp.call.operation_id,
        status="completed",
        reason=settled.op.reason,
        is_error=bool(settled.op.response_is_error),
        response_event_id=settled.op.response_event_id,
    )


async def recover_operation(rt: Runtime, inp: RecoverInput, attempt: Attempt) -> RecoverResult:
    """Resolve one operation and settle it from evidence, or park it; never re-run a side effect."""
    call = inp.call
    op_id = call.operation_id
    state = await rt.on_ledger(
        lambda: call_state(rt.ledger.view(inp.session_id), inp.session_id, inp.run_id, call.tool_call_id),
        attempt=attempt,
    )
    if state is None:
        # The call event itself is missing: the model step's commit never happened as the
        # orchestrator believes. Nothing ran; parking keeps a human in the loop for this anomaly.
        return _parked(inp, "call_not_found")
    op = state.op
    if op.status == "completed":
        return RecoverResult(
            operation_id=op_id,
            status="completed",
            reason=op.reason,
            is_error=bool(op.response_is_error),
            response_event_id=op.response_event_id,
        )
    if rt.guard.may_redispatch(op):
        return RecoverResult(operation_id=op_id, status="not_dispatched", reason=op.reason)
    if op.status in ("parked", "corruption") or op.reason != "dispatch_without_response":
        return _parked(inp, park_reason_for(op))
    tool = rt.tools.get(call.tool_name)
    args = committed_args(state.facts)
    if tool is None or not isinstance(args, dict):
        return _parked(inp, "dispatch_without_response")
    try:
        ws = rt.workspace(inp.workspace)
    except MakaError:
        return _parked(inp, "workspace_unavailable")
    if ws.identity != inp.workspace_identity:
        return _parked(inp, "workspace_identity_mismatch")
    held = await rt.on_ledger(lambda: rt.ledger.decision(op_id), attempt=attempt)
    session_gov = await rt.on_ledger(lambda: rt.session_governance(inp.session_id), attempt=attempt)
    guarantee = governed.recovery_guarantee(held, tool, args, session_gov.policy.trusted_reads)
    if guarantee == "read-only" or guarantee in KEYED_GUARANTEES:
        # T1 and no T2: a read reads again (there is no effect to repeat); a keyed call runs again
        # with the key recorded with its T1, its run recorded (and numbered) before it starts.
        record = None if held is None else held["decision"]
        gov = rt.session_governance(inp.session_id) if record is not None else None
        run_number = None
        if guarantee in KEYED_GUARANTEES:
            run_number = await rt.on_ledger(
                lambda: rt.ledger.record_rerun(op_id, attempt=attempt.record), attempt=attempt
            )
        key = None if record is None else record.get("idempotencyKey")
        # Bound to its call again (a MELRA tool: its task, its store) like the first run. With every
        # tool: this call's T1 was admitted under the session's set (fixed at its start, as its
        # policy is), so the tool and a task's inner tool were offered then and still are.
        tool = bound_call.for_call(
            melra.bind(rt, tool, inp.session_id, op_id),
            bound_call.CallContext(
                inp.session_id,
                op_id,
                attempt=run_number or 1,
                loop=asyncio.get_running_loop(),
                idempotency_key=key if isinstance(key, str) else None,
            ),
        )
        dispatched = Dispatched(
            state.ids, tool, args, ws, op.dispatch_event_id or "", record, gov, run_number=run_number
        )
        try:
            _, response = await run_and_commit_outcome(rt, dispatched, call, attempt)
        except LedgerRejection:
            # An attempt abandoned meanwhile (a local call past its timeout) committed its T2
            # first: the ledger's guard kept one, and that one is the outcome.
            settled = await rt.on_ledger(lambda: _settled(rt, inp), attempt=attempt)
            if settled is None:
                raise
            return settled
        reason = "replay_safe_reread" if guarantee == "read-only" else "idempotent_rerun"
        return _completed(op_id, reason, response)
    if guarantee != "reconciliation-required":
        return _parked(inp, "dispatch_without_response")
    dispatched = Dispatched(state.ids, tool, args, ws, op.dispatch_event_id or "")
    task_id = None if held is None else held["decision"].get("melraTaskId")
    if isinstance(task_id, str):
        # A MELRA task that declared reconciliation predicates: settled from them, never re-run.
        # Only a dispatch that said so (``reconcile``) may take a recovery bundle; one dispatched
        # before tasks were reconciled parks as it always did.
        dispatch = state.facts.dispatch
        td = None if dispatch is None or dispatch.actions is None else dispatch.actions.tool_dispatch
        task = await rt.on_ledger(lambda: rt.ledger.melra_task(task_id), attempt=attempt)
        if task is None or td is None or td.recovery_mode != "reconcile":
            return _parked(inp, "dispatch_without_response")
        return await _reconcile(
            rt, inp, state, dispatched, attempt, lambda: melra.reconcile_task(task, ws), task_id
        )
    evidence_json = await rt.on_ledger(lambda: rt.ledger.evidence(op_id), attempt=attempt)
    evidence = None if evidence_json is None else parse_evidence(evidence_json)
    bound = bound_call.for_call(
        tool, bound_call.CallContext(inp.session_id, op_id, loop=asyncio.get_running_loop())
    )
    target_held = False
    if isinstance(bound, GuardedWrite) and isinstance(evidence, FileEvidence):
        # Take the call over before looking at its target (``store.fences``): a late original
        # attempt asks the fence holding the target folder's lock, so once that lock is free it
        # has either written already (observed next) or will write nothing. A lock still held
        # past the wait is a frozen attempt mid-write: nothing can be judged now, the call parks.
        await rt.on_ledger(lambda: rt.ledger.fence_operation(op_id), attempt=attempt)
        target = evidence.target
        free = await rt.on_tool_pool(lambda: wait_for_folder(str(ws.root), target), attempt=attempt)
        target_held = not free

    def observe() -> Reconciliation | None:
        if target_held and isinstance(evidence, FileEvidence):
            return held_by_attempt(evidence)
        seen: Reconciliation | None = bound.reconcile(args, ws, evidence)
        return seen

    redo = None
    if (
        isinstance(bound, GuardedWrite)
        and isinstance(evidence, FileEvidence)
        and session_gov.policy.redo_interrupted_writes
    ):

        async def redo(prior: Reconciliation) -> tuple[Reconciliation, int] | None:
            # Unsettled, so each of its recovery rows is a redo recorded before it began (a bundle's
            # row commits with the bundle, which settles it). Counted after ``prior`` was observed:
            # with none recorded by then, no redo's exchange can have been under way while it was.
            started = await rt.on_ledger(lambda: _redos_recorded(rt, op_id), attempt=attempt)
            if started:
                # A redo began before this recovery (and may have exchanged): settle what it left
                # and observe; never start another.
                settled = await rt.on_tool_pool(
                    lambda: bound.redo(args, ws, evidence, prior, None), attempt=attempt
                )
                return settled, 1 + started
            if prior.observation != "matches_prior_state":
                return None
            # Recorded before it starts: only the run that recorded the first redo may exchange.
            run_number = await rt.on_ledger(
                lambda: rt.ledger.record_rerun(op_id, attempt=attempt.record), attempt=attempt
            )
            failpoints.hit("redo_recorded", tag=call.tool_name)
            done = await rt.on_tool_pool(
                lambda: bound.redo(args, ws, evidence, prior, run_number), attempt=attempt
            )
            failpoints.hit("redo_settled", tag=call.tool_name)
            return done, run_number

    return await _reconcile(rt, inp, state, dispatched, attempt, observe, redo=redo)


def _redos_recorded(rt: Runtime, op_id: str) -> int:
    return sum(row["phase"] == "recovery" for row in rt.ledger.attempts(op_id))


def _recovery_receipt(
    rt: Runtime,
    inp: RecoverInput,
    record: dict[str, Any],
    call: Dispatched,
    recovered: ToolResult | None,
    runs: int | None = None,
    redo: Any = None,
) -> tuple[dict[str, Any], TaskStatus, tuple[EvidenceItem, ...]]:
    """The receipt of an operation settled by recovery (and its status and evidence): verified
    against its predicates when the reconciler proved the effect, ``recovery_required`` when it
    parks; a redo lists its runs and what it observed and did (``observedEffect.redo``)."""
    ts = now_ms()
    if recovered is None:
        status: TaskStatus = "recovery_required"
        items: tuple[EvidenceItem, ...] = ()
    else:
        status, items = verification.verify(record, recovered, call.ws)
    sealed = verification.receipt(
        operation_id=inp.call.operation_id,
        gov=rt.session_governance(inp.session_id),
        record=record,
        args=call.args,
        started_ms=ts,
        ended_ms=ts,
        status=status,
        items=items,
        error=None if recovered is None else recovered.error_code,
        attempts=runs,
        redo=redo if isinstance(redo, dict) else None,
    )
    return sealed, status, items


async def _reconcile(
    rt: Runtime,
    inp: RecoverInput,
    state: CallState,
    call: Dispatched,
    attempt: Attempt,
    observe: Callable[[], Reconciliation | None],
    task_id: str | None = None,
    redo: Callable[[Reconciliation], Awaitable[tuple[Reconciliation, int] | None]] | None = None,
) -> RecoverResult:
    """Observe the target (``observe``, on the tool pool) and commit one atomic recovery bundle;
    a target in its before-state is first redone through ``redo`` when given (``tools.redo``)."""
    ref, op_id, op = inp.call, inp.call.operation_id, state.op
    rec = await rt.on_tool_pool(observe, attempt=attempt)
    if rec is None:
        return _parked(inp, "dispatch_without_response")
    runs = None
    redone = None if redo is None else await redo(rec)
    if redone is not None:
        rec, runs = redone
    held = await rt.on_ledger(lambda: rt.ledger.decision(op_id), attempt=attempt)
    receipt = None
    recovered = rec.recovered if rec.observation == "matches_expected_state" else None
    if held is not None:
        note = rec.observed.get("redo") if runs is not None else None
        receipt, status, items = await rt.on_tool_pool(
            lambda: _recovery_receipt(rt, inp, held["decision"], call, recovered, runs, note),
            attempt=attempt,
        )
        if recovered is not None and task_id is not None:
            # What melra_execute answers, as if it had seen its effect: the task's status,
            # evidence and receipt beside what reconciliation observed.
            recovered = execution_view(task_id, op_id, recovered, status, items)
    ts = now_ms()
    reconcile = builders.reconcile_event(
        call.ids, op_id, ref.tool_call_id, rec.observation, rec.observation_digest, ts
    )
    evidence_ids = [op.call_event_id or "", op.dispatch_event_id or "", reconcile.id]
    outcome: RuntimeEvent | None = None
    park: ParkReason | None = None
    if recovered is not None:
        outcome = builders.response_event(
            call.ids,
            f"{op_id}_recovered",
            ref.tool_call_id,
            ref.tool_name,
            recovered.result,
            recovered.is_error,
            ts,
            op_id,
        )
        decision = builders.decision_event(
            call.ids,
            op_id,
            ref.tool_call_id,
            "reconcile_matches_expected_state",
            [*evidence_ids, outcome.id],
            outcome.id,
            ts,
        )
    else:
        park = _OBSERVATION_PARKS.get(rec.observation, "reconcile_unreadable")
        decision = builders.decision_event(call.ids, op_id, ref.tool_call_id, park, evidence_ids, None, ts)
    failpoints.hit("P10", tag=ref.tool_name)

    def commit() -> RecoverResult | None:
        try:
            rt.ledger.commit_recovery_bundle(
                reconcile, decision, outcome, attempt=attempt.record, receipt=receipt
            )
            return None
        except LedgerRejection:
            # Another recoverer settled it first (a different observation is refused: parked is
            # terminal). Report what the ledger now says rather than what we observed.
            settled = _settled(rt, inp)
            if settled is None:
                raise
            return settled

    raced = await rt.on_ledger(commit, attempt=attempt)
    if raced is not None:
        return raced
    if outcome is not None:
        return _completed(op_id, "reconcile_matches_expected_state", outcome)
    assert park is not None
    return _parked(inp, park)
