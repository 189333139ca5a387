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


def rows_since(conn: Connection, sql: str, after: int) -> list[dict[str, Any]]:
    """The rows ``sql`` selects past ``after``, as column -> value dicts."""
    cursor = execute(conn, sql, (after,))
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
                f"SELECT {', '.join(c.name for c in runtime_events.columns)} FROM {runtime_events.name} "
                f"WHERE ledger_seq > {mark} ORDER BY ledger_seq"
            ),
        )
