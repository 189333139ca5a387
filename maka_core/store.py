"""The ledger store: immutable RuntimeEvents, their projections, and the dedicated writers.

Every writer is ONE short transaction with ONE durable commit. Inside it, the store brings its
in-memory ``LedgerScanner`` up to date with rows other processes committed (by ``ledger_seq``, so
validation costs O(new rows), never a rescan), recognises an exact retry (same id, same canonical
bytes: a no-op), asks the scanner to ``admit`` the batch, inserts the events, applies them to the
scanner, and writes the projections the scanner derives for the touched operations. If the
transaction does not commit, the scanner is dropped and rebuilt by a full scan on the next write,
so it can never run ahead of the database. Corruption anywhere in the ledger makes every
tool-boundary writer (T1, T2, recovery bundle) refuse, exact retries included.

Every row read is re-decoded and checked against its identity columns; a row whose payload
disagrees with its columns fails closed (``row_payload_identity_mismatch``).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from sqlalchemy import Connection, Engine, RowMapping, func, select, update

from maka_core import canonical_json, codec, failpoints
from maka_core.claims import ClaimResult, ContinuationClaim
from maka_core.engine import database_url, make_engine, read_tx, run_write, sqlite_file
from maka_core.errors import CodecError, LedgerRejection
from maka_core.events import RuntimeEvent
from maka_core.ledger_rows import Prefix, event_columns, row_event
from maka_core.projections import JournalRow, OperationRow, journal_rows, operation_row
from maka_core.runs import RunHeader, now_ms
from maka_core.scanner import LedgerScanner, Transition, group_transitions
from maka_core.schema import (
    agent_runs,
    continuation_claims,
    migrate,
    refuse_newer,
    runtime_events,
    sqlite_file_version,
    tool_attempts,
    tool_evidence,
    tool_journal_events,
    tool_operations,
)
from maka_core.store_reads import LedgerReads, _claim_row, _claim_values, _detail, _run_row

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
    imported: int
    existing: int


AttemptArg = ToolAttempt | Mapping[str, Any] | None
_Hook = Callable[[Connection], None]


def _attempt(value: AttemptArg) -> ToolAttempt | None:
    if value is None or isinstance(value, ToolAttempt):
        return value
    return ToolAttempt(**dict(value))


def _canonical(event: RuntimeEvent) -> str:
    """The canonical line, refusing an event that would not mean the same after a round trip."""
    line = codec.encode(event)
    if codec.decode(line) != event:
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


class LedgerStore(LedgerReads):
    """One ledger database (SQLite file, SQLite memory or any SQLAlchemy URL)."""

    def __init__(self, engine: Engine, url: str) -> None:
        self.engine = engine
        self.url = url
        self._scanner: LedgerScanner | None = None
        self._cursor = 0
        #: invocation id -> highest event_seq, kept in step with the scanner (saves a query per event).
        self._event_seq: dict[str, int] = {}
        self._lock = threading.RLock()

    # --- lifecycle -------------------------------------------------------------------------

    @classmethod
    def open(cls, target: str | Path) -> LedgerStore:
        """Open (creating and migrating if needed) the ledger at a path or URL.

        Raises:
            StoreError: ``schema_too_new`` (nothing written) or ``store_unreadable``.
        """
        url = database_url(target)
        file = sqlite_file(url)
        if file is not None:
            version = sqlite_file_version(file)
            if version is not None:
                refuse_newer(version)
            file.parent.mkdir(parents=True, exist_ok=True)
        engine = make_engine(url)
        try:
            migrate(engine)
        except BaseException:
            engine.dispose()
            raise
        return cls(engine, url)

    def close(self) -> None:
        self.engine.dispose()

    def __enter__(self) -> LedgerStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- the transaction seam --------------------------------------------------------------

    def _abort(self) -> None:
        self._scanner = None
        self._cursor = 0
        self._event_seq = {}

    def _write(self, body: Callable[[Connection], Any]) -> Any:
        with self._lock:
            return run_write(self.engine, body, on_abort=self._abort)

    def _sync(self, conn: Connection) -> LedgerScanner:
        """Fold rows committed since the cursor (all rows, the first time) into the scanner."""
        if self._scanner is None:
            self._scanner, self._cursor, self._event_seq = LedgerScanner(), 0, {}
        rows = conn.execute(
            select(runtime_events)
            .where(runtime_events.c.ledger_seq > self._cursor)
            .order_by(runtime_events.c.ledger_seq)
        ).mappings()
        for row in rows:
            self._scanner.apply(row_event(row))
            self._cursor = int(row["ledger_seq"])
            inv = row["invocation_id"]
            self._event_seq[inv] = max(self._event_seq.get(inv, 0), int(row["event_seq"]))
        return self._scanner

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
    ) -> CommitResult:
        scanner = self._sync(conn)
        lines = [_canonical(e) for e in batch]
        if transition in BOUNDARY_TRANSITIONS and scanner.has_corruption:
            # Corruption anywhere stops every tool boundary, exact retries included.
            issue = scanner.issues[0]
            raise LedgerRejection(
                issue.code, "the ledger is corrupt; tool boundaries are stopped", **_detail(issue)
            )
        stored = self._stored(conn, [e.id for e in batch])
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
        t1_call_committed = transition == "t1_prepare" and [e.id for e, _ in fresh] == [batch[-1].id]
        if stored and not t1_call_committed and transition != "generic_append":
            # Only T1 may find its call already committed; any other partial retry is a conflict.
            first = next(e for e in batch if e.id in stored)
            raise LedgerRejection("duplicate_event_id", "partial retry of an atomic batch", eventId=first.id)
        new_batch = [e for e, _ in fresh]
        scanner.admit(new_batch, transition)
        seq = self._insert_events(conn, transition, fresh)
        for event in new_batch:
            scanner.apply(event)
        self._cursor = seq
        self._after_insert(conn, transition, new_batch, evidence=evidence, attempt=attempt)
        return CommitResult(True, ids, seq, tuple(e.id for e in new_batch))

    def _insert_events(
        self, conn: Connection, transition: Transition, fresh: list[tuple[RuntimeEvent, str]]
    ) -> int:
        # _sync just read every row past the cursor inside this writer transaction, so the cursor
        # is the ledger's high-water and the per-invocation counters are current.
        seq = self._cursor
        now = now_ms()
        for event, line in fresh:
            seq += 1
            event_seq = self._event_seq.get(event.invocation_id, 0) + 1
            self._event_seq[event.invocation_id] = event_seq
            conn.execute(
                runtime_events.insert(),
                {
                    **event_columns(event),
                    "event_seq": event_seq,
                    "ledger_seq": seq,
                    "payload_json": line,
                    "committed_at": now,
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
        *,
        evidence: Mapping[str, Any] | None,
        attempt: ToolAttempt | None,
    ) -> None:
        assert self._scanner is not None
        touched: list[str] = []
        for event in batch:
            touched.extend(op for op in sorted(_operation_ids(event)) if op not in touched)
        now = now_ms()
        for op_id in touched:
            facts = self._scanner.operation(op_id)
            if facts is None:
                continue
            if evidence is not None and transition == "t1_prepare" and facts.dispatch is not None:
                conn.execute(
                    tool_evidence.insert(),
                    {
                        "operation_id": op_id,
                        "dispatch_event_id": facts.dispatch.id,
                        "evidence_json": canonical_json.dumps(dict(evidence)),
                    },
                )
            self._write_projection(conn, operation_row(facts), journal_rows(facts), now)
            if attempt is not None and transition in BOUNDARY_TRANSITIONS:
                phase = {"t1_prepare": "t1", "t2_outcome": "t2"}.get(transition, "recovery")
                conn.execute(
                    tool_attempts.insert(),
                    {"operation_id": op_id, "phase": phase, "recorded_at": now, **asdict(attempt)},
                )
        failpoints.hit("after_journal_event_insert", transition)

    @staticmethod
    def _write_projection(
        conn: Connection, row: OperationRow | None, journal: list[JournalRow], now: int
    ) -> None:
        if row is None:
            return
        values = asdict(row)
        current = (
            conn.execute(select(tool_operations).where(tool_operations.c.operation_id == row.operation_id))
            .mappings()
            .first()
        )
        if current is None:
            conn.execute(tool_operations.insert(), values)
        elif dict(current) != values:
            conn.execute(
                update(tool_operations)
                .where(tool_operations.c.operation_id == row.operation_id)
                .values(**values)
            )
        present = set(
            conn.execute(
                select(tool_journal_events.c.journal_event_id).where(
                    tool_journal_events.c.operation_id == row.operation_id
                )
            ).scalars()
        )
        for entry in journal:
            if entry.journal_event_id not in present:
                conn.execute(tool_journal_events.insert(), {**asdict(entry), "committed_at": now})

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
            result = self._admit_group(conn, transition, batch, **kwargs)
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
            for event in events:
                r = self._admit_group(conn, "generic_append", [event])
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
    ) -> CommitResult:
        """T1: the dispatch fact (with its call, when not yet committed) and the prepared projection."""
        batch = [dispatch] if call is None else [call, dispatch]
        return self._commit("t1_prepare", batch, evidence=evidence, attempt=_attempt(attempt))

    def commit_tool_outcome(self, response: RuntimeEvent, *, attempt: AttemptArg = None) -> CommitResult:
        """T2: the function response bound to its operation (``refs.operationId``)."""
        return self._commit("t2_outcome", [response], attempt=_attempt(attempt))

    def commit_recovery_bundle(
        self,
        reconcile: RuntimeEvent,
        decision: RuntimeEvent,
        outcome: RuntimeEvent | None = None,
        *,
        attempt: AttemptArg = None,
    ) -> CommitResult:
        """Reconcile observation + optional recovered outcome + completed/parked decision, atomically."""
        batch = [reconcile, decision] if outcome is None else [reconcile, outcome, decision]
        return self._commit("recovery_bundle", batch, attempt=_attempt(attempt))

    def commit_terminal(self, event: RuntimeEvent) -> CommitResult:
        """Commit a run's terminal event; a second, different terminal event is ``run_already_terminal``."""
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

        return self._commit("generic_append", [event], precheck=precheck)

    def import_events(self, events: Sequence[RuntimeEvent]) -> ImportResult:
        """Import a ledger batch-atomically: every writer transition in one transaction, or nothing.

        Raises:
            LedgerRejection: the first rejection's code; nothing is written.
        """

        def body(conn: Connection) -> ImportResult:
            imported = 0
            for transition, group in group_transitions(events):
                imported += len(self._admit_group(conn, transition, group).created_ids)
            return ImportResult(imported, len(events) - imported)

        result: ImportResult = self._write(body)
        return result

    # --- continuation ----------------------------------------------------------------------

    def claim_continuation(self, claim: ContinuationClaim) -> ClaimResult:
        """Claim a source boundary for one continuation (unique per source boundary).

        Raises:
            LedgerRejection: the source prefix no longer matches the claim (``source_high_water_changed``,
                ``source_prefix_digest_mismatch``) or the source run has no terminal event
                (``source_not_terminal``).
        """

        def body(conn: Connection) -> ClaimResult:
            same = _claim_row(conn, continuation_claims.c.claim_id == claim.claim_id)
            if same is not None:
                status = "existing" if same.identity() == claim.identity() else "conflict"
                return ClaimResult(status=status, claim=same)
            c = continuation_claims.c
            for clause in (
                (c.source_session_id == claim.source_session_id)
                & (c.source_run_id == claim.source_run_id)
                & (c.source_event_high_water == claim.source_event_high_water)
                & (c.source_prefix_digest == claim.source_prefix_digest),
                c.boundary_digest == claim.boundary_digest,
                c.target_run_id == claim.target_run_id,
                c.target_invocation_id == claim.target_invocation_id,
                (c.target_session_id == claim.target_session_id) & (c.target_turn_id == claim.target_turn_id),
            ):
                other = _claim_row(conn, clause)
                if other is not None:
                    return ClaimResult(status="conflict", claim=other)
            source = self._prefix(conn, claim.source_session_id, claim.source_run_id)
            if source.high_water != claim.source_event_high_water:
                raise LedgerRejection(
                    "source_high_water_changed",
                    "the source run's high-water differs from the claim",
                    highWater=source.high_water,
                    claimHighWater=claim.source_event_high_water,
                )
            if source.prefix_digest != claim.source_prefix_digest:
                raise LedgerRejection("source_prefix_digest_mismatch", "the source prefix changed")
            if not source.events[-1].is_terminal:
                raise LedgerRejection("source_not_terminal", "the source run has no terminal event")
            stored = claim.model_copy(
                update={
                    "claimed_at": claim.claimed_at or now_ms(),
                    "start_event_id": None,
                    "start_kind": None,
                }
            )
            conn.execute(continuation_claims.insert().values(**_claim_values(stored)))
            failpoints.hit("after_continuation_claim_insert")
            return ClaimResult(status="acquired", claim=stored)

        result: ClaimResult = self._write(body)
        return result

    def continuation_claim(self, claim_id: str) -> ContinuationClaim | None:
        with read_tx(self.engine) as conn:
            return _claim_row(conn, continuation_claims.c.claim_id == claim_id)

    def commit_continuation_start(self, event: RuntimeEvent) -> CommitResult:
        """Commit the target run's continuation-start event and bind it to its claim."""
        start = event.actions.continuation_start if event.actions is not None else None
        if start is None:
            raise LedgerRejection("transition_shape_conflict", "no continuationStart", eventId=event.id)

        def precheck(conn: Connection) -> None:
            claim = _claim_row(conn, continuation_claims.c.claim_id == start.claim_id)
            if claim is None:
                raise LedgerRejection(
                    "continuation_claim_missing", "no claim for this start", eventId=event.id
                )
            target = (
                claim.target_session_id,
                claim.target_invocation_id,
                claim.target_run_id,
                claim.target_turn_id,
            )
            if target != (event.session_id, event.invocation_id, event.run_id, event.turn_id) or (
                start.boundary_digest != claim.boundary_digest
            ):
                raise LedgerRejection(
                    "continuation_claim_conflict", "start does not match its claim", eventId=event.id
                )
            if claim.start_event_id not in (None, event.id):
                raise LedgerRejection(
                    "continuation_claim_conflict", "claim already started", eventId=event.id
                )

        def post(conn: Connection) -> None:
            conn.execute(
                update(continuation_claims)
                .where(continuation_claims.c.claim_id == start.claim_id)
                .values(start_event_id=event.id, start_kind=start.provenance)
            )
            failpoints.hit("after_continuation_start_insert")

        return self._commit("generic_append", [event], precheck=precheck, post=post)

    # --- run headers -----------------------------------------------------------------------

    def put_run(self, header: RunHeader) -> RunHeader:
        """Insert or update a run header. A terminal header needs the run's terminal event first.

        Raises:
            LedgerRejection: ``terminal_event_missing`` or ``run_already_terminal``.
        """

        def body(conn: Connection) -> RunHeader:
            now = now_ms()
            current = _run_row(conn, header.run_id)
            stored = header.model_copy(
                update={
                    "created_at": header.created_at or (current.created_at if current else now),
                    "updated_at": header.updated_at or now,
                }
            )
            if current is not None and current.is_terminal and current.status != header.status:
                raise LedgerRejection(
                    "run_already_terminal", "the run header is already terminal", runId=header.run_id
                )
            if header.is_terminal:
                terminal = conn.execute(
                    select(runtime_events.c.event_id).where(
                        runtime_events.c.run_id == header.run_id, runtime_events.c.terminal.is_(True)
                    )
                ).first()
                if terminal is None:
                    raise LedgerRejection(
                        "terminal_event_missing",
                        "the terminal RuntimeEvent commits before the terminal header",
                        runId=header.run_id,
                    )
            values = stored.model_dump()
            values["continuation_source"] = (
                canonical_json.dumps(values["continuation_source"])
                if values["continuation_source"] is not None
                else None
            )
            if current is None:
                conn.execute(agent_runs.insert().values(**values))
            else:
                conn.execute(update(agent_runs).where(agent_runs.c.run_id == header.run_id).values(**values))
            return stored

        result: RunHeader = self._write(body)
        return result


def _bundle_point(event: RuntimeEvent) -> str:
    recovery = event.actions.tool_recovery if event.actions is not None else None
    if recovery is None:
        return "after_recovery_outcome"
    if recovery.kind == "maka.tool.reconcile_result":
        return "after_recovery_reconcile"
    return "after_recovery_decision"


__all__ = ["BOUNDARY_TRANSITIONS", "CommitResult", "ImportResult", "LedgerStore", "Prefix", "ToolAttempt"]
