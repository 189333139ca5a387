"""The kill matrix: every crash boundary of a scripted turn x each tool, on a real dev server.

The turn (``fixtures/drill_script.json``) calls ``write_file``, then ``edit_file``, then ``bash``
(appending a line to ``effects.log``). Each cell SIGKILLs a real ``maka worker`` at one failpoint
(``MAKA_FAILPOINT_TAG`` picks the tool; ``MAKA_FAILPOINT_SKIP`` picks the k-th model step or store
transition for points that carry no tool tag), restarts a clean worker, waits for the session to
settle and checks the seed's crash table ("Crash position determines the conclusion"):

- before T1 (P0, P1, a T1 transaction torn before COMMIT): the tool runs once after restart;
- T1 without T2, before the effect (P2, P3): a file tool finds the prior state and recovery redoes
  it once (the guarded redo, ``tools.redo``), finalized by a recovery bundle like an effect that
  happened; ``bash`` parks (``dispatch_without_response``);
- T1 without T2, after the effect (P4, a T2 transaction torn before COMMIT): a file tool finds the
  expected state and is finalized by a recovery bundle, with no second write; ``bash`` parks;
- after T2 (P5, P6, P7) and at the turn's end (P8, P9): completed, nothing re-runs;
- a second kill inside recovery (P10, a recovery bundle torn before COMMIT): the next worker
  settles the operation the same way.

Every cell also checks: each side effect happened at most once (effect journal and log lines), one
terminal fact per run, no corrupt operation, and ``maka ledger verify`` clean through the real CLI.
The negative control runs the after-effect cells with the Resolver guard disabled
(a worker built by the test with ``NaiveRetryGuard``: naive Temporal retry) and must see duplicates.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any

import pytest

from maka_core import failpoints
from maka_core.store.writer import LedgerStore
from maka_core.tools.effect_journal import ENV as EFFECT_LOG_ENV
from maka_core.tools.registry import default_tools
from maka_core.workspace import Workspace
from maka_temporal.workers.client.audit import audit_session
from tests.drills import (
    NOTES_AFTER_TURN,
    TOOLS,
    Cell,
    CellResult,
    Expect,
    Kill,
    check,
    file_effects,
    format_table,
    run_cells,
)
from tests.pg_support import SKIP_REASON, pg_base_url
from tests.test_hybrid_tools import audit_all_clean

#: Marks of the drills (the effect-journal unit test at the end needs no server).
DRILL = (
    pytest.mark.slow,
    pytest.mark.temporal,
    pytest.mark.crash,
    pytest.mark.asyncio(loop_scope="session"),
)


def drill(fn: Any) -> Any:
    for mark in DRILL:
        fn = mark(fn)
    return fn


W, E, B = TOOLS
#: Cells run concurrently, each with its own ledger, workspace, task queue and workers.
PARALLEL = int(os.environ.get("MAKA_DRILL_PARALLEL", "6"))


def _ran_before(tool: str) -> tuple[str, ...]:
    return TOOLS[: TOOLS.index(tool)]


def runs_once() -> Expect:
    """Before T1, after T2 or at the turn's end: every tool completed, each effect exactly once."""
    return Expect(
        state="idle",
        reason=None,
        ops=_completed(TOOLS),
        effects=dict.fromkeys(TOOLS, 1),
        notes=NOTES_AFTER_TURN,
    )


def _completed(tools: tuple[str, ...]) -> dict[str, tuple[str, str | None]]:
    return {t: ("completed", "matching_response") for t in tools}


def t1_before_effect(tool: str) -> Expect:
    """T1 committed, the effect never happened: a file tool in its prior state is redone once by
    recovery (one effect, then the turn goes on); bash parks (unknown)."""
    if tool != B:
        return t1_after_effect(tool)
    ops: dict[str, tuple[str, str | None]] = {
        t: ("completed", "matching_response") for t in _ran_before(tool)
    }
    reason = "dispatch_without_response"
    ops[tool] = ("indeterminate", reason)
    effects = {t: int(t in _ran_before(tool)) for t in TOOLS}
    return Expect(state="parked", reason=reason, ops=ops, effects=effects, notes=NOTES_AFTER_TURN)


def t1_after_effect(tool: str) -> Expect:
    """T1 committed and the effect happened once: a file tool is finalized; bash parks."""
    ops = _completed(_ran_before(tool))
    if tool == B:
        ops[tool] = ("indeterminate", "dispatch_without_response")
        return Expect("parked", "dispatch_without_response", ops, dict.fromkeys(TOOLS, 1), NOTES_AFTER_TURN)
    ops[tool] = ("completed", "recovery_bundle_completed")
    ops.update(_completed(TOOLS[TOOLS.index(tool) + 1 :]))
    return Expect("idle", None, ops, dict.fromkeys(TOOLS, 1), NOTES_AFTER_TURN)


#: Store points inside a transaction, before COMMIT (tag = the transition, skip = which one).
TORN = "after_journal_event_insert"
BUNDLE = "recovery_bundle"


def matrix() -> list[Cell]:
    """Every failpoint that occurs in the turn x each tool it can hit.

    Slow cells first: a kill inside a ledger activity (``finish_run``, ``recover_operation``) is only
    noticed at that activity's start-to-close or heartbeat timeout (30 s), not the tool's 2 s heartbeat.
    """
    cells = [
        Cell("P8 turn end", (Kill("P8"),), runs_once()),
        Cell("P9 turn end", (Kill("P9"),), runs_once()),
    ]
    for tool in (W, E):
        after, before = t1_after_effect(tool), t1_before_effect(tool)
        cells.append(Cell(f"P4>P10 {tool}", (Kill("P4", tool), Kill("P10", tool)), after, tool))
        cells.append(Cell(f"P3>P10 {tool}", (Kill("P3", tool), Kill("P10", tool)), before, tool))
    torn_decision = Kill("after_recovery_decision", BUNDLE)
    torn_reconcile = Kill("after_recovery_reconcile", BUNDLE)
    cells.append(Cell(f"P4>bundle torn {W}", (Kill("P4", W), torn_decision), t1_after_effect(W), W))
    cells.append(Cell(f"P3>bundle torn {E}", (Kill("P3", E), torn_reconcile), t1_before_effect(E), E))
    for i, tool in enumerate(TOOLS):
        after, before = t1_after_effect(tool), t1_before_effect(tool)
        cells += [
            Cell(f"P0 {tool}", (Kill("P0", skip=i),), runs_once(), tool),
            Cell(f"P1 {tool}", (Kill("P1", skip=i),), runs_once(), tool),
            Cell(f"T1 torn {tool}", (Kill(TORN, "t1_prepare", i),), runs_once(), tool),
            Cell(f"P2 {tool}", (Kill("P2", tool),), before, tool),
            Cell(f"P3 {tool}", (Kill("P3", tool),), before, tool),
            Cell(f"P4 {tool}", (Kill("P4", tool),), after, tool),
            Cell(f"T2 torn {tool}", (Kill(TORN, "t2_outcome", i),), after, tool),
            Cell(f"P5 {tool}", (Kill("P5", tool),), runs_once(), tool),
            Cell(f"P6 {tool}", (Kill("P6", tool),), runs_once(), tool),
            Cell(f"P7 after {tool}", (Kill("P7", skip=i),), runs_once(), tool),
        ]
    return cells


#: Points of the Phase 0 catalog that occur inside a session's turn (P11, continuation-run creation,
#: belongs to ``maka resume``).
TURN_POINTS = frozenset(failpoints.PHASE0) - {"P11"}


def _coverage(cells: list[Cell]) -> str:
    killed = {k.failpoint for c in cells for k in c.kills}
    phase0 = sorted(killed & TURN_POINTS, key=lambda p: int(p[1:]))
    store = sorted(killed & set(failpoints.STORE))
    return (
        f"Phase 0 points killed: {len(phase0)} of {len(TURN_POINTS)} that occur in a turn "
        f"({', '.join(phase0)}); store points: {len(store)} of {len(failpoints.STORE)} ({', '.join(store)})"
    )


#: Kill points inside a ledger activity (finish_run, recover_operation): no tool heartbeat there.
LEDGER_ACTIVITY_POINTS = frozenset({"P8", "P9", "P10", "after_recovery_decision", "after_recovery_reconcile"})


def _detection(results: list[CellResult]) -> str:
    """Mean death->settled, split by where the last kill landed (the timeout that notices it differs)."""
    parts = []
    for label, in_ledger in (("tool/model-step kills", False), ("ledger-activity kills", True)):
        times = [
            r.recovery_s
            for r in results
            if r.recovery_s is not None
            and (r.cell.kills[-1].failpoint in LEDGER_ACTIVITY_POINTS) == in_ledger
        ]
        if times:
            parts.append(
                f"{label}: {len(times)} cells, mean {sum(times) / len(times):.1f}s, max {max(times):.1f}s"
            )
    return "death->settled by kill site: " + "; ".join(parts)


def _selected(cells: list[Cell]) -> list[Cell]:
    """``MAKA_DRILL_CELLS=P4,P10`` runs only the cells whose name contains one of the words (debugging)."""
    words = [w for w in os.environ.get("MAKA_DRILL_CELLS", "").split(",") if w]
    return [c for c in cells if any(w in c.name for w in words)] if words else cells


@drill
@pytest.mark.timeout(1200)
async def test_kill_matrix(temporal_server: Any, temporal_client: Any, tmp_path: Path, capsys: Any) -> None:
    cells = _selected(matrix())
    results = await run_cells(temporal_server, temporal_client, tmp_path, cells, parallel=PARALLEL)
    table = format_table(results, title="Kill matrix (W/E/B = real effects of write_file/edit_file/bash)")
    with capsys.disabled():
        print("\n" + table + "\n" + _coverage(cells) + "\n" + _detection(results) + "\n")
    if cells == matrix():
        assert {k.failpoint for c in cells for k in c.kills} >= TURN_POINTS
    assert [r.cell.name for r in results if not r.passed] == [], table
    assert sum(r.duplicates for r in results) == 0
    assert sum(r.kills for r in results) == sum(len(c.kills) for c in cells)
    # ``maka audit`` over every cell's own ledger: every crash audits clean after recovery (this was
    # a second run of the whole matrix in test_audit_drift; the cells' ledgers are the same facts).
    dirty = {}
    for result in results:
        db = tmp_path / result.cell.name.replace(" ", "_").replace("/", "_") / "ledger.sqlite"
        with LedgerStore.open(db) as store:
            report = await audit_session(temporal_client, store, result.session_id)
        if not report.ok:
            dirty[result.cell.name] = [f.to_json() for f in report.drift]
    with capsys.disabled():
        print(f"{len(results)} kill-matrix cells audited, {len(dirty)} with drift")
    assert dirty == {}


# --- the same drills in hybrid mode ---------------------------------------------------------------------

#: The cells whose kill lands inside a local tool call (``write_file``, ``edit_file``: their first
#: dispatch is a local activity in hybrid mode), one torn T1 and T2 each, a second kill inside the
#: recovery that a local call's re-run leads to, and ``bash`` (still a regular activity) after local
#: calls. The other cells kill a model step, ``finish_run`` or ``bash``, which hybrid mode leaves as
#: they are.
HYBRID_CELLS = (
    *(f"{p} {t}" for t in (W, E) for p in ("P0", "P2", "P3", "P4", "P5", "P6")),
    f"T1 torn {W}",
    f"T2 torn {E}",
    f"P4>P10 {W}",
    f"P4 {B}",
)


def hybrid_matrix() -> list[Cell]:
    """The same cells, same expected conclusions, in a session started with ``tool_mode=hybrid``."""
    by_name = {c.name: c for c in matrix()}
    return [
        dataclasses.replace(by_name[name], name=f"{name} hybrid", tool_mode="hybrid") for name in HYBRID_CELLS
    ]


@drill
@pytest.mark.timeout(1200)
async def test_kill_matrix_in_hybrid_mode(
    temporal_server: Any, temporal_client: Any, tmp_path: Path, capsys: Any
) -> None:
    """Same conclusion per crash point as the activity-mode matrix, and ``maka audit`` clean after
    every cell (a lost local marker is at most the notice ``local_attempt_unrecorded``)."""
    cells = _selected(hybrid_matrix())
    results = await run_cells(temporal_server, temporal_client, tmp_path, cells, parallel=PARALLEL)
    table = format_table(results, title="Kill matrix, hybrid tool mode (local file tools)")
    with capsys.disabled():
        print("\n" + table + "\n" + _detection(results) + "\n")
    assert [r.cell.name for r in results if not r.passed] == [], table
    assert sum(r.duplicates for r in results) == 0
    dbs = [tmp_path / r.cell.name.replace(" ", "_").replace("/", "_") / "ledger.sqlite" for r in results]
    await audit_all_clean(dbs, temporal_server.address)


# --- the same drills on a PostgreSQL ledger ------------------------------------------------------------

#: A representative subset (a kill after T1 on write_file and on bash, kills inside a ledger activity,
#: torn T1 and T2 transactions): each sandbox's ledger is a fresh schema on the test server.
PG_CELLS = (
    "P4 write_file",
    "P2 bash",
    "P4 bash",
    "T1 torn bash",
    "T2 torn write_file",
    "P8 turn end",
    "P4>P10 write_file",
)


@drill
@pytest.mark.timeout(1200)
@pytest.mark.skipif(pg_base_url() is None, reason=SKIP_REASON)
async def test_kill_matrix_on_postgres(
    temporal_server: Any, temporal_client: Any, tmp_path: Path, capsys: Any
) -> None:
    cells = [c for c in matrix() if c.name in PG_CELLS]
    assert sorted(c.name for c in cells) == sorted(PG_CELLS)
    results = await run_cells(
        temporal_server, temporal_client, tmp_path, cells, parallel=PARALLEL, backend="postgres"
    )
    table = format_table(results, title="Kill matrix on a PostgreSQL ledger (subset)")
    with capsys.disabled():
        print("\n" + table + "\n" + _detection(results) + "\n")
    assert [r.cell.name for r in results if not r.passed] == [], table
    assert all(r.verify_clean for r in results)  # maka ledger verify --db postgresql+psycopg://...
    assert not list(tmp_path.rglob("ledger.sqlite*"))  # every worker and check used the server
    assert sum(r.duplicates for r in results) == 0
    assert sum(r.kills for r in results) == sum(len(c.kills) for c in cells)


# --- negative control ---------------------------------------------------------------------------------

CONTROL_CELLS = [
    *(Cell(f"P4 {t} guard off", (Kill("P4", t),), tool=t, guard_disabled=True) for t in TOOLS),
    # A local call's re-run after the crash meets no guard either: it runs the effect again.
    *(
        Cell(f"P4 {t} guard off hybrid", (Kill("P4", t),), tool=t, guard_disabled=True, tool_mode="hybrid")
        for t in (W, E)
    ),
    *(
        Cell(
            f"T2 torn {t} guard off",
            (Kill(TORN, "t2_outcome", i),),
            tool=t,
            guard_disabled=True,
        )
        for i, t in enumerate(TOOLS)
    ),
]


@drill
@pytest.mark.timeout(1200)
async def test_negative_control_without_the_resolver_guard_the_matrix_sees_duplicates(
    temporal_server: Any, temporal_client: Any, tmp_path: Path, capsys: Any
) -> None:
    results = await run_cells(temporal_server, temporal_client, tmp_path, CONTROL_CELLS, parallel=PARALLEL)
    table = format_table(
        results,
        title="Negative control: Resolver guard disabled (naive Temporal retry)",
        verdict=lambda r: "duplicate seen" if r.duplicates else "MISSED",
    )
    with capsys.disabled():
        print("\n" + table + "\n")
    assert [r.error for r in results if r.error] == []
    for result in results:
        tool = result.cell.tool
        assert tool is not None
        _sees_the_duplicate(result, tool)


def _sees_the_duplicate(result: CellResult, tool: str) -> None:
    # The tool at the kill point ran twice, and the matrix's own checker flags exactly that.
    assert result.effects[tool] == 2, (result.cell.name, result.effects)
    assert result.duplicates >= 1
    assert any("duplicate side effect" in p for p in check(t1_after_effect(tool), result)), result.cell.name
    if tool == E:  # the re-applicable edit shows in the content too
        assert result.notes == "status: draft, reviewed, reviewed\n"


# --- the effect journal itself (no Temporal) --------------------------------------------------------------


def test_effect_journal_counts_identical_writes_and_is_off_when_unset(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "ws").mkdir()
    ws = Workspace.open(tmp_path / "ws", create=True)
    tools = default_tools()
    journal = tmp_path / "effects.jsonl"
    write = {"path": "a.txt", "content": "same\n"}
    monkeypatch.delenv(EFFECT_LOG_ENV, raising=False)
    assert not tools[W].run(write, ws, lambda: None).is_error
    assert not journal.exists()
    monkeypatch.setenv(EFFECT_LOG_ENV, str(journal))
    for _ in range(2):  # identical bytes: invisible in the file, visible in the journal
        assert not tools[W].run(write, ws, lambda: None).is_error
    edit = {"path": "a.txt", "old_text": "same", "new_text": "changed"}
    assert not tools[E].run(edit, ws, lambda: None).is_error
    refused = tools[E].run(edit, ws, lambda: None)  # no write, no line
    assert refused.is_error
    target = str(ws.resolve("a.txt"))
    assert file_effects(journal) == {(W, target): 2, (E, target): 1}
