"""Real-process crash harness: a child commits a session prefix and SIGKILLs itself at each
failpoint (Phase 0 P0-P11 and every internal store point); the parent reopens the ledger and checks
that it holds exactly the committed prefix the catalog names, that two plans agree, that reading
mutated nothing, and that SQLite's integrity check passes. A negative control writes the recovery
bundle without a transaction and shows the check catching the torn bundle."""

from __future__ import annotations

import hashlib
import os
import signal
import sqlite3
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from maka_core import failpoints
from maka_core.facts.events import RuntimeEvent
from maka_core.ledger.resolver import resolve
from maka_core.ledger.resume_plan import plan_resume
from maka_core.store.writer import LedgerStore
from tests.children.crash_session import BUNDLE, SESSION

pytestmark = pytest.mark.crash

REPO = Path(__file__).resolve().parents[1]

REC, OUT, DEC = BUNDLE


@dataclass(frozen=True)
class Case:
    point: str
    mode: str = "session"
    tag: str | None = None
    events: int = 0  # how many of SESSION survive
    header: str | None = "running"
    claim: bool = False
    kind: str = ""  # Phase 0 prefix kind

    @property
    def id(self) -> str:
        return f"{self.point}[{self.tag}]" if self.tag else self.point


PREFIX_EVENTS = {
    "before_function_call": 1,
    "after_function_call": 3,
    "after_function_response": 4,
    "after_terminal_event": 5,
}

PHASE0_CASES = [
    Case(
        p,
        kind=failpoints.PHASE0_PREFIX[p],
        events=2 if p == "P1" else PREFIX_EVENTS[failpoints.PHASE0_PREFIX[p]],
        header="completed" if p in ("P10", "P11") else "running",
        claim=p == "P11",
    )
    for p in failpoints.PHASE0
]
STORE_CASES = [
    Case("after_runtime_event_insert", tag="generic_append", events=0),
    Case("after_runtime_event_insert", tag="t1_prepare", events=2),
    Case("after_runtime_event_insert", tag="t2_outcome", events=3),
    Case("after_journal_event_insert", tag="t1_prepare", events=2),
    Case("after_journal_event_insert", tag="t2_outcome", events=3),
    Case("after_continuation_claim_insert", events=5, header="completed"),
    Case("after_continuation_start_insert", events=5, header="completed", claim=True),
    Case("after_runtime_event_insert", mode="bundle", tag="recovery_bundle", events=3, header=None),
    Case("after_journal_event_insert", mode="bundle", tag="recovery_bundle", events=3, header=None),
    Case("after_recovery_reconcile", mode="bundle", events=3, header=None),
    Case("after_recovery_outcome", mode="bundle", events=3, header=None),
    Case("after_recovery_decision", mode="bundle", events=3, header=None),
]
CASES = PHASE0_CASES + STORE_CASES


def test_every_failpoint_in_the_catalog_is_drilled() -> None:
    # The continuation points are drilled in tests/test_continuation_runtime.py (SIGKILL at each, with
    # the next plan's reference code), the compaction points in tests/test_compaction_sessions.py,
    # the checkpoint points in tests/test_git_checkpoints.py and tests/test_guarded_replace.py,
    # the redo points in tests/test_guarded_redo.py;
    # every other point of the catalog is drilled here.
    others = frozenset(failpoints.CONTINUATION) | frozenset(failpoints.COMPACTION)
    others |= frozenset(failpoints.CHECKPOINT) | frozenset(failpoints.REDO)
    assert {c.point for c in CASES} == failpoints.CATALOG - others
    assert len(failpoints.CATALOG) == 12 + 7 + len(others)


def run_child(db: Path, case: Case) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO), "MAKA_FAILPOINT": case.point}
    env.pop("MAKA_FAILPOINT_SKIP", None)
    env.pop("MAKA_FAILPOINT_TAG", None)
    if case.tag:
        env["MAKA_FAILPOINT_TAG"] = case.tag
    return subprocess.run(
        [sys.executable, "-m", "tests.children.crash_session", str(db), case.mode],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def rows_digest(db: Path) -> str:
    """Every row of every table, read through a read-only handle."""
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        h = hashlib.sha256()
        tables = [
            r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table' ORDER BY name")
        ]
        for table in tables:
            h.update(table.encode())
            for row in sorted(conn.execute(f"SELECT * FROM {table}").fetchall(), key=repr):
                h.update(repr(row).encode())
        h.update(str(conn.execute("PRAGMA user_version").fetchone()[0]).encode())
        return h.hexdigest()
    finally:
        conn.close()


def check_plan(events: list[RuntimeEvent], kind: str) -> None:
    plan = plan_resume(events)
    recovery = resolve(events)
    replay = plan.replay_event_ids
    assert plan.high_water == len(events)
    if kind == "before_function_call":
        assert plan.kind == "safe_replay" and not plan.operations and list(replay) == ["evt-user-1"]
        return
    (op,) = recovery.operations
    if kind == "after_function_call":
        assert plan.kind == "blocked" and list(plan.rejection_reasons) == ["dangling_tool_state"]
        assert "evt-call-1" not in replay and "evt-user-1" in replay
        if len(events) == 2:  # call only, new protocol: provably never dispatched
            assert op.status == "definitely_not_dispatched"
        else:
            assert op.status == "indeterminate" and op.requires_reconciliation
            assert plan.requires_verification and plan.directive and "Do not retry" in plan.directive
        return
    assert plan.kind == "safe_replay" and op.status == "completed" and op.settlement_origin == "normal_t2"
    assert replay.index("evt-call-1") < replay.index("op-1_response")
    assert ("evt-terminal-1" in replay) == (kind == "after_terminal_event")


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_sigkill_leaves_exactly_the_committed_prefix(case: Case, tmp_path: Path) -> None:
    db = tmp_path / "ledger.sqlite"
    proc = run_child(db, case)
    assert proc.returncode == -signal.SIGKILL, proc.stdout + proc.stderr
    assert "FINALLY" not in proc.stdout and "STEP done" not in proc.stdout

    before = rows_digest(db)
    plans = []
    for _ in range(2):
        with LedgerStore.open(db) as store:
            run1 = store.events(run_id="run-1")
            assert run1 == SESSION[: case.events] if case.mode == "session" else run1 == SESSION[:3]
            assert store.verify() == []
            header = store.get_run("run-1")
            assert (header.status if header else None) == case.header
            claim = store.continuation_claim("claim-1")
            assert (claim is not None) == case.claim
            if claim is not None:
                assert claim.start_event_id is None and store.events(run_id="run-2") == []
            if case.mode == "bundle":
                op = store.operation("op-1")
                assert op is not None and op.current_state == "prepared"
                assert [j.state for j in store.journal("op-1")] == ["prepared"]
            plans.append(plan_resume(run1).to_json())
    assert plans[0] == plans[1]
    if case.kind:
        check_plan(run1, case.kind)
    assert rows_digest(db) == before, "reading the ledger mutated it"
    conn = sqlite3.connect(db)
    assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    conn.close()


def test_a_session_without_a_failpoint_runs_to_the_end(tmp_path: Path) -> None:
    db = tmp_path / "ledger.sqlite"
    proc = run_child(db, Case("none"))
    assert proc.returncode == 0 and "STEP done" in proc.stdout and "FINALLY" in proc.stdout
    with LedgerStore.open(db) as store:
        assert store.events(run_id="run-1") == SESSION
        claim = store.continuation_claim("claim-1")
        assert claim is not None and claim.start_event_id == "evt-continuation-start"


@pytest.mark.parametrize("point", ["after_recovery_reconcile", "after_recovery_outcome"])
def test_negative_control_a_bundle_without_a_transaction_tears(point: str, tmp_path: Path) -> None:
    """The same checks see a torn bundle when the writer does not wrap it in one transaction."""
    db = tmp_path / "ledger.sqlite"
    proc = run_child(db, Case(point, mode="unsafe-bundle", tag="recovery_bundle"))
    assert proc.returncode == -signal.SIGKILL
    with LedgerStore.open(db) as store:
        events = store.events(run_id="run-1")
        assert events != SESSION[:3], "the control failed to tear the bundle"
        assert events[:3] == SESSION[:3] and events[3] == REC
        op = resolve(events).operations[0]
        assert op.status != "completed"
