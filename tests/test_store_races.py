"""Multi-process races on one ledger (real processes released together by a file barrier).

Every race runs on a SQLite file and on PostgreSQL (a fresh schema per ledger, when
``MAKA_TEST_POSTGRES_URL`` is set): writers serialize on ``BEGIN IMMEDIATE`` there and on the meta
row's ``FOR UPDATE`` here, and the outcome must be the same. Each race runs ``ROUNDS`` times on a
fresh ledger; ``MAKA_STORAGE_STRESS=1`` runs more rounds.
"""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path

import pytest
from sqlalchemy import func, select

from maka_core.facts.run_header import RunHeader
from maka_core.ledger.resolver import resolve
from maka_core.store.schema import SCHEMA_VERSION, continuation_claims
from maka_core.store.writer import LedgerStore
from tests.ledger_factory import call, dispatch, terminal, user
from tests.pg_support import SKIP_REASON, fresh_pg_schema, pg_base_url

pytestmark = pytest.mark.crash

REPO = Path(__file__).resolve().parents[1]
ROUNDS = 10 if os.environ.get("MAKA_STORAGE_STRESS") == "1" else 2


NewLedger = Callable[[], str]


@pytest.fixture(params=["sqlite", "postgres"])
def new_ledger(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[NewLedger]:
    """A factory of fresh, empty ledger targets (a file path, or a URL on a new PG schema)."""
    if request.param == "sqlite":
        names = iter(range(1000))
        yield lambda: str(tmp_path / f"ledger-{next(names)}.sqlite")
        return
    if pg_base_url() is None:
        pytest.skip(SKIP_REASON)
    with ExitStack() as stack:
        yield lambda: stack.enter_context(fresh_pg_schema())


def race(db: str, *actions: str, workdir: Path) -> list[tuple[int, str]]:
    """Start one child per action, release them together, return (exit code, last line) each."""
    go = workdir / f"go-{os.urandom(4).hex()}"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("MAKA_FAILPOINT", None)
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "tests.children.race_child", db, str(go), action],
            cwd=REPO,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for action in actions
    ]
    for proc in procs:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "READY"
    go.touch()
    results = []
    for proc in procs:
        out, err = proc.communicate(timeout=60)
        lines = out.strip().splitlines()
        assert lines, err
        results.append((proc.returncode, lines[-1]))
    return results


def prepared_ledger(new_ledger: NewLedger) -> str:
    db = new_ledger()
    with LedgerStore.open(db) as store:
        store.append([user()])
        store.commit_tool_prepared(
            dispatch(operation_id="op-1", recovery_mode="reconcile"), call=call(operation_id="op-1")
        )
    return db


@pytest.mark.parametrize("n", range(ROUNDS))
def test_two_processes_committing_the_same_exact_bundle_get_one_result(
    new_ledger: NewLedger, tmp_path: Path, n: int
) -> None:
    db = prepared_ledger(new_ledger)
    results = race(db, "completed", "completed", workdir=tmp_path)
    assert sorted(results) == [(0, "RESULT created"), (0, "RESULT existing")]
    with LedgerStore.open(db) as store:
        assert len(store.events()) == 6
        assert store.operation("op-1").current_state == "recovery_completed"  # type: ignore[union-attr]
        assert store.verify() == []


@pytest.mark.parametrize("n", range(ROUNDS))
def test_conflicting_completed_and_parked_bundles_serialize_to_one_decision(
    new_ledger: NewLedger, tmp_path: Path, n: int
) -> None:
    db = prepared_ledger(new_ledger)
    results = race(db, "completed", "parked", workdir=tmp_path)
    assert sorted(code for code, _ in results) == [0, 2]
    winner = next(line for code, line in results if code == 0)
    assert winner == "RESULT created"
    with LedgerStore.open(db) as store:
        events = store.events()
        recovery = resolve(events)
        assert not recovery.has_corruption and store.verify() == []
        decisions = [
            e
            for e in events
            if e.actions is not None
            and e.actions.tool_recovery is not None
            and e.actions.tool_recovery.kind == "maka.tool.recovery_decision"
        ]
        assert len(decisions) == 1
        state = store.operation("op-1").current_state  # type: ignore[union-attr]
        assert state in ("recovery_completed", "recovery_parked")
        assert recovery.operations[0].status == ("completed" if state == "recovery_completed" else "parked")


@pytest.mark.parametrize("n", range(ROUNDS))
def test_two_processes_dispatching_one_operation_create_it_once(
    new_ledger: NewLedger, tmp_path: Path, n: int
) -> None:
    db = new_ledger()
    with LedgerStore.open(db) as store:
        store.append([user()])
    results = race(db, "t1", "t1", workdir=tmp_path)
    assert sorted(results) == [(0, "RESULT created"), (0, "RESULT existing")]


def terminal_ledger(new_ledger: NewLedger) -> str:
    db = new_ledger()
    with LedgerStore.open(db) as store:
        store.append([user()])
        store.commit_terminal(terminal())
    return db


@pytest.mark.parametrize("n", range(ROUNDS))
def test_exactly_one_process_acquires_a_continuation_boundary(
    new_ledger: NewLedger, tmp_path: Path, n: int
) -> None:
    db = terminal_ledger(new_ledger)
    same = race(db, "claim-1", "claim-1", workdir=tmp_path)
    assert sorted(line for _, line in same) == ["RESULT acquired", "RESULT existing"]
    db2 = terminal_ledger(new_ledger)
    rivals = race(db2, "claim-1", "claim-2", workdir=tmp_path)
    assert sorted(line for _, line in rivals) == ["RESULT acquired", "RESULT conflict"]
    with LedgerStore.open(db2) as store, store.engine.connect() as conn:
        assert conn.execute(select(func.count()).select_from(continuation_claims)).scalar() == 1


@pytest.mark.parametrize("n", range(ROUNDS))
def test_two_processes_repairing_one_run_leave_one_terminal_fact(
    new_ledger: NewLedger, tmp_path: Path, n: int
) -> None:
    db = prepared_ledger(new_ledger)
    with LedgerStore.open(db) as store:
        store.put_run(RunHeader(session_id="sess-1", run_id="run-1", invocation_id="inv-1", turn_id="turn-1"))
    results = race(db, "repair", "repair", workdir=tmp_path)
    assert sorted(results) == [(0, "RESULT committed"), (0, "RESULT converged")]
    with LedgerStore.open(db) as store:
        assert [e.id for e in store.events() if e.is_terminal] == ["run-1_terminal"]
        assert store.get_run("run-1").status == "failed"  # type: ignore[union-attr]


def test_two_processes_initialize_one_fresh_wal_database(tmp_path: Path) -> None:
    db = tmp_path / "fresh.sqlite"
    assert sorted(race(db, "open", "open", workdir=tmp_path)) == [(0, "RESULT opened"), (0, "RESULT opened")]
    with sqlite3.connect(db) as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION


@pytest.mark.parametrize("n", range(ROUNDS))
def test_two_processes_initialize_one_fresh_postgres_schema(tmp_path: Path, n: int) -> None:
    if pg_base_url() is None:
        pytest.skip(SKIP_REASON)
    with fresh_pg_schema() as url:
        assert sorted(race(url, "open", "open", "open", workdir=tmp_path)) == [(0, "RESULT opened")] * 3
        with LedgerStore.open(url) as store:
            assert store.health.ledger_id is not None
            assert store.verify() == []
