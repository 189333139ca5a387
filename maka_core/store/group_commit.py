"""Group commit: several writers' transactions as SAVEPOINTs of ONE transaction, ONE durable commit.

The runtime's ledger thread runs every session's ledger work one item at a time, and each writer
is one short transaction with one fsync. When several sessions' items are queued, the thread can
run them inside one open transaction instead (``LedgerStore.group``): each writer is a SAVEPOINT
(``_write`` inside a group), the store's reads on that thread go through the same connection (so
a member sees what earlier members wrote), and the transaction commits once at the end. The
callers are released only after that commit returns (``runtime.ledger_executor``), so "T1 is
durable before the effect" holds member by member.

Failures, and what each rolls back:
- a writer that refuses (``MakaError``: conflict, corruption, a shape error) or raises any other
  non-driver error: ROLLBACK TO its SAVEPOINT; the members before it keep their writes. The
  in-memory view is dropped and rebuilt from this transaction on the next write (it sees the
  earlier members' rows), exactly as a failed transaction drops it outside a group;
- a driver error inside a writer (I/O, disk full, busy): the connection's state is unknown, so
  the group is *broken*: the whole transaction rolls back and every member run so far fails;
- the final COMMIT failing: nothing of the group is durable; every member fails, the view is
  dropped (``_abort``) and rebuilt from the database by the next write.
PostgreSQL runs the same code (SAVEPOINT is standard; the writer lock is taken once per group).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from typing import TypeVar

from sqlalchemy import Connection, Engine
from sqlalchemy.exc import DBAPIError

from maka_core.errors import StoreError
from maka_core.store.engine import is_sqlite, lock_and_check_identity, translate

T = TypeVar("T")


class GroupBroken(StoreError):
    """A driver error inside a member: the shared transaction is rolled back as a whole."""

    default_code = "ledger_group_aborted"


@dataclass
class WriteGroup:
    """The open shared transaction, owned by one thread."""

    conn: Connection
    thread: int
    broken: StoreError | None = None

    def owned_here(self) -> bool:
        return self.thread == threading.get_ident()

    def member(self, body: Callable[[Connection], T], on_refusal: Callable[[], None]) -> T:
        """One writer as a SAVEPOINT of the group (see the module docstring for failures)."""
        if self.broken is not None:
            raise GroupBroken(message="the shared ledger transaction was rolled back", cause=self.broken.code)
        savepoint = self.conn.begin_nested()
        try:
            result = body(self.conn)
        except DBAPIError as exc:
            self.broken = translate(exc)
            raise self.broken from exc
        except BaseException:
            try:
                savepoint.rollback()
            except DBAPIError as exc:
                self.broken = translate(exc)
                raise
            finally:
                on_refusal()
            raise
        try:
            savepoint.commit()
        except DBAPIError as exc:
            self.broken = translate(exc)
            raise self.broken from exc
        return result


@contextmanager
def open_group(engine: Engine, *, on_abort: Callable[[], None]) -> Iterator[WriteGroup]:
    """BEGIN IMMEDIATE (or the PostgreSQL writer lock) once; COMMIT once when the block ends.

    Raises:
        StoreError: the translated driver error of BEGIN or COMMIT (``on_abort`` has run), or the
            group's own breakage (``ledger_group_aborted`` / the driver code).
    """
    try:
        conn = engine.connect()
    except DBAPIError as exc:
        raise translate(exc) from exc
    try:
        try:
            tx = conn.begin()
            if not is_sqlite(engine):
                lock_and_check_identity(engine, conn)
        except DBAPIError as exc:
            raise translate(exc) from exc
        group = WriteGroup(conn, threading.get_ident())
        try:
            yield group
            if group.broken is not None:
                raise group.broken
            tx.commit()
        except BaseException as exc:
            on_abort()
            # Nothing of the group committed. A commit that failed part-way can leave the driver
            # connection inside its transaction, so it is discarded, never returned to the pool.
            with suppress(DBAPIError):
                if tx.is_active:
                    tx.rollback()
            conn.invalidate()
            if isinstance(exc, DBAPIError):
                raise translate(exc) from exc
            raise
    finally:
        conn.close()
