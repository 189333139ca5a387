"""The store contract suite: every backend (SQLite file, SQLite memory, Postgres when reachable)
must pass it unchanged. Semantic rejections (codes) come from the scanner; this suite checks the
store's part: transactions, idempotency, durability, projections, headers, claims, bad input."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
from sqlalchemy import event as sa_event

from maka_core.errors import CodecError, LedgerRejection, StoreError
from maka_core.facts import codec
from maka_core.facts.claims import ContinuationClaim
from maka_core.facts.run_header import RunHeader
from maka_core.store.jsonl import export_jsonl, parse_jsonl
from maka_core.store.rows import prefix_digest
from maka_core.store.schema import SCHEMA_VERSION
from maka_core.store.writer import LedgerStore
from tests.children.support import raw_update, reopen
from tests.ledger_factory import (
    DIGEST,
    TS,
    call,
    completed_bundle,
    continuation_claim,
    continuation_start,
    dispatch,
    ids,
    parked_bundle,
    response,
    terminal,
    text,
    user,
)


def seed_prepared(store: LedgerStore, op: str = "op-1", call_id: str = "call-1") -> None:
    store.append([user()]) if store.event("evt-user-1") is None else None
    store.commit_tool_prepared(
        dispatch(call_id, operation_id=op, recovery_mode="reconcile"), call=call(call_id, operation_id=op)
    )


def count_commits(store: LedgerStore) -> list[int]:
    counter = [0]

    @sa_event.listens_for(store.engine, "commit")
    def _on_commit(_conn: object) -> None:
        counter[0] += 1

    return counter


# --- appends, reads, exact retries --------------------------------------------------------------


def test_append_and_read_back_in_ledger_order(store: LedgerStore) -> None:
    events = [user(), text(id="evt-model-1"), terminal()]
    result = store.append(events)
    assert result.created and result.created_ids == tuple(e.id for e in events)
    assert result.ledger_seq == 3
    assert store.events() == events
    assert store.events(session_id="sess-1", run_id="run-1") == events
    assert store.events(invocation_id="nope") == []
    assert store.event("evt-model-1") == events[1]
    assert store.event("missing") is None
    assert store.sessions() == ["sess-1"]


def test_exact_retry_is_a_noop_and_different_bytes_are_refused(store: LedgerStore) -> None:
    store.append([user()])
    again = store.append([user()])
    assert not again.created and again.ledger_seq == 1
    with pytest.raises(LedgerRejection) as err:
        store.append([user(text="something else")])
    assert err.value.code == "duplicate_event_id" and err.value.event_id == "evt-user-1"
    assert store.events() == [user()]


def test_filters_and_sessions_keep_first_appearance_order(store: LedgerStore) -> None:
    store.append([user(id="a1", **ids(session="s-b", run="r-b", inv="i-b", turn="t-b"))])
    store.append([user(id="a2", **ids(session="s-a", run="r-a", inv="i-a", turn="t-a"))])
    store.append([text(id="a3", **ids(session="s-b", run="r-b", inv="i-b", turn="t-b"))])
    assert store.sessions() == ["s-b", "s-a"]
    assert [e.id for e in store.events(session_id="s-b")] == ["a1", "a3"]
    assert [e.id for e in store.events(run_id="r-a")] == ["a2"]


# --- T1 / T2 ------------------------------------------------------------------------------------


def test_t1_and_t2_each_cost_exactly_one_commit(store: LedgerStore) -> None:
    store.append([user()])
    commits = count_commits(store)
    t1 = store.commit_tool_prepared(
        dispatch(operation_id="op-1", recovery_mode="reconcile"), call=call(operation_id="op-1")
    )
    assert t1.created and commits[0] == 1
    t2 = store.commit_tool_outcome(response(operation_id="op-1"))
    assert t2.created and commits[0] == 2
    row = store.operation("op-1")
    assert row is not None and row.current_state == "outcome_committed"
    assert row.result_event_id == "op-1_response" and row.dispatch_event_id == "op-1_dispatch"
    assert [j.journal_event_id for j in store.journal("op-1")] == ["op-1_prepared", "op-1_outcome"]


def test_t1_exact_retry_returns_created_false(store: LedgerStore) -> None:
    seed_prepared(store)
    retry = store.commit_tool_prepared(
        dispatch(operation_id="op-1", recovery_mode="reconcile"), call=call(operation_id="op-1")
    )
    assert not retry.created and retry.created_ids == ()
    assert len(store.events()) == 3 and len(store.journal()) == 1


def test_t1_over_an_already_committed_call(store: LedgerStore) -> None:
    store.append([user(), call(operation_id="op-1")])
    result = store.commit_tool_prepared(
        dispatch(operation_id="op-1", recovery_mode="reconcile"), call=call(operation_id="op-1")
    )
    assert result.created_ids == ("op-1_dispatch",)
    assert store.operation_for_call("inv-1", "call-1") == store.operation("op-1")


def test_t1_writes_evidence_and_attempt_in_the_same_transaction(store: LedgerStore) -> None:
    store.append([user()])
    evidence = {"path": "a.txt", "priorDigest": DIGEST}
    attempt = {"workflow_id": "wf", "workflow_run_id": "r", "activity_id": "3", "attempt": 1}
    store.commit_tool_prepared(
        dispatch(operation_id="op-1", recovery_mode="reconcile"),
        call=call(operation_id="op-1"),
        evidence=evidence,
        attempt=attempt,
    )
    store.commit_tool_outcome(response(operation_id="op-1"), attempt={**attempt, "activity_id": "3"})
    assert store.evidence("op-1") == evidence
    assert store.evidence("op-2") is None
    rows = store.attempts("op-1")
    assert [(r["phase"], r["workflow_id"], r["attempt"]) for r in rows] == [("t1", "wf", 1), ("t2", "wf", 1)]


def test_failed_t1_writes_nothing(store: LedgerStore) -> None:
    store.append([user()])
    with pytest.raises(LedgerRejection) as err:
        store.commit_tool_prepared(
            dispatch(args_hash=DIGEST, operation_id="op-1", recovery_mode="reconcile"),
            call=call(operation_id="op-1"),
            evidence={"x": 1},
        )
    assert err.value.code == "canonical_args_hash_conflict"
    assert [e.id for e in store.events()] == ["evt-user-1"]
    assert store.operation("op-1") is None and store.evidence("op-1") is None and store.journal() == []
    # The scanner did not run ahead of the database: the honest T1 still commits.
    assert store.commit_tool_prepared(
        dispatch(operation_id="op-1", recovery_mode="reconcile"), call=call(operation_id="op-1")
    ).created


def test_lossy_values_are_refused_before_any_write(store: LedgerStore) -> None:
    store.append([user()])
    bad = call(operation_id="op-1").model_copy(
        update={"content": call(operation_id="op-1").content.model_copy(update={"args": {"x": float("nan")}})}
    )
    with pytest.raises(CodecError) as err:
        store.commit_tool_prepared(dispatch(operation_id="op-1", recovery_mode="reconcile"), call=bad)
    assert err.value.code == "lossy_json_value"
    with pytest.raises(CodecError):
        store.append([text(id="m").model_copy(update={"ts": 2**53 + 1})])
    assert [e.id for e in store.events()] == ["evt-user-1"]


# --- terminal events and run headers ------------------------------------------------------------


def test_commit_terminal_allows_exact_retry_only(store: LedgerStore) -> None:
    store.append([user()])
    assert store.commit_terminal(terminal()).created
    assert not store.commit_terminal(terminal()).created
    with pytest.raises(LedgerRejection) as err:
        store.commit_terminal(terminal("failed", id="evt-terminal-2"))
    assert err.value.code == "run_already_terminal"
    with pytest.raises(LedgerRejection) as err:
        store.commit_terminal(text(id="not-terminal"))
    assert err.value.code == "transition_shape_conflict"


def test_run_headers_follow_their_terminal_event(store: LedgerStore) -> None:
    header = RunHeader(
        session_id="sess-1",
        run_id="run-1",
        invocation_id="inv-1",
        turn_id="turn-1",
        workflow_id="maka-session-sess-1",
        workflow_run_id="wr-1",
        task_queue="maka",
        continuation_source={"sourceRunId": "run-0", "sourceRuntimeEventHighWater": 3},
    )
    stored = store.put_run(header)
    assert stored.created_at > 0 and store.get_run("run-1") == stored
    with pytest.raises(LedgerRejection) as err:
        store.put_run(stored.model_copy(update={"status": "completed"}))
    assert err.value.code == "terminal_event_missing"
    store.append([user()])
    store.commit_terminal(terminal())
    done = store.put_run(stored.model_copy(update={"status": "completed", "updated_at": 0}))
    assert store.get_run("run-1") == done and done.created_at == stored.created_at
    with pytest.raises(LedgerRejection) as err:
        store.put_run(done.model_copy(update={"status": "running"}))
    assert err.value.code == "run_already_terminal"
    store.put_run(RunHeader(session_id="sess-1", run_id="run-2", invocation_id="inv-2", turn_id="turn-2"))
    assert [r.run_id for r in store.list_runs(session_id="sess-1")] == ["run-1", "run-2"]
    assert [r.run_id for r in store.list_runs(nonterminal=True)] == ["run-2"]
    assert store.get_run("missing") is None


# --- prefixes and continuation claims -----------------------------------------------------------


def make_claim(store: LedgerStore, n: str = "1", target: str = "2") -> ContinuationClaim:
    prefix = store.prefix("sess-1", "run-1")
    return continuation_claim(prefix.high_water, prefix.prefix_digest, n=n, target=target)


def test_prefix_digest_is_stable_and_domain_separated(store: LedgerStore) -> None:
    store.append([user(), terminal()])
    prefix = store.prefix("sess-1", "run-1")
    assert prefix.high_water == 2 and prefix.last_event_id == "evt-terminal-1"
    assert prefix.prefix_digest == prefix_digest([user(), terminal()])
    assert prefix.prefix_digest != codec.digest("".join(codec.encode(e) + "\n" for e in prefix.events))
    assert store.prefix("sess-1", "nope").high_water == 0


def test_continuation_claim_is_unique_per_source_boundary(store: LedgerStore) -> None:
    store.append([user()])
    with pytest.raises(LedgerRejection) as err:
        store.claim_continuation(make_claim(store))
    assert err.value.code == "source_not_terminal"
    store.commit_terminal(terminal())
    other_turn = make_claim(store, "0").model_copy(update={"source_turn_id": "turn-9"})
    with pytest.raises(LedgerRejection) as err:
        store.claim_continuation(other_turn)
    assert err.value.code == "source_identity_changed"
    claim = make_claim(store)
    first = store.claim_continuation(claim)
    assert first.status == "acquired" and first.claim.claimed_at > 0
    again = store.claim_continuation(claim)
    assert again.status == "existing" and again.claim.claim_id == "claim-1"
    rival = store.claim_continuation(make_claim(store, "2", target="3"))
    assert rival.status == "conflict" and rival.claim.claim_id == "claim-1"
    stale = make_claim(store, "3", target="4").model_copy(update={"source_event_high_water": 1})
    with pytest.raises(LedgerRejection) as err:
        store.claim_continuation(stale)
    assert err.value.code == "source_high_water_changed"
    assert store.continuation_claim("claim-3") is None


def test_continuation_start_binds_to_its_claim(store: LedgerStore) -> None:
    store.append([user()])
    store.commit_terminal(terminal())
    claim = store.claim_continuation(make_claim(store)).claim
    start = continuation_start(claim, high_water=2, ts=TS + 10)
    start = codec.decode(codec.encode(start))
    with pytest.raises(LedgerRejection) as err:
        store.append([start])
    assert err.value.code == "reserved_continuation_fact"
    assert store.commit_continuation_start(start).created
    bound = store.continuation_claim("claim-1")
    assert (
        bound is not None and bound.start_event_id == "evt-start" and bound.start_kind == "runtime_admission"
    )
    assert not store.commit_continuation_start(start).created


# --- import / export ----------------------------------------------------------------------------


def test_import_is_atomic_and_idempotent_and_export_is_canonical(store: LedgerStore) -> None:
    events = [
        user(),
        call(operation_id="op-1"),
        dispatch(operation_id="op-1", recovery_mode="reconcile"),
        response(operation_id="op-1"),
        terminal(),
    ]
    first = store.import_events(events)
    assert (first.imported, first.existing) == (5, 0)
    again = store.import_events(events)
    assert (again.imported, again.existing) == (0, 5)
    text = export_jsonl(store, "sess-1")
    assert text == "".join(codec.encode(e) + "\n" for e in events)
    assert parse_jsonl(text.encode()) == (events, [])
    assert store.operation("op-1") is not None and store.verify() == []


def test_out_of_order_import_writes_nothing(store: LedgerStore) -> None:
    with pytest.raises(LedgerRejection) as err:
        store.import_events(
            [
                user(),
                response(operation_id="op-1"),
                call(operation_id="op-1"),
                dispatch(operation_id="op-1", recovery_mode="reconcile"),
            ]
        )
    assert err.value.code == "orphan_response"
    assert store.events() == [] and store.operations() == [] and store.journal() == []
    # A rejection mid-batch (after earlier groups were staged) rolls those back as well.
    with pytest.raises(LedgerRejection):
        store.import_events(
            [
                user(),
                call(operation_id="op-1"),
                dispatch(operation_id="op-1", recovery_mode="reconcile"),
                response(operation_id="op-1"),
                call("call-1", operation_id="op-2", id="dup"),
            ]
        )
    assert store.events() == [] and store.operations() == []


# --- fail closed ----------------------------------------------------------------------------


def test_row_payload_mismatch_fails_closed(store: LedgerStore) -> None:
    seed_prepared(store)
    raw_update(store, "evt-call-1", session_id="sess-forged")
    fresh = reopen(store)
    with pytest.raises(StoreError) as err:
        fresh.events()
    assert err.value.code == "row_payload_identity_mismatch" and err.value.detail["eventId"] == "evt-call-1"
    with pytest.raises(StoreError) as err:
        fresh.commit_tool_outcome(response(operation_id="op-1"))
    assert err.value.code == "row_payload_identity_mismatch"
    raw_update(fresh, "evt-call-1", session_id="sess-1")
    assert fresh.commit_tool_outcome(response(operation_id="op-1")).created


def test_non_canonical_payload_row_is_reported_and_refuses_exact_retries(store: LedgerStore) -> None:
    store.append([user()])
    raw_update(store, "evt-user-1", payload_json=" " + codec.encode(user()))
    fresh = reopen(store)
    assert fresh.events() == [user()]  # the same event: reads do not fail on formatting
    # Editing the bytes behind the writers also breaks the row's digest chain.
    assert [line.split(":")[0] for line in fresh.verify()] == [
        "ledger_chain_broken",
        "runtime_events evt-user-1",
    ]
    assert "evt-user-1" in fresh.verify()[0]
    with pytest.raises(LedgerRejection) as err:
        fresh.append([user()])
    assert err.value.code == "duplicate_event_id"


# --- SQLite specifics ---------------------------------------------------------------------------


def test_sqlite_file_pragmas_and_schema_version(ledger_path: Path) -> None:
    with LedgerStore.open(ledger_path) as store, store.engine.connect() as conn:
        pragmas = {
            p: conn.exec_driver_sql(f"PRAGMA {p}").scalar()
            for p in ("journal_mode", "synchronous", "foreign_keys", "busy_timeout", "user_version")
        }
    assert pragmas == {
        "journal_mode": "wal",
        "synchronous": 2,
        "foreign_keys": 1,
        "busy_timeout": 5000,
        "user_version": SCHEMA_VERSION,
    }


def test_newer_schema_fails_closed_without_writing_a_byte(ledger_path: Path) -> None:
    conn = sqlite3.connect(ledger_path)
    conn.execute("CREATE TABLE future (x)")
    conn.execute("PRAGMA user_version = 99")
    conn.commit()
    conn.close()
    before = ledger_path.read_bytes()
    with pytest.raises(StoreError) as err:
        LedgerStore.open(ledger_path)
    assert err.value.code == "schema_too_new" and err.value.detail["schemaVersion"] == 99
    assert ledger_path.read_bytes() == before
    assert not Path(f"{ledger_path}-wal").exists()


def test_garbage_file_is_unreadable_not_overwritten(ledger_path: Path) -> None:
    ledger_path.write_bytes(b"this is not a database" * 100)
    before = ledger_path.read_bytes()
    with pytest.raises(StoreError) as err:
        LedgerStore.open(ledger_path)
    assert err.value.code == "store_unreadable"
    assert ledger_path.read_bytes() == before


def test_reopen_keeps_everything(ledger_path: Path) -> None:
    with LedgerStore.open(ledger_path) as store:
        seed_prepared(store)
        store.commit_recovery_bundle(*parked_bundle(operation_id="op-1"))
        ops, journal = store.operations(), store.journal()
    with LedgerStore.open(ledger_path) as again:
        assert again.operations() == ops and again.journal() == journal and again.verify() == []
        rec, out, dec = completed_bundle(operation_id="op-1")
        with pytest.raises(LedgerRejection):
            again.commit_recovery_bundle(rec, dec, out)
