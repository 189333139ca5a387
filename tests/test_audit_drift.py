"""Crashes audit clean after recovery; drift is caught, each from a deliberately broken input.

The broken inputs are built by the test: a ledger exported, edited and imported into another
database (through ``maka ledger export``/``import``), audited against the same histories; and a
session run by the negative-control worker whose Resolver guard is disabled (it dispatches twice).
"""

from __future__ import annotations

import json
import subprocess
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest

from maka_core.audit.html import render_html
from maka_core.facts import codec
from maka_core.store.writer import LedgerStore
from maka_temporal.workers.client.audit import audit_session
from tests.drills import Cell, Kill, maka_cli, run_cells
from tests.temporal_support import in_process_worker, send_message, start, tool_step, wait_turn, write_script

pytestmark = [pytest.mark.temporal, pytest.mark.asyncio(loop_scope="session")]


async def _audit(client: Any, db: Path, session_id: str) -> Any:
    with LedgerStore.open(db) as store:
        return await audit_session(client, store, session_id)


def _drift(report: Any) -> set[str]:
    return {f.check for f in report.drift}


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*maka_cli(), *args], capture_output=True, text=True, timeout=120)


async def _two_turns(client: Any, db: Path, ws: Path, tmp: Path, queue: str) -> str:
    script = write_script(
        tmp / "script.json",
        [
            tool_step(("write_file", {"path": "a.txt", "content": "a\n"})),
            tool_step(("read_file", {"path": "a.txt"})),
            {"text": "one"},
            tool_step(("bash", {"command": "echo ok >> log.txt"})),
            {"text": "two"},
        ],
    )
    async with in_process_worker(client, db, queue):
        session_id, first = await start(client, ws, script, queue, "go")
        await wait_turn(client, session_id, first.run_id)
        second = await send_message(client, session_id, "again")
        await wait_turn(client, session_id, second.run_id)
    return session_id


def _reimport(src: Path, session_id: str, dest: Path, edit: Any) -> None:
    """Export the session, apply ``edit`` to its events, import into ``dest``; copy the run headers
    (``ledger import`` carries events only, and a run's header is what names its execution)."""
    exported = _cli("ledger", "export", "--db", str(src), "--session", session_id)
    assert exported.returncode == 0, exported.stderr
    events = [codec.decode(line) for line in exported.stdout.splitlines()]
    edited = edit(events)
    path = dest.with_suffix(".jsonl")
    path.write_text("".join(codec.encode(e) + "\n" for e in edited))
    imported = _cli("ledger", "import", "--db", str(dest), str(path), "--json")
    assert imported.returncode == 0, imported.stdout + imported.stderr
    with LedgerStore.open(src) as a, LedgerStore.open(dest) as b:
        for header in a.list_runs(session_id=session_id):
            if any(e.run_id == header.run_id for e in edited):
                b.put_run(header)


async def test_an_exported_and_reimported_ledger_audits_clean_and_a_removed_outcome_is_drift(
    temporal_server: Any, temporal_client: Any, tmp_path: Path, ws_dir: Path, task_queue: str
) -> None:
    db = tmp_path / "ledger.sqlite"
    session_id = await _two_turns(temporal_client, db, ws_dir, tmp_path, task_queue)
    assert (await _audit(temporal_client, db, session_id)).ok

    # Control: the same events through export and import audit clean against the same histories.
    same = tmp_path / "same.sqlite"
    _reimport(db, session_id, same, lambda events: events)
    control = await _audit(temporal_client, same, session_id)
    assert control.ok, [f.to_json() for f in control.findings]

    # Broken: the bash call's outcome (its T2) removed.
    def drop_outcome(events: list[Any]) -> list[Any]:
        bash = next(
            e
            for e in events
            if e.content is not None
            and getattr(e.content, "name", "") == "bash"
            and e.content.kind == "function_response"
        )
        return [e for e in events if e.id != bash.id]

    broken = tmp_path / "broken.sqlite"
    _reimport(db, session_id, broken, drop_outcome)
    report = await _audit(temporal_client, broken, session_id)
    assert not report.ok
    assert "outcome_missing" in _drift(report), [f.to_json() for f in report.findings]
    missing = next(f for f in report.drift if f.check == "outcome_missing")
    assert missing.operation_id and missing.execution_run_id and missing.run_id
    cli = _cli("audit", session_id, "--db", str(broken), "--address", temporal_server.address, "--json")
    assert cli.returncode == 1, cli.stdout + cli.stderr
    assert json.loads(cli.stdout)["ok"] is False


async def test_an_operation_no_history_shows_is_drift(
    temporal_client: Any, tmp_path: Path, ws_dir: Path, task_queue: str
) -> None:
    db = tmp_path / "ledger.sqlite"
    session_id = await _two_turns(temporal_client, db, ws_dir, tmp_path, task_queue)

    def add_operation(events: list[Any]) -> list[Any]:
        # A copy of the read_file call, its T1 and its T2 under fresh ids, right after the original.
        op = next(
            e
            for e in events
            if e.actions is not None
            and e.actions.tool_dispatch is not None
            and e.actions.tool_dispatch.tool_name == "read_file"
        )
        op_id, call_id = op.actions.tool_dispatch.operation_id, op.actions.tool_dispatch.provider_tool_call_id
        triple = [e for e in events if e.invocation_id == op.invocation_id and _names(e, op_id, call_id)]
        assert len(triple) == 3
        text = json.dumps([json.loads(codec.encode(e)) for e in triple])
        for old in {op_id, call_id, *(e.id for e in triple)}:
            text = text.replace(old, old + "-x")
        clones = [codec.decode(json.dumps(obj)) for obj in json.loads(text)]
        at = events.index(triple[-1]) + 1
        return events[:at] + clones + events[at:]

    extra = tmp_path / "extra.sqlite"
    _reimport(db, session_id, extra, add_operation)
    report = await _audit(temporal_client, extra, session_id)
    assert "operation_unhosted" in _drift(report), [f.to_json() for f in report.findings]


def _names(event: Any, op_id: str, call_id: str) -> bool:
    line = codec.encode(event)
    return op_id in line or f'"id":"{call_id}"' in line


# --- crashes: clean after recovery; the disabled guard is drift ----------------------------------

CELLS = [
    Cell("P4 write_file", (Kill("P4", "write_file"),), tool="write_file"),
    Cell("P4 bash", (Kill("P4", "bash"),), tool="bash"),
    Cell("P4 write_file guard off", (Kill("P4", "write_file"),), tool="write_file", guard_disabled=True),
]


@pytest.mark.timeout(1200)
async def test_crashes_audit_clean_after_recovery_and_a_disabled_guard_is_drift(
    temporal_server: Any, temporal_client: Any, tmp_path: Path
) -> None:
    # The cells are independent (own ledger, workspace, queue, workers), as in test_kill_matrix.
    results = await run_cells(temporal_server, temporal_client, tmp_path, CELLS, parallel=len(CELLS))
    assert [r.error for r in results] == [None, None, None]
    reports = {}
    for result in results:
        db = tmp_path / result.cell.name.replace(" ", "_") / "ledger.sqlite"
        reports[result.cell.name] = await _audit(temporal_client, db, result.session_id)
    for name in ("P4 write_file", "P4 bash"):
        out = reports[name].to_json()
        assert reports[name].ok, (name, out["findings"])
        assert any("recover" in op["recoveryPath"] for op in out["operations"]), out["operations"]
    assert results[1].state == "parked"
    naive = reports["P4 write_file guard off"]
    assert results[2].duplicates > 0  # ground truth: the effect ran twice
    assert not naive.ok
    assert _drift(naive) & {"redispatch_after_dispatch", "duplicate_dispatch"}, [
        f.to_json() for f in naive.findings
    ]
    # The page marks the drift in place and the park where the bash run parked.
    for name, report in reports.items():
        page = render_html(report.to_json())
        (tmp_path / f"{name.replace(' ', '_')}.html").write_text(page)
        titles = _Titles()
        titles.feed(page)
        drawn = " | ".join(titles.titles)
        assert ("drift on operation" in drawn) == (name == "P4 write_file guard off"), drawn
        assert "crash: write_file" in drawn or name == "P4 bash"
        assert "recovery: " in drawn
        assert ("parked: dispatch_without_response" in drawn) == (name == "P4 bash"), drawn


class _Titles(HTMLParser):
    """The tooltips of the timeline: what it draws, as text."""

    def __init__(self) -> None:
        super().__init__()
        self.titles: list[str] = []
        self._in = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self._in = tag == "title"
        if self._in:
            self.titles.append("")

    def handle_endtag(self, tag: str) -> None:
        self._in = False

    def handle_data(self, data: str) -> None:
        if self._in:
            self.titles[-1] += data


# Every kill-matrix cell audits clean after recovery: asserted in test_kill_matrix.test_kill_matrix
# over the ledgers of the matrix's own run (a second run of all its cells here added minutes).
