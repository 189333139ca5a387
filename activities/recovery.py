"""``maka.recover_operation``: settle a tool call whose activity failed or timed out.

Temporal only knows the attempt ended badly; the ledger knows where it stopped:

- completed (T2 or a bundle committed) -> continue with the committed outcome;
- definitely not dispatched (new protocol, no T1) -> the tool never ran; the workflow may dispatch it;
- dispatched without outcome -> a ``replay_safe`` read is simply read again and its T2 committed; a
  ``reconcile`` tool observes its target against the evidence committed with T1 and commits one
  atomic recovery bundle (finalize-only: completed when the file holds the expected state, parked
  otherwise); a tool with no reconciler (bash) parks with ``dispatch_without_response``;
- parked or corruption -> park with the Resolver's reason.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from activities import facts
from activities.tools import _guard_disabled, resolve_call, run_and_commit_outcome, run_heartbeating
from maka_core import failpoints
from maka_core.errors import LedgerRejection
from maka_core.tools import FileEvidence
from workflows.contracts import RecoverInput, RecoverResult, RunIds

if TYPE_CHECKING:
    from activities import MakaActivities

_PARK_REASONS = {
    "matches_prior_state": "reconcile_matches_prior_state",
    "diverged": "reconcile_diverged",
    "unreadable": "reconcile_unreadable",
}


async def recover_operation(host: MakaActivities, inp: RecoverInput) -> RecoverResult:
    """Resolve one operation and settle it from evidence, or park it; never re-run a side effect."""
    call = inp.call
    op, call_event, ids = await resolve_call(host, inp.session_id, inp.run_id, call.tool_call_id)
    op_id = call.operation_id
    if op is None or ids is None:
        # The call event itself is missing: the model step's commit never happened as the
        # workflow believes. Nothing ran; parking keeps a human in the loop for this anomaly.
        return RecoverResult(operation_id=op_id, status="parked", reason="call_not_found")
    if op.status == "completed":
        return RecoverResult(
            operation_id=op_id,
            status="completed",
            reason=op.reason,
            is_error=bool(op.response_is_error),
            response_event_id=op.response_event_id,
        )
    if op.status == "definitely_not_dispatched" or _guard_disabled():
        return RecoverResult(operation_id=op_id, status="not_dispatched", reason=op.reason)
    if op.status in ("parked", "corruption") or op.reason != "dispatch_without_response":
        return RecoverResult(operation_id=op_id, status="parked", reason=op.reason)

    tool = host.tools.get(call.tool_name)
    if (
        tool is None
        or call_event is None
        or call_event.content is None
        or call_event.content.kind != "function_call"
    ):
        return RecoverResult(operation_id=op_id, status="parked", reason="dispatch_without_response")
    args: dict[str, Any] = dict(call_event.content.args)
    try:
        ws = host.workspace(inp.workspace)
    except Exception:
        return RecoverResult(operation_id=op_id, status="parked", reason="workspace_unavailable")
    if ws.identity != inp.workspace_identity:
        return RecoverResult(operation_id=op_id, status="parked", reason="workspace_identity_mismatch")

    if tool.recovery_mode == "replay_safe" and not tool.mutates:
        return await _reread(host, inp, ids, tool, args, ws)
    if tool.recovery_mode != "reconcile":
        return RecoverResult(operation_id=op_id, status="parked", reason="dispatch_without_response")

    evidence_json = await host.ledger(host.store.evidence, op_id, _heartbeat=True)
    evidence = _load_evidence(evidence_json)
    rec = await run_heartbeating(host, tool.reconcile, args, ws, evidence, interval=host.heartbeat_interval())
    if rec is None:
        return RecoverResult(operation_id=op_id, status="parked", reason="dispatch_without_response")

    ts = facts.now_ms()
    reconcile = facts.reconcile_event(
        ids, op_id, call.tool_call_id, rec.observation, rec.observation_digest, ts
    )
    evidence_ids = [op.call_event_id or "", op.dispatch_event_id or "", reconcile.id]
    outcome = None
    if rec.observation == "matches_expected_state" and rec.recovered is not None:
        outcome = facts.response_event(
            ids,
            f"{op_id}_recovered",
            call.tool_call_id,
            call.tool_name,
            rec.recovered.result,
            rec.recovered.is_error,
            ts,
            op_id,
        )
        decision = facts.decision_event(
            ids,
            op_id,
            call.tool_call_id,
            "reconcile_matches_expected_state",
            [*evidence_ids, outcome.id],
            outcome.id,
            ts,
        )
    else:
        park_reason = _PARK_REASONS.get(rec.observation, "reconcile_unreadable")
        decision = facts.decision_event(ids, op_id, call.tool_call_id, park_reason, evidence_ids, None, ts)
    failpoints.hit("P10", tag=call.tool_name)
    try:
        await host.ledger(
            host.store.commit_recovery_bundle,
            reconcile,
            decision,
            outcome,
            attempt=facts.attempt_record("recovery"),
            _heartbeat=True,
        )
    except LedgerRejection:
        # Another recoverer settled it first (a different observation is refused: parked is
        # terminal). Report what the ledger now says rather than what we observed.
        settled, _, _ = await resolve_call(host, inp.session_id, inp.run_id, call.tool_call_id)
        if settled is None or settled.status not in ("completed", "parked"):
            raise
        return RecoverResult(
            operation_id=op_id,
            status="completed" if settled.status == "completed" else "parked",
            reason=settled.reason,
            is_error=bool(settled.response_is_error),
            response_event_id=settled.response_event_id,
        )
    if outcome is not None:
        return RecoverResult(
            operation_id=op_id,
            status="completed",
            reason="reconcile_matches_expected_state",
            is_error=outcome.content is not None and bool(getattr(outcome.content, "is_error", False)),
            response_event_id=outcome.id,
        )
    return RecoverResult(operation_id=op_id, status="parked", reason=park_reason)


async def _reread(
    host: MakaActivities, inp: RecoverInput, ids: RunIds, tool: Any, args: dict[str, Any], ws: Any
) -> RecoverResult:
    """A read-only call with T1 and no T2: reading again is the recovery (no effect to duplicate)."""
    call = inp.call
    result, response = await run_and_commit_outcome(host, ids, call, tool, args, ws)
    return RecoverResult(
        operation_id=call.operation_id,
        status="completed",
        reason="replay_safe_reread",
        is_error=result.is_error,
        response_event_id=response.id,
    )


def _load_evidence(value: Any) -> FileEvidence | None:
    if value is None:
        return None
    if isinstance(value, FileEvidence):
        return value
    return FileEvidence.from_json(value)
