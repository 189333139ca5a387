"""The RecoveryResolver's decision table (reference ``recovery-resolver.test.ts`` and facts §2)."""

from __future__ import annotations

import pytest

from maka_core.facts.codec import canonical_args_hash
from maka_core.facts.events import Actions, RuntimeProtocol
from maka_core.ledger.resolver import OperationResolution, interrupted_code_mode_outcomes, resolve
from maka_core.ledger.scanner import scan
from tests.ledger_factory import (
    DEFAULT_ARGS,
    call,
    completed_bundle,
    decision,
    dispatch,
    event,
    parked_bundle,
    reconcile,
    response,
    t1,
    terminal,
    text,
    user,
)


def only(events: list) -> OperationResolution:
    resolution = resolve(events)
    assert len(resolution.operations) == 1
    return resolution.operations[0]


# --- reference recovery-resolver.test.ts ----------------------------------------------------


def test_new_protocol_call_without_dispatch_was_never_dispatched() -> None:
    resolution = resolve([user(), call()])
    op = resolution.operations[0]
    assert (op.status, op.reason) == ("definitely_not_dispatched", "new_protocol_before_dispatch")
    assert resolution.tool_boundary_protocol == "t1_after_preflight_v1"
    assert not resolution.has_corruption
    assert not resolution.requires_reconciliation
    assert not op.requires_reconciliation


def test_dispatch_without_response_requires_reconciliation() -> None:
    resolution = resolve([user(), *t1()])
    op = resolution.operations[0]
    assert (op.status, op.reason) == ("indeterminate", "dispatch_without_response")
    assert op.requires_reconciliation and resolution.requires_reconciliation
    assert op.operation_id == "op-call-1" and op.settlement_origin is None


def test_builds_an_interrupted_outcome_only_for_the_outer_exec_operation() -> None:
    nested = dict(origin="code_mode", model_visibility="hidden")
    events = [
        user(),
        *t1("exec-1", "exec", {"code": "1"}),
        *t1("nested-1", "Read", {"path": "a"}, **nested),
        *t1("other-1", "Bash"),
    ]
    outcomes = interrupted_code_mode_outcomes(events, now=42, tool_mode="code_mode")
    assert [o.id for o in outcomes] == ["op-exec-1_response"]
    outcome = outcomes[0]
    assert outcome.ts == 42 and outcome.role == "tool" and outcome.author == "tool"
    assert outcome.content is not None and outcome.content.kind == "function_response"
    assert outcome.content.is_error is True
    assert outcome.content.result["value"]["status"] == "interrupted"
    assert outcome.refs is not None and outcome.refs.operation_id == "op-exec-1"
    # Committing it settles exactly that operation as a failed outcome.
    settled = resolve([*events, *outcomes]).for_call("inv-1", "exec-1")
    assert settled is not None and settled.status == "completed" and settled.response_is_error


def test_does_not_infer_code_mode_recovery_from_a_custom_direct_exec_name() -> None:
    events = [user(), *t1("exec-1", "exec", {"code": "1"})]
    assert interrupted_code_mode_outcomes(events, now=42, tool_mode="direct") == []


def test_matching_response_without_dispatch_is_a_completed_pre_t1_result() -> None:
    op = only([user(), call(), response(bound=False)])
    assert (op.status, op.reason, op.settlement_origin) == (
        "completed",
        "matching_response",
        "pre_t1_synthetic",
    )
    assert op.operation_id is None and op.dispatch_event_id is None


def test_dispatch_without_its_call_is_corruption() -> None:
    resolution = resolve([user(), dispatch()])
    op = resolution.operations[0]
    assert (op.status, op.reason) == ("corruption", "orphan_dispatch")
    assert resolution.has_corruption and not resolution.requires_reconciliation
    assert [i.code for i in resolution.issues] == ["event_order_conflict"]


def test_response_without_its_call_is_corruption() -> None:
    resolution = resolve([user(), response()])
    op = resolution.operations[0]
    assert (op.status, op.reason) == ("corruption", "orphan_response")
    assert op.operation_id is None and op.response_is_error is False
    assert [i.code for i in resolution.issues] == ["orphan_response"]


def test_dispatch_identity_drift_is_corruption() -> None:
    # Same argument identity, different tool name on the dispatch.
    same_hash = canonical_args_hash("Bash", DEFAULT_ARGS)
    op = only([user(), call(operation_id="op-call-1"), dispatch(name="Write", args_hash=same_hash)])
    assert (op.status, op.reason) == ("corruption", "identity_conflict")


def test_repeated_dispatch_is_corruption() -> None:
    events = [user(), *t1(), dispatch(id="op-call-1_dispatch_dup"), response()]
    resolution = resolve(events)
    assert (resolution.operations[0].status, resolution.operations[0].reason) == (
        "corruption",
        "duplicate_dispatch",
    )
    assert resolution.to_json()["issues"] == [
        {"code": "duplicate_dispatch", "eventId": "op-call-1_dispatch_dup"}
    ]


def test_repeated_response_is_corruption() -> None:
    op = only([user(), *t1(), response(), response(id="op-call-1_response_dup")])
    assert (op.status, op.reason) == ("corruption", "duplicate_response")


def test_protocol_marker_after_the_first_event_is_invalid() -> None:
    late = text(actions=Actions(runtime_protocol=RuntimeProtocol(tool_boundary="t1_after_preflight_v1")))
    resolution = resolve([user(protocol=None), late, call()])
    assert resolution.tool_boundary_protocol is None
    assert resolution.has_corruption
    assert [(i.code, i.event_id) for i in resolution.issues] == [("protocol_marker_invalid", "evt-model-1")]
    # Without a valid marker the call may predate T1: never "definitely not dispatched".
    assert resolution.operations[0].status == "indeterminate"


def test_unknown_protocol_marker_on_the_first_event_counts_as_legacy() -> None:
    # The reference decoder refuses an unknown marker, so (like the reference's own test) the
    # event is built in code without validation; the Resolver must still judge it.
    marker = RuntimeProtocol.model_construct(tool_boundary="t0_unknown_v9")
    first = user(protocol=None).model_copy(update={"actions": Actions(runtime_protocol=marker)})
    resolution = resolve([first, call()])
    assert resolution.tool_boundary_protocol is None
    assert [(i.code, i.event_id) for i in resolution.issues] == [("protocol_marker_invalid", "evt-user-1")]
    op = resolution.operations[0]
    assert (op.status, op.reason) == ("indeterminate", "legacy_dispatch_unknown")


def test_response_linked_to_a_different_operation_is_corruption() -> None:
    op = only([user(), *t1(), response(operation_id="op-other")])
    assert (op.status, op.reason) == ("corruption", "identity_conflict")


# --- the rest of the decision table ---------------------------------------------------------


def test_call_dispatch_response_completes_through_normal_t2() -> None:
    op = only([user(), *t1(), response(is_error=True), terminal()])
    assert (op.status, op.reason, op.settlement_origin) == ("completed", "matching_response", "normal_t2")
    assert op.response_is_error is True
    assert (op.call_event_id, op.dispatch_event_id, op.response_event_id) == (
        "evt-call-1",
        "op-call-1_dispatch",
        "op-call-1_response",
    )


def test_call_only_without_marker_is_legacy_indeterminate() -> None:
    resolution = resolve([user(protocol=None), call(), terminal("failed")])
    assert resolution.requires_reconciliation
    assert resolution.operations[0].reason == "legacy_dispatch_unknown"


def test_valid_completed_bundle_completes_the_operation() -> None:
    events = [user(), *t1(recovery_mode="reconcile"), *completed_bundle()]
    op = only(events)
    assert (op.status, op.reason, op.settlement_origin) == (
        "completed",
        "recovery_bundle_completed",
        "recovery_bundle",
    )
    assert op.response_event_id == "op-call-1_recovered"


@pytest.mark.parametrize(
    "observation,reason",
    [
        ("matches_prior_state", "reconcile_matches_prior_state"),
        ("diverged", "reconcile_diverged"),
        ("unreadable", "reconcile_unreadable"),
    ],
)
def test_valid_parked_bundle_parks_with_the_observation_reason(observation: str, reason: str) -> None:
    events = [user(), *t1(recovery_mode="reconcile"), *parked_bundle(observation=observation)]
    resolution = resolve(events)
    op = resolution.operations[0]
    assert (op.status, op.reason, op.settlement_origin) == ("parked", reason, "recovery_bundle")
    assert not resolution.has_corruption and not resolution.requires_reconciliation


def test_bundle_for_a_non_reconcile_mode_is_recovery_corruption() -> None:
    events = [user(), *t1(recovery_mode="never_auto_retry"), *parked_bundle()]
    op = only(events)
    assert (op.status, op.reason, op.settlement_origin) == ("corruption", "recovery_fact_corruption", None)


def test_bundle_with_wrong_evidence_order_is_recovery_corruption() -> None:
    rec, _dec = parked_bundle()
    wrong = decision(evidence=["op-call-1_dispatch", "evt-call-1", rec.id], disposition="parked")
    op = only([user(), *t1(recovery_mode="reconcile"), rec, wrong])
    assert op.reason == "recovery_fact_corruption"


def test_completed_bundle_over_a_prior_state_observation_is_recovery_corruption() -> None:
    _rec, out, dec = completed_bundle()
    prior = reconcile(observation="matches_prior_state")
    op = only([user(), *t1(recovery_mode="reconcile"), prior, out, dec])
    assert op.reason == "recovery_fact_corruption"


def test_decision_without_reconcile_is_recovery_corruption() -> None:
    _rec, dec = parked_bundle()
    op = only([user(), *t1(recovery_mode="reconcile"), dec])
    assert op.reason == "recovery_fact_corruption"


def test_recovery_fact_before_any_dispatch_is_an_order_issue() -> None:
    resolution = resolve([user(), call(), reconcile()])
    assert [i.code for i in resolution.issues] == ["event_order_conflict"]
    assert resolution.has_corruption


def test_duplicate_call_is_corruption() -> None:
    op = only([user(), call(), call(id="evt-call-1-again")])
    assert (op.status, op.reason) == ("corruption", "duplicate_call")


def test_two_calls_dispatching_one_operation_id_is_duplicate_operation() -> None:
    events = [
        user(),
        *t1("call-1"),
        call("call-2"),
        dispatch("call-2", operation_id="op-call-1", id="op-call-1_dispatch_again"),
    ]
    resolution = resolve(events)
    assert [(o.tool_call_id, o.reason) for o in resolution.operations] == [
        ("call-1", "duplicate_operation"),
        ("call-2", "duplicate_operation"),
    ]


def test_wrong_canonical_args_hash_is_corruption() -> None:
    op = only([user(), call(operation_id="op-call-1"), dispatch(args={"command": "rm -rf /"})])
    assert (op.status, op.reason) == ("corruption", "canonical_args_hash_conflict")


def test_dispatch_after_a_synthetic_response_is_an_order_conflict() -> None:
    op = only([user(), call(), response(bound=False), dispatch()])
    assert (op.status, op.reason) == ("corruption", "identity_conflict")
    codes = [i.code for i in scan([user(), call(), response(bound=False), dispatch()]).issues]
    assert codes == ["event_order_conflict", "identity_conflict"]


def test_duplicate_event_id_and_lane_conflicts_are_ledger_issues() -> None:
    bad_lane = event("evt-bad", role="system", author="system", content=call().content)
    resolution = resolve([user(), user(protocol=None), bad_lane])
    assert [i.code for i in resolution.issues] == ["duplicate_event_id", "semantic_lane_conflict"]
    assert resolution.has_corruption and resolution.operations == ()


def test_calls_are_keyed_per_invocation() -> None:
    # The same provider call id in two invocations is two operations, not a duplicate.
    events = [
        user(),
        *t1(),
        response(),
        call(id="evt-call-1-inv2", invocation_id="inv-2", run_id="run-2", turn_id="turn-2"),
    ]
    resolution = resolve(events)
    assert [(o.invocation_id, o.status) for o in resolution.operations] == [
        ("inv-1", "completed"),
        ("inv-2", "definitely_not_dispatched"),
    ]
    assert resolution.for_call("inv-2", "call-1") is resolution.operations[1]
    assert resolution.for_operation("op-call-1") is resolution.operations[0]
    assert resolution.for_operation("op-missing") is None


def test_session_scanner_judges_the_protocol_per_run() -> None:
    run2 = dict(invocation_id="inv-2", run_id="run-2", turn_id="turn-2")
    legacy = dict(invocation_id="inv-3", run_id="run-3", turn_id="turn-3")
    events = [
        user(),
        terminal(),
        user(id="evt-user-2", **run2),
        call("c2", **run2),
        user(id="evt-user-3", protocol=None, **legacy),
        call("c3", **legacy),
    ]
    per_run = resolve(scan(events, protocol_scope="run"))
    assert per_run.issues == ()
    assert [o.status for o in per_run.operations] == ["definitely_not_dispatched", "indeterminate"]
    # Read as one prefix (the reference's reading), the second marker is misplaced.
    as_prefix = resolve(events)
    assert [i.event_id for i in as_prefix.issues] == ["evt-user-2"]
