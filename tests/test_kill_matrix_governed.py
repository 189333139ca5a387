"""The kill matrix, unchanged, under a policy that confirms every mutation and a test approver.

Every cell of ``test_kill_matrix.matrix()`` runs with the same kills and the same expectations;
the only differences are the session's recorded policy (``mutations: confirm``; ``bash``'s
evidence is its exit code) and an approver that answers every pending request with its exact
phrase as soon as it appears, through the ``approve`` Update (what ``maka session approve`` sends
while the execution runs: the workflow holds the wait, so a ledger-only answer would be seen only at
the request's expiry). So each mutation waits for its approval before T1, and a crash at
any boundary must still settle exactly as without governance: effects at most once, the same
parks, one terminal fact per run, a clean ``ledger verify``.
"""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path
from typing import Any

import pytest

from maka_core.errors import MakaError
from maka_core.governance import parse_policy
from maka_core.runtime import approvals
from maka_core.runtime.governed import SessionGovernance
from maka_core.store.writer import LedgerStore
from maka_temporal.workers.client import turn_messages
from tests.drills import (
    DRILL_SCRIPT,
    Cell,
    CellResult,
    Sandbox,
    format_table,
    run_cell,
)
from tests.test_hybrid_tools import audit_all_clean
from tests.test_kill_matrix import PARALLEL, _selected, drill, hybrid_matrix, matrix

CONFIRM_ALL = {
    "policyVersion": "kill-matrix-confirm",
    "mutations": "confirm",
    "defaultEvidence": {"bash": [{"type": "exit_code", "value": 0}]},
}


def _record_policy(db: Path, session_id: str) -> None:
    record = SessionGovernance(parse_policy(CONFIRM_ALL)).to_record()
    with LedgerStore.open(db) as store:
        store.put_session_policy(
            session_id,
            policy=record["policy"],
            version=record["version"],
            digest=record["digest"],
            identity=record["identity"],
        )


def _pending(db: Path, session_id: str) -> list[dict[str, Any]]:
    with LedgerStore.open(db) as store:
        return approvals.pending(store, session_id)


async def _approve_all(
    client: Any, db: Path, session_id: str, stop_at: list[bool], approved: list[str]
) -> None:
    """The test approver, until ``stop_at``: every pending request of the session, with its exact
    phrase. Each ledger read borrows a default-executor thread for a moment only: a loop holding one
    thread per cell would starve the harness's own ``to_thread`` calls when as many cells run at
    once as the executor has threads (six on two cores). An Update sent while the cell's worker is
    down waits for the next one (bounded here; the next pass asks again)."""
    while not stop_at:
        for pending in await asyncio.to_thread(_pending, db, session_id):
            # Refused: answered meanwhile, expired, or not yet the request the turn waits on.
            with contextlib.suppress(MakaError, TimeoutError):
                await asyncio.wait_for(
                    turn_messages.approve(
                        client, session_id, pending["approvalId"], phrase=pending["phrase"], by="test"
                    ),
                    5,
                )
                approved.append(pending["operationId"])
        await asyncio.sleep(0.1)


async def run_governed_cell(server: Any, client: Any, root: Path, cell: Cell) -> tuple[CellResult, int]:
    """``drills.run_cell`` with the policy recorded before the session starts and the approver on."""
    halt: list[bool] = []
    approved: list[str] = []
    approvers: list[asyncio.Future[None]] = []

    def govern(box: Sandbox, session_id: str) -> None:
        _record_policy(box.db, session_id)
        approvers.append(asyncio.ensure_future(_approve_all(client, box.db, session_id, halt, approved)))

    try:
        result = await run_cell(server, client, root, cell, DRILL_SCRIPT, before_start=govern)
    finally:
        halt.append(True)
        await asyncio.gather(*approvers)
    return result, len(approved)


@drill
@pytest.mark.timeout(900)
async def test_kill_matrix_with_every_mutation_confirmed(
    temporal_server: Any, temporal_client: Any, tmp_path: Path, capsys: Any
) -> None:
    cells = _selected(matrix())
    gate = asyncio.Semaphore(PARALLEL)

    async def one(cell: Cell) -> tuple[CellResult, int]:
        async with gate:
            return await run_governed_cell(temporal_server, temporal_client, tmp_path, cell)

    outcomes = await asyncio.gather(*(one(c) for c in cells))
    results = [r for r, _ in outcomes]
    table = format_table(results, title="Kill matrix, every mutation confirmed by a test approver")
    with capsys.disabled():
        print("\n" + table + "\n")
    assert [r.cell.name for r in results if not r.passed] == [], table
    assert sum(r.duplicates for r in results) == 0
    # The approver was needed: every cell approved at least the first write before anything ran.
    assert all(n >= 1 for _, n in outcomes), [(r.cell.name, n) for r, n in outcomes]


@drill
@pytest.mark.timeout(900)
async def test_kill_matrix_with_every_mutation_confirmed_in_hybrid_mode(
    temporal_server: Any, temporal_client: Any, tmp_path: Path, capsys: Any
) -> None:
    """The hybrid cells (``test_kill_matrix.HYBRID_CELLS``) under the confirming policy: each local
    write commits its permission request and defers (``approval``) before T1, and the regular
    activity that follows waits for the answer, so every crash point settles as in activity mode;
    ``maka audit`` is clean after every cell."""
    cells = _selected(hybrid_matrix())
    gate = asyncio.Semaphore(PARALLEL)

    async def one(cell: Cell) -> tuple[CellResult, int]:
        async with gate:
            return await run_governed_cell(temporal_server, temporal_client, tmp_path, cell)

    outcomes = await asyncio.gather(*(one(c) for c in cells))
    results = [r for r, _ in outcomes]
    table = format_table(results, title="Kill matrix, hybrid tool mode, every mutation confirmed")
    with capsys.disabled():
        print("\n" + table + "\n")
    assert [r.cell.name for r in results if not r.passed] == [], table
    assert sum(r.duplicates for r in results) == 0
    assert all(n >= 1 for _, n in outcomes), [(r.cell.name, n) for r, n in outcomes]
    dbs = [tmp_path / r.cell.name.replace(" ", "_").replace("/", "_") / "ledger.sqlite" for r in results]
    await audit_all_clean(dbs, temporal_server.address)
