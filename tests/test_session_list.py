"""``maka session list`` and its index (``store.session_index``), without Temporal: sessions made by
the runtime's own turn writers (``begin_run``, ``model_step``, ``finish_run``, ``host_park``) on every
store backend.

- The index's state of each session is the one ``session_view`` (``maka session status`` without
  Temporal) derives from the same ledger, and the index rebuilds equal (``verify``); negative
  control: a row edited behind the writers is reported by ``verify``.
- The v5 -> v6 migration fills the index from the ledger it finds, in its transaction (SQLite and
  PostgreSQL); negative control: the same migration without its backfill leaves rows ``verify``
  reports missing.
- The JSON contract's keys, the order (newest activity first), every filter and the default limit,
  through the real CLI; every bad flag is refused ``config_invalid`` naming it, exit 2.
"""

from __future__ import annotations

import asyncio
import json
import os
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import text

from maka_core.facts.events import Actions
from maka_core.facts.run_header import RunHeader
from maka_core.runtime import turn
from maka_core.runtime.contracts import BeginRunInput, FinishRunInput, HostParkInput, RunIds, SessionConfig
from maka_core.runtime.runtime import Runtime
from maka_core.runtime.session_view import session_view
from maka_core.store import schema
from maka_core.store.session_index import IndexUpkeep, SessionRow, rebuild_index
from maka_core.store.writer import LedgerStore
from maka_core.workspace import Workspace
from maka_temporal.workers.cli.app import main as maka_main
from maka_temporal.workers.client.session_api import SessionClient
from maka_temporal.workers.client.session_list import SUMMARY_KEYS, list_query
from maka_temporal.workflows.contracts import workflow_id_for
from tests import ledger_factory as lf
from tests.temporal_support import run_maka

SCRIPT = {"kind": "script", "steps": [{"text": "done"}]}


def _ids(sid: str, n: int) -> RunIds:
    return RunIds(session_id=sid, turn_id=f"{sid}-t{n}", run_id=f"{sid}-r{n}", invocation_id=f"{sid}-i{n}")


def _begin(rt: Runtime, ws: Workspace, ids: RunIds, ts: int, host: str | None = None) -> None:
    config = SessionConfig(provider=SCRIPT, host=host)
    inp = BeginRunInput(
        ids=ids,
        text="hi",
        ts=ts,
        workflow_id=workflow_id_for(ids.session_id),
        workflow_run_id="wr",
        task_queue="q",
        workspace=str(ws.root),
        workspace_identity=ws.identity,
        config=config,
    )
    asyncio.run(turn.begin_run(rt, inp))


def _finish(rt: Runtime, ids: RunIds, ts: int, status: Any = "completed", park: Any = None) -> None:
    asyncio.run(turn.finish_run(rt, FinishRunInput(ids=ids, status=status, ts=ts, park_reason=park)))


def make_sessions(rt: Runtime, ws: Workspace, prefix: str = "") -> dict[str, str]:
    """One session per state the runtime's writers can leave without Temporal; session -> state."""
    p = prefix
    _begin(rt, ws, _ids(f"{p}idle", 1), 1000, host="alpha")
    _finish(rt, _ids(f"{p}idle", 1), 1001)
    _begin(rt, ws, _ids(f"{p}twice", 1), 1100)
    _finish(rt, _ids(f"{p}twice", 1), 1101, "failed")
    _begin(rt, ws, _ids(f"{p}twice", 2), 1200)  # a second turn: the latest run decides
    _finish(rt, _ids(f"{p}twice", 2), 1201)
    _begin(rt, ws, _ids(f"{p}failed", 1), 1300)
    _finish(rt, _ids(f"{p}failed", 1), 1301, "failed")
    _begin(rt, ws, _ids(f"{p}parked", 1), 1400)
    _finish(rt, _ids(f"{p}parked", 1), 1401, "failed", park="max_steps_exceeded")
    _begin(rt, ws, _ids(f"{p}running", 1), 1500)
    _begin(rt, ws, _ids(f"{p}hostpark", 1), 1600, host="beta")
    asyncio.run(turn.host_park(rt, HostParkInput(ids=_ids(f"{p}hostpark", 1), parked=True)))
    _begin(rt, ws, _ids(f"{p}cancelled", 1), 1700)
    _finish(rt, _ids(f"{p}cancelled", 1), 1701, "cancelled")
    return {
        f"{p}idle": "idle",
        f"{p}twice": "idle",
        f"{p}failed": "failed",
        f"{p}parked": "parked",
        f"{p}running": "running",
        f"{p}hostpark": "parked",
        f"{p}cancelled": "idle",
    }


@pytest.fixture
def workspace(tmp_path: Path) -> Workspace:
    root = tmp_path / "ws"
    root.mkdir(exist_ok=True)
    return Workspace.open(root)


def test_the_index_state_is_the_one_status_derives_and_it_rebuilds_equal(
    store: LedgerStore, workspace: Workspace
) -> None:
    rt = Runtime(store)
    try:
        expected = make_sessions(rt, workspace)
    finally:
        rt.close()
    listed = {r.session_id: r for r in store.list_sessions(limit=100)}
    for sid, state in expected.items():
        view = session_view(store, sid, workflow_id=workflow_id_for(sid))
        row = listed[sid]
        assert (row.state, row.park_reason) == (view.state, view.park_reason) == (row.state, row.park_reason)
        assert row.state == state, (sid, row)
        assert (row.turns, row.event_count) == (len(view.turns), view.event_count), (sid, row, view)
    assert listed["hostpark"].park_reason == "workspace_host_unavailable"
    assert listed["parked"].park_reason == "max_steps_exceeded"
    assert listed["idle"].host == "alpha" and listed["hostpark"].host == "beta"
    assert listed["running"].host is None and listed["twice"].turns == 2
    assert store.verify() == []
    before = store.session_index()
    store.rebuild_projections()
    assert store.session_index() == before


def test_verify_reports_an_index_row_edited_behind_the_writers(
    store: LedgerStore, workspace: Workspace
) -> None:
    """Negative control of the rebuild-equality check: a projection that drifted is found."""
    rt = Runtime(store)
    try:
        make_sessions(rt, workspace)
    finally:
        rt.close()
    with store.engine.begin() as conn:
        conn.execute(text("UPDATE session_index SET state = 'idle' WHERE session_id = 'failed'"))
    problems = store.verify()
    assert len(problems) == 1 and problems[0].startswith("session_index failed: online="), problems


class _Blind(IndexUpkeep):
    """The control's index: it hears a session's run header, then no request begin or stop waiting
    (the writers before their ``touch``)."""

    def __init__(self) -> None:
        super().__init__()
        self.heard: set[str] = set()

    def touch(self, session_id: str) -> None:
        if session_id not in self.heard:
            self.heard.add(session_id)
            super().touch(session_id)


def _row(store: LedgerStore, session_id: str) -> SessionRow:
    return next(r for r in store.session_index() if r.session_id == session_id)


@pytest.mark.parametrize("index", ["writers", "control-blind-to-requests"])
def test_a_request_and_its_answer_move_the_index_and_it_rebuilds_equal(
    store: LedgerStore, index: str
) -> None:
    """A running turn's facts only add to its row (no read, ``test_write_statements``); a request
    that waits and its answer are what move a running session's state, so their writers tell the
    index. The control's index does not hear them, and ``verify`` finds the row it left behind."""
    if index != "writers":
        store._index = _Blind()
    env = lf.ids(session="asks", run="asks-r1", inv="asks-i1", turn="asks-t1")
    store.append(
        [lf.user(id="evt-first", **lf.ids(session="bare", run="bare-r", inv="bare-i", turn="bare-t"))]
    )
    store.put_run(RunHeader(**env, status="running"))
    store.append([lf.user(id="evt-asks-user", **env)])
    challenge = {"approvalId": "ap-1", "phrase": "approve ap-1"}
    request = lf.event(
        "evt-asks-permission",
        role="system",
        author="system",
        actions=Actions(
            permission_request={
                "kind": "tool_permission",
                "requestId": "ap-1",
                "toolUseId": "call-w",
                "toolName": "w",
                "category": "write",
                "reason": "file_write",
                "args": {},
                "rememberForTurnAllowed": False,
                "hint": "approve ap-1",
            }
        ),
        **env,
    )
    store.commit_permission_request(request, operation_id="op-w", decision={"challenge": challenge})
    states = [_row(store, "asks").state]
    problems = store.verify()
    answer = lf.event(
        "evt-asks-answer",
        role="system",
        author="system",
        actions=Actions(permission_decision={"requestId": "ap-1", "decision": "allow", "toolName": "w"}),
        **env,
    )
    store.commit_approval_answer(answer, "ap-1", "approved")
    states.append(_row(store, "asks").state)
    problems += store.verify()
    assert _row(store, "bare").event_count == 1  # a session's first facts, no header
    if index == "writers":
        assert states == ["awaiting_approval", "running"] and problems == [], (states, problems)
    else:
        assert states == ["running", "running"], states
        assert len(problems) == 1 and problems[0].startswith("session_index asks: online="), problems


def _downgrade_to_v5(url: str) -> None:
    """The ledger as schema v5 left it: no session index."""
    store = LedgerStore.open(url)
    try:
        with store.engine.begin() as conn:
            conn.execute(text("DROP TABLE session_index"))
            conn.execute(text("UPDATE maka_meta SET schema_version = 5"))
            if conn.dialect.name == "sqlite":
                conn.exec_driver_sql("PRAGMA user_version = 5")
    finally:
        store.close()


@pytest.mark.parametrize("backfill", [True, False], ids=["migration", "control-no-backfill"])
def test_the_v6_migration_fills_the_index_from_the_ledger_it_finds(
    store_url: str, workspace: Workspace, backfill: bool
) -> None:
    if store_url == "sqlite://":
        pytest.skip("a memory ledger does not outlive its store")
    store = LedgerStore.open(store_url)
    rt = Runtime(store)
    try:
        make_sessions(rt, workspace)
        online = store.session_index()
    finally:
        rt.close()
        store.close()
    _downgrade_to_v5(store_url)
    if backfill:
        reopened = LedgerStore.open(store_url)
    else:
        from maka_core.store.engine import make_engine

        engine = make_engine(store_url)
        try:
            assert schema.migrate(engine) == schema.SCHEMA_VERSION  # the step without its backfill
        finally:
            engine.dispose()
        reopened = LedgerStore.open(store_url)
    try:
        if backfill:
            assert reopened.session_index() == online and reopened.verify() == []
        else:
            assert reopened.session_index() == []
            assert len(reopened.verify()) == len(online), "verify must report every missing row"
    finally:
        reopened.close()


def test_rebuild_index_over_a_connection_equals_the_online_rows(
    store: LedgerStore, workspace: Workspace
) -> None:
    rt = Runtime(store)
    try:
        make_sessions(rt, workspace)
    finally:
        rt.close()
    online = store.session_index()
    store._write(rebuild_index)  # the migration's backfill, in one writer transaction
    assert store.session_index() == online


# --- through the CLI ------------------------------------------------------------------------------


@pytest.fixture
def ledger(tmp_path: Path, workspace: Workspace) -> Path:
    db = tmp_path / "ledger.sqlite"
    store = LedgerStore.open(db)
    rt = Runtime(store)
    try:
        make_sessions(rt, workspace)
    finally:
        rt.close()
        store.close()
    return db


def _env(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MAKA_", "TEMPORAL_"))}
    return {**env, "MAKA_HOME": str(tmp_path / "home"), "TEMPORAL_ADDRESS": "127.0.0.1:1"}


def test_cli_json_contract_order_and_filters(
    tmp_path: Path, ledger: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    env = _env(tmp_path)
    out = run_maka("session", "list", "--db", str(ledger), "--json", env=env)  # a real process once
    assert out.returncode == 0, out.stderr
    every: list[dict[str, Any]] = json.loads(out.stdout)

    def listed(*flags: str) -> list[dict[str, Any]]:  # the same entry point, in this process
        code = maka_main(["session", "list", "--db", str(ledger), "--json", *flags])
        value: list[dict[str, Any]] = json.loads(capsys.readouterr().out)
        assert code == 0
        return value

    assert listed() == every
    assert all(tuple(item) == SUMMARY_KEYS for item in every), every[0]
    # Newest activity first: the running session's header was the last write of all.
    times = [item["lastActivity"] for item in every]
    assert times == sorted(times, reverse=True) and every[0]["sessionId"] == "cancelled"
    assert {item["sessionId"] for item in every} == {
        "idle",
        "twice",
        "failed",
        "parked",
        "running",
        "hostpark",
        "cancelled",
    }
    first = every[0]
    assert first["workflowId"] == workflow_id_for("cancelled") and first["turnCount"] == 1
    assert first["eventCount"] == 2 and first["usage"] is None and first["lastActivity"].endswith("Z")
    parked = listed("--state", "parked")
    assert {(i["sessionId"], i["parkReason"]) for i in parked} == {
        ("parked", "max_steps_exceeded"),
        ("hostpark", "workspace_host_unavailable"),
    }
    assert [i["sessionId"] for i in listed("--host", "alpha")] == ["idle"]
    assert len(listed("--limit", "2")) == 2
    assert len(listed("--since", "1h")) == len(every)
    future = (datetime.now(UTC) + timedelta(days=1)).isoformat()
    assert listed("--since", future) == []
    assert maka_main(["session", "list", "--db", str(ledger)]) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[0].split()[:2] == ["SESSION", "STATE"] and len(table) == 1 + len(every)
    assert table[1].split()[:2] == ["cancelled", "idle"]
    assert any(row.split()[:3] == ["parked", "parked", "max_steps_exceeded"] for row in table)


@pytest.mark.parametrize(
    ("flags", "option"),
    [
        (["--state", "sleeping"], "--state"),
        (["--limit", "0"], "--limit"),
        (["--limit", "10001"], "--limit"),
        (["--limit", "ten"], "--limit"),
        (["--since", "yesterday"], "--since"),
        (["--since", "0h"], "--since"),
        (["--host", ""], "--host"),
        (["--host", "a\x1b[2Jb"], "--host"),
    ],
)
def test_every_bad_flag_is_refused_config_invalid_naming_it(
    tmp_path: Path, ledger: Path, capsys: pytest.CaptureFixture[str], flags: list[str], option: str
) -> None:
    code = maka_main(["session", "list", "--db", str(ledger), *flags])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith(f"error: config_invalid: {option} "), err
    assert "\x1b" not in err
    code = maka_main(["session", "list", "--db", str(ledger), "--json", *flags])
    refused = json.loads(capsys.readouterr().out)
    assert code == 2 and refused["code"] == "config_invalid" and refused["option"] == option, refused


def test_a_missing_ledger_is_refused_not_created(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    missing = tmp_path / "none.sqlite"
    assert maka_main(["session", "list", "--db", str(missing)]) == 2
    assert capsys.readouterr().err.startswith("error: ledger_not_found: ") and not missing.exists()


def test_the_library_call_validates_and_answers_as_the_cli(ledger: Path) -> None:
    client = SessionClient(None, ledger=ledger)
    found = asyncio.run(client.list(state="idle"))
    assert {s.session_id for s in found} == {"idle", "twice", "cancelled"}
    assert asyncio.run(client.list(limit=1))[0].session_id == "cancelled"
    with pytest.raises(Exception) as refused:
        asyncio.run(client.list(limit=0))
    assert getattr(refused.value, "code", None) == "config_invalid"
    assert list_query().limit == 100  # the default
    assert list_query(since="2h", now=datetime(2026, 1, 1, tzinfo=UTC)).since_ms == int(
        datetime(2025, 12, 31, 22, tzinfo=UTC).timestamp() * 1000
    )
    assert (
        list_query(since="2026-01-01T00:00:00").since_ms == list_query(since="2026-01-01T00:00:00Z").since_ms
    )


def test_the_table_shows_recorded_text_inert(
    tmp_path: Path, workspace: Workspace, capsys: pytest.CaptureFixture[str]
) -> None:
    """A host recorded with terminal escapes (an imported or old ledger) prints escaped, one line."""
    db = tmp_path / "hostile.sqlite"
    store = LedgerStore.open(db)
    rt = Runtime(store)
    try:
        _begin(rt, workspace, _ids("hostile", 1), 1000, host="evil\x1b[2J\nhost\u202e")
    finally:
        rt.close()
        store.close()
    assert maka_main(["session", "list", "--db", str(db)]) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\u202e" not in out and len(out.splitlines()) == 2, out
    assert "evil\\x1b[2J\\nhost\\u202e" in out
