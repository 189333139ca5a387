"""The recovery bundle's rules: what makes reconcile [+ outcome] + decision a valid terminal fact.

One function (``interpret_recovery``) reads the recovery tail of one scanned operation; the
Resolver, projection rebuild and the writers' admission all consume it rather than assembling
facts or causal-order rules of their own (reference ``tool-recovery-bundle.ts``). Codes are the
reference's ``ToolRecoveryBundleValidationCode`` plus ``recovery_fact_shape_conflict`` and
``event_order_conflict`` from interpretation.

Only ``recoveryMode: reconcile`` operations may be recovered: for any other mode the runtime
has no evidence that could prove the side effect's state, so the operation stays indeterminate.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from itertools import pairwise
from typing import Literal

from maka_core.errors import LedgerRejection
from maka_core.facts.events import ReconcileResult, RecoveryDecision, RuntimeEvent
from maka_core.ledger.lanes import args_hash_or_none, event_lane
from maka_core.ledger.operation_facts import OperationFacts

BundleCode = Literal[
    "call_identity_conflict",
    "canonical_args_hash_conflict",
    "dispatch_identity_conflict",
    "reconcile_fact_invalid",
    "decision_fact_invalid",
    "recovery_fact_identity_conflict",
    "operation_identity_conflict",
    "recovery_mode_unsupported",
    "outcome_required",
    "outcome_for_parked",
    "outcome_identity_conflict",
    "outcome_not_successful",
    "outcome_reference_conflict",
    "reconcile_decision_conflict",
    "evidence_order_conflict",
    "recovery_fact_shape_conflict",
    "event_order_conflict",
]

_PARK_REASON = {
    "matches_prior_state": "reconcile_matches_prior_state",
    "diverged": "reconcile_diverged",
    "unreadable": "reconcile_unreadable",
}


@dataclass(frozen=True)
class BundleFinding:
    """A bundle that does not hold, with the stable code and a human message."""

    code: BundleCode
    message: str


@dataclass(frozen=True)
class RecoveryInterpretation:
    """What an operation's recovery tail means: absent, a valid terminal decision, or corrupt."""

    kind: Literal["absent", "valid", "corruption"]
    code: BundleCode | None = None
    message: str | None = None
    reconcile: ReconcileResult | None = None
    decision: RecoveryDecision | None = None
    reconcile_event: RuntimeEvent | None = None
    decision_event: RuntimeEvent | None = None
    outcome_event: RuntimeEvent | None = None


def _same_execution(event: RuntimeEvent, anchor: RuntimeEvent) -> bool:
    return (
        not event.partial
        and event.invocation_id == anchor.invocation_id
        and event.run_id == anchor.run_id
        and event.turn_id == anchor.turn_id
    )


def _refs_bind(event: RuntimeEvent, operation_id: str, call_id: str) -> bool:
    refs = event.refs
    return refs is not None and refs.operation_id == operation_id and refs.tool_call_id == call_id


def validate_bundle(
    call: RuntimeEvent,
    dispatch: RuntimeEvent,
    reconcile: RuntimeEvent,
    outcome: RuntimeEvent | None,
    decision: RuntimeEvent,
) -> BundleFinding | None:
    """Check one recovery bundle against its committed call and dispatch.

    The operation identity (invocation, run, turn, name, hash, mode) is the dispatch's own; the
    call must match it, and every recovery fact must bind to it.

    Returns:
        None when the bundle holds, else the first finding in the reference's order.
    """
    td = dispatch.actions.tool_dispatch if dispatch.actions is not None else None
    if td is None:
        return BundleFinding("dispatch_identity_conflict", "Recovery bundle dispatch identity conflict")
    op_id, call_id = td.operation_id, td.provider_tool_call_id
    content = call.content
    if (
        content is None
        or content.kind != "function_call"
        or content.id != call_id
        or content.name != td.tool_name
        or event_lane(call) is None
        or not _same_execution(call, dispatch)
    ):
        return BundleFinding("call_identity_conflict", "Recovery bundle call identity conflict")
    if args_hash_or_none(content.name, content.args) != td.canonical_args_hash:
        return BundleFinding(
            "canonical_args_hash_conflict",
            "Recovery bundle argument hash does not match its canonical function call",
        )
    if (
        event_lane(dispatch) is None
        or dispatch.session_id != call.session_id
        or not _refs_bind(dispatch, op_id, call_id)
    ):
        return BundleFinding("dispatch_identity_conflict", "Recovery bundle dispatch identity conflict")
    if td.recovery_mode != "reconcile":
        return BundleFinding("recovery_mode_unsupported", "Recovery bundle requires reconcile recovery mode")

    r_env = reconcile.actions.tool_recovery if reconcile.actions is not None else None
    if (
        r_env is None
        or r_env.kind != "maka.tool.reconcile_result"
        or not isinstance(r_env.payload, ReconcileResult)
    ):
        return BundleFinding(
            "reconcile_fact_invalid", "Recovery bundle requires one canonical reconcile result fact"
        )
    d_env = decision.actions.tool_recovery if decision.actions is not None else None
    if (
        d_env is None
        or d_env.kind != "maka.tool.recovery_decision"
        or not isinstance(d_env.payload, RecoveryDecision)
    ):
        return BundleFinding(
            "decision_fact_invalid", "Recovery bundle requires one canonical recovery decision fact"
        )
    r_fact, d_fact = r_env.payload, d_env.payload

    for fact in (reconcile, decision):
        if (
            event_lane(fact) is None
            or not _same_execution(fact, dispatch)
            or fact.session_id != call.session_id
            or not _refs_bind(fact, op_id, call_id)
        ):
            return BundleFinding(
                "recovery_fact_identity_conflict", "Recovery fact execution identity conflict"
            )
    if r_fact.operation_id != op_id or d_fact.operation_id != op_id:
        return BundleFinding(
            "operation_identity_conflict", "Recovery bundle fact operation identity conflict"
        )

    expected = [call.id, dispatch.id, reconcile.id]
    if d_fact.disposition == "completed":
        if outcome is None:
            return BundleFinding(
                "outcome_required", "Completed recovery decision requires a persisted outcome"
            )
        o_content = outcome.content
        if (
            outcome.session_id != call.session_id
            or event_lane(outcome) is None
            or not _same_execution(outcome, dispatch)
            or o_content is None
            or o_content.kind != "function_response"
            or o_content.id != call_id
            or o_content.name != td.tool_name
            or not _refs_bind(outcome, op_id, call_id)
        ):
            return BundleFinding(
                "outcome_identity_conflict", "Completed recovery outcome execution identity conflict"
            )
        if o_content.is_error:
            return BundleFinding(
                "outcome_not_successful",
                "Completed recovery decision requires a successful synthesized outcome",
            )
        if d_fact.outcome_event_id != outcome.id:
            return BundleFinding(
                "outcome_reference_conflict", "Completed recovery decision outcome reference conflict"
            )
        if r_fact.observation != "matches_expected_state":
            return BundleFinding(
                "reconcile_decision_conflict",
                "Completed recovery decision requires a matching expected-state observation",
            )
        expected.append(outcome.id)
    else:
        if outcome is not None:
            return BundleFinding(
                "outcome_for_parked", "Parked recovery decision must not commit a provider outcome"
            )
        if d_fact.reason_code != _PARK_REASON.get(r_fact.observation):
            return BundleFinding(
                "reconcile_decision_conflict", "Parked recovery decision does not match the reconcile result"
            )
    if list(d_fact.evidence_event_ids) != expected:
        return BundleFinding(
            "evidence_order_conflict", "Recovery decision evidence does not match the canonical causal order"
        )
    return None


def interpret_recovery(facts: OperationFacts, order: Mapping[str, int]) -> RecoveryInterpretation:
    """Interpret the recovery tail of one scanned operation.

    Args:
        facts: the scanner's record of the operation.
        order: event id -> ledger position, to check causal order call < dispatch < reconcile
            [< outcome] < decision.
    """
    if not facts.reconcile_events and not facts.decision_events:
        return RecoveryInterpretation("absent")
    if (
        len(facts.reconcile_events) != 1
        or len(facts.decision_events) != 1
        or facts.call is None
        or facts.dispatch is None
    ):
        return RecoveryInterpretation(
            "corruption",
            "recovery_fact_shape_conflict",
            "Recovery requires exactly one reconcile fact and one terminal decision",
        )
    reconcile, decision = facts.reconcile_events[0], facts.decision_events[0]
    finding = validate_bundle(facts.call, facts.dispatch, reconcile, facts.response, decision)
    if finding is not None:
        return RecoveryInterpretation("corruption", finding.code, finding.message)
    chain = [facts.call, facts.dispatch, reconcile]
    if facts.response is not None:
        chain.append(facts.response)
    chain.append(decision)
    positions = [order.get(e.id, -1) for e in chain]
    if any(p < 0 for p in positions) or any(b <= a for a, b in pairwise(positions)):
        return RecoveryInterpretation(
            "corruption", "event_order_conflict", "Recovery facts violate canonical RuntimeEvent causal order"
        )
    assert reconcile.actions is not None and reconcile.actions.tool_recovery is not None
    assert decision.actions is not None and decision.actions.tool_recovery is not None
    r_fact, d_fact = reconcile.actions.tool_recovery.payload, decision.actions.tool_recovery.payload
    assert isinstance(r_fact, ReconcileResult) and isinstance(d_fact, RecoveryDecision)
    return RecoveryInterpretation(
        "valid",
        reconcile=r_fact,
        decision=d_fact,
        reconcile_event=reconcile,
        decision_event=decision,
        outcome_event=facts.response,
    )


def check_bundle_commit(
    operation: Callable[[str], OperationFacts | None], batch: Sequence[RuntimeEvent]
) -> None:
    """Refuse a recovery bundle that is invalid in itself, judged against its committed call and
    dispatch (``validate_bundle``; ``operation`` finds an operation's facts by its id), without the
    transition check.

    The writers do not call this first. The reference's answers put the transition check ahead
    of the bundle rules: a recovered response naming another tool is ``identity_conflict`` and a
    reconcile of another turn ``invocation_identity_conflict`` (the scan's codes), not
    ``outcome_identity_conflict`` / ``recovery_fact_identity_conflict``; a strict ``admit`` (live
    writer and import alike) reaches ``interpret_recovery`` only after that check. This is the
    bundle rules on their own, for a caller that wants them before it commits. A batch that is
    not bundle-shaped, or names an operation with no committed call and dispatch, is left to the
    transition check.

    Raises:
        LedgerRejection: the bundle validation code, at the bundle's first event.
    """
    lanes = tuple(event_lane(e) for e in batch)
    if lanes == ("reconcile_result", "recovery_decision"):
        reconcile, outcome, decision = batch[0], None, batch[1]
    elif lanes == ("reconcile_result", "function_response", "recovery_decision"):
        reconcile, outcome, decision = batch
    else:
        return
    recovery = reconcile.actions.tool_recovery if reconcile.actions is not None else None
    if recovery is None:
        return
    op_id = recovery.payload.operation_id
    facts = operation(op_id)
    if facts is None or facts.call is None or facts.dispatch is None:
        return
    finding = validate_bundle(facts.call, facts.dispatch, reconcile, outcome, decision)
    if finding is not None:
        raise LedgerRejection(
            finding.code,
            f"recovery bundle rejected: {finding.message}",
            eventId=reconcile.id,
            operationId=op_id,
            toolCallId=facts.tool_call_id,
        )
