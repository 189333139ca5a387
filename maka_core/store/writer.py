"""The ledger store: immutable RuntimeEvents, their projections, and the dedicated writers.

Every writer is ONE short transaction with ONE durable commit. Inside it, the store brings its
in-memory session scopes (``store.scopes``: one ``LedgerScanner`` fold per session it serves) up to
date with rows other processes committed (by ``ledger_seq``, so validation costs O(new rows), never
a rescan), loads the batch's session scope if it is not resident (one indexed read of that
session), recognises an exact retry (same id, same canonical bytes: a no-op), asks the session's
scanner to ``admit`` the batch (an admitted batch stays folded in it), checks the identities that
cross sessions (event id, invocation, operation) against the database, inserts the events, and
writes the projections the scanner derives for the touched operations. If the transaction does not
commit, every scope is dropped and reloaded on demand, so none can run ahead of the database.
Corruption anywhere in the ledger stops every tool-boundary writer (T1, T2, recovery bundle),
exact retries included: in history before the store opened once its start scan
(``store.verification``) reaches it; in any row the store folds since (a resident session's, or
another process's row of a session it does not hold, folded with its session to check it) at
once. The record is the store's, sticky; ``maka audit`` and ``verify`` read the whole ledger.

Every row read is re-decoded and checked against its identity columns; a row whose payload
disagrees with its columns fails closed (``row_payload_identity_mismatch``).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from sqlalchemy import Connection, Engine, RowMapping, select
from sqlalchemy.pool import StaticPool

from maka_core import failpoints
from maka_core.errors import CodecError, LedgerRejection, StoreError
from maka_core.facts import canonical_json, codec
from maka_core.facts.clock import now_ms
from maka_core.facts.events import RuntimeEvent
from maka_core.facts.run_header import RunHeader
from maka_core.ledger.committed import CommittedView
from maka_core.ledger.projections import JournalRow, OperationRow, journal_rows, operation_row
from maka_core.ledger.scanner import LedgerIssue, LedgerScanner, Transition, group_transitions
from maka_core.store.chain import chain_digest
from maka_core.store.continuations import ContinuationWrites
from maka_core.store.engine import (
    KeptConnection,
    database_url,
    is_sqlite,
    make_engine,
    read_tx,
    run_write,
    select_rows,
    sqlite_file,
)
from maka_core.store.fences import FenceRecords
from maka_core.store.governance_rows import (
    GovernanceRecords,
    insert_certificate,
    insert_decision,
    insert_receipt,
)
from maka_core.store.group_commit import WriteGroup, open_group
from maka_core.store.health import LedgerHealth, create_private, unwritable
from maka_core.store.hot_sql import HotSQL, KeyFacts, read_keys, rows_since
from maka_core.store.reads import LedgerReads, _detail
from maka_core.store.rows import Prefix, event_columns, row_event
from maka_core.store.runs import RunHeaderStore, write_run_header
from maka_core.store.schema import (
    ledger_id,
    maka_meta,
    migrate,
    refuse_newer,
    runtime_events,
    sqlite_file_version,
    tool_attempts,
)
from maka_core.store.scopes import SessionScope, SessionScopes
from maka_core.store.session_index import IndexUpkeep, rebuild_index
from maka_core.store.verification import LedgerVerification

BOUNDARY_TRANSITIONS: frozenset[str] = frozenset({"t1_prepare", "t2_outcome", "recovery_bundle"})


@dataclass(frozen=True)
class ToolAttempt:
    """The Temporal attempt that performed a write (audit only, never an identity)."""

    workflow_id: str | None = None
    workflow_run_id: str | None = None
    activity_id: str | None = None
    attempt: int | None = None


@dataclass(frozen=True)
class CommitResult:
    """``created`` is False for an exact retry; ``ledger_seq`` is the batch's last position."""

    created: bool
    event_ids: tuple[str, ...]
    ledger_seq: int
    created_ids: tuple[str, ...] = ()


@dataclass(frozen=True)
class ImportResult:
    """How many events an import wrote, and how many were already present (exact retries)."""

    imported: int
    existing: int


AttemptArg = ToolAttempt | Mapping[str, Any] | None
_Hook = Callable[[Connection], None]


def _attempt(value: AttemptArg) -> ToolAttempt | None:
    if value is None or isinstance(value, ToolAttempt):
        return value
    return ToolAttempt(**dict(value))


def _row_values(row: Any) -> dict[str, Any]:
    """A flat row dataclass as column values (``asdict`` deep-copies; these hold scalars only)."""
    return {name: getattr(row, name) for name in _field_names(type(row))}


_FIELD_NAMES: dict[type, tuple[str, ...]] = {}


def _field_names(cls: type) -> tuple[str, ...]:
    names = _FIELD_NAMES.get(cls)
    if names is None:
        names = _FIELD_NAMES[cls] = tuple(f.name for f in fields(cls))
    return names


def _canonical(event: RuntimeEvent) -> str:
    """The canonical line, refusing an event that would not mean the same after a round trip."""
    wire = event.to_wire()
    line, plain = canonical_json.dumps_plain(wire)
    # ``codec.decode(line)``, without parsing the line again when that would only give back ``wire``.
    if codec.from_json_object(wire if plain else canonical_json.loads(line)) != event:
        raise CodecError(
            "runtime_event_not_lossless", "event is not losslessly serializable", eventId=event.id
        )
    return line


def _operation_ids(event: RuntimeEvent) -> set[str]:
    ids: set[str] = set()
    if event.refs is not None and event.refs.operation_id is not None:
        ids.add(event.refs.operation_id)
    if event.actions is not None:
        if event.actions.tool_dispatch is not None:
            ids.add(event.actions.tool_dispatch.operation_id)
        if event.actions.tool_recovery is not None:
            ids.add(event.actions.tool_recovery.payload.operation_id)
    return ids


class LedgerStore(ContinuationWrites, FenceRecords, RunHeaderStore, GovernanceRecords, LedgerReads):
    """One ledger database (SQLite file, SQLite memory or any SQLAlchemy URL)."""

    def __init__(self, engine: Engine, url: str) -> None:
        self.engine = engine
        self.url = url
        #: The sessions this store serves, each folded once (``store.scopes``); None until the
        #: first sync, and dropped whenever a transaction does not commit.
        self._scopes: SessionScopes | None = None
        #: The ledger_seq every resident scope is current with.
        self._cursor = 0
        self._lock = threading.RLock()
        #: session id -> its first issue, for every corrupt session seen since the store opened:
        #: sticky like ``health.failure`` (an abort drops the scopes, never this record).
        self._corrupt: dict[str, LedgerIssue] = {}
        #: The shared transaction of a group commit, while one is open (``group``).
        self._group: WriteGroup | None = None
        self._index = IndexUpkeep()  # the session index rows a transaction changes
        self._sql = HotSQL.for_engine(engine)
        #: A SQLite file's writers reuse one connection (``engine.KeptConnection``).
        self._kept = KeptConnection(engine) if sqlite_file(url) is not None else None
        #: SQLite: ``view`` catches up with one driver SELECT (``engine.select_rows``).
        self._fast_reads = is_sqlite(engine)
        self._mark = "?" if self._fast_reads else "%s"
        with read_tx(engine) as conn:
            #: The file and identity opened; checked before every writer transaction.
            self.health = LedgerHealth(sqlite_file(url), ledger_id(conn))
            start = int(rows_since(conn, self._sql.high_water)[0]["seq"])
        #: Every committed row at or below this ledger_seq is the start scan's, or has been folded
        #: in its session's scope (resident, or loaded to check it): nothing is skipped unchecked.
        self._checked = start
        #: The start scan of the history up to ``start`` (``store.verification``).
        self.verification = self._start_verification(start)
        if self.verification is not None:
            self.health.progress = self.verification.to_json

    # --- lifecycle -------------------------------------------------------------------------

    @classmethod
    def open(cls, target: str | Path) -> LedgerStore:
        """Open (creating and migrating if needed) the ledger at a path or URL.

        Raises:
            StoreError: ``schema_too_new`` (nothing written), ``store_unreadable``, or
                ``ledger_unwritable`` when the open failed on a read-only file, directory or
                file system.
        """
        url = database_url(target)
        file = sqlite_file(url)
        try:
            if file is not None:
                version = sqlite_file_version(file)
                if version is not None:
                    refuse_newer(version)
                create_private(file)
            engine = make_engine(url)
            try:
                migrate(engine, backfill=rebuild_index)
                return cls(engine, url)
            except BaseException:
                engine.dispose()
                raise
        except (StoreError, OSError) as exc:
            cause = unwritable(file) if file is not None else None
            if cause is None or (isinstance(exc, StoreError) and exc.code == "schema_too_new"):
                raise
            raise cause from exc

    def close(self) -> None:
        if self.verification is not None:
            self.verification.stop()
        if self._kept is not None:
            with self._lock:  # never under a writer that is using it
                self._kept.close()
        self.engine.dispose()

    def __enter__(self) -> LedgerStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- the transaction seam --------------------------------------------------------------

    def _abort(self) -> None:
        self._scopes = None
        self._cursor = 0
        self._index.reset()

    def _touch_session(self, session_id: str) -> None:
        self._index.touch(session_id)

    def _write(self, write: Callable[[Connection], Any]) -> Any:
        body = self._index.following(write)  # the session index follows, in the same transaction
        group = self._group
        if group is not None and group.owned_here():
            return group.member(body, self._abort)
        with self._lock:
            self.health.check()
            try:
                return run_write(self.engine, body, on_abort=self._abort, connect=self._kept)
            except StoreError as exc:
                self.health.note(exc)
                raise

    @contextmanager
    def group(self) -> Iterator[WriteGroup]:
        """Group commit (``store.group_commit``): every writer this thread runs inside the block is
        a SAVEPOINT of one transaction, committed once (one fsync) when the block ends; reads on
        this thread see the group's writes. Other threads' writers wait for the group.

        Raises:
            StoreError: BEGIN or COMMIT failed, or a driver error broke the group; nothing of the
                group is then durable.
        """
        with self._lock:
            self.health.check()
            try:
                with open_group(self.engine, on_abort=self._abort) as group:
                    self._group = group
                    try:
                        yield group
                    finally:
                        self._group = None
            except StoreError as exc:
                self.health.note(exc)
                raise

    def _reading(self) -> AbstractContextManager[Connection]:
        group = self._group
        if group is not None and group.owned_here():
            return nullcontext(group.conn)
        return read_tx(self.engine)

    def check_health(self) -> None:
        """A real (empty) write transaction, for a worker before it serves: a ledger that is
        replaced, read-only or out of space refuses here instead of mid-turn.

        Raises:
            StoreError: ``ledger_replaced``, ``ledger_unwritable``, ``ledger_full`` (or another
                store code).
        """

        def probe(conn: Connection) -> None:
            self.health.check_id(ledger_id(conn))
            conn.execute(
                maka_meta.update().where(maka_meta.c.id == 1).values(ledger_id=maka_meta.c.ledger_id)
            )

        self._write(probe)

    def _start_verification(self, upto: int) -> LedgerVerification | None:
        """Verify the history up to ``upto`` in the background (a memory database, whose one
        connection no second thread may use, is verified here, before the store serves)."""
        memory = isinstance(self.engine.pool, StaticPool)
        # Its own engine (connections, pool, listeners): the writers' are never waited on.
        engine = self.engine if memory or upto == 0 else make_engine(self.url)
        own = engine is not self.engine
        scan = LedgerVerification(engine, self._sql, upto, self._record_corrupt, own=own)
        if memory or upto == 0:
            scan.run()  # an empty history verifies at once
        else:
            scan.start()
        return scan

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
        with self._lock:
            group = self._group
            in_group = group is not None and group.owned_here()
            if self._scopes is not None and self._fast_reads and not in_group:
                # The runtime asks before every step and call: one SELECT past the cursor, on the
                # driver (a fresh start, which re-reads the identity, takes the path below).
                rows = select_rows(self.engine, self._sql.events_since, (self._cursor,), kept=self._kept)
                self._fold_rows(rows)
                return self._scope(None, session_id).view
            with self._reading() as conn:
                self._sync(conn)
                return self._scope(conn, session_id).view

    def _stored(self, conn: Connection, ids: Sequence[str]) -> dict[str, RowMapping]:
        rows = conn.execute(select(runtime_events).where(runtime_events.c.event_id.in_(list(ids)))).mappings()
        out = {}
        for row in rows:
            row_event(row)  # fail closed on a row that disagrees with its payload
            out[row["event_id"]] = row
        return out

    def _admit_group(
        self,
        conn: Connection,
        transition: Transition,
        batch: Sequence[RuntimeEvent],
        *,
        evidence: Mapping[str, Any] | None = None,
        attempt: ToolAttempt | None = None,
        synced: bool = False,
        strict: bool = True,
        partial_retry: bool = False,
        live: bool = False,
    ) -> CommitResult:
        # A multi-group transaction syncs once: the write lock keeps other writers out meanwhile.
        if not synced or self._scopes is None:
            self._sync(conn)
        scope = self._scope(conn, batch[0].session_id)
        scanner = scope.view.scanner
        lines = [_canonical(e) for e in batch]
        corrupt = scanner.issues[0] if scanner.has_corruption else self._first_corrupt()
        if transition in BOUNDARY_TRANSITIONS and corrupt is not None:
            # Corruption in any session folded here (every open one, from the start) stops every
            # tool boundary, exact retries included.
            issue = corrupt
            raise LedgerRejection(
                issue.code, "the ledger is corrupt; tool boundaries are stopped", **_detail(issue)
            )
        # The session's scanner has folded every committed row of the session (synced under the
        # write lock), so only an id it knows, or another session's row found by its key, can be
        # an exact retry.
        known = [e.id for e in batch if scanner.position(e.id) is not None]
        keys = self._read_keys(conn, scope, scanner, [e for e in batch if e.id not in known], live)
        known.extend(e.id for e in batch if e.id in keys.events)
        stored = self._stored(conn, known) if known else {}
        fresh: list[tuple[RuntimeEvent, str]] = []
        for event, line in zip(batch, lines, strict=True):
            row = stored.get(event.id)
            if row is None:
                fresh.append((event, line))
            elif row["payload_json"] != line:
                raise LedgerRejection(
                    "duplicate_event_id",
                    "an event with this id is already committed with other bytes",
                    eventId=event.id,
                )
        ids = tuple(e.id for e in batch)
        if not fresh:
            return CommitResult(False, ids, max(int(r["ledger_seq"]) for r in stored.values()))
        if live:
            foreign = self._foreign_terminal(conn, scope, fresh, keys)
            _refuse_after_terminal(scope.view, [e for e, _ in fresh], foreign)
        t1_call_committed = transition == "t1_prepare" and [e.id for e, _ in fresh] == [batch[-1].id]
        if stored and not (t1_call_committed or partial_retry) and transition != "generic_append":
            # Only T1 may find its call already committed; any other partial retry is a conflict.
            # An import (``partial_retry``) checks only the rest, as the reference's transition
            # check does with the candidates an existing prefix does not hold.
            first = next(e for e in batch if e.id in stored)
            raise LedgerRejection("duplicate_event_id", "partial retry of an atomic batch", eventId=first.id)
        new_batch = [e for e, _ in fresh]
        crossing = _crossing_identities(scanner, new_batch)
        # The admitted batch stays folded in the scanner (no second fold below): if this
        # transaction does not commit, ``_abort`` drops every scope anyway.
        scanned = {id(e) for e in scanner.admit(new_batch, transition, strict=strict, keep=True)}
        self._check_crossing(conn, crossing, keys)
        seq = self._insert_events(conn, transition, fresh, scope)
        for event in new_batch:
            scope.view.fold(event, scanned=id(event) in scanned)
        self._cursor = seq
        self._after_insert(conn, transition, new_batch, scope, evidence=evidence, attempt=attempt)
        self._index.saw(new_batch)
        return CommitResult(True, ids, seq, tuple(e.id for e in new_batch))

    def _read_keys(
        self,
        conn: Connection,
        scope: SessionScope,
        scanner: LedgerScanner,
        unknown: Sequence[RuntimeEvent],
        live: bool,
    ) -> KeyFacts:
        """One read of every key the batch's events the session has not folded may meet elsewhere:
        their ids, the invocations and operation ids the session has not seen, and (live) the
        terminal facts of runs it has not seen. A superset of what the checks below ask."""
        if not unknown:
            return KeyFacts()
        crossing = _crossing_identities(scanner, unknown)
        runs = sorted({e.run_id for e in unknown} - scope.view.first_of_run.keys()) if live else []
        return read_keys(
            conn,
            self._mark,
            events=[e.id for e in unknown],
            invocations=[e.invocation_id for e, _ in crossing.invocations],
            operations=sorted({op for _, op, _ in crossing.operations}),
            runs=runs,
        )

    def _foreign_terminal(
        self, conn: Connection, scope: SessionScope, fresh: Sequence[tuple[RuntimeEvent, str]], keys: KeyFacts
    ) -> dict[str, str]:
        """The terminal facts of the batch's runs this session has never seen (a run id another
        session uses), from the run/terminal index: the full fold refuses what follows them too."""
        runs = sorted({e.run_id for e, _ in fresh} - scope.view.first_of_run.keys())
        if not keys.answers("t", runs):  # never today (the write's read covers the batch); kept as a net
            keys = read_keys(conn, self._mark, runs=runs)
        return {run: keys.terminals[run] for run in runs if run in keys.terminals}

    def _check_crossing(self, conn: Connection, crossing: _Crossing, keys: KeyFacts) -> None:
        """The fold's identity checks for what only another session can hold: an invocation seen
        first under another spine, an operation id bound to another call, a batch of two sessions
        (the scanner of the batch's session cannot see them; the database's keys can)."""
        invocations = [e.invocation_id for e, _ in crossing.invocations]
        operations = [op for _, op, _ in crossing.operations]
        if not (keys.answers("s", invocations) and keys.answers("o", operations)):  # a net, as above
            keys = read_keys(conn, self._mark, invocations=invocations, operations=operations)
        for event, spine in crossing.invocations:
            found = keys.spines.get(event.invocation_id)
            if found is not None and found != spine:
                raise _crossing_rejection("invocation_identity_conflict", event)
        for event, op_id, call_id in crossing.operations:
            if op_id in keys.owned:
                raise _crossing_rejection("duplicate_operation", event, op_id, call_id)
        if crossing.sessions > 1:
            raise _crossing_rejection("invocation_identity_conflict", crossing.first)

    def _insert_events(
        self,
        conn: Connection,
        transition: Transition,
        fresh: list[tuple[RuntimeEvent, str]],
        scope: SessionScope,
    ) -> int:
        # _sync just read every row past the cursor inside this writer transaction, so the cursor
        # is the ledger's high-water and the scope's counters are current. An admitted batch is
        # one session's (its invocations agree with their spines, checked across sessions too).
        seq = self._cursor
        now = now_ms()
        for event, line in fresh:
            seq += 1
            event_seq = scope.event_seq.get(event.invocation_id, 0) + 1
            scope.event_seq[event.invocation_id] = event_seq
            digest = chain_digest(scope.chain, line)
            scope.chain = digest
            self._sql.event.run(
                conn,
                {
                    **event_columns(event),
                    "event_seq": event_seq,
                    "ledger_seq": seq,
                    "payload_json": line,
                    "committed_at": now,
                    "chain_digest": digest,
                },
            )
            failpoints.hit("after_runtime_event_insert", transition)
            if transition == "recovery_bundle":
                failpoints.hit(_bundle_point(event), transition)
        return seq

    def _after_insert(
        self,
        conn: Connection,
        transition: Transition,
        batch: Sequence[RuntimeEvent],
        scope: SessionScope,
        *,
        evidence: Mapping[str, Any] | None,
        attempt: ToolAttempt | None,
    ) -> None:
        touched: list[str] = []
        new_ids = {event.id for event in batch}
        for event in batch:
            touched.extend(op for op in sorted(_operation_ids(event)) if op not in touched)
        now = now_ms()
        for op_id in touched:
            facts = scope.view.scanner.operation(op_id)
            if facts is None:
                continue
            if evidence is not None and transition == "t1_prepare" and facts.dispatch is not None:
                self._sql.evidence.run(
                    conn,
                    {
                        "operation_id": op_id,
                        "dispatch_event_id": facts.dispatch.id,
                        "evidence_json": canonical_json.dumps(dict(evidence)),
                    },
                )
            self._write_projection(conn, operation_row(facts), journal_rows(facts), now, new_ids)
            if attempt is not None and transition in BOUNDARY_TRANSITIONS:
                phase = {"t1_prepare": "t1", "t2_outcome": "t2"}.get(transition, "recovery")
                self._sql.attempt.run(
                    conn, {"operation_id": op_id, "phase": phase, "recorded_at": now, **_row_values(attempt)}
                )
        failpoints.hit("after_journal_event_insert", transition)

    def _write_projection(
        self,
        conn: Connection,
        row: OperationRow | None,
        journal: list[JournalRow],
        now: int,
        new_ids: set[str],
    ) -> None:
        # Rows follow from the batch alone, with no read-back: the operation row is created by the
        # batch that commits its dispatch and updated by every later one, and journal rows are
        # immutable, one per committed event, so only the new events' rows are missing. verify()
        # and the rebuild tests check that this equals a projection rebuilt from the events.
        if row is None:
            return
        values = _row_values(row)
        if row.dispatch_event_id in new_ids:
            self._sql.operation.run(conn, values)
        else:
            self._sql.operation_update.run(conn, values)
        self._sql.journal.run_many(
            conn,
            [{**_row_values(e), "committed_at": now} for e in journal if e.runtime_event_id in new_ids],
        )

    def _commit(
        self,
        transition: Transition,
        batch: Sequence[RuntimeEvent],
        *,
        precheck: _Hook | None = None,
        post: _Hook | None = None,
        **kwargs: Any,
    ) -> CommitResult:
        if not batch:
            raise LedgerRejection("transition_shape_conflict", "an empty batch")

        def body(conn: Connection) -> CommitResult:
            if precheck is not None:
                precheck(conn)
            result = self._admit_group(conn, transition, batch, live=True, **kwargs)
            if post is not None and result.created:
                post(conn)
            return result

        result: CommitResult = self._write(body)
        return result

    # --- writers ---------------------------------------------------------------------------

    def append(self, events: Sequence[RuntimeEvent]) -> CommitResult:
        """Generic append (user/model/terminal...); refuses dispatch, bound outcomes and recovery facts."""
        for event in events:
            if event.actions is not None and event.actions.continuation_start is not None:
                raise LedgerRejection(
                    "reserved_continuation_fact",
                    "continuation starts go through commit_continuation_start",
                    eventId=event.id,
                )

        def body(conn: Connection) -> CommitResult:
            created: list[str] = []
            seq = 0
            for i, event in enumerate(events):
                r = self._admit_group(conn, "generic_append", [event], synced=i > 0, live=True)
                created.extend(r.created_ids)
                seq = max(seq, r.ledger_seq)
            return CommitResult(bool(created), tuple(e.id for e in events), seq, tuple(created))

        if not events:
            raise LedgerRejection("transition_shape_conflict", "an empty batch")
        result: CommitResult = self._write(body)
        return result

    def commit_tool_prepared(
        self,
        dispatch: RuntimeEvent,
        *,
        call: RuntimeEvent | None = None,
        evidence: Mapping[str, Any] | None = None,
        attempt: AttemptArg = None,
        decision: Mapping[str, Any] | None = None,
    ) -> CommitResult:
        """T1: the dispatch fact (with its call, when not yet committed) and the prepared projection;
        ``decision``, the operation's policy decision, in the same transaction."""
        batch = [dispatch] if call is None else [call, dispatch]
        post = _decision_hook(dispatch, decision, self._sql)
        return self._commit("t1_prepare", batch, post=post, evidence=evidence, attempt=_attempt(attempt))

    def record_rerun(self, operation_id: str, *, attempt: AttemptArg = None) -> int:
        """Record, durably and before it starts, one more run of a dispatched operation's effect
        (what its guarantee allows after a crash: a ``recovery`` attempt row); returns the run's
        number, T1's being 1. A rerun that crashes too still counts: the next one is numbered on."""
        row = _attempt(attempt) or ToolAttempt()

        def body(conn: Connection) -> int:
            self._sql.attempt.run(
                conn,
                {
                    "operation_id": operation_id,
                    "phase": "recovery",
                    "recorded_at": now_ms(),
                    **_row_values(row),
                },
            )
            query = select(tool_attempts.c.attempt_seq).where(
                tool_attempts.c.operation_id == operation_id, tool_attempts.c.phase == "recovery"
            )
            # Exact under concurrent reruns only because ``_write`` serializes writers for the whole
            # transaction: BEGIN IMMEDIATE on SQLite, and on PostgreSQL the meta row's FOR UPDATE
            # lock, taken before this count; under READ COMMITTED without it two transactions
            # could count the same rows and both believe they are run 2.
            return 1 + len(conn.execute(query).all())

        return int(self._write(body))

    def commit_tool_outcome(
        self, response: RuntimeEvent, *, attempt: AttemptArg = None, receipt: Mapping[str, Any] | None = None
    ) -> CommitResult:
        """T2: the function response bound to its operation (``refs.operationId``), and its receipt."""
        post = _receipt_hook(response, receipt, self._sql)
        return self._commit("t2_outcome", [response], post=post, attempt=_attempt(attempt))

    def commit_refusal(
        self,
        response: RuntimeEvent,
        *,
        operation_id: str,
        decision: Mapping[str, Any] | None = None,
        receipt: Mapping[str, Any] | None = None,
    ) -> CommitResult:
        """A pre-T1 refusal (an unbound error response) with the decision and receipt behind it."""

        def post(conn: Connection) -> None:
            if decision is not None:
                insert_decision(conn, operation_id, response.session_id, response.run_id, decision)
            if receipt is not None:
                insert_receipt(conn, response.session_id, response.run_id, receipt)

        return self._commit("generic_append", [response], post=post)

    def commit_permission_request(
        self, request: RuntimeEvent, *, operation_id: str, decision: Mapping[str, Any]
    ) -> CommitResult:
        """A ``confirm`` decision: the permission request fact and the decision awaiting its answer."""

        def post(conn: Connection) -> None:
            insert_decision(conn, operation_id, request.session_id, request.run_id, decision)

        return self._commit("generic_append", [request], post=post)

    def commit_recovery_bundle(
        self,
        reconcile: RuntimeEvent,
        decision: RuntimeEvent,
        outcome: RuntimeEvent | None = None,
        *,
        attempt: AttemptArg = None,
        receipt: Mapping[str, Any] | None = None,
    ) -> CommitResult:
        """Reconcile observation + optional recovered outcome + completed/parked decision, atomically
        (with the operation's receipt, when it was decided under governance)."""
        batch = [reconcile, decision] if outcome is None else [reconcile, outcome, decision]
        post = _receipt_hook(decision, receipt)
        return self._commit("recovery_bundle", batch, post=post, attempt=_attempt(attempt))

    def commit_terminal(self, event: RuntimeEvent, header: RunHeader | None = None) -> CommitResult:
        """Commit a run's terminal event; a second, different terminal event is ``run_already_terminal``.
        ``header``: the run's header, written in the same transaction (an operator's run, which no
        workflow begins, has no header before its one fact)."""
        if not event.is_terminal:
            raise LedgerRejection("transition_shape_conflict", "not a terminal event", eventId=event.id)

        def precheck(conn: Connection) -> None:
            other = conn.execute(
                select(runtime_events.c.event_id).where(
                    runtime_events.c.run_id == event.run_id,
                    runtime_events.c.terminal.is_(True),
                    runtime_events.c.event_id != event.id,
                )
            ).first()
            if other is not None:
                raise LedgerRejection(
                    "run_already_terminal",
                    "the run already has a terminal event",
                    eventId=event.id,
                    runId=event.run_id,
                    terminalEventId=other[0],
                )
            self._close_waiting_requests(conn, event)  # no request outlives its run (approvals)

        def post(conn: Connection) -> None:
            insert_certificate(conn, event)
            if header is not None:
                write_run_header(conn, header)

        return self._commit("generic_append", [event], precheck=precheck, post=post)

    def import_events(self, events: Sequence[RuntimeEvent]) -> ImportResult:
        """Import a ledger batch-atomically: every writer transition in one transaction, or nothing.

        The file is replayed in order, one transition at a time, and the first transition that
        fails refuses the file with its own code; nothing is checked across the whole file first.
        Each transition gets the reference's transition check against the prefix read so far
        (``strict=False``); a recovery bundle then gets the live bundle writer's rules too (the
        admission ``commit_recovery_bundle`` runs, which validates the bundle after the transition
        check). A line repeating an earlier line's event (equal canonical bytes) is an exact retry,
        stored once; but the prefix read so far then holds that id twice, a corrupt prefix to the
        reference, so every later transition is refused ``duplicate_event_id`` at the repeated id
        (the reference's first issue of that prefix). An event committed before the import is an
        exact retry like any retried write, so re-importing a committed file is idempotent.

        Raises:
            LedgerRejection: the first rejection's code and ids, plus the refused transition and
                its ``eventIds`` (the reference's ``firstRejection``); nothing is written.
        """

        def body(conn: Connection) -> ImportResult:
            imported = 0
            self._sync(conn)
            read: set[str] = set()
            repeated: str | None = None
            for transition, group in group_transitions(events):
                try:
                    if repeated is not None:
                        raise LedgerRejection(
                            "duplicate_event_id",
                            "the file repeats this event, so its prefix holds the id twice",
                            eventId=repeated,
                        )
                    result = self._admit_group(
                        conn,
                        transition,
                        group,
                        synced=True,
                        strict=transition == "recovery_bundle",
                        partial_retry=True,
                    )
                except LedgerRejection as rejection:
                    rejection.detail.update(transition=transition, eventIds=[e.id for e in group])
                    raise
                imported += len(result.created_ids)
                repeated = next((e.id for e in group if e.id in read), None)
                read.update(e.id for e in group)
            return ImportResult(imported, len(events) - imported)

        result: ImportResult = self._write(body)
        return result


def _refuse_after_terminal(
    view: CommittedView, fresh: Sequence[RuntimeEvent], foreign: Mapping[str, str]
) -> None:
    """A live writer's new event of a run that already has a terminal fact is refused
    (``run_already_terminal``): the view was synced inside this writer transaction, under the write
    lock, so a racing terminal commit is either seen here or serialized after this one. An exact
    retry never gets here (it is not fresh); ``import_events`` admits as the reference does, and
    ``maka audit`` reports what it let in (``event_after_terminal``). ``foreign``: the terminal
    facts, from the database, of runs the session has not seen (a run id reused across sessions)."""
    for event in fresh:
        terminal = view.terminal_of_run.get(event.run_id) or foreign.get(event.run_id)
        if terminal is not None and terminal != event.id:
            raise LedgerRejection(
                "run_already_terminal",
                "the run already has a terminal event; nothing may follow it",
                eventId=event.id,
                runId=event.run_id,
                terminalEventId=terminal,
            )


@dataclass(frozen=True)
class _Crossing:
    """What a batch asks of sessions other than its own (``LedgerStore._check_crossing``)."""

    first: RuntimeEvent
    sessions: int
    invocations: tuple[tuple[RuntimeEvent, tuple[str, str, str]], ...]
    operations: tuple[tuple[RuntimeEvent, str, str], ...]


def _crossing_identities(scanner: LedgerScanner, batch: Sequence[RuntimeEvent]) -> _Crossing:
    """Before ``admit``: the batch's invocations and operation ids its session has not seen."""
    invocations: dict[str, tuple[RuntimeEvent, tuple[str, str, str]]] = {}
    operations: list[tuple[RuntimeEvent, str, str]] = []
    for event in batch:
        if scanner.spine(event.invocation_id) is None and event.invocation_id not in invocations:
            invocations[event.invocation_id] = (event, (event.session_id, event.run_id, event.turn_id))
        td = event.actions.tool_dispatch if event.actions is not None else None
        if td is not None and scanner.operation(td.operation_id) is None:
            operations.append((event, td.operation_id, td.provider_tool_call_id))
    return _Crossing(
        batch[0], len({e.session_id for e in batch}), tuple(invocations.values()), tuple(operations)
    )


def _crossing_rejection(
    code: str, event: RuntimeEvent, operation_id: str | None = None, tool_call_id: str | None = None
) -> LedgerRejection:
    # The scanner's own rejection, as a fold of the whole ledger would have raised it.
    return LedgerRejection(
        code,
        f"tool ledger transition rejected: {code} at {event.id}",
        eventId=event.id,
        operationId=operation_id,
        toolCallId=tool_call_id,
    )


def _decision_hook(
    dispatch: RuntimeEvent, decision: Mapping[str, Any] | None, sql: HotSQL | None = None
) -> _Hook | None:
    op_id = dispatch.refs.operation_id if dispatch.refs is not None else None
    if decision is None or op_id is None:
        return None
    return lambda conn: insert_decision(conn, op_id, dispatch.session_id, dispatch.run_id, decision, sql)


def _receipt_hook(
    event: RuntimeEvent, receipt: Mapping[str, Any] | None, sql: HotSQL | None = None
) -> _Hook | None:
    if receipt is None:
        return None
    return lambda conn: insert_receipt(conn, event.session_id, event.run_id, receipt, sql)


def _bundle_point(event: RuntimeEvent) -> str:
    recovery = event.actions.tool_recovery if event.actions is not None else None
    if recovery is None:
        return "after_recovery_outcome"
    if recovery.kind == "maka.tool.reconcile_result":
        return "after_recovery_reconcile"
    return "after_recovery_decision"


__all__ = ["BOUNDARY_TRANSITIONS", "CommitResult", "ImportResult", "LedgerStore", "Prefix", "ToolAttempt"]
