"""Multi-process races on one SQLite ledger (real processes released together by a file barrier).

Each race runs ``ROUNDS`` times on a fresh ledger; ``MAKA_STORAGE_STRESS=1`` runs more rounds.
"""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from maka_core.facts.run_header import RunHeader
from maka_core.ledger.resolver import resolve
from maka_core.store.schema import SCHEMA_VERSION
from maka_core.store.writer import LedgerStore
from tests.ledger_factory import call, dispatch, terminal, user

pytestmark = pytest.mark.crash

REPO = Path(__file__).resolve().parents[1]
ROUNDS = 10 if os.environ.get("MAKA_STORAGE_STRESS") == "1" else 2


def race(db: Path, *actions: str) -> list[tuple[int, str]]:
    """Start one child per action, release them together, return (exit code, last line) each."""
    go = db.parent / f"go-{os.urandom(4).hex()}"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("MAKA_FAILPOINT", None)
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "tests.children.race_child", str(db), str(go), action],
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


def prepared_ledger(tmp_path: Path, n: int) -> Path:
    db = tmp_path / f"ledger-{n}.sqlite"
    with LedgerStore.open(db) as store:
        store.append([user()])
        store.commit_tool_prepared(
            dispatch(operation_id="op-1", recovery_mode="reconcile"), call=call(operation_id="op-1")
        )
    return db


@pytest.mark.parametrize("n", range(ROUNDS))
def test_two_processes_committing_the_same_exact_bundle_get_one_result(tmp_path: Path, n: int) -> None:
    db = prepared_ledger(tmp_path, n)
    results = race(db, "completed", "completed")
    assert sorted(results) == [(0, "RESULT created"), (0, "RESULT existing")]
    with LedgerStore.open(db) as store:
        assert len(store.events()) == 6
        assert store.operation("op-1").current_state == "recovery_completed"  # type: ignore[union-attr]
        assert store.verify() == []


@pytest.mark.parametrize("n", range(ROUNDS))
def test_conflicting_completed_and_parked_bundles_serialize_to_one_decision(tmp_path: Path, n: int) -> None:
    db = prepared_ledger(tmp_path, n)
    results = race(db, "completed", "parked")
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
def test_two_processes_dispatching_one_operation_create_it_once(tmp_path: Path, n: int) -> None:
    db = tmp_path / f"ledger-{n}.sqlite"
    with LedgerStore.open(db) as store:
        store.append([user()])
    results = race(db, "t1", "t1")
    assert sorted(results) == [(0, "RESULT created"), (0, "RESULT existing")]


def terminal_ledger(tmp_path: Path, n: int) -> Path:
    db = tmp_path / f"ledger-{n}.sqlite"
    with LedgerStore.open(db) as store:
        store.append([user()])
        store.commit_terminal(terminal())
    return db


@pytest.mark.parametrize("n", range(ROUNDS))
def test_exactly_one_process_acquires_a_continuation_boundary(tmp_path: Path, n: int) -> None:
    db = terminal_ledger(tmp_path, n)
    same = race(db, "claim-1", "claim-1")
    assert sorted(line for _, line in same) == ["RESULT acquired", "RESULT existing"]
    db2 = terminal_ledger(tmp_path, n + 100)
    rivals = race(db2, "claim-1", "claim-2")
    assert sorted(line for _, line in rivals) == ["RESULT acquired", "RESULT conflict"]
    with sqlite3.connect(db2) as conn:
        assert conn.execute("SELECT count(*) FROM continuation_claims").fetchone()[0] == 1


@pytest.mark.parametrize("n", range(ROUNDS))
def test_two_processes_repairing_one_run_leave_one_terminal_fact(tmp_path: Path, n: int) -> None:
    db = prepared_ledger(tmp_path, n)
    with LedgerStore.open(db) as store:
        store.put_run(RunHeader(session_id="sess-1", run_id="run-1", invocation_id="inv-1", turn_id="turn-1"))
    results = race(db, "repair", "repair")
    assert sorted(results) == [(0, "RESULT committed"), (0, "RESULT converged")]
    with LedgerStore.open(db) as store:
        assert [e.id for e in store.events() if e.is_terminal] == ["run-1_terminal"]
        assert store.get_run("run-1").status == "failed"  # type: ignore[union-attr]


def test_two_processes_initialize_one_fresh_wal_database(tmp_path: Path) -> None:
    db = tmp_path / "fresh.sqlite"
    assert sorted(race(db, "open", "open")) == [(0, "RESULT opened"), (0, "RESULT opened")]
    with sqlite3.connect(db) as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
