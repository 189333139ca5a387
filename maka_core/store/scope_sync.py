"""The store's resident session scopes (``store.scopes``), kept current with the ledger.

A mixin of ``LedgerStore``: every writer transaction and every ``view`` first folds the rows
committed since the store's cursor (by ``ledger_seq``, other processes' included) into the scopes
it holds, and loads a session's scope the first time the session is named. A row of a session
no scope holds is checked by folding that session once, so corruption anywhere stops the tool
boundaries; the record of a corrupt session (``_corrupt``) outlives any scope set an abort drops.
The attributes below are the store's, set in ``LedgerStore.__init__``.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any

from sqlalchemy import Connection, Engine

from maka_core.facts.events import RuntimeEvent
from maka_core.ledger.committed import CommittedView
from maka_core.ledger.scanner import LedgerIssue
from maka_core.store.engine import KeptConnection, select_rows
from maka_core.store.group_commit import WriteGroup
from maka_core.store.health import LedgerHealth
from maka_core.store.hot_sql import HotSQL, rows_since
from maka_core.store.schema import ledger_id
from maka_core.store.scopes import SessionScope, SessionScopes


class ScopeSync:
    """Resident scopes, the cursor they are current with, and the corruption seen while folding."""

    engine: Engine
    health: LedgerHealth
    _lock: threading.RLock
    _sql: HotSQL
    #: A SQLite file's writers' one connection (``engine.KeptConnection``), else None.
    _kept: KeptConnection | None
    #: SQLite: ``view`` catches up with one driver SELECT (``engine.select_rows``).
    _fast_reads: bool
    #: The shared transaction of a group commit, while one is open.
    _group: WriteGroup | None
    #: The sessions this store serves, each folded once; None until the first sync, and dropped
    #: whenever a transaction does not commit.
    _scopes: SessionScopes | None
    #: The ledger_seq every resident scope is current with.
    _cursor: int
    #: Every committed row at or below this ledger_seq is the start scan's, or has been folded in
    #: its session's scope (resident, or loaded to check it): nothing is skipped unchecked.
    _checked: int
    #: session id -> its first issue, for every corrupt session seen since the store opened:
    #: sticky like ``health.failure`` (an abort drops the scopes, never this record).
    _corrupt: dict[str, LedgerIssue]

    if TYPE_CHECKING:

        def _reading(self) -> AbstractContextManager[Connection]: ...

    def _record_corrupt(self, session_id: str, issue: LedgerIssue) -> None:
        self._corrupt.setdefault(session_id, issue)

    def _sync(self, conn: Connection) -> SessionScopes:
        """Fold rows committed since the cursor into the resident scopes."""
        if self._scopes is None:
            # A fresh start (first use, or after an abort) re-reads the identity, starts at the
            # high-water and folds the sessions with an open run, the ones live work and a
            # corruption gate need: O(open sessions), whatever the ledger's history. Any other
            # session loads when it is named.
            self.health.check_id(ledger_id(conn))
            self._scopes = self._new_scopes()
            self._cursor = int(rows_since(conn, self._sql.high_water)[0]["seq"])
            for row in rows_since(conn, self._sql.open_sessions):
                self._scope(conn, str(row["session_id"]))
            # Rows committed since the last check (the start scan's bound, or before an abort)
            # of sessions not resident now: each such session is folded once to check them.
            gap = rows_since(conn, self._sql.sessions_between, self._checked, self._cursor)
            self._check_sessions(conn, [str(r["session_id"]) for r in gap])
            self._checked = self._cursor
            return self._scopes
        self._fold_rows(rows_since(conn, self._sql.events_since, self._cursor), conn)
        return self._scopes

    def _fold_rows(self, rows: list[dict[str, Any]], conn: Connection | None = None) -> None:
        scopes = self._scopes
        assert scopes is not None
        others: list[str] = []
        for row in rows:
            scope = scopes.peek(row["session_id"])
            if scope is not None:
                scope.fold_row(row)
                self._note(scope)
            elif row["session_id"] not in others:
                others.append(str(row["session_id"]))
            self._cursor = int(row["ledger_seq"])
        # Another process's rows of a session no scope holds: folded in a throwaway scope of the
        # session (all its rows), so corruption there stops the boundaries as it would resident.
        self._check_sessions(conn, others)
        self._checked = self._cursor

    def _check_sessions(self, conn: Connection | None, session_ids: Sequence[str]) -> None:
        scopes = self._scopes
        assert scopes is not None
        for session_id in session_ids:
            if session_id not in scopes:
                self._note(self._load(conn, session_id))

    def _scope(self, conn: Connection | None, session_id: str) -> SessionScope:
        """The session's resident scope, loaded (every row up to the cursor) if it is not;
        ``conn`` None: read on the driver (``view``'s fast path)."""
        scopes = self._scopes
        assert scopes is not None
        scope = scopes.use(session_id)
        if scope is None:
            scope = self._load(conn, session_id)
            scopes.put(session_id, scope)
            self._note(scope)
        return scope

    def _load(self, conn: Connection | None, session_id: str) -> SessionScope:
        """A fold of the session's rows up to the cursor (one indexed read)."""
        scope = SessionScope(session_id)
        params = (session_id, self._cursor)
        if conn is None:
            rows = select_rows(self.engine, self._sql.session_events, params, kept=self._kept)
        else:
            rows = rows_since(conn, self._sql.session_events, *params)
        for row in self._session_rows(rows):
            scope.fold_row(row)
        return scope

    def _note(self, scope: SessionScope) -> None:
        """Remember a corrupt scope's first issue, for good (kept when the scope is dropped)."""
        scanner = scope.view.scanner
        if scanner.has_corruption:
            self._corrupt.setdefault(scope.session_id, scanner.issues[0])

    def _first_corrupt(self) -> LedgerIssue | None:
        """The first issue of the first corrupt session seen, or None."""
        return next(iter(list(self._corrupt.values())), None)

    def _new_scopes(self) -> SessionScopes:
        """The resident-scope set (its bounds: ``store.scopes``)."""
        return SessionScopes()

    def _session_rows(self, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The rows a scope loads from, as read."""
        return rows

    def view(self, session_id: str) -> CommittedView:
        """The session's committed events, folded and brought up to date with other processes'
        commits (one read of the rows past the cursor, usually none; the session's rows, when it
        is not resident). Use it on the thread that owns this store."""
        return self._resident(session_id).view

    def session_events(self, session_id: str) -> list[RuntimeEvent]:
        """The session's committed events in ledger order, as ``events(session_id=...)`` returns
        them, from its resident scope: only the rows committed since the last read are read and
        decoded (``view``'s one read past the cursor), each row once for as long as the session
        stays resident. The list is the caller's (a copy of the references). Use it on the thread
        that owns this store."""
        with self._lock:
            return list(self._resident(session_id).events)

    def _resident(self, session_id: str) -> SessionScope:
        with self._lock:
            group = self._group
            in_group = group is not None and group.owned_here()
            if self._scopes is not None and self._fast_reads and not in_group:
                # The runtime asks before every step and call: one SELECT past the cursor, on the
                # driver (a fresh start, which re-reads the identity, takes the path below).
                rows = select_rows(self.engine, self._sql.events_since, (self._cursor,), kept=self._kept)
                self._fold_rows(rows)
                return self._scope(None, session_id)
            with self._reading() as conn:
                self._sync(conn)
                return self._scope(conn, session_id)


__all__ = ["ScopeSync"]
