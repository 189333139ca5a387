"""PostgreSQL as the ledger of a fleet (issue 12, item 1): what SQLite guarantees, on a real server.

Every test runs on a fresh schema of ``MAKA_TEST_POSTGRES_URL`` (``scripts/test`` starts a throwaway
server) and skips with the reason when none is configured. Covered here: two ledgers side by side
on one server, the ledger's identity and health (a replaced schema, a read-only server, a full
disk), the v1 -> v2 migration, the ``maka`` ledger commands with ``--db URL`` and ``MAKA_DB``, and
the connection-loss drill: the store's own backend is terminated (``pg_terminate_backend``) inside a
T1 or T2 transaction, and nothing is half-written, the activity fails retryably, recovery takes over
with no second effect, and the pool never hands out the dead connection again.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.exc import OperationalError

from maka_core import failpoints
from maka_core.errors import StoreError
from maka_core.runtime import recovery, tool_call
from maka_core.runtime.call_state import DispatchWithoutOutcome
from maka_core.runtime.runtime import Runtime
from maka_core.store.engine import make_engine, translate
from maka_core.store.health import probe_url
from maka_core.store.schema import SCHEMA_VERSION
from maka_core.store.writer import LedgerStore
from maka_core.tools.effect_journal import ENV as EFFECT_LOG_ENV
from maka_core.workspace import Workspace
from maka_temporal.activities import to_application_error
from tests.drills import file_effects
from tests.ledger_factory import ids, user
from tests.ledger_factory import text as model_text
from tests.pg_support import SKIP_REASON, fresh_pg_schema, pg_base_url, terminate_backends
from tests.test_runtime import ATTEMPT, IDS, one_call, op_status, recover_input, tool_input

pytestmark = pytest.mark.skipif(pg_base_url() is None, reason=SKIP_REASON)

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "tests" / "fixtures" / "maka_examples"


@pytest.fixture
def app() -> str:
    """The ``application_name`` this test's store connects with (what the drill terminates)."""
    return f"maka-victim-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def pg_url(app: str) -> Iterator[str]:
    with fresh_pg_schema(app=app) as url:
        yield url


def admin_sql(sql: str, **params: Any) -> list[Any]:
    base = pg_base_url()
    assert base is not None
    engine = create_engine(base)
    try:
        with engine.begin() as conn:
            result = conn.execute(text(sql), params)
            return list(result.all()) if result.returns_rows else []
    finally:
        engine.dispose()


def in_schema(url: str, sql: str) -> None:
    engine = create_engine(url)
    try:
        with engine.begin() as conn:
            for statement in sql.split(";"):
                if statement.strip():
                    conn.execute(text(statement))
    finally:
        engine.dispose()


# --- several ledgers on one server, identity ------------------------------------------------------


def test_two_ledgers_on_one_server_are_two_identities_that_never_see_each_other() -> None:
    with fresh_pg_schema() as a, fresh_pg_schema() as b:
        # The second schema is opened while the first one's maka_meta exists: the version lookup must
        # go through search_path (it once found the other schema's table and failed).
        with LedgerStore.open(a) as sa, LedgerStore.open(b) as sb:
            sa.append([user()])
            assert sa.health.ledger_id and sb.health.ledger_id
            assert sa.health.ledger_id != sb.health.ledger_id
            assert len(sa.events()) == 1 and sb.events() == []
        with LedgerStore.open(a) as again:
            assert again.health.ledger_id == sa.health.ledger_id  # written once, kept across opens


def test_a_replaced_schema_is_refused_by_the_workers_health_check(pg_url: str) -> None:
    store = LedgerStore.open(pg_url)
    store.append([user()])
    store.check_health()  # healthy: a real empty write transaction
    schema = pg_url.split("search_path%3D")[1].split("&")[0]
    admin_sql(f"DROP SCHEMA {schema} CASCADE; CREATE SCHEMA {schema}")
    LedgerStore.open(pg_url).close()  # somebody starts a new, empty ledger under the same name
    # The next ordinary write is refused (the writer lock reads the identity), not only the check.
    with pytest.raises(StoreError) as err:
        store.append([model_text(id="evt-model-1")])
    assert err.value.code == "ledger_replaced" and store.health.failure is not None
    with pytest.raises(StoreError) as again:  # sticky
        store.check_health()
    assert again.value.code == "ledger_replaced"
    store.close()
    with LedgerStore.open(pg_url) as fresh:
        assert fresh.events() == []  # nothing landed in the new ledger


# --- health: PostgreSQL's own states map to the store's codes -----------------------------------


@pytest.fixture
def role_url(pg_url: str) -> Iterator[tuple[str, str]]:
    """The same ledger opened by an unprivileged role (the superuser ignores read-only settings
    on nothing, but privileges and role defaults are what a DBA changes in production)."""
    role = f"maka_role_{uuid.uuid4().hex[:8]}"
    schema = pg_url.split("search_path%3D")[1].split("&")[0]
    admin_sql(f"CREATE ROLE {role} LOGIN; GRANT USAGE, CREATE ON SCHEMA {schema} TO {role}")
    url = pg_url.replace("://maka@", f"://{role}@", 1)
    assert url != pg_url, "the test server's URL names another user than maka"
    yield url, role
    admin_sql(f"DROP OWNED BY {role} CASCADE; DROP ROLE {role}")


@pytest.mark.parametrize("fault", ["read_only", "none"])
def test_a_server_turned_read_only_stops_writes_with_ledger_unwritable(
    role_url: tuple[str, str], app: str, fault: str
) -> None:
    url, role = role_url
    store = LedgerStore.open(url)
    store.append([user()])
    if fault == "read_only":
        # What a failover to a standby or a DBA's read-only switch looks like to the store (25006).
        admin_sql(f"ALTER ROLE {role} SET default_transaction_read_only = on")
    terminate_backends(app)  # the setting applies to new sessions; pre-ping replaces the dead one
    probe = probe_url(url)  # what `maka session status` can report without writing
    assert probe == {"ok": True} if fault == "none" else probe["code"] == "ledger_unwritable"
    if fault == "none":  # negative control: the same reconnect without the fault writes
        assert store.append([model_text(id="evt-model-1")]).created
        store.close()
        return
    with pytest.raises(StoreError) as err:
        store.append([model_text(id="evt-model-1")])
    assert err.value.code == "ledger_unwritable" and store.health.failure is not None
    admin_sql(f"ALTER ROLE {role} RESET default_transaction_read_only")
    with pytest.raises(StoreError) as again:  # sticky until the worker restarts
        store.check_health()
    assert again.value.code == "ledger_unwritable"
    store.close()
    with LedgerStore.open(url) as fresh:
        assert [e.id for e in fresh.events()] == ["evt-user-1"]  # nothing half-written


def test_revoked_privileges_read_as_unwritable_and_a_full_disk_as_ledger_full(
    role_url: tuple[str, str],
) -> None:
    url, role = role_url
    store = LedgerStore.open(url)
    store.append([user()])
    admin_sql(
        f"REVOKE UPDATE ON ALL TABLES IN SCHEMA {url.split('search_path%3D')[1].split('&')[0]} FROM {role}"
    )
    assert probe_url(url)["code"] == "ledger_unwritable"  # what `maka session status` can report
    with pytest.raises(StoreError) as err:  # FOR UPDATE needs UPDATE on maka_meta: 42501
        store.append([model_text(id="evt-model-1")])
    assert err.value.code == "ledger_unwritable"
    store.close()
    # 53100 (disk_full) cannot be provoked on a shared test server: the driver's own exception class
    # goes through the one translation seam instead.
    full = OperationalError("INSERT ...", {}, psycopg.errors.DiskFull("could not extend file"))
    assert translate(full).code == "ledger_full"


# --- migration ------------------------------------------------------------------------------------


def test_a_v1_postgres_ledger_migrates_with_its_chain_and_an_identity(pg_url: str) -> None:
    with LedgerStore.open(pg_url) as store:
        store.append([user(), model_text()])
        old_id = store.health.ledger_id
    engine = create_engine(pg_url)
    with engine.connect() as conn:
        digests = dict(conn.execute(text("SELECT event_id, chain_digest FROM runtime_events")).all())
    # What version 1 wrote on PostgreSQL: the meta row (the writer lock) at version 1, no ledger id,
    # no chain column.
    in_schema(
        pg_url,
        "ALTER TABLE runtime_events DROP COLUMN chain_digest; ALTER TABLE maka_meta DROP COLUMN ledger_id;"
        "UPDATE maka_meta SET schema_version = 1",
    )
    with LedgerStore.open(pg_url) as store:
        assert store.verify() == []
        assert store.health.ledger_id is not None and store.health.ledger_id != old_id
        store.append([user("again", id="evt-user-3", **ids(session="sess-3", run="run-3", inv="inv-3"))])
        assert store.verify() == []
    with engine.connect() as conn:
        assert conn.execute(text("SELECT schema_version FROM maka_meta")).scalar() == SCHEMA_VERSION
        migrated = dict(conn.execute(text("SELECT event_id, chain_digest FROM runtime_events")).all())
    engine.dispose()
    assert {k: migrated[k] for k in digests} == digests  # exactly what the writers computed


# --- the CLI with a URL ---------------------------------------------------------------------------


def maka(
    *args: str | Path, home: Path, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    full = {**os.environ, "MAKA_HOME": str(home), "PYTHONPATH": str(REPO), **(env or {})}
    full.pop("MAKA_FAILPOINT", None)
    return subprocess.run(
        [sys.executable, "-m", "maka_temporal", *map(str, args)],
        cwd=REPO,
        env=full,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_ledger_commands_take_a_postgres_url_by_flag_and_by_maka_db(pg_url: str, tmp_path: Path) -> None:
    example = next(
        p
        for p in sorted(EXAMPLES.glob("*.jsonl"))
        if json.loads(p.with_suffix(".out.json").read_text())["writerAdmission"]["admissible"]
    )
    n = json.loads(example.with_suffix(".out.json").read_text())["eventCount"]
    imported = maka("ledger", "import", "--db", pg_url, example, "--json", home=tmp_path)
    assert imported.returncode == 0, imported.stdout + imported.stderr
    assert json.loads(imported.stdout) == {"ok": True, "imported": n, "existing": 0}
    by_env = {"MAKA_DB": pg_url}
    again = maka("ledger", "import", example, "--json", home=tmp_path, env=by_env)
    assert json.loads(again.stdout) == {"ok": True, "imported": 0, "existing": n}
    exported = maka("ledger", "export", "--session", "sess-1", home=tmp_path, env=by_env)
    assert exported.returncode == 0 and exported.stdout == example.read_text()
    plan = maka("ledger", "plan", "--db", pg_url, "--session", "sess-1", "--json", home=tmp_path)
    assert plan.returncode == 0 and json.loads(plan.stdout)["ok"] is True, plan.stdout + plan.stderr
    verify = maka("ledger", "verify", "--json", home=tmp_path, env=by_env)
    assert verify.returncode == 0 and json.loads(verify.stdout.splitlines()[-1])["ok"] is True
    shown = maka("session", "show", "sess-1", home=tmp_path, env=by_env)
    assert shown.returncode == 0 and "user:" in shown.stdout, shown.stdout + shown.stderr
    # Nothing was written under MAKA_HOME: the ledger lives on the server.
    assert not (tmp_path / "ledger.sqlite").exists()
    # A forged row is found through the URL as well (the check is not SQLite-only).
    in_schema(pg_url, "UPDATE runtime_events SET chain_digest = 'x' WHERE ledger_seq = 1")
    assert maka("ledger", "verify", "--db", pg_url, home=tmp_path).returncode == 1


def test_an_unreachable_server_is_a_refusal_with_a_code(tmp_path: Path) -> None:
    base = pg_base_url()
    assert base is not None
    dead = base.rsplit(":", 1)[0] + ":1/postgres"
    proc = maka("ledger", "verify", "--db", dead, "--json", home=tmp_path)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert json.loads(proc.stdout)["code"] in {"store_unreadable", "store_io_failed"}


# --- connection loss mid-transaction ------------------------------------------------------------


@pytest.fixture
def rt(pg_url: str) -> Iterator[Runtime]:
    runtime = Runtime(LedgerStore.open(pg_url))
    yield runtime
    runtime.close()


def cut_at(monkeypatch: pytest.MonkeyPatch, app: str, point: str, transition: str) -> list[int]:
    """Arm the store's failpoint (through this test's own construction) to terminate the store's
    own backends, from a second connection, inside the transaction; returns how many were cut."""
    cut: list[int] = []

    def hit(name: str, tag: str | None = None) -> None:
        if name == point and tag == transition and not cut:
            cut.append(terminate_backends(app))

    monkeypatch.setattr(failpoints, "hit", hit)
    return cut


WRITE = {"path": "out.txt", "content": "one\n"}


def test_connection_lost_inside_t1_writes_nothing_and_the_retry_runs_the_tool_once(
    rt: Runtime, ws: Workspace, app: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    journal = tmp_path / "effects.jsonl"
    monkeypatch.setenv(EFFECT_LOG_ENV, str(journal))
    ref = one_call(rt, ws, "write_file", WRITE)
    before = [e.id for e in rt.ledger.events(session_id=IDS.session_id)]
    cut = cut_at(monkeypatch, app, "after_runtime_event_insert", "t1_prepare")
    with pytest.raises(StoreError) as err:
        asyncio_run(tool_call.execute_tool(rt, tool_input(ws, ref), ATTEMPT))
    assert cut and cut[0] >= 1
    assert to_application_error(err.value).non_retryable is False  # Temporal retries the activity
    assert not (ws.root / "out.txt").exists() and not journal.exists()  # T1 before the effect
    with LedgerStore.open(rt.ledger.url) as other:  # a second process sees nothing half-written
        assert [e.id for e in other.events(session_id=IDS.session_id)] == before
        assert other.operation(ref.operation_id) is None and other.verify() == []
    outcome = asyncio_run(tool_call.execute_tool(rt, tool_input(ws, ref), ATTEMPT))  # the retry
    assert outcome.status == "completed" and not outcome.replayed
    assert list(file_effects(journal).values()) == [1]
    assert op_status(rt, ref) == ("completed", "matching_response")


def test_connection_lost_inside_t2_rolls_it_back_and_recovery_finalizes_without_a_second_write(
    rt: Runtime, ws: Workspace, app: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    journal = tmp_path / "effects.jsonl"
    monkeypatch.setenv(EFFECT_LOG_ENV, str(journal))
    ref = one_call(rt, ws, "write_file", WRITE)
    cut = cut_at(monkeypatch, app, "after_runtime_event_insert", "t2_outcome")
    with pytest.raises(StoreError) as err:
        asyncio_run(tool_call.execute_tool(rt, tool_input(ws, ref), ATTEMPT))
    assert cut and to_application_error(err.value).non_retryable is False
    assert list(file_effects(journal).values()) == [1]  # the effect happened once, T2 did not commit
    with LedgerStore.open(rt.ledger.url) as other:
        row = other.operation(ref.operation_id)
        assert row is not None and row.current_state == "prepared"  # T1 only: no half of T2
        assert other.verify() == []
    assert op_status(rt, ref) == ("indeterminate", "dispatch_without_response")
    # The retried activity refuses to run the effect again; the workflow hands over to recovery.
    with pytest.raises(DispatchWithoutOutcome):
        asyncio_run(tool_call.execute_tool(rt, tool_input(ws, ref), ATTEMPT))
    asyncio_run(recovery.recover_operation(rt, recover_input(ws, ref), ATTEMPT))
    assert op_status(rt, ref) == ("completed", "recovery_bundle_completed")
    assert list(file_effects(journal).values()) == [1]  # no duplicate effect
    assert (ws.root / "out.txt").read_text() == "one\n"


@pytest.mark.parametrize("pre_ping", [True, False], ids=["store-engine", "no-pre-ping"])
def test_the_pool_never_hands_out_a_terminated_connection(pg_url: str, app: str, pre_ping: bool) -> None:
    # The store's engine, and the negative control: the same pool built by the test without pre-ping.
    engine = make_engine(pg_url) if pre_ping else create_engine(pg_url)
    assert engine.pool._pre_ping is pre_ping
    with engine.connect() as conn:
        first = conn.execute(text("SELECT pg_backend_pid()")).scalar()
    assert terminate_backends(app) >= 1  # the idle pooled connection dies on the server
    try:
        if pre_ping:
            with engine.connect() as conn:
                again = conn.execute(text("SELECT pg_backend_pid()")).scalar()
            assert again != first
        else:
            with pytest.raises(OperationalError), engine.connect() as conn:
                conn.execute(text("SELECT 1"))
    finally:
        engine.dispose()


def asyncio_run(coro: Any) -> Any:
    import asyncio

    return asyncio.run(coro)


# --- a worker and the session commands on a PostgreSQL ledger (real processes, real server) ------


@pytest.mark.temporal
def test_worker_and_session_commands_on_a_postgres_ledger_by_maka_db(
    temporal_server: Any, pg_url: str, tmp_path: Path
) -> None:
    from tests.temporal_support import WorkerProcess, tool_step, write_script

    home, ws = tmp_path / "home", tmp_path / "ws"
    ws.mkdir()
    queue = f"pg-{uuid.uuid4().hex[:8]}"
    env = {"MAKA_DB": pg_url, "TEMPORAL_ADDRESS": temporal_server.address, "MAKA_TASK_QUEUE": queue}
    script = write_script(
        tmp_path / "s.json", [tool_step(("write_file", {"path": "f.txt", "content": "hi\n"})), {"text": "ok"}]
    )
    with WorkerProcess(temporal_server, pg_url, queue, home=home) as worker:  # type: ignore[arg-type]
        worker.wait_ready()
        started = maka(
            "session", "start", "--workspace", ws, "--script", script, "--wait", "--json", "go",
            home=home, env=env,
        )  # fmt: skip
        assert started.returncode == 0, started.stdout + started.stderr
        body = json.loads(started.stdout)
        session = body["sessionId"]
        assert body["state"] == "idle" and [op["status"] for op in body["operations"]] == ["completed"]
        status = maka("session", "status", session, "--json", home=home, env=env)
        assert status.returncode == 0 and json.loads(status.stdout)["state"] == "idle", status.stderr
        audit = maka("audit", session, "--json", home=home, env=env)
        assert audit.returncode == 0, audit.stdout + audit.stderr
    shown = maka("session", "show", session, home=home, env=env)
    assert shown.returncode == 0 and "[T1] write_file dispatched" in shown.stdout
    assert (ws / "f.txt").read_text() == "hi\n"
    assert not (home / "ledger.sqlite").exists()  # the worker and every command used the server
    with LedgerStore.open(pg_url) as store:
        assert store.verify() == [] and len(store.events(session_id=session)) >= 5


# --- the connection-loss drill through a real worker process and a real server ---------------------

CUTS = {
    # (transition, which hit) -> the tool whose transaction loses its connection
    "T2 write_file": ("t2_outcome", 0),
    "T1 bash": ("t1_prepare", 2),
}


@pytest.mark.slow
@pytest.mark.temporal
@pytest.mark.crash
@pytest.mark.asyncio(loop_scope="session")
@pytest.mark.parametrize("cut", list(CUTS))
async def test_a_worker_that_loses_its_connection_mid_transaction_recovers_with_no_duplicate(
    temporal_server: Any, temporal_client: Any, tmp_path: Path, cut: str
) -> None:
    from tests.drills import (
        DRILL_SCRIPT,
        TOOLS,
        Cell,
        CellResult,
        Expect,
        Sandbox,
        check,
        collect,
        ready,
        settle,
        stop,
    )
    from tests.temporal_support import WorkerProcess, start

    transition, skip = CUTS[cut]
    app = f"maka-cut-{uuid.uuid4().hex[:8]}"
    box = Sandbox(temporal_server, tmp_path, backend="postgres")
    url = f"{box.db}&application_name={app}"
    worker = WorkerProcess(
        temporal_server,
        url,  # type: ignore[arg-type]
        box.queue,
        home=box.root,
        heartbeat_timeout=2.0,
        extra_env={EFFECT_LOG_ENV: str(box.journal)},
        log=box.root / "worker.log",
        entry=(
            "-m", "tests.children.pg_cut_worker", "--cut-point", "after_runtime_event_insert",
            "--cut-tag", transition, "--cut-skip", str(skip), "--cut-app", app,
        ),
    )  # fmt: skip
    result = CellResult(Cell(cut, ()))
    try:
        await ready(worker)
        result.session_id, accepted = await start(temporal_client, box.ws, DRILL_SCRIPT, box.queue)
        status = await settle(temporal_client, result.session_id, accepted.run_id, timeout=90)
        log = worker.log.read_text()
    finally:
        await stop(worker)
    try:
        result.state, result.park_reason = status.state, status.park_reason
        collect(box, result)
        result.verify_clean, result.verify_output = await box.verify()
    finally:
        box.close()
    assert "CUT " in log and "CUT 0" not in log, log[-2000:]
    assert "StoreError" in log or "store_io_failed" in log, log[-2000:]  # the activity failed, retryably
    finalized = "recovery_bundle_completed" if transition == "t2_outcome" else "matching_response"
    ops: dict[str, tuple[str, str | None]] = {t: ("completed", "matching_response") for t in TOOLS}
    ops["write_file"] = ("completed", finalized) if cut.endswith("write_file") else ops["write_file"]
    expect = Expect("idle", None, ops, dict.fromkeys(TOOLS, 1), "status: draft, reviewed\n")
    assert check(expect, result) == [], (result, log[-3000:])
