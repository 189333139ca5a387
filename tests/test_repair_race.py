"""The startup-repair race: two ``maka worker`` processes started at once over one ledger.

Setup (real processes, a real server): ``RUNS`` sessions start one turn each on one worker; their
bash call blocks, and the test SIGKILLs the worker once every run has begun and several bash calls
are dispatched, so every run is left non-terminal. Then the executions are lost in the ways an
operator meets: most are terminated, one is deleted outright (gone), and one, whose bash was
dispatched, stays open. Two workers start at the same instant; both run startup repair over the
same runs (the test holds the ledger's write lock while they start, so they really overlap). The
drill runs on a SQLite file and on a PostgreSQL ledger (a fresh schema, when one is configured).

Must hold: exactly one terminal fact per run (the deterministic repair event for lost executions,
the workflow's own for the open one), every header terminal, the open run left to its workflow
(which parks it: bash dispatched without an outcome), ``maka ledger verify`` clean, and nothing
re-run (at most one bash line per session, none for the call killed before it started).
"""

from __future__ import annotations

import asyncio
import json
import re
import sqlite3
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import create_engine, text
from temporalio.api.common.v1 import WorkflowExecution
from temporalio.api.workflowservice.v1 import DeleteWorkflowExecutionRequest

from maka_core.runtime.session_view import operations
from maka_core.store.writer import LedgerStore
from maka_temporal.workflows.contracts import workflow_id_for
from tests.drills import Backend, Sandbox, log_lines, open_session, ready, send, settle, stop
from tests.pg_support import SKIP_REASON, pg_base_url

pytestmark = [
    pytest.mark.slow,
    pytest.mark.temporal,
    pytest.mark.crash,
    pytest.mark.asyncio(loop_scope="session"),
]

RUNS = 24
#: The tool pool runs 8 bodies at once; the rest wait before T1 (still non-terminal runs).
MIN_DISPATCHED = 4
#: Long enough for both workers to start and list the runs, well under the store's busy timeout.
LOCK_HOLD_S = 3.0
MAX_ROUNDS = 5
_REPAIRED = re.compile(r"repaired (\d+) run")


def _script(path: Path) -> Path:
    # Each bash call logs once as it starts, then waits for a release file in its own workspace (the
    # only place a sandboxed command sees the test's files), so no call can finish before the worker
    # dies (the last session's call never starts: its worker dies at P2). A second line anywhere
    # would be a re-run.
    command = "echo ran >> effects.log; for i in $(seq 600); do [ -e release ] && break; sleep 0.1; done"
    steps = [{"toolCalls": [{"name": "bash", "args": {"command": command}}]}, {"text": "done"}]
    path.write_text(json.dumps({"steps": steps}))
    return path


def _progress(db: Path | str) -> tuple[set[str], set[str]]:
    """(non-terminal run ids, session ids whose bash call has its dispatch fact)."""
    with LedgerStore.open(db) as store:
        begun = {r.run_id for r in store.list_runs(nonterminal=True)}
        dispatched = {
            op_session
            for op_session, op in (
                (sid, op) for sid in store.sessions() for op in operations(store.events(session_id=sid))
            )
            if op.tool_name == "bash" and op.dispatch_event_id
        }
    return begun, dispatched


class WriterLock:
    """The ledger's writer lock held by the test: ``BEGIN IMMEDIATE`` on SQLite, the meta row's
    ``FOR UPDATE`` on PostgreSQL (readers pass on both)."""

    def __init__(self, db: Path | str) -> None:
        self.db = db
        self._conn: Any = None

    def __enter__(self) -> WriterLock:
        if isinstance(self.db, Path):
            self._conn = sqlite3.connect(self.db, isolation_level=None)
            self._conn.execute("BEGIN IMMEDIATE")
        else:
            self._engine = create_engine(self.db)
            self._conn = self._engine.connect()
            self._conn.execute(text("SELECT * FROM maka_meta WHERE id = 1 FOR UPDATE"))
        return self

    def release(self) -> None:
        if self._conn is None:
            return
        if isinstance(self.db, Path):
            self._conn.execute("ROLLBACK")
            self._conn.close()
        else:
            self._conn.rollback()
            self._conn.close()
            self._engine.dispose()
        self._conn = None

    def __exit__(self, *exc: object) -> None:
        self.release()


async def _race_round(
    temporal_server: Any, temporal_client: Any, tmp_path: Path, capsys: Any, backend: Backend = "sqlite"
) -> int:
    """One round: leave RUNS runs non-terminal, race two workers, check; return how many runs both
    workers repaired (the overlap)."""
    box = Sandbox(temporal_server, tmp_path, backend=backend)
    try:
        return await _race_in(box, temporal_client, tmp_path, capsys)
    finally:
        box.close()


async def _race_in(box: Sandbox, temporal_client: Any, tmp_path: Path, capsys: Any) -> int:
    script = _script(tmp_path / "script.json")
    sessions = [f"race-{i}-{box.queue}" for i in range(RUNS)]
    workspaces = [box.root / f"ws-{i}" for i in range(RUNS)]
    runs: dict[str, str] = {}

    doomed = box.worker()
    try:
        await ready(doomed)
        for sid, ws in zip(sessions, workspaces, strict=True):
            ws.mkdir()
            await open_session(temporal_client, ws, script, box.queue, session_id=sid)
        accepted = await asyncio.gather(
            *(send(temporal_client, sid, "go", update_id=f"{sid}-1") for sid in sessions)
        )
        runs = {sid: a.run_id for sid, a in zip(sessions, accepted, strict=True)}
        deadline = time.monotonic() + 60
        while True:
            begun, dispatched = await asyncio.to_thread(_progress, box.db)
            if len(begun) == RUNS and len(dispatched) >= MIN_DISPATCHED:
                break
            assert time.monotonic() < deadline, (len(begun), len(dispatched))
            await asyncio.sleep(0.1)
        doomed.proc.kill()  # SIGKILL, by pid, mid-turn for every session
        assert await doomed.wait_exit(timeout=10) == -9
    finally:
        await stop(doomed)
        for ws in workspaces:  # any orphaned bash command ends now
            if ws.exists():
                (ws / "release").touch()

    begun, dispatched = await asyncio.to_thread(_progress, box.db)
    assert begun == set(runs.values())
    # Keep open a session whose bash was dispatched: its workflow must recover and park it.
    kept_open = next(sid for sid in sessions if sid in dispatched)
    deleted = next(sid for sid in sessions if sid != kept_open)
    terminated = [sid for sid in sessions if sid not in (kept_open, deleted)]
    for sid in terminated:
        await temporal_client.get_workflow_handle(workflow_id_for(sid)).terminate("drill: execution lost")
    desc = await temporal_client.get_workflow_handle(workflow_id_for(deleted)).describe()
    await temporal_client.workflow_service.delete_workflow_execution(
        DeleteWorkflowExecutionRequest(
            namespace=temporal_client.namespace,
            workflow_execution=WorkflowExecution(workflow_id=workflow_id_for(deleted), run_id=desc.run_id),
        )
    )

    # The race: two workers, one ledger, started back to back. The test holds the ledger's write lock
    # while they start, so both list the same non-terminal runs (WAL readers are not blocked) and
    # both queue on their first repair commit: without the lock the first worker usually finishes
    # before the second one has even listed, and there is no race to speak of.
    lock = WriterLock(box.db).__enter__()
    first, second = box.worker(), box.worker()
    try:
        await asyncio.sleep(LOCK_HOLD_S)
        lock.release()
        await asyncio.gather(ready(first), ready(second))
        started = time.monotonic()
        parked = await settle(temporal_client, kept_open, runs[kept_open], timeout=60)
        settled_open = time.monotonic() - started
    finally:
        lock.release()
        await asyncio.gather(stop(first), stop(second))
    clean, verify_output = await box.verify()

    reports = [_REPAIRED.findall(w.log.read_text()) for w in (first, second)]
    with LedgerStore.open(box.db) as store:
        left = store.list_runs(nonterminal=True)
        headers = {sid: store.get_run(runs[sid]) for sid in sessions}
        terminal: Counter[str] = Counter()
        terminal_ids: dict[str, list[str]] = {}
        for sid in sessions:
            for event in store.events(session_id=sid):
                if event.is_terminal:
                    terminal[event.run_id] += 1
                    terminal_ids.setdefault(event.run_id, []).append(event.id)
    overlap = sum(int(n) for r in reports for n in r) - (RUNS - 1)
    with capsys.disabled():
        print(
            f"\nRepair race round: {RUNS} runs left non-terminal "
            f"({len(terminated)} terminated, 1 deleted, 1 open); "
            f"worker A reported {reports[0] or ['nothing']} repaired, worker B {reports[1] or ['nothing']}; "
            f"terminal facts per run {sorted(terminal.values())}; open session {parked.state} "
            f"({parked.park_reason}) {settled_open:.1f}s after both were up; "
            f"ledger verify {'clean' if clean else verify_output}; repaired by both: {overlap}"
        )

    assert left == []
    assert set(terminal) == set(runs.values()) and set(terminal.values()) == {1}, terminal_ids
    for sid in [deleted, *terminated]:
        run_id = runs[sid]
        assert terminal_ids[run_id] == [f"{run_id}_terminal"]  # the deterministic repair event
        assert headers[sid] is not None and headers[sid].status == "failed"  # type: ignore[union-attr]
    # The open execution was left to its workflow, which recovered the run and parked it.
    assert parked.state == "parked" and parked.park_reason == "dispatch_without_response"
    assert terminal_ids[runs[kept_open]] != [f"{runs[kept_open]}_terminal"]
    assert headers[kept_open] is not None and headers[kept_open].park_reason == "dispatch_without_response"  # type: ignore[union-attr]
    # Together the two workers repaired every lost run; a run both repaired converged on one
    # terminal fact (the second commit is an exact retry) instead of adding another.
    assert sum(int(n) for r in reports for n in r) >= RUNS - 1, reports
    assert clean, verify_output
    lines = [len(log_lines(ws / "effects.log")) for ws in workspaces]
    assert max(lines) <= 1 and sum(lines) < RUNS, lines  # nothing ran again
    return overlap


@pytest.mark.timeout(1200)
@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
async def test_two_workers_starting_at_once_repair_each_run_exactly_once(
    temporal_server: Any, temporal_client: Any, tmp_path: Path, capsys: Any, backend: Backend
) -> None:
    if backend == "postgres" and pg_base_url() is None:
        pytest.skip(SKIP_REASON)
    # Whether the second worker lists a run before the first has repaired it is up to the
    # scheduler; rounds continue until one shows both workers repairing the same runs.
    overlaps: list[int] = []
    for round_ in range(MAX_ROUNDS):
        overlaps.append(
            await _race_round(temporal_server, temporal_client, tmp_path / f"round-{round_}", capsys, backend)
        )
        if overlaps[-1] > 0:
            break
    with capsys.disabled():
        print(
            f"Repair race ({backend}): rounds {len(overlaps)}, "
            f"runs repaired by both workers per round {overlaps}\n"
        )
    assert overlaps[-1] > 0, f"no round raced: {overlaps}"
