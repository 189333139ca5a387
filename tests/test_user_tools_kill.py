"""Kill drills per guarantee with user tools: a real ``maka worker --tools`` (``MAKA_TOOLS``) runs a
scripted call of a tool from ``tests.user_tools_pkg.effects`` and SIGKILLs itself at P4 tagged with
the tool's name (the effect returned, T2 not committed); a fresh worker recovers the session. The
effects are counted in the workspace, outside the ledger.

- read-only (``lookup``) runs again: two lookups, the turn completes;
- provider-idempotent (``charge``) runs again with the same key: the provider saw the key twice
  and charged once;
- at-least-once (``notify``) runs again with the same key: two sends, one key;
- at-most-once (``append_entry``) parks ``dispatch_without_response`` with exactly one entry;
- reconciliation-required (``put_note``) settles from its evidence: one write, completed.

Negative controls, from the test's own tool module (``tests.user_tools_pkg.wide``: the same
effects under the same names with a wrongly wide guarantee, or a fresh key per run): the journal
entry and the note are written twice, the provider charges twice, and a read declared
at-most-once parks where a re-read would have answered; and, with the Resolver guard disabled
(``tests.children.naive_worker``, a plain Temporal retry), the at-most-once entry runs twice.

The kill matrix's user-tools column: every tool killed at P3 (T1 committed, the effect not begun)
and at P5 (T2 committed), each effect counted.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from maka_core.runtime.session_view import operations
from maka_core.store.writer import LedgerStore
from tests.drills import NAIVE_WORKER
from tests.temporal_support import WorkerProcess, start, tool_step, wait_turn, write_script

pytestmark = [
    pytest.mark.temporal,
    pytest.mark.crash,
    pytest.mark.slow,
    pytest.mark.asyncio(loop_scope="session"),
]

HONEST = "tests.user_tools_pkg.effects"
WIDE = "tests.user_tools_pkg.wide"


@dataclass(frozen=True)
class Drilled:
    state: str
    park_reason: str | None
    op_status: str
    op_reason: str
    guarantee: str
    receipt: dict[str, Any] | None
    key: str | None


async def kill_at_p4_and_recover(
    server: Any,
    client: Any,
    tmp_path: Path,
    ws: Path,
    queue: str,
    module: str,
    name: str,
    args: dict[str, Any],
) -> Drilled:
    db = tmp_path / "ledger.sqlite"
    script = write_script(tmp_path / "s.json", [tool_step((name, args)), {"text": "ok"}])
    kw: dict[str, Any] = {"home": tmp_path, "extra_env": {"MAKA_TOOLS": module}}
    with WorkerProcess(server, db, queue, failpoint="P4", failpoint_tag=name, **kw) as doomed:
        doomed.wait_ready()
        session_id, accepted = await start(client, ws, script, queue)
        assert await doomed.wait_exit() == -9, (
            f"the armed worker did not die at P4[{name}]: {doomed.log.read_text()[-2000:]}"
        )
    with WorkerProcess(server, db, queue, **kw) as worker:
        worker.wait_ready()
        status = await wait_turn(client, session_id, accepted.run_id, timeout=90)
    with LedgerStore.open(db) as store:
        assert store.verify() == []
        (op,) = operations(store.events(session_id=session_id))
        held = store.decision(op.operation_id)
        receipts = [r for r in store.receipts(session_id) if r.get("taskId") == op.operation_id]
    assert held is not None
    return Drilled(
        state=status.state,
        park_reason=status.park_reason,
        op_status=op.status,
        op_reason=op.reason,
        guarantee=held["decision"]["executionGuarantee"],
        receipt=receipts[-1] if receipts else None,
        key=held["decision"].get("idempotencyKey"),
    )


def lines(ws: Path, name: str) -> list[str]:
    path = ws / name
    return path.read_text().splitlines() if path.exists() else []


async def test_read_only_runs_again(
    temporal_server: Any, temporal_client: Any, tmp_path: Path, ws_dir: Path, task_queue: str
) -> None:
    d = await kill_at_p4_and_recover(
        temporal_server, temporal_client, tmp_path, ws_dir, task_queue, HONEST, "lookup", {"name": "ada"}
    )
    assert (d.guarantee, d.state, d.op_status) == ("read-only", "idle", "completed")
    assert len(lines(ws_dir, "lookups.log")) == 2


async def test_negative_control_a_read_declared_at_most_once_parks(
    temporal_server: Any, temporal_client: Any, tmp_path: Path, ws_dir: Path, task_queue: str
) -> None:
    d = await kill_at_p4_and_recover(
        temporal_server, temporal_client, tmp_path, ws_dir, task_queue, WIDE, "lookup", {"name": "ada"}
    )
    assert (d.guarantee, d.state, d.park_reason) == ("at-most-once", "parked", "dispatch_without_response")
    assert len(lines(ws_dir, "lookups.log")) == 1


async def test_provider_idempotent_runs_again_with_the_same_key(
    temporal_server: Any, temporal_client: Any, tmp_path: Path, ws_dir: Path, task_queue: str
) -> None:
    d = await kill_at_p4_and_recover(
        temporal_server, temporal_client, tmp_path, ws_dir, task_queue, HONEST, "charge", {"amount": 7}
    )
    assert (d.guarantee, d.state, d.op_status) == ("provider-idempotent", "idle", "completed")
    assert d.key is not None
    assert lines(ws_dir, "provider/requests.log") == [d.key, d.key]  # every run presented the key
    assert lines(ws_dir, "provider/charges.log") == [d.key]  # charged once
    assert d.receipt is not None and d.receipt["observedEffect"]["attempts"] == [1, 2]


async def test_negative_control_a_fresh_key_per_run_charges_twice(
    temporal_server: Any, temporal_client: Any, tmp_path: Path, ws_dir: Path, task_queue: str
) -> None:
    d = await kill_at_p4_and_recover(
        temporal_server, temporal_client, tmp_path, ws_dir, task_queue, WIDE, "charge", {"amount": 7}
    )
    assert (d.guarantee, d.state) == ("provider-idempotent", "idle")
    assert len(lines(ws_dir, "provider/charges.log")) == 2  # what the recorded key prevents


async def test_at_least_once_runs_again_with_the_same_key(
    temporal_server: Any, temporal_client: Any, tmp_path: Path, ws_dir: Path, task_queue: str
) -> None:
    d = await kill_at_p4_and_recover(
        temporal_server, temporal_client, tmp_path, ws_dir, task_queue, HONEST, "notify", {"text": "hi"}
    )
    assert (d.guarantee, d.state, d.op_status) == ("at-least-once", "idle", "completed")
    assert lines(ws_dir, "outbox.log") == [f"{d.key} hi", f"{d.key} hi"]


async def test_at_most_once_parks_with_exactly_one_effect(
    temporal_server: Any, temporal_client: Any, tmp_path: Path, ws_dir: Path, task_queue: str
) -> None:
    d = await kill_at_p4_and_recover(
        temporal_server,
        temporal_client,
        tmp_path,
        ws_dir,
        task_queue,
        HONEST,
        "append_entry",
        {"text": "pay"},
    )
    assert (d.guarantee, d.state, d.park_reason) == ("at-most-once", "parked", "dispatch_without_response")
    assert (d.op_status, d.op_reason) == ("indeterminate", "dispatch_without_response")
    assert lines(ws_dir, "journal.log") == ["pay"]


async def test_negative_control_at_most_once_declared_at_least_once_appends_twice(
    temporal_server: Any, temporal_client: Any, tmp_path: Path, ws_dir: Path, task_queue: str
) -> None:
    d = await kill_at_p4_and_recover(
        temporal_server, temporal_client, tmp_path, ws_dir, task_queue, WIDE, "append_entry", {"text": "pay"}
    )
    assert (d.guarantee, d.state) == ("at-least-once", "idle")
    assert lines(ws_dir, "journal.log") == ["pay", "pay"]


async def test_reconciliation_required_settles_from_evidence(
    temporal_server: Any, temporal_client: Any, tmp_path: Path, ws_dir: Path, task_queue: str
) -> None:
    note = {"name": "n1", "text": "hello"}
    d = await kill_at_p4_and_recover(
        temporal_server, temporal_client, tmp_path, ws_dir, task_queue, HONEST, "put_note", note
    )
    assert (d.guarantee, d.state) == ("reconciliation-required", "idle")
    assert (d.op_status, d.op_reason) == ("completed", "recovery_bundle_completed")
    assert lines(ws_dir, "note_writes.log") == ["n1"]


async def test_negative_control_a_note_declared_at_least_once_is_written_twice(
    temporal_server: Any, temporal_client: Any, tmp_path: Path, ws_dir: Path, task_queue: str
) -> None:
    note = {"name": "n1", "text": "hello"}
    d = await kill_at_p4_and_recover(
        temporal_server, temporal_client, tmp_path, ws_dir, task_queue, WIDE, "put_note", note
    )
    assert (d.guarantee, d.state) == ("at-least-once", "idle")
    assert lines(ws_dir, "note_writes.log") == ["n1", "n1"]


# --- the kill matrix's user-tools column: P3 (the effect is starting) and P5 (after T2) ---------

#: Each tool's args and the workspace file holding one line per real effect.
COLUMN: dict[str, tuple[dict[str, Any], str]] = {
    "lookup": ({"name": "ada"}, "lookups.log"),
    "charge": ({"amount": 7}, "provider/charges.log"),
    "notify": ({"text": "hi"}, "outbox.log"),
    "append_entry": ({"text": "pay"}, "journal.log"),
    "put_note": ({"name": "n1", "text": "hello"}, "note_writes.log"),
}
#: (tool, failpoint) -> (session state, park reason, effects). At P3 T1 is committed and the
#: effect has not begun: a re-runnable guarantee runs it (once), reconciliation finds the prior
#: state, at-most-once parks. At P5 T2 is committed: nothing runs again.
EXPECTED: dict[tuple[str, str], tuple[str, str | None, int]] = {
    ("lookup", "P3"): ("idle", None, 1),
    ("charge", "P3"): ("idle", None, 1),
    ("notify", "P3"): ("idle", None, 1),
    ("append_entry", "P3"): ("parked", "dispatch_without_response", 0),
    ("put_note", "P3"): ("parked", "reconcile_matches_prior_state", 0),
    **{(name, "P5"): ("idle", None, 1) for name in COLUMN},
}


@pytest.mark.parametrize(("name", "point"), sorted(EXPECTED))
async def test_kill_matrix_user_tools_column(
    temporal_server: Any,
    temporal_client: Any,
    tmp_path: Path,
    ws_dir: Path,
    task_queue: str,
    name: str,
    point: str,
) -> None:
    args, effect_file = COLUMN[name]
    db = tmp_path / "ledger.sqlite"
    script = write_script(tmp_path / "s.json", [tool_step((name, args)), {"text": "ok"}])
    kw: dict[str, Any] = {"home": tmp_path, "extra_env": {"MAKA_TOOLS": HONEST}}
    with WorkerProcess(temporal_server, db, task_queue, failpoint=point, failpoint_tag=name, **kw) as doomed:
        doomed.wait_ready()
        session_id, accepted = await start(temporal_client, ws_dir, script, task_queue)
        assert await doomed.wait_exit() == -9, f"the armed worker did not die at {point}[{name}]"
    with WorkerProcess(temporal_server, db, task_queue, **kw) as worker:
        worker.wait_ready()
        status = await wait_turn(temporal_client, session_id, accepted.run_id, timeout=90)
    with LedgerStore.open(db) as store:
        assert store.verify() == []
        (op,) = operations(store.events(session_id=session_id))
    state, reason, effects = EXPECTED[(name, point)]
    assert (status.state, status.park_reason) == (state, reason), (op.status, op.reason)
    assert len(lines(ws_dir, effect_file)) == effects
    if name == "charge":  # every run the provider saw presented one key
        assert len(set(lines(ws_dir, "provider/requests.log"))) == 1


async def test_negative_control_without_the_resolver_guard_an_at_most_once_tool_runs_twice(
    temporal_server: Any, temporal_client: Any, tmp_path: Path, ws_dir: Path, task_queue: str
) -> None:
    # The kill matrix's own negative control, on a user tool: the guard disabled (a plain
    # Temporal retry), the at-most-once entry killed at P4 is appended again.
    db = tmp_path / "ledger.sqlite"
    script = write_script(tmp_path / "s.json", [tool_step(("append_entry", {"text": "pay"})), {"text": "ok"}])
    kw: dict[str, Any] = {"home": tmp_path, "extra_env": {"MAKA_TOOLS": HONEST}, "entry": NAIVE_WORKER}
    with WorkerProcess(
        temporal_server, db, task_queue, failpoint="P4", failpoint_tag="append_entry", **kw
    ) as doomed:
        doomed.wait_ready()
        session_id, accepted = await start(temporal_client, ws_dir, script, task_queue)
        assert await doomed.wait_exit() == -9
    with WorkerProcess(temporal_server, db, task_queue, **kw) as worker:
        worker.wait_ready()
        await wait_turn(temporal_client, session_id, accepted.run_id, timeout=90)
    assert lines(ws_dir, "journal.log") == ["pay", "pay"]
