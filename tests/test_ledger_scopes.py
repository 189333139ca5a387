"""The committed view in session scopes (``store.scopes``) answers as a fold of the whole ledger.

A store keeps one fold per session it serves, loads a session from the database when it is
named, and evicts settled sessions. These tests build a ledger of many interleaved sessions
through the writers, read every session through a store whose scope set is tiny (so sessions are
evicted and reloaded many times), and compare each answer the runtime asks of the view (run
identities, terminal facts, model steps, every call's Resolver decision and facts, issues, order)
with the same question put to one fold of every committed event. The negative control drops one
row from a scope's load and shows the comparison catches it.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

import pytest

from maka_core.errors import LedgerRejection, StoreError
from maka_core.facts.events import Refs, RuntimeEvent
from maka_core.ledger.committed import CommittedView
from maka_core.ledger.scanner import Transition, scan
from maka_core.store.scopes import SessionScopes
from maka_core.store.writer import LedgerStore
from tests import ledger_factory as f
from tests.children.support import raw_insert

SESSIONS = 24


class SmallScopes(LedgerStore):
    """A store holding at most two settled and four open sessions: nearly every read reloads."""

    def _new_scopes(self) -> SessionScopes:
        return SessionScopes(settled=2, limit=4)


class DropsARow(SmallScopes):
    """Today's bug class, injected: a scope load that loses one committed row (an outcome)."""

    def _session_rows(self, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [r for r in rows if r["event_id"] != "op-s3-c0_response"]


def _session_script(k: int) -> list[Callable[[LedgerStore], object]]:
    """One session's writes: a run with a step, settled and prepared calls, a recovery bundle and
    (for most sessions) a terminal fact; every other session opens a second run."""
    sid = f"s{k}"
    steps: list[Callable[[LedgerStore], object]] = []
    for run in ("a", "b") if k % 2 == 0 else ("a",):
        env = f.ids(session=sid, run=f"r{k}{run}", inv=f"i{k}{run}", turn=f"t{k}{run}")
        tag = f"{sid}{run}"
        steps.append(lambda s, env=env, tag=tag: s.append([f.user(id=f"u-{tag}", **env)]))
        steps.append(
            lambda s, env=env, tag=tag: s.append(
                [f.text("thinking", id=f"m-{tag}", refs=Refs(step_id=f"{env['run_id']}:0"), **env)]
            )
        )
        for c in range(3):
            call_id = f"{tag}-c{c}" if run == "b" else f"{sid}-c{c}"
            op = f"op-{call_id}"
            pair = f.t1(call_id, recovery_mode="reconcile", operation_id=op, **env)
            steps.append(lambda s, pair=pair: s.commit_tool_prepared(pair[1], call=pair[0]))
            if c == 0:
                resp = f.response(call_id, operation_id=op, **env)
                steps.append(lambda s, resp=resp: s.commit_tool_outcome(resp))
            elif c == 1 and k % 3 == 0:
                bundle = f.completed_bundle(call_id, operation_id=op, **env)
                steps.append(lambda s, b=bundle: s.commit_recovery_bundle(b[0], b[2], b[1]))
        if k % 4 != 1:
            steps.append(lambda s, env=env, tag=tag: s.commit_terminal(f.terminal(id=f"end-{tag}", **env)))
    return steps


def _build(shared_url: str) -> list[RuntimeEvent]:
    """The ledger, written round-robin across sessions so their rows interleave."""
    scripts = [_session_script(k) for k in range(SESSIONS)]
    with LedgerStore.open(shared_url) as store:
        while any(scripts):
            for script in scripts:
                if script:
                    script.pop(0)(store)
        return store.events()


def _answers(view: CommittedView, sid: str, ledger: list[RuntimeEvent]) -> dict[str, Any]:
    """Everything the runtime asks the view about one session, in a comparable form."""
    mine = [e for e in ledger if e.session_id == sid]
    runs = sorted({e.run_id for e in mine})
    steps = sorted({e.refs.step_id for e in mine if e.refs is not None and e.refs.step_id is not None})
    calls = sorted(
        {(e.invocation_id, e.content.id) for e in mine if e.content is not None and hasattr(e.content, "id")}
    )
    scanner = view.scanner
    decided: dict[str, Any] = {}
    for inv, call_id in calls:
        found = view.call(inv, call_id)
        if found is None:
            decided[f"{inv}/{call_id}"] = None
            continue
        op, facts = found
        decided[f"{inv}/{call_id}"] = (
            op,
            facts.state,
            [e.id if e is not None else None for e in (facts.call, facts.dispatch, facts.response)],
            [e.id for e in facts.reconcile_events],
            [e.id for e in facts.decision_events],
            facts.issues,
        )
        if facts.operation_id is not None:
            assert scanner.operation(facts.operation_id) is facts
    own_ids = {e.id for e in mine}
    return {
        "runs": {
            r: (view.first_of_run[r].id, view.terminal_of_run.get(r), scanner.protocol(r)) for r in runs
        },
        "steps": {s: [e.id for e in view.step_events(s)] for s in steps},
        "step_count": view.step_count(sid),
        "calls": decided,
        "issues": [i for i in scanner.issues if i.event_id in own_ids],
        "order": sorted(own_ids, key=lambda i: scanner.positions.get(i, -1)),
        "events": [scanner.event(i) for i in sorted(own_ids)],
    }


def _full_fold(ledger: list[RuntimeEvent]) -> CommittedView:
    full = CommittedView()
    for event in ledger:
        full.fold(event)
    return full


def _compare(store: LedgerStore, ledger: list[RuntimeEvent], rounds: int = 3) -> list[str]:
    """The sessions whose scoped answers differ from the full fold's, over shuffled read orders."""
    full = _full_fold(ledger)
    expected = {f"s{k}": _answers(full, f"s{k}", ledger) for k in range(SESSIONS)}
    order = list(expected)
    differ: list[str] = []
    rng = random.Random(21)
    for _ in range(rounds):
        rng.shuffle(order)
        for sid in order:
            if _answers(store.view(sid), sid, ledger) != expected[sid] and sid not in differ:
                differ.append(sid)
    return differ


def test_scoped_and_evicted_views_answer_as_the_full_fold(shared_url: str) -> None:
    ledger = _build(shared_url)
    assert len({e.session_id for e in ledger}) == SESSIONS
    with SmallScopes.open(shared_url) as store:
        assert _compare(store, ledger) == []
        scopes = store._scopes
        assert scopes is not None and len(scopes) <= 4  # bounded, though every session was read
    with LedgerStore.open(shared_url) as store:  # the default bounds: the same answers
        assert _compare(store, ledger, rounds=1) == []


def test_negative_control_a_scope_that_drops_a_row_is_caught(shared_url: str) -> None:
    ledger = _build(shared_url)
    with DropsARow.open(shared_url) as store:
        assert _compare(store, ledger) == ["s3"]


def test_a_store_starts_with_the_open_sessions_only(shared_url: str) -> None:
    ledger = _build(shared_url)
    open_runs = {e.session_id for e in ledger} - {
        e.session_id for e in ledger if e.is_terminal and e.run_id.endswith("a")
    }
    with LedgerStore.open(shared_url) as store:
        store.check_health()
        store.view("s1")  # the first read: the start's fold
        scopes = store._scopes
        assert scopes is not None
        resident = sorted(sid for sid in (f"s{k}" for k in range(SESSIONS)) if sid in scopes)
        # Sessions with a run lacking its terminal fact (k % 4 == 1), nothing else.
        assert resident == sorted(f"s{k}" for k in range(SESSIONS) if k % 4 == 1), resident
        assert set(resident) <= open_runs | {"s1"}


def test_writes_after_eviction_continue_each_sessions_counters_and_chain(shared_url: str) -> None:
    _build(shared_url)
    with SmallScopes.open(shared_url) as store:
        for k in range(SESSIONS):  # each write evicts others; the reloaded scope carries on
            env = f.ids(session=f"s{k}", run=f"r{k}c", inv=f"i{k}c", turn=f"t{k}c")
            store.append([f.user(id=f"u-s{k}c", **env)])
            pair = f.t1(f"s{k}-late", operation_id=f"op-s{k}-late", **env)
            store.commit_tool_prepared(pair[1], call=pair[0])
        assert store.verify() == []  # chains, event_seq and projections as a rebuild derives them


def test_identities_that_cross_sessions_are_refused_as_the_full_fold_refuses_them(shared_url: str) -> None:
    _build(shared_url)
    other = f.ids(session="s-new", run="r-new", inv="i-new", turn="t-new")
    stolen = f.ids(session="s-new", run="r-new", inv="i0a", turn="t-new")  # s0's invocation
    taken = [  # an operation id s0's call is bound to (under fresh event ids)
        f.call("new-c0", operation_id="op-s0-c0", id="new-call", **other),
        f.dispatch("new-c0", operation_id="op-s0-c0", id="new-dispatch", **other),
    ]
    refused: list[tuple[Callable[[LedgerStore], object], list[RuntimeEvent], Transition, str]] = [
        (
            lambda s: s.append([f.user(id="u-stolen", **stolen)]),
            [f.user(id="u-stolen", **stolen)],
            "generic_append",
            "invocation_identity_conflict",
        ),
        (
            lambda s: s.append([f.text("other bytes", id="m-s0a", **other)]),
            [f.text("other bytes", id="m-s0a", **other)],
            "generic_append",
            "duplicate_event_id",
        ),
        (
            lambda s: s.commit_tool_prepared(taken[1], call=taken[0]),
            taken,
            "t1_prepare",
            "duplicate_operation",
        ),
    ]
    with SmallScopes.open(shared_url) as store:
        store.append([f.user(id="u-new", **other)])  # negative control: its own invocation lands
        for write, batch, transition, code in refused:
            # The reference answer: the scanner over the whole ledger.
            with pytest.raises(LedgerRejection) as whole:
                scan(store.events()).admit(batch, transition)
            with pytest.raises(LedgerRejection) as err:
                write(store)
            assert err.value.code == whole.value.code == code
        fresh = f.t1("new-c0", operation_id="op-new-c0", **other)
        assert store.commit_tool_prepared(fresh[1], call=fresh[0]).created  # negative control
    with SmallScopes.open(shared_url) as store:
        # An exact retry of another session's event is a no-op, as before.
        assert not store.append([store.events("s0")[0]]).created


class ForgetsOnAbort(LedgerStore):
    """The broken variant (the record kept on the scope set an abort drops): forgets corruption."""

    def _abort(self) -> None:
        super()._abort()
        self._corrupt.clear()

    def _start_verification(self, upto: int) -> None:
        return None  # the gate here is the one a read set: no start scan re-records it


def _settled_corrupt_session(shared_url: str) -> None:
    """Session b: one settled call, then a second call row for its call id (corrupt, below the
    writers); session a: an open run."""
    b = f.ids(session="sess-b", run="run-b", inv="inv-b", turn="turn-b")
    with LedgerStore.open(shared_url) as store:
        store.append([f.user(id="evt-user-b", **b)])
        pair = f.t1("call-b", operation_id="op-b", recovery_mode="reconcile", **b)
        store.commit_tool_prepared(pair[1], call=pair[0])
        store.commit_tool_outcome(f.response("call-b", operation_id="op-b", **b))
        store.commit_terminal(f.terminal(id="end-b", **b))
        raw_insert(store, f.call("call-b", operation_id="op-x", id="evt-call-dup", **b))
        store.append([f.user()])


def _t1_outcome(store: LedgerStore, op: str) -> str:
    pair = f.t1(f"call-{op}", operation_id=op, recovery_mode="reconcile")
    try:
        store.commit_tool_prepared(pair[1], call=pair[0])
    except LedgerRejection as exc:
        return exc.code
    return "accepted"


@pytest.mark.parametrize("cls", [LedgerStore, ForgetsOnAbort])
def test_corruption_once_seen_stops_every_later_boundary(shared_url: str, cls: type[LedgerStore]) -> None:
    _settled_corrupt_session(shared_url)
    with cls.open(shared_url) as store:
        store.view("sess-b")  # a status read names the corrupt session
        first, second = _t1_outcome(store, "op-1"), _t1_outcome(store, "op-2")
    assert first == "duplicate_call", first
    if cls is LedgerStore:
        assert second == "duplicate_call", f"the refusal cleared the gate: {second}"
    else:  # negative control: the record dropped with the scopes lets the second T1 through
        assert second == "accepted", second


class BlindToOtherSessionsRuns(LedgerStore):
    """The broken variant: a run the session has not seen is taken to have no terminal fact."""

    def _foreign_terminal(self, *args: Any) -> dict[str, str]:
        return {}


@pytest.mark.parametrize("cls", [LedgerStore, BlindToOtherSessionsRuns])
def test_a_run_id_terminal_in_another_session_refuses_what_follows(
    shared_url: str, cls: type[LedgerStore]
) -> None:
    x = f.ids(session="sx", run="R", inv="ix", turn="tx")
    y = f.ids(session="sy", run="R", inv="iy", turn="ty")  # the same run id, another session
    with LedgerStore.open(shared_url) as store:
        store.append([f.user(id="ux", **x)])
        store.commit_terminal(f.terminal(id="endx", **x))
    pair = f.t1("cy", operation_id="opy", recovery_mode="reconcile", **y)
    writes: list[Callable[[LedgerStore], object]] = [
        lambda s: s.append([f.user(id="uy", **y)]),
        lambda s: s.commit_tool_prepared(pair[1], call=pair[0]),
    ]
    got: list[str] = []
    for write in writes:
        with cls.open(shared_url) as store:  # a fresh start: sx is settled, not resident
            try:
                write(store)
                got.append("accepted")
            except LedgerRejection as exc:
                got.append(exc.code)
    # main's live writers (one fold of the whole ledger) refuse both ``run_already_terminal``.
    want = ["run_already_terminal"] * 2 if cls is LedgerStore else ["accepted"] * 2
    assert got == want, got


class NoStartScan(LedgerStore):
    """The broken variant: no verification of the history this worker never reads."""

    def _start_verification(self, upto: int) -> None:
        return None


@pytest.mark.parametrize("cls", [LedgerStore, NoStartScan])
def test_the_start_scan_finds_a_settled_corrupt_session_nobody_reads(
    shared_url: str, cls: type[LedgerStore]
) -> None:
    _settled_corrupt_session(shared_url)
    with cls.open(shared_url) as store:
        scan = store.verification
        if scan is not None:
            assert scan.wait(120), f"the start scan did not end in 120 s: {scan.to_json()}"
            progress = store.health.to_json()["verification"]
            assert progress["state"] == "corrupt" and progress["corruptSessions"] == 1, progress
        got = _t1_outcome(store, "op-1")  # in session a: b is never named
    want = "duplicate_call" if cls is LedgerStore else "accepted"  # main's code for this ledger
    assert got == want, got


class SkipsOtherSessionsRows(LedgerStore):
    """The broken variant: another process's rows of a session no scope holds are skipped."""

    def _check_sessions(self, conn: Any, session_ids: Any) -> None:
        return None


@pytest.mark.parametrize("cls", [LedgerStore, SkipsOtherSessionsRows])
def test_another_process_corrupting_a_session_not_resident_stops_boundaries(
    shared_url: str, cls: type[LedgerStore]
) -> None:
    b = f.ids(session="sess-b", run="run-b", inv="inv-b", turn="turn-b")
    with cls.open(shared_url) as store:
        store.append([f.user()])
        with LedgerStore.open(shared_url) as other:  # another worker, settling session b
            other.append([f.user(id="evt-user-b", **b)])
            pair = f.t1("call-b", operation_id="op-b", recovery_mode="reconcile", **b)
            other.commit_tool_prepared(pair[1], call=pair[0])
            other.commit_tool_outcome(f.response("call-b", operation_id="op-b", **b))
            other.commit_terminal(f.terminal(id="end-b", **b))
            raw_insert(other, f.call("call-b", operation_id="op-x", id="evt-call-dup", **b))
        got = _t1_outcome(store, "op-1")
    want = "duplicate_call" if cls is LedgerStore else "accepted"
    assert got == want, got


class NoCrossingCheck(SmallScopes):
    """The broken variant: only the batch's own session is consulted (no database keys)."""

    def _check_crossing(self, *args: Any) -> None:
        return None


def test_negative_control_without_the_crossing_check_the_full_folds_codes_are_lost(shared_url: str) -> None:
    _build(shared_url)
    other = f.ids(session="s-new", run="r-new", inv="i-new", turn="t-new")
    stolen = f.ids(session="s-new", run="r-new", inv="i0a", turn="t-new")  # s0's invocation
    call = f.call("new-c0", operation_id="op-s0-c0", id="new-call", **other)
    dispatch = f.dispatch("new-c0", operation_id="op-s0-c0", id="new-dispatch", **other)
    got: list[str] = []
    with NoCrossingCheck.open(shared_url) as store:
        store.append([f.user(id="u-new", **other)])
        for write in (
            lambda: store.append([f.user(id="u-stolen", **stolen)]),
            lambda: store.commit_tool_prepared(dispatch, call=call),
        ):
            try:
                write()
                got.append("accepted")
            except (LedgerRejection, StoreError) as exc:
                got.append(exc.code)
    # The test above sees these refused invocation_identity_conflict / duplicate_operation (the
    # codes of one fold of the whole ledger); without the check only the unique keys answer.
    assert got == ["store_constraint_violation"] * 2, got
