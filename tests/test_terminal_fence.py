"""A run with a terminal fact accepts no further event (``run_already_terminal``), on every backend.

The zombie of issue 23: ``temporal workflow terminate`` does not stop a running activity, so a
repair that settles the run (its terminal fact) races the old attempt's T2 and next model step.
The refusal lives inside the writer transaction (the scanner is synced under the write lock), so
a second handle that synced before the terminal committed is refused all the same. Negative
control: the old writer (no refusal, ``OldWriter``) admits the late T2 and the run is wedged; the
old effect leg (``DeafBash``: a heartbeat that never says stop) lets a cancelled attempt's bash run on.
What an exact retry, an operator resolution, a continuation and an import may still commit after
a terminal fact stays admitted.
"""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from maka_core.audit.model import read_ledger
from maka_core.audit.report import audit
from maka_core.errors import LedgerRejection
from maka_core.facts import codec
from maka_core.facts.run_header import RunHeader
from maka_core.ledger.resolver import resolve
from maka_core.runtime import tool_call
from maka_core.runtime.contracts import CallRef
from maka_core.runtime.resolution import resolve_operation
from maka_core.runtime.runtime import Runtime
from maka_core.store.writer import LedgerStore
from maka_core.tools.registry import default_tools
from maka_core.tools.sandbox import sandbox_status
from maka_core.workspace import Workspace
from maka_temporal.activities import to_application_error
from tests.children.old_writer_worker import DeafBash, OldWriter
from tests.drills import maka_cli
from tests.ledger_factory import SESSION, call, dispatch, response, t1, terminal, text, user
from tests.test_runtime import ATTEMPT, one_call, op_status, run, tool_input


def _ended_with_op_in_flight(store: LedgerStore) -> None:
    """user, T1 (call + dispatch), no T2, then the run's terminal fact (a repair's park)."""
    store.append([user()])
    c, d = t1("call-1")
    store.commit_tool_prepared(d, call=c)
    store.commit_terminal(terminal("failed"))
    store.put_run(
        RunHeader(
            session_id="sess-1", run_id="run-1", invocation_id="inv-1", turn_id="turn-1", status="failed"
        )
    )


def test_every_live_writer_refuses_an_event_after_the_terminal_fact(store: LedgerStore) -> None:
    _ended_with_op_in_flight(store)
    late = {
        "t2": lambda: store.commit_tool_outcome(response("call-1")),
        "model_output": lambda: store.append([text(id="evt-model-late")]),
        "t1": lambda: store.commit_tool_prepared(
            dispatch("call-2", operation_id="op-call-2"), call=call("call-2", operation_id="op-call-2")
        ),
        "second_terminal": lambda: store.commit_terminal(terminal(id="evt-terminal-2")),
    }
    for name, write in late.items():
        with pytest.raises(LedgerRejection) as err:
            write()
        assert err.value.code == "run_already_terminal", name
        assert err.value.detail["terminalEventId"] == "evt-terminal-1", name
    assert [e.id for e in store.events()][-1] == "evt-terminal-1"
    # An exact retry of a fact committed before the end is still a no-op, not a refusal.
    assert not store.append([user()]).created
    assert not store.commit_terminal(terminal("failed")).created
    # The operation stays dispatched without a response: parked, and an operator can resolve it.
    (op,) = resolve(store.events(run_id="run-1")).operations
    assert (op.status, op.reason) == ("indeterminate", "dispatch_without_response")
    resolved = resolve_operation(store, "sess-1", "op-call-1", "applied", "ops", "checked log.txt")
    assert resolved["runId"] == "run-1"


def test_a_handle_that_synced_before_the_terminal_is_refused_inside_its_transaction(tmp_path: Path) -> None:
    path = tmp_path / "ledger.sqlite"
    zombie, repairer = LedgerStore.open(path), LedgerStore.open(path)
    try:
        zombie.append([user()])
        c, d = t1("call-1")
        zombie.commit_tool_prepared(d, call=c)
        assert zombie.view(SESSION).terminal_of_run == {}  # the zombie's view: the run is open
        repairer.commit_terminal(terminal("failed"))
        with pytest.raises(LedgerRejection) as err:
            zombie.commit_tool_outcome(response("call-1"))
        assert err.value.code == "run_already_terminal"
        mapped = to_application_error(err.value)
        assert mapped.non_retryable and mapped.type == "LedgerRejection"
        assert [e.id for e in repairer.events()][-1] == "evt-terminal-1"
    finally:
        zombie.close()
        repairer.close()


def test_negative_control_the_old_writer_admits_the_zombie_and_wedges_the_run(tmp_path: Path) -> None:
    store = OldWriter.open(tmp_path / "ledger.sqlite")
    try:
        _ended_with_op_in_flight(store)
        store.commit_tool_outcome(response("call-1"))  # the zombie's T2, after the terminal fact
        store.append([text(id="evt-model-late")])
        assert [e.id for e in store.events()][-2:] == ["op-call-1_response", "evt-model-late"]
        (op,) = resolve(store.events(run_id="run-1")).operations
        assert op.status == "completed"  # while the terminal fact recorded a park: the wedge
        with pytest.raises(Exception) as err:
            resolve_operation(store, "sess-1", "op-call-1", "applied", "ops", "checked")
        assert getattr(err.value, "code", None) == "operation_not_parked"
    finally:
        store.close()


def test_resolutions_continuations_and_imports_still_land_after_a_terminal_fact(store: LedgerStore) -> None:
    _ended_with_op_in_flight(store)
    # An operator resolution is its own run (its own terminal fact).
    resolved = resolve_operation(store, "sess-1", "op-call-1", "not_applied", "ops", "nothing ran")
    assert store.event(resolved["resolutionEventId"]) is not None
    # An import admits as the reference does; the audit reports what it let in.
    late = text(id="evt-imported-late")
    assert store.import_events([late]).imported == 1
    assert [e.id for e in store.events(run_id="run-1")][-1] == "evt-imported-late"


def _after_terminal_findings(store: LedgerStore) -> list[dict[str, Any]]:
    report = audit(read_ledger(store, "sess-1"), [])
    return [f for f in report.to_json()["findings"] if f["check"] == "event_after_terminal"]


def test_audit_reports_an_imported_event_after_the_terminal_fact_as_drift(tmp_path: Path) -> None:
    ledger = tmp_path / "ledger.jsonl"
    clean = [user(), *t1("call-1"), terminal("failed")]
    late = [response("call-1"), text(id="evt-model-late")]  # the zombie's T2 and next step
    for name, events in (("clean", clean), ("late", clean + late)):
        db = tmp_path / f"{name}.sqlite"
        ledger.write_text("".join(codec.encode(e) + "\n" for e in events))
        done = subprocess.run(
            [*maka_cli(), "ledger", "import", "--db", str(db), str(ledger), "--json"],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stdout + done.stderr
        with LedgerStore.open(db) as store:
            found = _after_terminal_findings(store)
        if name == "clean":
            assert found == []  # the check can be silent: it is not reporting every ledger
            continue
        assert found == [
            {
                "check": "event_after_terminal",
                "severity": "drift",
                "runId": "run-1",
                "operationId": "op-call-1",
                "message": "2 event(s) after terminal fact evt-terminal-1, first op-call-1_response",
            }
        ]


# --- a cancelled attempt stops its tool -------------------------------------------------------


def _cancel_mid_command(rt: Runtime, ws: Workspace, *, goes_on: bool = False) -> CallRef:
    """A bash call that sleeps, then appends to log.txt; its attempt is cancelled one second in
    (what Temporal does once a heartbeat learns that the workflow execution is gone)."""
    ref = one_call(rt, ws, "bash", {"command": "sleep 3; echo ran >> log.txt"})

    async def main() -> None:
        task = asyncio.create_task(tool_call.execute_tool(rt, tool_input(ws, ref), ATTEMPT))
        await asyncio.sleep(1.0)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        # Past the command's own end: had it gone on, its line and its T2 would be there by now.
        await asyncio.sleep(3.5)
        # A command that went on may be late on a loaded machine: give its T2 a generous bound.
        deadline = time.monotonic() + 60.0
        while goes_on and op_status(rt, ref)[0] != "completed" and time.monotonic() < deadline:
            await asyncio.sleep(0.1)

    run(main())
    return ref


@pytest.mark.skipif(not sandbox_status().available, reason="bubblewrap sandbox unavailable")
@pytest.mark.parametrize("variant", ["stops", "deaf"])
def test_a_cancelled_attempt_kills_its_command_and_commits_no_outcome(
    tmp_path: Path, ws: Workspace, variant: str
) -> None:
    store = LedgerStore.open(tmp_path / "ledger.sqlite")
    tools = default_tools()
    if variant == "deaf":
        tools = {**tools, "bash": DeafBash(tools["bash"])}  # type: ignore[dict-item]
    rt = Runtime(store, tools=tools)
    try:
        ref = _cancel_mid_command(rt, ws, goes_on=variant == "deaf")
        ran = (ws.root / "log.txt").exists()
        status = op_status(rt, ref)
    finally:
        rt.close()
        store.close()
    if variant == "deaf":  # the negative control: the zombie goes on and commits its outcome
        assert ran and status == ("completed", "matching_response")
        return
    assert not ran, "the cancelled attempt's command ran to its end"
    assert status == ("indeterminate", "dispatch_without_response")
