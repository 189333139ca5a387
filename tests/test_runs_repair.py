"""Startup repair of runs: terminal RuntimeEvent first, then the header; converge, fail closed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from maka_core.errors import StoreError
from maka_core.facts import codec
from maka_core.runtime.settle import RunHeader, recovered_terminal_event, repair_all, repair_run
from maka_core.store.writer import LedgerStore
from tests.children.support import raw_update
from tests.ledger_factory import TS, ids, t1, terminal, user

EXAMPLES = Path(__file__).parent / "fixtures" / "maka_examples"


def header(run: str = "run-1", status: str = "running", **kw: str) -> RunHeader:
    n = run.split("-")[-1]
    return RunHeader(
        session_id="sess-1",
        run_id=run,
        invocation_id=f"inv-{n}",
        turn_id=f"turn-{n}",
        status=status,
        workflow_id="maka-session-sess-1",
        **kw,
    )  # type: ignore[arg-type]


def test_recovered_terminal_event_has_example_02s_shape() -> None:
    lines = (EXAMPLES / "02-call-dispatch-no-response.jsonl").read_text().splitlines()
    reference = json.loads(lines[-1])
    last = codec.decode(lines[-2])
    ours = recovered_terminal_event(last, "run-1", "process_crashed").to_wire()
    # Same shape and values except the id (ours is deterministic) and ts (ours is the last event's).
    assert set(ours) == set(reference)
    assert {k: v for k, v in ours.items() if k not in ("id", "ts")} == {
        k: v for k, v in reference.items() if k not in ("id", "ts")
    }
    assert ours["id"] == "run-1_terminal" and ours["ts"] == last.ts


def test_repair_commits_the_terminal_event_before_the_header(store: LedgerStore) -> None:
    store.put_run(header())
    store.append([user()])
    t1_ts = TS + 1  # the T1 pair is the run's last event, and the repair takes its ts
    call, dispatch = t1(recovery_mode="reconcile", ts=t1_ts)
    store.commit_tool_prepared(dispatch, call=call)
    result = repair_run(store, "run-1")
    assert result.terminal_committed and result.terminal_event_id == "run-1_terminal"
    assert result.header_status == "failed" and result.header_updated
    events = store.events(run_id="run-1")
    assert events[-1].id == "run-1_terminal" and events[-1].ts == t1_ts and events[-1].is_terminal
    got = store.get_run("run-1")
    assert got is not None and got.status == "failed"
    again = repair_run(store, "run-1")
    assert not again.terminal_committed and not again.header_updated
    assert len(store.events(run_id="run-1")) == 4


def test_header_lagging_a_terminal_event_is_repaired_from_the_event(store: LedgerStore) -> None:
    store.put_run(header())
    store.append([user()])
    store.commit_terminal(terminal(status="completed"))
    result = repair_run(store, "run-1")
    assert not result.terminal_committed and result.terminal_event_id == "evt-terminal-1"
    assert result.header_status == "completed"
    assert [e.id for e in store.events()] == ["evt-user-1", "evt-terminal-1"]


def test_two_repairers_converge_on_one_terminal_fact(store: LedgerStore) -> None:
    store.put_run(header())
    store.append([user()])
    first = repair_run(store, "run-1")
    second = repair_run(store, "run-1", reason="worker_restarted")  # a different reason, same run
    assert first.terminal_committed and not second.terminal_committed
    assert [e.id for e in store.events() if e.is_terminal] == ["run-1_terminal"]


def test_repair_of_a_run_with_a_header_but_no_events(store: LedgerStore) -> None:
    store.put_run(header(created_at=TS))  # type: ignore[arg-type]
    result = repair_run(store, "run-1")
    assert result.terminal_committed
    (event,) = store.events(run_id="run-1")
    assert event.id == "run-1_terminal" and event.ts == TS and event.invocation_id == "inv-1"


def test_repair_of_events_without_a_header_creates_the_header(store: LedgerStore) -> None:
    store.append([user()])
    result = repair_run(store, "run-1")
    got = store.get_run("run-1")
    assert result.terminal_committed and got is not None and got.status == "failed"


def test_unknown_run_is_refused(store: LedgerStore) -> None:
    with pytest.raises(StoreError) as err:
        repair_run(store, "nope")
    assert err.value.code == "run_not_found"


def test_unreadable_ledger_fails_closed_and_writes_nothing(store: LedgerStore) -> None:
    store.put_run(header())
    store.append([user()])
    raw_update(store, "evt-user-1", payload_json='{"torn": ')
    with pytest.raises(StoreError) as err:
        repair_run(store, "run-1")
    assert err.value.code == "row_payload_undecodable"
    with store.engine.connect() as conn:
        count = conn.exec_driver_sql("SELECT count(*) FROM runtime_events").scalar_one()
    assert count == 1 and store.get_run("run-1").status == "running"  # type: ignore[union-attr]


def test_repair_all_skips_open_workflows_and_parked_runs(store: LedgerStore) -> None:
    for n in (1, 2, 3, 4):
        store.append([user(id=f"u{n}", **ids(run=f"run-{n}", inv=f"inv-{n}", turn=f"turn-{n}"))])
        store.put_run(header(f"run-{n}", workflow_run_id=f"wr-{n}"))
    store.put_run(store.get_run("run-3").model_copy(update={"status": "parked", "park_reason": "x"}))  # type: ignore[union-attr]
    store.commit_terminal(terminal(id="t4", **ids(run="run-4", inv="inv-4", turn="turn-4")))
    store.put_run(store.get_run("run-4").model_copy(update={"status": "completed"}))  # type: ignore[union-attr]
    results = repair_all(store, is_open=lambda run: run.workflow_run_id == "wr-2")
    assert [r.run_id for r in results] == ["run-1"]
    assert {r.run_id: r.status for r in store.list_runs()} == {
        "run-1": "failed",
        "run-2": "running",
        "run-3": "parked",
        "run-4": "completed",
    }
