"""The ledger store: immutable RuntimeEvents, their projections, and the dedicated writers.

``LedgerStore`` is one ledger database. This module holds its lifecycle (open, migrate, close),
its transaction seam (``_write``, ``group``, ``_reading``) and its public writers. Every writer is
ONE short transaction with ONE durable commit, through the one commit path (``store.commit``:
admission against the session's scope, kept current by ``store.scope_sync``; the identities that
cross sessions, ``store.crossing``; the events and their projections). If the transaction does
not commit, every scope is dropped and reloaded on demand, so none can run ahead of the database.
Corruption anywhere in the ledger stops every tool-boundary writer (T1, T2, recovery bundle),
exact retries included: in history before the store opened once its start scan
(``store.verification``) reaches it; in any row the store folds since (a resident session's, or
another process's row of a session it does not hold, folded with its session to check it) at
once. The record is the store's, sticky; ``maka audit`` and ``verify`` read the whole ledger.

Every row read is re-decoded and checked against its identity columns; a row whose payload
disagrees with its columns fails closed (``row_payload_identity_mismatch``). The values the
writers take and give back are ``store.results``'s.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from pathlib import Path
from typing import Any

from sqlalchemy import Connection, Engine, func, select
from sqlalchemy.pool import StaticPool

from maka_core.checkpoints.contract import bound_high_water
from maka_core.errors import LedgerRejection, StoreError
from maka_core.facts.clock import now_ms
from maka_core.facts.events import RuntimeEvent
from maka_core.facts.run_header import RunHeader
from maka_core.ledger.scanner import group_transitions
from maka_core.store.commit import BOUNDARY_TRANSITIONS, CommitPath
from maka_core.store.continuations import ContinuationWrites
from maka_core.store.engine import (
    KeptConnection,
    database_url,
    is_sqlite,
    make_engine,
    read_tx,
    run_write,
    sqlite_file,
)
from maka_core.store.fences import FenceRecords
from maka_core.store.governance_rows import (
    GovernanceRecords,
    decision_hook,
    insert_certificate,
    insert_decision,
    insert_receipt,
    receipt_hook,
)
from maka_core.store.group_commit import WriteGroup, open_group
from maka_core.store.health import LedgerHealth, create_private, unwritable
from maka_core.store.hot_sql import HotSQL, rows_since
from maka_core.store.partials import StepPartials
from maka_core.store.reads import LedgerReads
from maka_core.store.results import (
    AttemptArg,
    CommitResult,
    ImportResult,
    ToolAttempt,
    as_attempt,
    row_values,
)
from maka_core.store.rows import Prefix
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
from maka_core.store.session_index import IndexUpkeep, rebuild_index
from maka_core.store.verification import LedgerVerification


class LedgerStore(
    CommitPath,
    ContinuationWrites,
    FenceRecords,
    RunHeaderStore,
    GovernanceRecords,
    StepPartials,
    LedgerReads,
):
    """One ledger database (SQLite file, SQLite memory or any SQLAlchemy URL)."""

    def __init__(self, engine: Engine, url: str) -> None:
        # The scope and commit attributes are documented where they are declared
        # (``ScopeSync``, ``CommitPath``); all of them are set here.
        self.engine = engine
        self.url = url
        self._scopes = None
        self._cursor = 0
        self._lock = threading.RLock()
        self._corrupt = {}
        self._group = None
        self._index = IndexUpkeep()  # the session index rows a transaction changes
        self._sql = HotSQL.for_engine(engine)
        self._kept = KeptConnection(engine) if sqlite_file(url) is not None else None
        self._fast_reads = is_sqlite(engine)
        self._mark = "?" if self._fast_reads else "%s"
        with read_tx(engine) as conn:
            #: The file and identity opened; checked before every writer transaction.
            self.health = LedgerHealth(sqlite_file(url), ledger_id(conn))
            start = int(rows_since(conn, self._sql.high_water)[0]["seq"])
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

    def _waiting(
        self, hook: Callable[[Connection], None], dispatch: RuntimeEvent
    ) -> Callable[[Connection], None]:
        """T1's decision hook for a call that asks for approval: its session starts waiting."""

        def post(conn: Connection) -> None:
            hook(conn)
            self._touch_session(dispatch.session_id)

        return post

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
        hook = decision_hook(dispatch, decision, self._sql)
        post = (
            hook if hook is None or not (decision or {}).get("challenge") else self._waiting(hook, dispatch)
        )
        return self._commit("t1_prepare", batch, post=post, evidence=evidence, attempt=as_attempt(attempt))

    def record_rerun(self, operation_id: str, *, attempt: AttemptArg = None) -> int:
        """Record, durably and before it starts, one more run of a dispatched operation's effect
        (what its guarantee allows after a crash: a ``recovery`` attempt row); returns the run's
        number, T1's being 1. A rerun that crashes too still counts: the next one is numbered on."""
        row = as_attempt(attempt) or ToolAttempt()

        def body(conn: Connection) -> int:
            self._sql.attempt.run(
                conn,
                {
                    "operation_id": operation_id,
                    "phase": "recovery",
                    "recorded_at": now_ms(),
                    **row_values(row),
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
        post = receipt_hook(response, receipt, self._sql)
        return self._commit("t2_outcome", [response], post=post, attempt=as_attempt(attempt))

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
                if decision.get("challenge"):
                    self._touch_session(response.session_id)
            if receipt is not None:
                insert_receipt(conn, response.session_id, response.run_id, receipt)

        return self._commit("generic_append", [response], post=post)

    def commit_permission_request(
        self, request: RuntimeEvent, *, operation_id: str, decision: Mapping[str, Any]
    ) -> CommitResult:
        """A ``confirm`` decision: the permission request fact and the decision awaiting its answer."""

        def post(conn: Connection) -> None:
            insert_decision(conn, operation_id, request.session_id, request.run_id, decision)
            self._touch_session(request.session_id)  # the session now waits for an answer

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
        post = receipt_hook(decision, receipt)
        return self._commit("recovery_bundle", batch, post=post, attempt=as_attempt(attempt))

    def commit_terminal(self, event: RuntimeEvent, header: RunHeader | None = None) -> CommitResult:
        """Commit a run's terminal event; a second, different terminal event is ``run_already_terminal``;
        one whose workspace checkpoint binds another high-water than the run's facts before it is
        ``checkpoint_boundary_stale`` (bind it again and commit that).
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
            bound = bound_high_water(event)
            if bound is not None:
                prefix = conn.execute(
                    select(func.count())
                    .select_from(runtime_events)
                    .where(runtime_events.c.run_id == event.run_id, runtime_events.c.terminal.is_(False))
                ).scalar_one()
                if prefix != bound:
                    # A fact of the run (a late attempt's outcome, or the closure of a request
                    # opened since the caller closed them: ``close_waiting_requests``) is not in
                    # the prefix the checkpoint binds: the bundle would name a boundary the run no
                    # longer ends at, and every continuation would park
                    # checkpoint_boundary_mismatch. The caller binds again.
                    raise LedgerRejection(
                        "checkpoint_boundary_stale",
                        "the terminal fact's checkpoint binds another prefix than the run's",
                        eventId=event.id,
                        runId=event.run_id,
                        boundHighWater=bound,
                        prefixHighWater=prefix,
                    )

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


__all__ = ["BOUNDARY_TRANSITIONS", "CommitResult", "ImportResult", "LedgerStore", "Prefix", "ToolAttempt"]
