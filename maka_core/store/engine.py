"""The engine factory and the one transaction seam every store write goes through.

SQLite is the default backend. pysqlite's own transaction handling is switched off
(``isolation_level=None`` on every connection) so that the ``begin`` event can emit the BEGIN we
choose: writers take ``BEGIN IMMEDIATE`` (the write lock is taken up front, so validation inside
the transaction sees the last committed state and two writers serialize instead of deadlocking on
lock upgrade); readers take a plain ``BEGIN`` (a WAL snapshot), except a single SELECT on the
driver (``select_rows``), which is its own snapshot. A store keeps one connection for its writers
(``KeptConnection``) instead of a pool checkout per write. All pragmas are set in one place,
on every new connection. Any other SQLAlchemy URL (Postgres) goes through the same Core code; there
a writer serializes on ``SELECT ... FOR UPDATE`` of the one-row meta table.

Driver errors are translated once, here, into ``StoreError`` with stable codes. SQLITE_BUSY/LOCKED
is retried only as a whole transaction: a busy BEGIN or COMMIT leaves nothing committed, so
re-running the transaction body is safe.
"""

from __future__ import annotations

import sqlite3
import time
import weakref
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, suppress
from pathlib import Path
from typing import Any, TypeVar

from sqlalchemy import Connection, Engine, create_engine, event, text
from sqlalchemy.exc import DBAPIError, IntegrityError, OperationalError
from sqlalchemy.pool import StaticPool

from maka_core.errors import MakaError, StoreError

T = TypeVar("T")

BUSY_TIMEOUT_MS = 5000
#: Whole-transaction retries after SQLITE_BUSY outlasted busy_timeout.
BUSY_RETRIES = 3

SQLITE_PRAGMAS: tuple[str, ...] = (
    f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}",
    "PRAGMA journal_mode=WAL",
    "PRAGMA synchronous=FULL",
    "PRAGMA foreign_keys=ON",
)


def database_url(target: str | Path) -> str:
    """A SQLAlchemy URL for a path, ``sqlite://`` (memory) or any URL."""
    if isinstance(target, Path):
        return f"sqlite:///{target}"
    if "://" in target:
        return target
    return f"sqlite:///{target}"


def is_sqlite(engine: Engine) -> bool:
    return engine.dialect.name == "sqlite"


def sqlite_file(url: str) -> Path | None:
    """The file behind a SQLite URL, or None for memory and other backends."""
    if not url.startswith("sqlite:///"):
        return None
    path = url[len("sqlite:///") :]
    if not path or path == ":memory:":
        return None
    return Path(path)


def make_engine(target: str | Path) -> Engine:
    """Create the engine for a ledger path or URL with the store's pragmas and BEGIN policy."""
    url = database_url(target)
    if url.startswith("sqlite"):
        file = sqlite_file(url)
        if file is None:
            # One connection holds a memory database; StaticPool shares it across uses.
            engine = create_engine(url, poolclass=StaticPool, connect_args={"check_same_thread": False})
        else:
            engine = create_engine(url, connect_args={"timeout": BUSY_TIMEOUT_MS / 1000})
        _install_sqlite_events(engine, wal=file is not None)
        return engine
    return create_engine(url, pool_pre_ping=True)


def _install_sqlite_events(engine: Engine, *, wal: bool) -> None:
    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn: Any, _record: Any) -> None:
        # Disable pysqlite's implicit BEGIN so ours is the only one.
        dbapi_conn.isolation_level = None
        cur = dbapi_conn.cursor()
        try:
            for pragma in SQLITE_PRAGMAS:
                if "journal_mode" in pragma:
                    if wal:
                        _ensure_wal(cur)
                    continue
                cur.execute(pragma)
        finally:
            cur.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Connection) -> None:
        reader = conn.get_execution_options().get("maka_reader", False)
        # On the driver connection: every transaction starts here, and SQLAlchemy's statement path
        # costs more than the BEGIN itself.
        driver_execute(conn, "BEGIN" if reader else "BEGIN IMMEDIATE", ())


def driver_execute(conn: Connection, sql: str, params: tuple[Any, ...]) -> Any:
    """Run ``sql`` on the driver connection inside ``conn``'s transaction; returns the cursor. A
    driver error is wrapped as SQLAlchemy would wrap it, so ``translate`` sees it as any other."""
    driver = conn.connection.driver_connection
    assert driver is not None
    try:
        return driver.execute(sql, params)
    except conn.dialect.loaded_dbapi.Error as exc:
        raise DBAPIError.instance(sql, params, exc, conn.dialect.loaded_dbapi.Error) from exc


def _ensure_wal(cur: Any) -> None:
    """Put the file in WAL mode once (it is a property of the file, kept across connections).

    Two processes opening a fresh file at once race for the switch, and the loser gets SQLITE_BUSY
    straight away (the busy handler does not cover a journal-mode change), so it waits a moment and
    reads the mode again: by then the winner has usually made it WAL and there is nothing to do.
    """
    deadline = time.monotonic() + BUSY_TIMEOUT_MS / 1000
    while True:
        try:
            if str(cur.execute("PRAGMA journal_mode").fetchone()[0]).lower() != "wal":
                cur.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as exc:
            busy = "locked" in str(exc).lower() or "busy" in str(exc).lower()
            if not busy or time.monotonic() > deadline:
                raise
            time.sleep(0.02)


def _is_busy(exc: DBAPIError) -> bool:
    text_ = str(exc.orig).lower()
    return "database is locked" in text_ or "database is busy" in text_ or "locked" in text_


def translate(exc: DBAPIError) -> StoreError:
    """One place where driver errors become stable codes."""
    if isinstance(exc, OperationalError) and _is_busy(exc):
        return StoreError("store_busy", "the ledger stayed locked past busy_timeout")
    if isinstance(exc, IntegrityError):
        return StoreError("store_constraint_violation", str(exc.orig))
    health = _health_fault(exc.orig)
    if health is not None:
        return StoreError(health, str(exc.orig))
    message = str(exc.orig).lower()
    if "malformed" in message or "not a database" in message or "corrupt" in message:
        return StoreError("store_unreadable", str(exc.orig))
    return StoreError("store_io_failed", str(exc.orig))


#: SQLITE_READONLY and SQLITE_FULL (primary codes; extended codes keep them in the low byte).
_SQLITE_HEALTH = {8: "ledger_unwritable", 13: "ledger_full"}
#: PostgreSQL: read_only_sql_transaction, disk_full, insufficient_privilege.
_PG_HEALTH = {"25006": "ledger_unwritable", "53100": "ledger_full", "42501": "ledger_unwritable"}


def _health_fault(orig: BaseException | None) -> str | None:
    """``ledger_unwritable`` / ``ledger_full`` when the database says so (see ``store.health``)."""
    code = getattr(orig, "sqlite_errorcode", None)
    if isinstance(code, int):
        return _SQLITE_HEALTH.get(code & 0xFF)
    state = getattr(orig, "sqlstate", None) or getattr(orig, "pgcode", None)
    if isinstance(state, str):
        return _PG_HEALTH.get(state)
    message = str(orig).lower()
    if "readonly database" in message or "read-only" in message:
        return "ledger_unwritable"
    if "disk is full" in message:
        return "ledger_full"
    return None


@contextmanager
def read_tx(engine: Engine) -> Iterator[Connection]:
    """A read transaction (a consistent snapshot); driver errors come out as ``StoreError``."""
    try:
        with engine.connect() as conn:
            conn = conn.execution_options(maka_reader=True)
            with conn.begin():
                yield conn
    except DBAPIError as exc:
        raise translate(exc) from exc


def select_rows(
    engine: Engine, sql: str, params: tuple[Any, ...], *, kept: KeptConnection | None = None
) -> list[dict[str, Any]]:
    """One driver-SQL SELECT on a SQLite connection, outside SQLAlchemy's ``Connection``: the
    statement is its own read transaction (one WAL snapshot), which is all a single read needs, and
    it costs a fraction of a ``read_tx``. It runs on ``kept`` when that is idle (no writer
    transaction open on it), else on a pooled connection. Driver errors come out as ``StoreError``."""
    dbapi_error = engine.dialect.loaded_dbapi.Error
    idle = kept.idle_driver() if kept is not None else None
    try:
        raw = None if idle is not None else engine.raw_connection()
    except DBAPIError as exc:
        raise translate(exc) from exc
    try:
        driver: Any = idle if raw is None else raw.driver_connection
        cursor = driver.execute(sql, params)
        names = [d[0] for d in cursor.description]
        return [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]
    except dbapi_error as exc:
        if kept is not None and idle is not None:
            kept.close()
        wrapped = DBAPIError.instance(sql, params, exc, dbapi_error)
        assert isinstance(wrapped, DBAPIError)  # a driver error always wraps as one
        raise translate(wrapped) from exc
    finally:
        if raw is not None:
            raw.close()


#: The ledger identity each PostgreSQL engine first wrote to (one engine per opened store).
_WRITING_TO: weakref.WeakKeyDictionary[Engine, str] = weakref.WeakKeyDictionary()


def lock_and_check_identity(engine: Engine, conn: Connection) -> None:
    """Take the writer lock (the meta row) and refuse a ledger that is not the one this engine wrote
    to before: SQLite's per-write stat has no file to look at here, and a schema dropped and created
    again under a live worker would otherwise take its next event as if nothing had happened.
    ``*``: a version 1 ledger being migrated has no ``ledger_id`` column yet."""
    row = conn.execute(text("SELECT * FROM maka_meta WHERE id = 1 FOR UPDATE")).mappings().first()
    found = None if row is None else row.get("ledger_id")
    if found is None:
        return
    pinned = _WRITING_TO.setdefault(engine, str(found))
    if pinned != found:
        raise StoreError(
            "ledger_replaced",
            "the ledger's identity changed under this process",
            ledgerId=pinned,
            foundId=found,
        )


class KeptConnection:
    """One SQLAlchemy connection kept open between a store's writer transactions (SQLite files).

    Checking a pooled connection out and back in costs more than a durable commit's Python side;
    the store runs one writer at a time (under its lock), so it can keep one connection instead.
    A transaction that fails in any way closes it (a fresh one is taken next time), so no state of a
    failed transaction outlives it. ``close`` (the store's) returns it to the pool; a store dropped
    without closing returns it when collected. SQLAlchemy opens file databases with
    ``check_same_thread=False``, so whichever thread holds the store's lock may use it.
    """

    def __init__(self, engine: Engine) -> None:
        self._engine = engine
        self._slot: list[Connection] = []
        weakref.finalize(self, _close_kept, self._slot)

    @contextmanager
    def __call__(self) -> Iterator[Connection]:
        if self._slot and (self._slot[0].closed or self._slot[0].invalidated):
            _close_kept(self._slot)
        if not self._slot:
            self._slot.append(self._engine.connect())
        conn = self._slot[0]
        try:
            yield conn
        except BaseException:
            _close_kept(self._slot)
            raise

    def idle_driver(self) -> Any:
        """The kept connection's driver connection when no transaction is open on it, else None."""
        if not self._slot or self._slot[0].closed or self._slot[0].invalidated:
            return None
        conn = self._slot[0]
        if conn.in_transaction():
            return None
        driver = conn.connection.driver_connection
        return None if driver is None or driver.in_transaction else driver

    def close(self) -> None:
        _close_kept(self._slot)


def _close_kept(slot: list[Connection]) -> None:
    while slot:
        with suppress(DBAPIError):
            slot.pop().close()


def run_write(
    engine: Engine,
    body: Callable[[Connection], T],
    *,
    on_abort: Callable[[], None],
    connect: Callable[[], AbstractContextManager[Connection]] | None = None,
) -> T:
    """Run ``body`` in one writer transaction (BEGIN IMMEDIATE / row lock) and commit once.

    ``on_abort`` runs whenever the transaction did not commit (so callers can drop in-memory state
    that may have run ahead of the database). ``MakaError`` from the body passes through unchanged;
    driver errors are translated; a busy database is retried as a whole transaction. ``connect``
    gives the connection (a ``KeptConnection``); by default one is checked out of the pool.
    """
    attempt = 0
    while True:
        try:
            with (connect or engine.connect)() as conn, conn.begin():
                if not is_sqlite(engine):
                    lock_and_check_identity(engine, conn)
                return body(conn)
        except MakaError:
            on_abort()
            raise
        except DBAPIError as exc:
            on_abort()
            err = translate(exc)
            if err.code == "store_busy" and attempt < BUSY_RETRIES:
                attempt += 1
                time.sleep(0.05 * attempt)
                continue
            raise err from exc
        except BaseException:
            on_abort()
            raise
