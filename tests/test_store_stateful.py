"""Hypothesis stateful test: random sequences of appends, T1, T2, recovery bundles, exact retries,
conflicting retries, run header moves and reopens. After every step the online projections (the
session index among them) equal a rebuild from the ledger, and the Resolver agrees with a simple
model of each operation's state. The same machine runs on a SQLite file and, when
``MAKA_TEST_POSTGRES_URL`` is set, on a fresh PostgreSQL schema."""

from __future__ import annotations

import shutil
import tempfile
from contextlib import ExitStack
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from maka_core.errors import LedgerRejection
from maka_core.facts.run_header import RunHeader
from maka_core.ledger.resolver import resolve
from maka_core.store.writer import LedgerStore
from tests.ledger_factory import (
    INVOCATION,
    RUN,
    SESSION,
    TURN,
    call,
    completed_bundle,
    dispatch,
    parked_bundle,
    response,
    text,
    user,
)
from tests.pg_support import SKIP_REASON, fresh_pg_schema, pg_base_url

# 40 examples x 25 steps on a real SQLite file take ~15 s: it runs with the drills, not the quick set.
pytestmark = pytest.mark.slow

# model state -> (Resolver status, settlement origin, projection state)
EXPECT = {
    "called": ("definitely_not_dispatched", None, None),
    "prepared": ("indeterminate", None, "prepared"),
    "outcome": ("completed", "normal_t2", "outcome_committed"),
    "recovered": ("completed", "recovery_bundle", "recovery_completed"),
    "parked": ("parked", "recovery_bundle", "recovery_parked"),
}


class LedgerMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.dir = Path(tempfile.mkdtemp(prefix="maka-stateful-"))
        self.resources = ExitStack()
        self.db = self.new_ledger()
        self.store = LedgerStore.open(self.db)
        self.store.append([user()])
        self.state: dict[int, str] = {}
        self.is_error: dict[int, bool] = {}
        self.texts = 0

    def new_ledger(self) -> str | Path:
        return self.dir / "ledger.sqlite"

    def teardown(self) -> None:
        self.store.close()
        self.resources.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    def ops(self, *states: str) -> list[int]:
        return [k for k, s in self.state.items() if s in states]

    @staticmethod
    def ids(k: int) -> tuple[str, str]:
        return f"op-{k}", f"call-{k}"

    def refused(self, fn: object, *args: object) -> None:
        before = len(self.store.events())
        with pytest.raises(LedgerRejection):
            fn(*args)  # type: ignore[operator]
        assert len(self.store.events()) == before

    # --- rules ---------------------------------------------------------------------------------

    @rule()
    def append_text(self) -> None:
        self.texts += 1
        self.store.append([text(id=f"text-{self.texts}")])

    @rule(with_call=st.booleans())
    def new_operation(self, with_call: bool) -> None:
        k = len(self.state) + 1
        op, cid = self.ids(k)
        if with_call:
            assert self.store.commit_tool_prepared(
                dispatch(cid, operation_id=op, recovery_mode="reconcile"), call=call(cid, operation_id=op)
            ).created
            self.state[k] = "prepared"
        else:
            self.store.append([call(cid, operation_id=op)])
            self.state[k] = "called"

    @precondition(lambda self: self.ops("called"))
    @rule(data=st.data())
    def dispatch_called(self, data: st.DataObject) -> None:
        k = data.draw(st.sampled_from(self.ops("called")))
        op, cid = self.ids(k)
        assert self.store.commit_tool_prepared(
            dispatch(cid, operation_id=op, recovery_mode="reconcile"), call=call(cid, operation_id=op)
        ).created_ids == (f"{op}_dispatch",)
        self.state[k] = "prepared"

    @precondition(lambda self: self.ops("called"))
    @rule(data=st.data())
    def outcome_without_dispatch_is_refused(self, data: st.DataObject) -> None:
        op, cid = self.ids(data.draw(st.sampled_from(self.ops("called"))))
        self.refused(self.store.commit_tool_outcome, response(cid, operation_id=op))

    @precondition(lambda self: self.ops("prepared"))
    @rule(data=st.data(), is_error=st.booleans())
    def outcome(self, data: st.DataObject, is_error: bool) -> None:
        k = data.draw(st.sampled_from(self.ops("prepared")))
        op, cid = self.ids(k)
        assert self.store.commit_tool_outcome(
            response(cid, operation_id=op, is_error=is_error or None)
        ).created
        self.state[k], self.is_error[k] = "outcome", is_error

    @precondition(lambda self: self.ops("prepared"))
    @rule(data=st.data(), complete=st.booleans())
    def recovery_bundle(self, data: st.DataObject, complete: bool) -> None:
        k = data.draw(st.sampled_from(self.ops("prepared")))
        op, cid = self.ids(k)
        if complete:
            rec, out, dec = completed_bundle(cid, operation_id=op)
            assert self.store.commit_recovery_bundle(rec, dec, out).created
            self.state[k] = "recovered"
        else:
            observation = data.draw(st.sampled_from(["matches_prior_state", "diverged", "unreadable"]))
            assert self.store.commit_recovery_bundle(
                *parked_bundle(cid, observation, operation_id=op)
            ).created
            self.state[k] = "parked"

    @precondition(lambda self: self.ops("prepared", "outcome", "recovered", "parked"))
    @rule(data=st.data())
    def exact_retry(self, data: st.DataObject) -> None:
        k = data.draw(st.sampled_from(self.ops("prepared", "outcome", "recovered", "parked")))
        op, cid = self.ids(k)
        s = self.state[k]
        if s == "prepared":
            result = self.store.commit_tool_prepared(
                dispatch(cid, operation_id=op, recovery_mode="reconcile"), call=call(cid, operation_id=op)
            )
        elif s == "outcome":
            result = self.store.commit_tool_outcome(
                response(cid, operation_id=op, is_error=self.is_error[k] or None)
            )
        elif s == "recovered":
            rec, out, dec = completed_bundle(cid, operation_id=op)
            result = self.store.commit_recovery_bundle(rec, dec, out)
        else:
            # The parked observation is not remembered; retrying the T1 is an exact retry too.
            result = self.store.commit_tool_prepared(
                dispatch(cid, operation_id=op, recovery_mode="reconcile"), call=call(cid, operation_id=op)
            )
        assert not result.created

    @precondition(lambda self: self.ops("outcome", "recovered", "parked"))
    @rule(data=st.data(), kind=st.sampled_from(["t2", "bundle", "t1-other-args"]))
    def conflicting_retry(self, data: st.DataObject, kind: str) -> None:
        k = data.draw(st.sampled_from(self.ops("outcome", "recovered", "parked")))
        op, cid = self.ids(k)
        if kind == "t2":
            self.refused(
                self.store.commit_tool_outcome, response(cid, operation_id=op, id=f"{op}_response_again")
            )
        elif kind == "bundle":
            rec, dec = parked_bundle(cid, operation_id=op, suffix="-again")
            self.refused(self.store.commit_recovery_bundle, rec, dec)
        else:
            other = dispatch(
                cid,
                operation_id=op,
                recovery_mode="reconcile",
                args={"command": "rm -rf /"},
                id=f"{op}_dispatch_again",
            )
            self.refused(self.store.commit_tool_prepared, other)

    @rule(parked=st.booleans())
    def run_header(self, parked: bool) -> None:
        """The run's header moves between running and parked (a host park): the session index
        follows it in the header's own transaction, and must still equal its rebuild."""
        self.store.put_run(
            RunHeader(
                session_id=SESSION,
                run_id=RUN,
                invocation_id=INVOCATION,
                turn_id=TURN,
                status="parked" if parked else "running",
                park_reason="workspace_host_unavailable" if parked else None,
            )
        )

    @rule()
    def reopen(self) -> None:
        self.store.close()
        self.store = LedgerStore.open(self.db)

    # --- invariants ----------------------------------------------------------------------------

    @invariant()
    def projections_equal_rebuild_and_resolver_agrees(self) -> None:
        assert self.store.verify() == []
        recovery = resolve(self.store.events())
        assert not recovery.has_corruption
        by_call = {o.tool_call_id: o for o in recovery.operations}
        assert set(by_call) == {self.ids(k)[1] for k in self.state}
        for k, s in self.state.items():
            op, cid = self.ids(k)
            status, origin, projected = EXPECT[s]
            got = by_call[cid]
            assert (got.status, got.settlement_origin) == (status, origin), (k, s)
            row = self.store.operation(op)
            assert (row.current_state if row else None) == projected
        assert recovery.requires_reconciliation == bool(self.ops("prepared"))


class PostgresLedgerMachine(LedgerMachine):
    """The same machine on a fresh PostgreSQL schema per example (reopen = a new engine and pool)."""

    def new_ledger(self) -> str | Path:
        return self.resources.enter_context(fresh_pg_schema())


MACHINE_SETTINGS = settings(
    max_examples=40,
    stateful_step_count=25,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
LedgerMachine.TestCase.settings = MACHINE_SETTINGS
PostgresLedgerMachine.TestCase.settings = MACHINE_SETTINGS
test_ledger_state_machine = LedgerMachine.TestCase


@pytest.mark.skipif(pg_base_url() is None, reason=SKIP_REASON)
class TestLedgerStateMachineOnPostgres(PostgresLedgerMachine.TestCase):  # type: ignore[misc,valid-type]
    pass
