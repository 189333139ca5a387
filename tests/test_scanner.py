"""The shared scanner: lanes, writer admission and projections (the pure part of the reference's
``recovery-persistence-authority.test.ts``; the store's tests cover the database side)."""

from __future__ import annotations

import time
from typing import Any

import pytest

from maka_core.errors import LedgerRejection
from maka_core.facts.events import Actions, Refs, RuntimeEvent
from maka_core.ledger.lanes import event_lane
from maka_core.ledger.projections import journal_rows, operation_row, project
from maka_core.ledger.scanner import LedgerScanner, Transition, group_transitions, scan, writer_admission
from tests.ledger_factory import (
    call,
    completed_bundle,
    decision,
    dispatch,
    event,
    op_id,
    parked_bundle,
    reconcile,
    response,
    t1,
    terminal,
    text,
    user,
)


def scanner_of(*events: RuntimeEvent) -> LedgerScanner:
    return scan(events)


def snapshot(scanner: LedgerScanner) -> Any:
    """Everything observable about a scanner, to prove a refused admit left it untouched."""
    return (
        scanner.event_count,
        [i.to_json() for i in scanner.issues],
        [i.to_json() for i in scanner.protocol_issues],
        [
            (
                f.tool_call_id,
                f.call,
                f.dispatch,
                f.response,
                list(f.reconcile_events),
                list(f.decision_events),
                list(f.issues),
                f.state,
            )
            for f in scanner.operations()
        ],
        dict(scanner.positions),
        project(scanner),
    )


def rejected(scanner: LedgerScanner, batch: list[RuntimeEvent], transition: Transition) -> LedgerRejection:
    before = snapshot(scanner)
    with pytest.raises(LedgerRejection) as info:
        scanner.admit(batch, transition)
    assert snapshot(scanner) == before, "admit() must never mutate the scanner"
    return info.value


def commit(scanner: LedgerScanner, batch: list[RuntimeEvent], transition: Transition) -> None:
    scanner.admit(batch, transition)
    for e in batch:
        scanner.apply(e)


# --- lanes ----------------------------------------------------------------------------------


def test_each_tool_fact_has_exactly_one_lane() -> None:
    assert event_lane(user()) == "ordinary"
    assert event_lane(call()) == "function_call"
    assert event_lane(dispatch()) == "tool_dispatch"
    assert event_lane(response()) == "function_response"
    assert event_lane(reconcile()) == "reconcile_result"
    assert event_lane(decision()) == "recovery_decision"


@pytest.mark.parametrize(
    "bad",
    [
        pytest.param(call(partial=True), id="partial call"),
        pytest.param(call(status="completed"), id="call with status"),
        pytest.param(call(branch="b"), id="call with branch"),
        pytest.param(event("e", role="system", author="system", content=call().content), id="call by system"),
        pytest.param(call(actions=Actions(end_invocation=True)), id="call with other actions"),
        pytest.param(
            response(actions=Actions(state_delta={"durationMs": "12"})), id="response non-number duration"
        ),
        pytest.param(
            event(
                "e",
                role="tool",
                author="tool",
                content=response().content,
                actions=Actions(tool_dispatch=dispatch().actions.tool_dispatch),
            ),  # type: ignore[union-attr]
            id="response that also dispatches",
        ),
        pytest.param(dispatch(refs=Refs(operation_id="op-call-1")), id="dispatch refs incomplete"),
        pytest.param(
            event(
                "e",
                role="system",
                author="system",
                actions=dispatch().actions,
                refs=Refs(operation_id="op-call-1", tool_call_id="call-1", step_id="s"),
            ),
            id="dispatch refs extra",
        ),
        pytest.param(reconcile(role="tool"), id="reconcile by tool"),
    ],
)
def test_lane_envelope_violations(bad: RuntimeEvent) -> None:
    assert event_lane(bad) is None
    assert [i.code for i in scan([user(), bad]).issues] == ["semantic_lane_conflict"]


def test_call_and_response_may_carry_their_narrow_state_delta() -> None:
    assert (
        event_lane(call(actions=Actions(state_delta={"displayName": "List", "intent": "look"})))
        == "function_call"
    )
    assert event_lane(response(actions=Actions(state_delta={"durationMs": 12.5}))) == "function_response"
    assert event_lane(call(actions=Actions(state_delta={"durationMs": 1}))) is None


# --- generic append -------------------------------------------------------------------------


def test_generic_append_refuses_recovery_facts() -> None:
    s = scanner_of(user(), *t1(recovery_mode="reconcile"))
    for fact in (reconcile(), decision()):
        assert rejected(s, [fact], "generic_append").code == "reserved_recovery_fact"


def test_generic_append_refuses_dispatch_and_bound_outcomes() -> None:
    s = scanner_of(user(), *t1())
    assert rejected(s, [dispatch(id="d2")], "generic_append").code == "reserved_tool_boundary_fact"
    assert rejected(s, [response()], "generic_append").code == "reserved_tool_boundary_fact"


def test_generic_append_admits_calls_and_unbound_responses() -> None:
    s = scanner_of(user())
    commit(s, [call()], "generic_append")
    commit(s, [response(bound=False)], "generic_append")
    assert s.operations()[0].state is None  # pre-T1: no operation row


def test_generic_duplicate_call_identity_is_rejected() -> None:
    s = scanner_of(user(), call())
    assert rejected(s, [call(id="evt-call-1-again")], "generic_append").code == "duplicate_call"


def test_invocation_identity_may_not_cross_run_turn_or_session() -> None:
    s = scanner_of(user())
    for drift in ({"run_id": "run-x"}, {"turn_id": "turn-x"}, {"session_id": "sess-x"}):
        err = rejected(s, [call(**drift)], "generic_append")
        assert err.code == "invocation_identity_conflict" and err.event_id == "evt-call-1"


def test_unbound_generic_response_after_t1_is_an_identity_conflict() -> None:
    s = scanner_of(user(), *t1())
    assert rejected(s, [response(bound=False)], "generic_append").code == "identity_conflict"
    assert s.operation("op-call-1").state == "prepared"  # type: ignore[union-attr]


def test_out_of_order_tool_batch_is_rejected_atomically() -> None:
    s = scanner_of(user())
    err = rejected(s, [response(bound=False), call()], "generic_append")
    assert err.code == "orphan_response" and err.detail["toolCallId"] == "call-1"


def test_ordinary_events_still_append_to_a_corrupt_ledger() -> None:
    # Startup repair must be able to seal a run whose ledger is already corrupt.
    s = scanner_of(user(), call(), call(id="dup"))
    assert s.has_corruption
    commit(s, [terminal("failed")], "generic_append")
    assert rejected(s, [call("c2")], "generic_append").code == "duplicate_call"


# --- T1 ------------------------------------------------------------------------------------


def test_t1_recomputes_the_args_hash_from_the_committed_call() -> None:
    s = scanner_of(user())
    wrong = dispatch(args={"command": "rm -rf /"})
    err = rejected(s, [call(operation_id="op-call-1"), wrong], "t1_prepare")
    assert (err.code, err.detail["operationId"]) == ("canonical_args_hash_conflict", "op-call-1")
    # The call committed earlier (generic) is what a lone dispatch is checked against.
    commit(s, [call(operation_id="op-call-1")], "generic_append")
    assert rejected(s, [wrong], "t1_prepare").code == "canonical_args_hash_conflict"
    commit(s, [dispatch()], "t1_prepare")
    assert s.operation("op-call-1").state == "prepared"  # type: ignore[union-attr]


def test_t1_after_a_pre_t1_synthetic_response_is_an_order_conflict() -> None:
    s = scanner_of(user(), call(), response(bound=False))
    assert rejected(s, [dispatch()], "t1_prepare").code == "event_order_conflict"


def test_t1_without_its_call_is_an_order_conflict() -> None:
    assert rejected(scanner_of(user()), [dispatch()], "t1_prepare").code == "event_order_conflict"


def test_second_dispatch_is_a_duplicate() -> None:
    err = rejected(scanner_of(user(), *t1()), [dispatch(id="again")], "t1_prepare")
    assert err.detail == {"eventId": "again", "operationId": "op-call-1", "toolCallId": "call-1"}
    assert err.code == "duplicate_dispatch"


@pytest.mark.parametrize(
    "batch,transition",
    [
        ([call()], "t1_prepare"),
        ([dispatch(), call()], "t1_prepare"),
        ([response(bound=False)], "t2_outcome"),
        ([response(), response(id="r2")], "t2_outcome"),
        ([reconcile()], "recovery_bundle"),
        ([decision(), reconcile()], "recovery_bundle"),
        ([user(id="u2")], "t1_prepare"),
    ],
)
def test_writer_batch_shapes(batch: list[RuntimeEvent], transition: Transition) -> None:
    assert rejected(scanner_of(user()), batch, transition).code == "transition_shape_conflict"


def test_t2_row_claiming_another_lane_is_a_lane_conflict() -> None:
    s = scanner_of(user(), *t1())
    both = event(
        "op-call-1_response",
        role="tool",
        author="tool",
        content=response().content,
        actions=dispatch().actions,
        refs=Refs(operation_id="op-call-1", tool_call_id="call-1"),
    )
    assert rejected(s, [both], "t2_outcome").code == "semantic_lane_conflict"


# --- T2 ------------------------------------------------------------------------------------


def test_t2_binds_only_to_a_dispatched_operation() -> None:
    s = scanner_of(user(), call())
    assert rejected(s, [response()], "t2_outcome").code == "identity_conflict"
    s2 = scanner_of(user(), *t1())
    assert rejected(s2, [response(operation_id="op-other")], "t2_outcome").code == "identity_conflict"
    assert rejected(s2, [response(name="Write")], "t2_outcome").code == "identity_conflict"
    commit(s2, [response()], "t2_outcome")
    assert s2.operation("op-call-1").state == "outcome_committed"  # type: ignore[union-attr]
    assert rejected(s2, [response(id="r2")], "t2_outcome").code == "duplicate_response"


def test_t2_for_a_call_never_seen_is_an_orphan() -> None:
    err = rejected(scanner_of(user()), [response()], "t2_outcome")
    assert (err.code, err.detail) == (
        "orphan_response",
        {"eventId": "op-call-1_response", "toolCallId": "call-1"},
    )


def test_exact_retry_is_a_no_op_and_a_changed_retry_a_duplicate_id() -> None:
    s = scanner_of(user(), *t1(), response())
    s.admit([response()], "t2_outcome")  # exact: nothing new to check
    s.admit(t1(), "t1_prepare")
    changed = response(result="different")
    assert rejected(s, [changed], "t2_outcome").code == "duplicate_event_id"


# --- recovery bundles -----------------------------------------------------------------------


def reconcilable() -> LedgerScanner:
    return scanner_of(user(), *t1(recovery_mode="reconcile"))


def test_completed_bundle_settles_and_projects_its_journal() -> None:
    s = reconcilable()
    commit(s, completed_bundle(), "recovery_bundle")
    facts = s.operation("op-call-1")
    assert facts is not None and facts.state == "recovery_completed"
    row = operation_row(facts)
    assert row is not None and row.current_state == "recovery_completed" and row.version == 4
    assert row.result_event_id == "op-call-1_recovered"
    journal = journal_rows(facts)
    assert [j.state for j in journal] == [
        "prepared",
        "reconcile_observed",
        "outcome_committed",
        "recovery_completed",
    ]
    assert [j.journal_event_id for j in journal] == [
        "op-call-1_prepared",
        "op-call-1_reconcile_journal",
        "op-call-1_outcome",
        "op-call-1_decision_journal",
    ]
    assert (
        journal[1].metadata_json is not None
        and '"kind":"maka.tool.reconcile_result"' in journal[1].metadata_json
    )
    assert journal[2].metadata_json is None


def test_parked_bundle_is_terminal_and_only_its_exact_retry_converges() -> None:
    s = reconcilable()
    bundle = parked_bundle()
    commit(s, bundle, "recovery_bundle")
    assert s.operation("op-call-1").state == "recovery_parked"  # type: ignore[union-attr]
    s.admit(bundle, "recovery_bundle")  # exact retry
    # A different bundle reusing the ids is a duplicate identity...
    assert rejected(s, parked_bundle(observation="diverged"), "recovery_bundle").code == "duplicate_event_id"
    # ...and one with fresh ids a second terminal decision.
    again = completed_bundle(suffix="-2")
    assert rejected(s, again, "recovery_bundle").code == "recovery_fact_shape_conflict"
    # Nor may a late outcome settle a parked operation.
    assert rejected(s, [response()], "t2_outcome").code == "outcome_for_parked"


def test_bundle_rules_are_enforced_at_admission() -> None:
    rec, out, dec = completed_bundle()
    assert (
        rejected(scanner_of(user(), *t1()), parked_bundle(), "recovery_bundle").code
        == "recovery_mode_unsupported"
    )
    s = reconcilable()
    assert rejected(s, [rec, dec], "recovery_bundle").code == "outcome_required"
    assert rejected(s, [reconcile(observation="diverged"), out, dec], "recovery_bundle").code == (
        "reconcile_decision_conflict"
    )
    bad_evidence = decision(evidence=["evt-call-1", rec.id], outcome_event_id=out.id)
    assert rejected(s, [rec, out, bad_evidence], "recovery_bundle").code == "evidence_order_conflict"
    failed = response(result="x", id=out.id, is_error=True)
    assert rejected(s, [rec, failed, dec], "recovery_bundle").code == "outcome_not_successful"


def test_bundle_for_an_unknown_operation_is_an_order_conflict() -> None:
    s = scanner_of(user(), call())
    assert rejected(s, parked_bundle(), "recovery_bundle").code == "event_order_conflict"


# --- corruption fails every tool boundary closed -------------------------------------------


def corrupt_after_t1() -> LedgerScanner:
    s = scanner_of(user(), *t1(recovery_mode="reconcile"))
    s.apply(call(id="evt-call-1-dup"))  # committed by something that bypassed the writers
    return s


def test_exact_t1_retry_fails_closed_on_a_corrupt_ledger() -> None:
    assert rejected(corrupt_after_t1(), t1(recovery_mode="reconcile"), "t1_prepare").code == "duplicate_call"


def test_exact_t2_retry_fails_closed_on_a_corrupt_ledger() -> None:
    s = scanner_of(user(), *t1(), response())
    s.apply(call(id="evt-call-1-dup"))
    assert rejected(s, [response()], "t2_outcome").code == "duplicate_call"


def test_exact_recovery_retry_fails_closed_on_a_corrupt_ledger() -> None:
    s = reconcilable()
    bundle = parked_bundle()
    commit(s, bundle, "recovery_bundle")
    s.apply(call(id="evt-call-1-dup"))
    assert rejected(s, bundle, "recovery_bundle").code == "duplicate_call"


def test_corruption_in_another_session_stops_new_tool_boundaries() -> None:
    s = corrupt_after_t1()
    other = dict(session_id="sess-2", invocation_id="inv-9", run_id="run-9", turn_id="turn-9")
    commit(s, [user(id="evt-user-9", **other)], "generic_append")
    assert rejected(s, t1("c9", **other), "t1_prepare").code == "duplicate_call"


# --- rebuild --------------------------------------------------------------------------------


def test_rebuild_reports_duplicate_call_and_dispatch_before_call() -> None:
    assert [i.code for i in scan([user(), call(), call(id="x")]).issues] == ["duplicate_call"]
    issues = scan([user(), dispatch(), call(operation_id="op-call-1")]).issues
    assert [i.code for i in issues] == ["event_order_conflict"]


def test_interleaved_operations_project_the_same_online_and_rebuilt() -> None:
    ledger = [
        user(),
        *t1("a", recovery_mode="reconcile"),
        *t1("b"),
        response("b"),
        *t1("c", recovery_mode="reconcile"),
        *completed_bundle("a"),
        text(),
        *parked_bundle("c", "unreadable"),
        call("d"),
        terminal(),
    ]
    online = LedgerScanner()
    online_rows: dict[str, Any] = {}
    for transition, batch in group_transitions(ledger):
        commit(online, batch, transition)
        # The store rewrites the rows of the operations a transaction touched.
        for facts in online.operations():
            row = operation_row(facts)
            if row is not None:
                online_rows[row.operation_id] = (row, journal_rows(facts))
    rebuilt_ops, rebuilt_journal = project(scan(ledger))
    assert [online_rows[r.operation_id][0] for r in rebuilt_ops] == rebuilt_ops
    # Journal rows come in commit (ledger) order, as the online writer appends them.
    position = scan(ledger).positions
    online_journal = [j for r in rebuilt_ops for j in online_rows[r.operation_id][1]]
    assert sorted(online_journal, key=lambda j: position[j.runtime_event_id]) == rebuilt_journal
    assert {r.operation_id: r.current_state for r in rebuilt_ops} == {
        op_id("a"): "recovery_completed",
        op_id("b"): "outcome_committed",
        op_id("c"): "recovery_parked",
    }
    assert writer_admission(ledger)["admissible"] is True


# --- grouping and admission of whole ledgers -----------------------------------------------


def test_group_transitions_mirrors_the_writers() -> None:
    ledger = [
        user(),
        *t1(recovery_mode="reconcile"),
        *completed_bundle(),
        call("b"),
        dispatch("b"),
        response("b"),
    ]
    assert [(t, [e.id for e in b]) for t, b in group_transitions(ledger)] == [
        ("generic_append", ["evt-user-1"]),
        ("t1_prepare", ["evt-call-1", "op-call-1_dispatch"]),
        ("recovery_bundle", ["op-call-1_reconcile", "op-call-1_recovered", "op-call-1_decision"]),
        ("t1_prepare", ["evt-b", "op-b_dispatch"]),
        ("t2_outcome", ["op-b_response"]),
    ]


def test_writer_admission_stops_at_the_first_rejection() -> None:
    result = writer_admission([user(), call(), call(id="dup"), terminal()])
    assert result["admissible"] is False
    assert result["firstRejection"] == {
        "eventIds": ["dup"],
        "transition": "generic_append",
        "ok": False,
        "code": "duplicate_call",
        "eventId": "dup",
        "toolCallId": "call-1",
    }
    assert len(result["steps"]) == 3


def test_protocol_markers_are_not_writer_rejections() -> None:
    # The reference writers accept a misplaced marker; only the Resolver reports it.
    late = text(actions=Actions(runtime_protocol=user().actions.runtime_protocol))  # type: ignore[union-attr]
    s = scan([user(), late])
    assert not s.has_corruption and [i.code for i in s.protocol_issues] == ["protocol_marker_invalid"]


# --- cost ----------------------------------------------------------------------------------


def _ledger(calls: int) -> list[RuntimeEvent]:
    events = [user()]
    c = call("c")
    d = dispatch("c")
    r = response("c")
    # model_copy keeps construction cheap (same tool and args, so the dispatch hash still
    # matches); ids and call ids stay unique per operation.
    for i in range(calls):
        cid = f"c{i}"
        op = f"op-{cid}"
        events.append(
            c.model_copy(update={"id": f"evt-{cid}", "content": c.content.model_copy(update={"id": cid})})
        )  # type: ignore[union-attr]
        td = d.actions.tool_dispatch.model_copy(  # type: ignore[union-attr]
            update={
                "operation_id": op,
                "provider_tool_call_id": cid,
            }
        )
        events.append(
            d.model_copy(
                update={
                    "id": f"{op}_dispatch",
                    "actions": Actions(tool_dispatch=td),
                    "refs": Refs(operation_id=op, tool_call_id=cid),
                }
            )
        )
        events.append(
            r.model_copy(
                update={
                    "id": f"{op}_response",
                    "content": r.content.model_copy(update={"id": cid}),  # type: ignore[union-attr]
                    "refs": Refs(operation_id=op, tool_call_id=cid),
                }
            )
        )
    return events


def test_scanning_is_linear() -> None:
    small, large = _ledger(1_500), _ledger(15_000)

    def cost(events: list[RuntimeEvent]) -> float:
        best = float("inf")
        for _ in range(5):
            start = time.perf_counter()
            s = scan(events)
            best = min(best, time.perf_counter() - start)
            assert not s.has_corruption
        return best

    ratio = cost(large) / cost(small)
    # Linear is 10x; a quadratic fold would be ~100x. The bound leaves room for a loaded machine
    # (the suite runs in four processes): the best of five runs of each, and 50x.
    assert ratio < 50, ratio


def test_oracle_admission_is_the_bare_transition_check() -> None:
    # A bundle for a never_auto_retry operation passes the reference's transition check (the
    # Resolver later calls it recovery_fact_corruption); the dedicated writer refuses it.
    ledger = [user(), *t1(), *parked_bundle()]
    assert writer_admission(ledger)["admissible"] is True
    strict = writer_admission(ledger, strict=True)
    assert strict["firstRejection"]["code"] == "recovery_mode_unsupported"


def test_journal_identities_are_derived_not_trusted() -> None:
    s = scanner_of(user(), *t1())
    facts = s.operation("op-call-1")
    assert facts is not None
    assert [(j.journal_event_id, j.state, j.runtime_event_id) for j in journal_rows(facts)] == [
        ("op-call-1_prepared", "prepared", "op-call-1_dispatch")
    ]
    row = operation_row(facts)
    assert row is not None and (row.current_state, row.version, row.result_event_id) == ("prepared", 1, None)
    s.apply(response())
    assert [j.journal_event_id for j in journal_rows(facts)] == ["op-call-1_prepared", "op-call-1_outcome"]
    row = operation_row(facts)
    assert row is not None and (row.current_state, row.version) == ("outcome_committed", 2)
    assert operation_row(scanner_of(user(), call()).operations()[0]) is None


def test_an_exact_duplicate_row_is_a_retry_but_leaves_the_ledger_corrupt() -> None:
    ledger = [user(), call(), call(), terminal()]
    oracle = writer_admission(ledger)
    assert [s["ok"] for s in oracle["steps"]] == [True, True, True, False]
    assert oracle["firstRejection"]["code"] == "duplicate_event_id"
    # The store's writers still let an ordinary event (a repair's terminal) land.
    assert writer_admission(ledger, strict=True)["admissible"] is True


# --- the bundle writer's own validation (check_bundle) ------------------------------------------


def test_check_bundle_refuses_an_unsuccessful_completed_outcome_without_touching_the_scanner() -> None:
    s = scanner_of(user(), *t1(recovery_mode="reconcile"))
    before = snapshot(s)
    rec, out, dec = completed_bundle()
    failed = response(result="boom", id=out.id, is_error=True)
    with pytest.raises(LedgerRejection) as err:
        s.check_bundle([rec, failed, dec])
    assert err.value.code == "outcome_not_successful"
    assert err.value.detail == {"eventId": rec.id, "operationId": "op-call-1", "toolCallId": "call-1"}
    assert snapshot(s) == before
    # Negative control: the bare transition check admits the same batch.
    s.admit([rec, failed, dec], "recovery_bundle", strict=False)


def test_check_bundle_passes_valid_bundles_and_leaves_other_shapes_to_admit() -> None:
    s = scanner_of(user(), *t1(recovery_mode="reconcile"))
    s.check_bundle(completed_bundle())
    s.check_bundle(parked_bundle())
    rec, dec = parked_bundle()
    s.check_bundle([rec])  # not bundle-shaped: transition_shape_conflict is admit's to report
    s.check_bundle([dec, rec])
    # An operation with no committed T1 is the transition check's (event_order_conflict) too.
    scanner_of(user()).check_bundle(parked_bundle())
    with pytest.raises(LedgerRejection) as err:
        scanner_of(user()).admit(parked_bundle(), "recovery_bundle", strict=False)
    assert err.value.code == "event_order_conflict"


def test_check_bundle_follows_the_reference_rule_order() -> None:
    """recovery_mode_unsupported is checked before the facts themselves (tool-recovery-bundle.ts)."""
    s = scanner_of(user(), *t1())
    rec, _ = parked_bundle()
    bad_evidence = decision(evidence=["x"], disposition="parked")
    with pytest.raises(LedgerRejection) as err:
        s.check_bundle([rec, bad_evidence])
    assert err.value.code == "recovery_mode_unsupported"
    s2 = scanner_of(user(), *t1(recovery_mode="reconcile"))
    with pytest.raises(LedgerRejection) as err:
        s2.check_bundle([rec, bad_evidence])
    assert err.value.code == "evidence_order_conflict"
    # The outcome's success is judged before the decision's outcome reference.
    rec2, out, _ = completed_bundle()
    wrong_ref = decision(disposition="completed", outcome_event_id="elsewhere")
    failed = response(result="boom", id=out.id, is_error=True)
    with pytest.raises(LedgerRejection) as err:
        s2.check_bundle([rec2, failed, wrong_ref])
    assert err.value.code == "outcome_not_successful"
    with pytest.raises(LedgerRejection) as err:
        s2.check_bundle([rec2, out, wrong_ref])
    assert err.value.code == "outcome_reference_conflict"
