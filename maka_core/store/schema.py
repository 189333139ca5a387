"""The ledger schema (SQLAlchemy Core tables) and its migrations.

``runtime_events`` is the only canonical table: each row is one RuntimeEvent in its canonical
encoding (``payload_json``) plus the identity columns needed for indexed lookups, which every
read re-checks against the payload. ``tool_operations`` and ``tool_journal_events`` are
projections derived by the scanner and rebuildable from events alone; ``tool_evidence``,
``tool_attempts``, ``agent_runs`` and ``continuation_claims`` are operational records.

The version lives in ``PRAGMA user_version`` on SQLite and in the one-row ``maka_meta`` table
elsewhere. Migrations run in one writer transaction; a database newer than this code fails closed
before a byte is written. ``maka_meta`` also holds the ledger's identity (``ledger_id``, written once
at creation), which the health check and the workers on one task queue compare.

Versions: 1, the schema; 2, ``runtime_events.chain_digest`` (``maka_core.store.chain``, computed for
existing rows by the migration) and ``maka_meta.ledger_id``; 3, governed execution's operational
records (``session_policies``, ``tool_decisions``, ``action_receipts``, ``execution_certificates``),
created empty by the migration: append-only, written in the transaction of the fact they describe;
4, ``melra_tasks`` (the tasks ``melra_plan`` persists), created empty by the migration; 5,
``operation_fences`` (an operation recovery took over: its original attempt writes nothing after),
created empty by the migration; 6, ``session_index`` (one row per session for ``maka session list``,
``store.session_index``), filled by the migration from the ledger it finds; 7, ``step_partials``
(a streamed model step's text so far, ``store.partials``), created empty by the migration: never
an event, never in a digest, a cursor or verify's rebuild.
"""

from __future__ import annotations

import sqlite3
import uuid
from collections.abc import Callable
from pathlib import Path

from sqlalchemy import (
    BigInteger,
    Boolean,
    CheckConstraint,
    Column,
    Connection,
    Engine,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    UniqueConstraint,
    select,
    text,
)

from maka_core.errors import StoreError
from maka_core.store.chain import chain_all
from maka_core.store.engine import is_sqlite, read_tx, run_write

SCHEMA_VERSION = 7

metadata = MetaData()

maka_meta = Table(
    "maka_meta",
    metadata,
    Column("id", Integer, primary_key=True),
    Column("schema_version", Integer, nullable=False),
    # Nullable only because PostgreSQL's writer-lock row exists before the migration that fills it.
    Column("ledger_id", String),
    CheckConstraint("id = 1", name="maka_meta_singleton"),
)

runtime_events = Table(
    "runtime_events",
    metadata,
    Column("event_id", String, primary_key=True),
    Column("session_id", String, nullable=False),
    Column("invocation_id", String, nullable=False),
    Column("run_id", String, nullable=False),
    Column("turn_id", String, nullable=False),
    Column("event_seq", Integer, nullable=False),
    Column("ledger_seq", BigInteger, nullable=False, unique=True),
    Column("event_kind", String, nullable=False),
    Column("operation_id", String),
    Column("tool_call_id", String),
    Column("terminal", Boolean, nullable=False),
    Column("payload_json", Text, nullable=False),
    Column("committed_at", BigInteger, nullable=False),
    # Nullable so a v1 ledger can gain the column; every writer fills it, verify flags a NULL.
    Column("chain_digest", String),
    UniqueConstraint("invocation_id", "event_seq", name="runtime_events_invocation_seq"),
    CheckConstraint("event_seq > 0", name="runtime_events_seq_positive"),
    Index("runtime_events_session_run", "session_id", "run_id", "ledger_seq"),
    Index("runtime_events_run_terminal", "run_id", "terminal"),
    Index("runtime_events_operation", "operation_id"),
)

tool_operations = Table(
    "tool_operations",
    metadata,
    Column("operation_id", String, primary_key=True),
    Column("invocation_id", String, nullable=False),
    Column("run_id", String, nullable=False),
    Column("turn_id", String, nullable=False),
    Column("provider_tool_call_id", String, nullable=False),
    Column("tool_name", String, nullable=False),
    Column("canonical_args_hash", String, nullable=False),
    Column("recovery_mode", String, nullable=False),
    Column("current_state", String, nullable=False),
    Column("call_event_id", String, ForeignKey("runtime_events.event_id")),
    Column("dispatch_event_id", String, ForeignKey("runtime_events.event_id")),
    Column("result_event_id", String, ForeignKey("runtime_events.event_id")),
    Column("version", Integer, nullable=False),
    UniqueConstraint("invocation_id", "provider_tool_call_id", name="tool_operations_call"),
    CheckConstraint("version > 0", name="tool_operations_version_positive"),
)

tool_journal_events = Table(
    "tool_journal_events",
    metadata,
    Column("journal_seq", Integer, primary_key=True, autoincrement=True),
    Column("journal_event_id", String, nullable=False, unique=True),
    Column("operation_id", String, nullable=False),
    Column("invocation_id", String, nullable=False),
    Column("run_id", String, nullable=False),
    Column("turn_id", String, nullable=False),
    Column("state", String, nullable=False),
    Column("runtime_event_id", String, ForeignKey("runtime_events.event_id"), nullable=False),
    Column("canonical_args_hash", String),
    Column("recovery_mode", String),
    Column("external_handle", String),
    Column("metadata_json", Text),
    Column("committed_at", BigInteger, nullable=False),
    Index("tool_journal_operation", "operation_id", "journal_seq"),
)

tool_evidence = Table(
    "tool_evidence",
    metadata,
    Column("operation_id", String, primary_key=True),
    Column("dispatch_event_id", String, ForeignKey("runtime_events.event_id"), nullable=False),
    Column("evidence_json", Text, nullable=False),
)

tool_attempts = Table(
    "tool_attempts",
    metadata,
    Column("attempt_seq", Integer, primary_key=True, autoincrement=True),
    Column("operation_id", String, nullable=False),
    Column("phase", String, nullable=False),
    Column("workflow_id", String),
    Column("workflow_run_id", String),
    Column("activity_id", String),
    Column("attempt", Integer),
    Column("recorded_at", BigInteger, nullable=False),
    CheckConstraint("phase IN ('t1', 't2', 'recovery')", name="tool_attempts_phase"),
    Index("tool_attempts_operation", "operation_id", "attempt_seq"),
)

agent_runs = Table(
    "agent_runs",
    metadata,
    Column("run_id", String, primary_key=True),
    Column("session_id", String, nullable=False),
    Column("invocation_id", String, nullable=False),
    Column("turn_id", String, nullable=False),
    Column("status", String, nullable=False),
    Column("park_reason", String),
    Column("workflow_id", String),
    Column("workflow_run_id", String),
    Column("task_queue", String),
    Column("continuation_source", Text),
    Column("created_at", BigInteger, nullable=False),
    Column("updated_at", BigInteger, nullable=False),
    CheckConstraint(
        "status IN ('running', 'completed', 'failed', 'cancelled', 'parked')", name="agent_runs_status"
    ),
    Index("agent_runs_session", "session_id", "created_at"),
)

continuation_claims = Table(
    "continuation_claims",
    metadata,
    Column("claim_id", String, primary_key=True),
    Column("source_session_id", String, nullable=False),
    Column("source_invocation_id", String, nullable=False),
    Column("source_run_id", String, nullable=False),
    Column("source_turn_id", String, nullable=False),
    Column("source_event_high_water", Integer, nullable=False),
    Column("source_prefix_digest", String, nullable=False),
    Column("boundary_digest", String, nullable=False, unique=True),
    Column("boundary_json", Text, nullable=False),
    Column("provider_projection_version", Integer, nullable=False),
    Column("provider_replay_digest", String, nullable=False),
    Column("target_session_id", String, nullable=False),
    Column("target_invocation_id", String, nullable=False, unique=True),
    Column("target_run_id", String, nullable=False, unique=True),
    Column("target_turn_id", String, nullable=False),
    Column("target_run_header_json", Text),
    Column("claimed_at", BigInteger, nullable=False),
    Column("start_event_id", String, ForeignKey("runtime_events.event_id"), unique=True),
    Column("start_kind", String),
    Column("protocol_version", Integer, nullable=False),
    UniqueConstraint(
        "source_session_id",
        "source_run_id",
        "source_event_high_water",
        "source_prefix_digest",
        name="continuation_claims_source_boundary",
    ),
    UniqueConstraint("target_session_id", "target_turn_id", name="continuation_claims_target_turn"),
    CheckConstraint("source_event_high_water > 0", name="continuation_claims_high_water"),
    CheckConstraint(
        "start_kind IS NULL OR start_kind IN ('runtime_admission', 'claim_repair')",
        name="continuation_claims_start_kind",
    ),
)

#: The policy a session decides by, recorded once when the session starts (insert-if-absent).
session_policies = Table(
    "session_policies",
    metadata,
    Column("session_id", String, primary_key=True),
    Column("policy_version", String, nullable=False),
    Column("policy_digest", String, nullable=False),
    Column("policy_json", Text, nullable=False),
    Column("identity_json", Text, nullable=False),
    Column("recorded_at", BigInteger, nullable=False),
)

#: One policy decision per operation: with its refusal, its permission request, or its T1. An
#: awaiting approval moves once, by compare-and-swap on ``state``, to approved/denied/expired.
tool_decisions = Table(
    "tool_decisions",
    metadata,
    Column("operation_id", String, primary_key=True),
    Column("session_id", String, nullable=False),
    Column("run_id", String, nullable=False),
    Column("state", String, nullable=False),
    Column("approval_id", String, unique=True),
    Column("decision_json", Text, nullable=False),
    Column("recorded_at", BigInteger, nullable=False),
    Column("updated_at", BigInteger, nullable=False),
    CheckConstraint(
        "state IN ('decided', 'awaiting_approval', 'approved', 'denied', 'expired')",
        name="tool_decisions_state",
    ),
    Index("tool_decisions_session", "session_id", "recorded_at"),
)

action_receipts = Table(
    "action_receipts",
    metadata,
    Column("receipt_seq", Integer, primary_key=True, autoincrement=True),
    Column("receipt_id", String, nullable=False, unique=True),
    Column("operation_id", String, nullable=False, unique=True),
    Column("session_id", String, nullable=False),
    Column("run_id", String, nullable=False),
    Column("receipt_json", Text, nullable=False),
    Column("digest", String, nullable=False),
    Index("action_receipts_session", "session_id", "receipt_seq"),
)

execution_certificates = Table(
    "execution_certificates",
    metadata,
    Column("certificate_seq", Integer, primary_key=True, autoincrement=True),
    Column("certificate_id", String, nullable=False, unique=True),
    Column("run_id", String, nullable=False, unique=True),
    Column("session_id", String, nullable=False),
    Column("certificate_json", Text, nullable=False),
    Column("digest", String, nullable=False),
    Index("execution_certificates_session", "session_id", "certificate_seq"),
)

#: One row per task ``melra_plan`` persisted, keyed by the task id derived from the planning
#: call's operation id (insert-if-absent: a re-run of that call finds its task). Never updated:
#: a task's status is derived from its executions' decisions and receipts.
melra_tasks = Table(
    "melra_tasks",
    metadata,
    Column("task_id", String, primary_key=True),
    Column("session_id", String, nullable=False),
    Column("plan_operation_id", String, nullable=False, unique=True),
    Column("request_json", Text, nullable=False),
    Column("plan_json", Text, nullable=False),
    Column("planned_at", BigInteger, nullable=False),
    Index("melra_tasks_session", "session_id", "planned_at"),
)

GOVERNANCE_TABLES = (session_policies, tool_decisions, action_receipts, execution_certificates)

#: Operations recovery has taken over (``store.fences``): one row, written before recovery looks at
#: the operation's target; an original attempt that wakes late checks it, holding the target
#: folder's lock, and writes nothing once it is there. Insert-if-absent, never updated.
operation_fences = Table(
    "operation_fences",
    metadata,
    Column("operation_id", String, primary_key=True),
    Column("fenced_at", BigInteger, nullable=False),
)

#: One row per session (``store.session_index``): what ``maka session list`` shows and filters on,
#: kept by the writers in the transaction of each fact or header that changes it, and rebuilt equal
#: from the events and run headers. A projection: it never overrides what it follows.
session_index = Table(
    "session_index",
    metadata,
    Column("session_id", String, primary_key=True),
    Column("state", String, nullable=False),
    Column("park_reason", String),
    Column("last_activity_at", BigInteger, nullable=False),
    Column("last_event_at", BigInteger, nullable=False),
    Column("host", String),
    Column("turns", Integer, nullable=False),
    Column("event_count", Integer, nullable=False),
    Column("usage_json", Text),
    Index("session_index_activity", "last_activity_at", "session_id"),
    Index("session_index_state", "state", "last_activity_at"),
)

#: A streamed model step's text so far (``store.partials``): one mutable row per step while the
#: vendor streams it, overwritten at most every 100 ms, deleted once the step's output commits (a
#: reader ignores a row whose step has committed). Never an event: nothing here is a fact.
step_partials = Table(
    "step_partials",
    metadata,
    Column("step_id", String, primary_key=True),
    Column("session_id", String, nullable=False),
    Column("run_id", String, nullable=False),
    Column("text", Text, nullable=False),
    Column("started_at", BigInteger, nullable=False),
    Column("first_token_at", BigInteger),
    Column("updated_at", BigInteger, nullable=False),
    Index("step_partials_session", "session_id"),
)


def sqlite_file_version(path: Path) -> int | None:
    """``user_version`` of an existing SQLite file, read through a read-only handle.

    Read-only on purpose: a database newer than this code must not be touched at all, not even by
    the journal-mode pragma the engine sets on connect.
    """
    if not path.exists() or path.stat().st_size == 0:
        return None
    try:
        conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=5)
    except sqlite3.Error as exc:
        raise StoreError("store_unreadable", str(exc), path=str(path)) from exc
    try:
        return int(conn.execute("PRAGMA user_version").fetchone()[0])
    except sqlite3.DatabaseError as exc:
        raise StoreError("store_unreadable", str(exc), path=str(path)) from exc
    finally:
        conn.close()


def refuse_newer(version: int) -> None:
    if version > SCHEMA_VERSION:
        raise StoreError(
            "schema_too_new",
            f"ledger schema version {version} is newer than this code ({SCHEMA_VERSION})",
            schemaVersion=version,
            supportedVersion=SCHEMA_VERSION,
        )


def _current_version(conn: Connection) -> int:
    if is_sqlite_conn(conn):
        return int(conn.exec_driver_sql("PRAGMA user_version").scalar_one())
    # to_regclass resolves through search_path: a maka_meta in another schema (another ledger on
    # the same server) must not count as this ledger's.
    exists = conn.execute(text("SELECT to_regclass('maka_meta')")).scalar()
    if exists is None:
        return 0
    value = conn.execute(select(maka_meta.c.schema_version).where(maka_meta.c.id == 1)).scalar()
    return int(value or 0)


def is_sqlite_conn(conn: Connection) -> bool:
    return conn.dialect.name == "sqlite"


def _add_chain_and_identity(conn: Connection) -> None:
    """v1 -> v2: the chain column, computed for every existing row in ledger order, and the id column."""
    conn.exec_driver_sql("ALTER TABLE runtime_events ADD COLUMN chain_digest VARCHAR")
    if is_sqlite_conn(conn):
        conn.exec_driver_sql("ALTER TABLE maka_meta ADD COLUMN ledger_id VARCHAR")
    else:
        conn.exec_driver_sql("ALTER TABLE maka_meta ADD COLUMN IF NOT EXISTS ledger_id VARCHAR")
    rows = conn.execute(
        select(
            runtime_events.c.event_id, runtime_events.c.session_id, runtime_events.c.payload_json
        ).order_by(runtime_events.c.ledger_seq)
    ).all()
    digests = chain_all((str(a), str(b), str(c)) for a, b, c in rows)
    if digests:
        mark = "?" if conn.dialect.paramstyle == "qmark" else "%s"
        conn.exec_driver_sql(
            f"UPDATE runtime_events SET chain_digest = {mark} WHERE event_id = {mark}",
            [(digest, event_id) for event_id, digest in digests],
        )


def _ensure_ledger_id(conn: Connection) -> None:
    """Give the ledger its identity once (SQLite has no meta row before v2; PostgreSQL has one)."""
    row = conn.execute(select(maka_meta.c.ledger_id).where(maka_meta.c.id == 1)).first()
    new_id = f"ledger-{uuid.uuid4().hex}"
    if row is None:
        conn.execute(maka_meta.insert().values(id=1, schema_version=SCHEMA_VERSION, ledger_id=new_id))
    elif row[0] is None:
        conn.execute(maka_meta.update().where(maka_meta.c.id == 1).values(ledger_id=new_id))


def ledger_id(conn: Connection) -> str | None:
    """The ledger's identity (None before the migration that writes it)."""
    value = conn.execute(select(maka_meta.c.ledger_id).where(maka_meta.c.id == 1)).scalar()
    return None if value is None else str(value)


def migrate(engine: Engine, backfill: Callable[[Connection], None] | None = None) -> int:
    """Bring the schema to ``SCHEMA_VERSION`` in one writer transaction; return the version.
    ``backfill``: fills a projection a step creates from the rows already there, in the same
    transaction (``session_index.rebuild_index``; passed in, so this module imports no reader).

    Raises:
        StoreError: ``schema_too_new`` when the database is newer than this code.
    """

    def body(conn: Connection) -> int:
        version = _current_version(conn)
        refuse_newer(version)
        if version == SCHEMA_VERSION:
            return version
        if version == 0:
            metadata.create_all(conn)
        if version == 1:
            _add_chain_and_identity(conn)
        if 0 < version < 3:
            metadata.create_all(conn, tables=list(GOVERNANCE_TABLES))
        if 0 < version < 4:
            metadata.create_all(conn, tables=[melra_tasks])
        if 0 < version < 5:
            metadata.create_all(conn, tables=[operation_fences])
        if 0 < version < 6:
            metadata.create_all(conn, tables=[session_index])
            if backfill is not None:
                backfill(conn)
        if 0 < version < 7:
            metadata.create_all(conn, tables=[step_partials])
        # Later versions add steps here, each inside this transaction.
        _ensure_ledger_id(conn)
        if is_sqlite_conn(conn):
            conn.exec_driver_sql(f"PRAGMA user_version = {SCHEMA_VERSION}")
        conn.execute(maka_meta.update().where(maka_meta.c.id == 1).values(schema_version=SCHEMA_VERSION))
        return SCHEMA_VERSION

    if not is_sqlite(engine):
        # Postgres: the meta row is the writer lock, so it must exist before the first writer.
        with engine.begin() as conn:
            # Processes opening one fresh schema at once would race CREATE TABLE (a unique violation
            # in pg_type): a transaction-scoped advisory lock per schema lets one create it first.
            conn.execute(text("SELECT pg_advisory_xact_lock(7263, hashtext(current_schema()))"))
            if _current_version(conn) == 0:
                maka_meta.create(conn, checkfirst=True)
                conn.execute(
                    text(
                        "INSERT INTO maka_meta (id, schema_version) VALUES (1, 0) ON CONFLICT (id) DO NOTHING"
                    )
                )
    # A current schema needs no writer: opening must not queue behind a long write transaction.
    with read_tx(engine) as conn:
        version = _current_version(conn)
    refuse_newer(version)
    if version == SCHEMA_VERSION:
        return version
    return run_write(engine, body, on_abort=lambda: None)
