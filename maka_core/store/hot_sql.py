"""The writers' hot-path statements as the driver's own SQL, built once per store.

Every tool call commits a handful of rows (its event, the operation projection, a journal row, the
attempt, sometimes evidence). Through SQLAlchemy each ``execute`` pays for coercion, a compiled-cache
lookup, parameter processing and result set-up: about 30 us a statement here, three times what the
SQLite insert itself costs. These statements are plain INSERT/UPDATE/SELECT over plain column types
(no type processors), so the same text runs on the driver connection underneath the SQLAlchemy
connection (both pysqlite and psycopg have ``Connection.execute``), inside the same transaction, with
only the placeholder differing (``?`` for pysqlite, ``%s`` for psycopg). A driver error is wrapped as
SQLAlchemy would wrap it, so the transaction seam translates it once, as every other error.
Everything else (schema, migrations, reads, the transaction itself) stays in SQLAlchemy.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from operator import itemgetter
from typing import Any

from sqlalchemy import Connection, Engine, Table

from maka_core.store.engine import driver_execute as execute
from maka_core.store.schema import (
    action_receipts,
    runtime_events,
    tool_attempts,
    tool_decisions,
    tool_evidence,
    tool_journal_events,
    tool_operations,
)


@dataclass(frozen=True)
class Insert:
    """``INSERT INTO table (columns) VALUES (...)`` with the columns in a fixed order."""

    sql: str
    columns: tuple[str, ...]
    _params: Callable[[Mapping[str, Any]], tuple[Any, ...]] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        # The parameter tuple in one C call (every statement here has two columns or more).
        assert len(self.columns) > 1
        object.__setattr__(self, "_params", itemgetter(*self.columns))

    def run(self, conn: Connection, values: Mapping[str, Any]) -> None:
        execute(conn, self.sql, self._params(values))

    def run_many(self, conn: Connection, rows: Sequence[Mapping[str, Any]]) -> None:
        for row in rows:
            self.run(conn, row)


def rows_since(conn: Connection, sql: str, *params: Any) -> list[dict[str, Any]]:
    """The rows ``sql`` selects with ``params`` (past a ledger_seq: ``events_since``), as dicts."""
    cursor = execute(conn, sql, params)
    names = [d[0] for d in cursor.description]
    return [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]


@dataclass(frozen=True)
class HotSQL:
    """The statements, for one engine's placeholder style."""

    event: Insert
    operation: Insert
    journal: Insert
    evidence: Insert
    attempt: Insert
    #: ``UPDATE tool_operations SET <every column but the key> WHERE operation_id = ?``
    operation_update: Insert
    #: every runtime_events row past a ledger_seq, in commit order
    events_since: str
    #: one session's rows up to a ledger_seq, in commit order (a scope's load): every row of the
    #: session's invocations, so a row whose session column was edited still fails closed there
    session_events: str
    #: the ledger's high-water ledger_seq (0 when empty)
    high_water: str
    #: the sessions with a run that has no terminal fact (an aggregate over the run/terminal index)
    open_sessions: str
    #: a page of the session ids with a row at or below a ledger_seq, after an id (the start scan)
    sessions_page: str
    #: the session ids with a row in (a, b] of ledger_seq
    sessions_between: str
    #: governed execution: a decision with T1 or a refusal, a receipt with T2
    decision: Insert | None = None
    receipt: Insert | None = None

    @classmethod
    def for_engine(cls, engine: Engine) -> HotSQL:
        mark = "?" if engine.dialect.paramstyle == "qmark" else "%s"

        def insert(table: Table, skip: tuple[str, ...] = ()) -> Insert:
            columns = tuple(c.name for c in table.columns if c.name not in skip)
            marks = ", ".join(mark for _ in columns)
            return Insert(f"INSERT INTO {table.name} ({', '.join(columns)}) VALUES ({marks})", columns)

        op_columns = tuple(c.name for c in tool_operations.columns if c.name != "operation_id")
        sets = ", ".join(f"{c} = {mark}" for c in op_columns)
        update = Insert(
            f"UPDATE {tool_operations.name} SET {sets} WHERE operation_id = {mark}",
            (*op_columns, "operation_id"),
        )
        columns = ", ".join(c.name for c in runtime_events.columns)
        return cls(
            event=insert(runtime_events),
            operation=insert(tool_operations),
            # The autoincrement keys are the database's to assign.
            journal=insert(tool_journal_events, skip=("journal_seq",)),
            evidence=insert(tool_evidence),
            attempt=insert(tool_attempts, skip=("attempt_seq",)),
            operation_update=update,
            decision=insert(tool_decisions),
            receipt=insert(action_receipts, skip=("receipt_seq",)),
            events_since=(
                f"SELECT {columns} FROM {runtime_events.name} WHERE ledger_seq > {mark} ORDER BY ledger_seq"
            ),
            session_events=(
                f"SELECT {columns} FROM {runtime_events.name} WHERE invocation_id IN "
                f"(SELECT DISTINCT invocation_id FROM {runtime_events.name} WHERE session_id = {mark}) "
                f"AND ledger_seq <= {mark} ORDER BY ledger_seq"
            ),
            high_water=f"SELECT COALESCE(MAX(ledger_seq), 0) AS seq FROM {runtime_events.name}",
            open_sessions=(
                f"SELECT DISTINCT session_id FROM {runtime_events.name} WHERE run_id IN "
                f"(SELECT run_id FROM {runtime_events.name} GROUP BY run_id "
                "HAVING SUM(CASE WHEN terminal THEN 1 ELSE 0 END) = 0) ORDER BY session_id"
            ),
            sessions_page=(
                f"SELECT DISTINCT session_id FROM {runtime_events.name} WHERE ledger_seq <= {mark} "
                f"AND session_id > {mark} ORDER BY session_id LIMIT {mark}"
            ),
            sessions_between=(
                f"SELECT DISTINCT session_id FROM {runtime_events.name} WHERE ledger_seq > {mark} "
                f"AND ledger_seq <= {mark} ORDER BY session_id"
            ),
        )


@dataclass(frozen=True)
class KeyFacts:
    """What the database's keys hold for a batch a session's fold cannot answer: which event ids
    are committed, each invocation's first spine, which operation ids are bound, each run's
    terminal fact. One read, under the write lock, for every check of a write."""

    events: frozenset[str] = frozenset()
    spines: Mapping[str, tuple[str, str, str]] = field(default_factory=dict)
    owned: frozenset[str] = frozenset()
    terminals: Mapping[str, str] = field(default_factory=dict)
    #: the keys asked (an answer about a key not asked is not an answer)
    asked: frozenset[tuple[str, str]] = frozenset()

    def answers(self, kind: str, keys: Sequence[str]) -> bool:
        return all((kind, k) in self.asked for k in keys)


def read_keys(
    conn: Connection,
    mark: str,
    *,
    events: Sequence[str] = (),
    invocations: Sequence[str] = (),
    operations: Sequence[str] = (),
    runs: Sequence[str] = (),
) -> KeyFacts:
    """Every key lookup of one write as one ``UNION ALL`` statement (rows ``(kind, key, a, b, c)``).
    A per-key ``LIMIT 1`` sits in a derived table, as SQLite and PostgreSQL both allow. Each
    invocation and run is one compound term and SQLite refuses a compound SELECT of more than 500
    terms: a write batch holds at most a few events (the lanes split imports into groups), far below."""
    ev, ops = runtime_events.name, tool_operations.name
    parts: list[str] = []
    params: list[str] = []
    if events:
        parts.append(
            f"SELECT 'e' AS k, event_id AS key, NULL AS a, NULL AS b, NULL AS c FROM {ev} "
            f"WHERE event_id IN ({', '.join(mark for _ in events)})"
        )
        params.extend(events)
    for n, inv in enumerate(invocations):
        parts.append(
            f"SELECT * FROM (SELECT 's' AS k, invocation_id AS key, session_id AS a, run_id AS b, "
            f"turn_id AS c FROM {ev} WHERE invocation_id = {mark} LIMIT 1) AS s{n}"
        )
        params.append(inv)
    if operations:
        parts.append(
            f"SELECT 'o' AS k, operation_id AS key, NULL AS a, NULL AS b, NULL AS c FROM {ops} "
            f"WHERE operation_id IN ({', '.join(mark for _ in operations)})"
        )
        params.extend(operations)
    for n, run in enumerate(runs):
        parts.append(
            f"SELECT * FROM (SELECT 't' AS k, run_id AS key, event_id AS a, NULL AS b, NULL AS c "
            f"FROM {ev} WHERE run_id = {mark} AND terminal ORDER BY ledger_seq LIMIT 1) AS t{n}"
        )
        params.append(run)
    asked = frozenset(
        [("e", k) for k in events]
        + [("s", k) for k in invocations]
        + [("o", k) for k in operations]
        + [("t", k) for k in runs]
    )
    if not parts:
        return KeyFacts(asked=asked)
    found: dict[str, list[tuple[str, Any, Any, Any]]] = {"e": [], "s": [], "o": [], "t": []}
    for kind, key, a, b, c in execute(conn, " UNION ALL ".join(parts), tuple(params)).fetchall():
        found[kind].append((str(key), a, b, c))
    return KeyFacts(
        events=frozenset(k for k, *_ in found["e"]),
        spines={k: (str(a), str(b), str(c)) for k, a, b, c in found["s"]},
        owned=frozenset(k for k, *_ in found["o"]),
        terminals={k: str(a) for k, a, *_ in found["t"]},
        asked=asked,
    )
