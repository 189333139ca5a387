"""The DB-level cases of the reference's ``recovery-persistence-authority.test.ts`` (and the
store-level ones of ``tool-runtime-durable-boundary.test.ts``), on every store backend.

The crash-boundary rollback case ("rolls the whole recovery bundle back at every internal crash
boundary") runs with real SIGKILLs in ``test_crash_prefix.py``.
"""

from __future__ import annotations

import pytest

from maka_core.errors import CodecError, LedgerRejection, StoreError
from maka_core.facts import codec
from maka_core.facts.events import Actions
from maka_core.store.writer import LedgerStore
from tests.children.support import raw_insert, raw_update, reopen
from tests.ledger_factory import (
    DIGEST,
    call,
    completed_bundle,
    dispatch,
    ids,
    parked_bundle,
    response,
    t1,
    text,
    user,
)


def prepared(store: LedgerStore, op: str = "op-1", call_id: str = "call-1", **kw: str) -> None:
    user_id = kw.pop("user_id", "evt-user-1")
    who = ids(**kw)
    if store.event(user_id) is None:
        store.append([user(id=user_id, **who)])
    store.commit_tool_prepared(
        dispatch(call_id, operation_id=op, recovery_mode="reconcile", **who),
        call=call(call_id, operation_id=op, **who),
    )


def rejected(fn: object, *args: object, **kw: object) -> LedgerRejection:
    with pytest.raises(LedgerRejection) as err:
        fn(*args, **kw)  # type: ignore[operator]
    return err.value


def test_rejects_reserved_recovery_and_boundary_facts_through_generic_append(store: LedgerStore) -> None:
    prepared(store)
    rec, dec = parked_bundle(operation_id="op-1")
    before = store.events()
    assert rejected(store.append, [rec]).code == "reserved_recovery_fact"
    assert rejected(store.append, [dec]).code == "reserved_recovery_fact"
    assert (
        rejected(store.append, [dispatch("call-2", operation_id="op-2", recovery_mode="reconcile")]).code
        == "reserved_tool_boundary_fact"
    )
    assert rejected(store.append, [response(operation_id="op-1")]).code == "reserved_tool_boundary_fact"
    assert rejected(store.import_events, [text(id="m1"), rec]).code in {
        "transition_shape_conflict",
        "reserved_recovery_fact",
    }
    assert store.events() == before and store.operation("op-1").current_state == "prepared"  # type: ignore[union-attr]


def test_recomputes_t1_identity_from_the_persisted_call(store: LedgerStore) -> None:
    store.append([user(), call(args={"command": "ls -la"}, operation_id="op-1")])
    wrong = dispatch(
        args={"command": "ls"}, operation_id="op-1", recovery_mode="reconcile"
    )  # hash of other args than the committed call's
    err = rejected(store.commit_tool_prepared, wrong)
    assert err.code == "canonical_args_hash_conflict" and err.event_id == "op-1_dispatch"
    assert [e.id for e in store.events()] == ["evt-user-1", "evt-call-1"] and store.journal() == []


def test_derives_projection_local_journal_identities(store: LedgerStore) -> None:
    prepared(store)
    store.commit_tool_outcome(response(operation_id="op-1"))
    journal = store.journal("op-1")
    assert [(j.journal_event_id, j.state, j.runtime_event_id) for j in journal] == [
        ("op-1_prepared", "prepared", "op-1_dispatch"),
        ("op-1_outcome", "outcome_committed", "op-1_response"),
    ]


def test_rejects_duplicate_call_identities_through_the_generic_writer(store: LedgerStore) -> None:
    store.append([user(), call(operation_id="op-1")])
    err = rejected(store.append, [call(id="evt-call-again", operation_id="op-1")])
    assert err.code == "duplicate_call" and err.event_id == "evt-call-again"


@pytest.mark.parametrize("drift", [{"run": "run-2"}, {"turn": "turn-2"}, {"session": "sess-2"}])
def test_rejects_one_invocation_identity_crossing_boundaries(
    store: LedgerStore, drift: dict[str, str]
) -> None:
    prepared(store)
    assert (
        rejected(store.append, [call("call-2", operation_id="op-2", **ids(**drift))]).code
        == "invocation_identity_conflict"
    )
    err = rejected(
        store.commit_tool_prepared,
        dispatch("call-3", operation_id="op-3", recovery_mode="reconcile", **ids(**drift)),
        call=call("call-3", operation_id="op-3", **ids(**drift)),
    )
    assert err.code == "invocation_identity_conflict"
    assert len(store.events()) == 3


@pytest.mark.parametrize("drift", [{"run": "run-2"}, {"turn": "turn-2"}, {"session": "sess-2"}])
def test_rejects_an_ordinary_event_whose_invocation_crosses_boundaries(
    store: LedgerStore, drift: dict[str, str]
) -> None:
    prepared(store)
    assert rejected(store.append, [text(id="m-drift", **ids(**drift))]).code == "invocation_identity_conflict"
    assert len(store.events()) == 3


def test_rejects_an_unbound_generic_response_after_t1(store: LedgerStore) -> None:
    prepared(store)
    err = rejected(store.append, [response(bound=False)])
    assert err.code == "identity_conflict"
    assert store.operation("op-1").current_state == "prepared"  # type: ignore[union-attr]


def test_rejects_a_dispatch_after_a_pre_t1_synthetic_response(store: LedgerStore) -> None:
    denied = response(bound=False, result={"kind": "text", "text": "denied"}, is_error=True)
    store.append([user(), call(operation_id="op-1"), denied])
    err = rejected(store.commit_tool_prepared, dispatch(operation_id="op-1", recovery_mode="reconcile"))
    assert err.code == "event_order_conflict"
    assert store.operation("op-1") is None


def test_rejects_an_out_of_order_tool_batch_import_atomically(store: LedgerStore) -> None:
    op1 = {"operation_id": "op-1"}
    err = rejected(store.import_events, [user(), response(**op1), call(**op1), dispatch(**op1)])
    assert err.code == "orphan_response" and err.event_id == "op-1_response"
    assert store.events() == [] and store.sessions() == []


def test_rejects_a_t2_row_that_also_claims_another_lane(store: LedgerStore) -> None:
    prepared(store)
    smuggled = response(operation_id="op-1").model_copy(
        update={
            "actions": Actions(
                tool_dispatch=dispatch(operation_id="op-1", recovery_mode="reconcile").actions.tool_dispatch
            )
        }
    )  # type: ignore[union-attr]
    smuggled = codec.decode(codec.encode(smuggled))
    assert rejected(store.commit_tool_outcome, smuggled).code == "semantic_lane_conflict"
    assert store.operation("op-1").current_state == "prepared"  # type: ignore[union-attr]


def test_settles_completed_recovery_atomically_and_rebuilds_after_reopen(store: LedgerStore) -> None:
    prepared(store)
    rec, out, dec = completed_bundle(operation_id="op-1")
    store.commit_recovery_bundle(rec, dec, out)
    row = store.operation("op-1")
    assert row is not None and row.current_state == "recovery_completed" and row.result_event_id == out.id
    assert [j.state for j in store.journal("op-1")] == [
        "prepared",
        "reconcile_observed",
        "outcome_committed",
        "recovery_completed",
    ]
    ops, journal = store.operations(), store.journal()
    again = reopen(store)
    assert again.operations() == ops and again.journal() == journal
    again.rebuild_projections()
    assert again.operations() == ops and [j.journal_event_id for j in again.journal()] == [
        j.journal_event_id for j in journal
    ]
    assert again.verify() == []


def test_rebuilds_interleaved_operations_to_the_same_projections(store: LedgerStore) -> None:
    prepared(store, "op-1", "call-1")
    prepared(store, "op-2", "call-2")
    store.commit_tool_outcome(response("call-2", operation_id="op-2"))
    prepared(store, "op-3", "call-3")
    store.commit_tool_outcome(response("call-1", operation_id="op-1", is_error=True))
    store.commit_recovery_bundle(*parked_bundle("call-3", "unreadable", operation_id="op-3"))
    assert store.verify() == []
    scratch = store.rebuild_projections("sqlite://")
    assert scratch is not None
    assert scratch.operations() == store.operations()
    assert {j.journal_event_id: j for j in scratch.journal()} == {
        j.journal_event_id: j for j in store.journal()
    }
    assert [r.current_state for r in store.operations()] == [
        "outcome_committed",
        "outcome_committed",
        "recovery_parked",
    ]


def test_makes_a_parked_bundle_terminal_and_only_permits_its_exact_retry(store: LedgerStore) -> None:
    prepared(store)
    rec, dec = parked_bundle(operation_id="op-1")
    assert store.commit_recovery_bundle(rec, dec).created
    assert not store.commit_recovery_bundle(rec, dec).created
    assert store.operation("op-1").current_state == "recovery_parked"  # type: ignore[union-attr]
    other_rec, other_out, other_dec = completed_bundle(operation_id="op-1")  # same ids, different bytes
    assert (
        rejected(store.commit_recovery_bundle, other_rec, other_dec, other_out).code == "duplicate_event_id"
    )
    fresh_rec, fresh_out, fresh_dec = completed_bundle(suffix="-2", operation_id="op-1")
    assert rejected(store.commit_recovery_bundle, fresh_rec, fresh_dec, fresh_out).code
    assert store.operation("op-1").current_state == "recovery_parked"  # type: ignore[union-attr]
    assert len(store.events()) == 5


def test_rejects_row_payload_identity_corruption_through_the_bundle_writer(store: LedgerStore) -> None:
    prepared(store)
    raw_update(store, "op-1_dispatch", operation_id="op-forged")
    rec, dec = parked_bundle(operation_id="op-1")
    with pytest.raises(StoreError) as err:
        reopen(store).commit_recovery_bundle(rec, dec)
    assert err.value.code == "row_payload_identity_mismatch"


def test_persists_the_canonical_event_and_makes_raw_retries_idempotent(store: LedgerStore) -> None:
    canonical = codec.encode(user())
    raw = (
        '{ "turnId": "turn-1", "sessionId": "sess-1", "runId": "run-1", "role": "user", "partial": false,'
        ' "invocationId": "inv-1", "id": "evt-user-1", "ts": 1767225600000.0, "author": "user",'
        ' "content": {"text": "list the files", "kind": "text"},'
        ' "actions": {"runtimeProtocol": {"toolBoundary": "t1_after_preflight_v1"}} }'
    )
    assert raw != canonical
    store.append([codec.decode(raw)])
    assert codec.encode(store.events()[0]) == canonical
    with store.engine.connect() as conn:
        stored = conn.exec_driver_sql("SELECT payload_json FROM runtime_events").scalar_one()
    assert stored == canonical
    assert not store.append([codec.decode(raw)]).created


@pytest.mark.parametrize(
    "bad",
    [{"nested": [1, {"x": float("inf")}]}, {"big": 2**53 + 1}, {"set": {1, 2}}, {"bytes": b"x"}],
    ids=["inf", "unsafe-int", "set", "bytes"],
)
def test_rejects_events_that_lose_values_during_serialization(
    store: LedgerStore, bad: dict[str, object]
) -> None:
    prepared(store)
    resp = response(operation_id="op-1")
    lossy = resp.model_copy(update={"content": resp.content.model_copy(update={"result": bad})})  # type: ignore[union-attr]
    with pytest.raises(CodecError) as err:
        store.commit_tool_outcome(lossy)
    assert err.value.code == "lossy_json_value"
    rec, dec = parked_bundle(operation_id="op-1")
    payload = dec.actions.tool_recovery.payload  # type: ignore[union-attr]
    forged = dec.model_copy(
        update={
            "actions": dec.actions.model_copy(
                update={  # type: ignore[union-attr]
                    "tool_recovery": dec.actions.tool_recovery.model_copy(
                        update={  # type: ignore[union-attr]
                            "payload": payload.model_copy(
                                update={"evidence_event_ids": [*payload.evidence_event_ids, bad]}
                            )
                        }
                    )
                }
            )
        }
    )
    with pytest.raises(CodecError):
        store.commit_recovery_bundle(rec, forged)
    assert store.operation("op-1").current_state == "prepared"  # type: ignore[union-attr]
    assert len(store.events()) == 3


def plant_duplicate_call(store: LedgerStore, **kw: str) -> None:
    raw_insert(store, call("call-1", operation_id="op-x", id="evt-call-dup", **kw))


def test_exact_t1_t2_and_recovery_retries_fail_closed_on_a_corrupt_ledger(store: LedgerStore) -> None:
    prepared(store, "op-1", "call-1")
    store.commit_tool_outcome(response("call-1", operation_id="op-1"))
    prepared(store, "op-2", "call-2")
    rec, dec = parked_bundle("call-2", operation_id="op-2")
    store.commit_recovery_bundle(rec, dec)
    plant_duplicate_call(store)
    store = reopen(store)
    for retry in (
        lambda: store.commit_tool_prepared(
            dispatch("call-1", operation_id="op-1", recovery_mode="reconcile"),
            call=call("call-1", operation_id="op-1"),
        ),
        lambda: store.commit_tool_outcome(response("call-1", operation_id="op-1")),
        lambda: store.commit_recovery_bundle(rec, dec),
    ):
        err = rejected(retry)
        assert err.code == "duplicate_call" and err.event_id == "evt-call-dup"


def test_corruption_in_another_session_stops_a_new_tool_boundary(store: LedgerStore) -> None:
    other = ids(session="sess-b", run="run-b", inv="inv-b", turn="turn-b")
    store.append([user(id="evt-user-b", **other)])
    store.commit_tool_prepared(
        dispatch("call-b", operation_id="op-b", recovery_mode="reconcile", **other),
        call=call("call-b", operation_id="op-b", **other),
    )
    raw_insert(store, call("call-b", operation_id="op-x", id="evt-call-dup", **other))
    store = reopen(store)
    store.append([user()])  # ordinary conversation still lands
    err = rejected(
        store.commit_tool_prepared,
        dispatch(operation_id="op-1", recovery_mode="reconcile"),
        call=call(operation_id="op-1"),
    )
    assert err.code == "duplicate_call" and err.event_id == "evt-call-dup"
    assert store.operation("op-1") is None


def test_rebuild_rejects_duplicate_call_identity(store: LedgerStore) -> None:
    prepared(store)
    plant_duplicate_call(store)
    assert rejected(store.rebuild_projections).code == "duplicate_call"
    assert any("duplicate_call" in line for line in store.verify())
    assert store.operation("op-1") is not None  # the online projection was not wiped


def test_rebuild_rejects_dispatch_before_call_physical_order(store: LedgerStore) -> None:
    store.append([user()])
    raw_insert(store, dispatch(operation_id="op-1", recovery_mode="reconcile"), call(operation_id="op-1"))
    assert rejected(store.rebuild_projections).code == "event_order_conflict"
    assert rejected(
        reopen(store).commit_tool_prepared,
        dispatch("call-2", operation_id="op-2", recovery_mode="reconcile"),
        call=call("call-2", operation_id="op-2"),
    ).code


def test_t1_then_t2_facts_have_the_durable_boundary_shape(store: LedgerStore) -> None:
    prepared(store)
    store.commit_tool_outcome(response(operation_id="op-1"))
    events = {e.id: e for e in store.events()}
    d = events["op-1_dispatch"]
    assert d.content is None and d.actions is not None and d.actions.tool_dispatch is not None
    assert d.actions.tool_dispatch.protocol == "t1_after_preflight_v1"
    assert d.actions.tool_dispatch.canonical_args_hash == codec.canonical_args_hash("Bash", {"command": "ls"})
    assert {e.refs.operation_id for e in events.values() if e.refs is not None} == {"op-1"}
    assert list(events) == ["evt-user-1", "evt-call-1", "op-1_dispatch", "op-1_response"]
    assert DIGEST not in {d.actions.tool_dispatch.canonical_args_hash}


def test_import_admits_what_the_reference_writers_admit_and_rebuilds_equal(store: LedgerStore) -> None:
    """Import uses the reference's bare transition check: a ledger Maka's writers admit (here an
    outcome committed after a parked decision) is imported, and its online projection equals the
    rebuild, journal rows in commit order."""
    from maka_core.ledger.scanner import writer_admission

    ledger = [user(), *t1(recovery_mode="reconcile"), *parked_bundle(), response()]
    assert writer_admission(ledger)["admissible"] is True
    result = store.import_events(ledger)
    assert result.imported == len(ledger)
    assert store.verify() == []
