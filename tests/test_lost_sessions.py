"""Which sessions a worker's auto-resume proposes after startup repair (``lost_sessions``).

A real SQLite ledger holding one session of each kind. Only a run whose execution was lost (closed
by a repair: a ``recovered`` terminal fact) or a claimed continuation that never started is lost; a
run with no terminal fact and no continuation source belongs to an execution that is still open (a
turn in flight, a session parked on its host), and proposing it only earns ``session_busy``.
"""

from __future__ import annotations

from pathlib import Path

from maka_core.facts.run_header import RunHeader
from maka_core.runtime.settle import repair_run
from maka_core.store.writer import LedgerStore
from maka_temporal.workers.host.resume import lost_sessions
from tests.ledger_factory import ids, terminal, user


def _run(store: LedgerStore, session: str, *, status: str = "running", **fields: object) -> dict[str, str]:
    names = ids(session=session, run=f"run-{session}", inv=f"inv-{session}", turn=f"turn-{session}")
    store.put_run(
        RunHeader(
            session_id=session,
            run_id=names["run_id"],
            invocation_id=names["invocation_id"],
            turn_id=names["turn_id"],
            status=status,  # type: ignore[arg-type]
            **fields,  # type: ignore[arg-type]
        )
    )
    return names


def test_only_repaired_runs_and_unstarted_continuations_are_lost(tmp_path: Path) -> None:
    with LedgerStore.open(tmp_path / "ledger.sqlite") as store:
        # In flight: its execution is open (no terminal fact, no continuation source).
        running = _run(store, "s-running")
        store.append([user(id="evt-u-running", **running)])
        # Lost mid-turn and closed by startup repair.
        repaired = _run(store, "s-repaired")
        store.append([user(id="evt-u-repaired", **repaired)])
        repair_run(store, repaired["run_id"])
        # Claimed by a resume whose start never ran.
        _run(store, "s-claimed", continuation_source={"runId": "run-0"})
        # Finished.
        done = _run(store, "s-done")
        store.append([user(id="evt-u-done", **done)])
        store.commit_terminal(terminal(id="evt-t-done", **done))

        assert sorted(lost_sessions(store)) == ["s-claimed", "s-repaired"]
