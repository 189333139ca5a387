"""The commit path: one batch admitted, its events appended and its projections written, in the
writer's one transaction.

Every ``LedgerStore`` writer ends here (``_commit``, or ``_admit_group`` for a writer that admits
several groups in one transaction). ``_admit_group`` brings the scopes up to date
(``store.scope_sync``), recognises an exact retry (same id, same canonical bytes: a no-op), stops
the tool boundaries on corruption, asks the session's scanner to ``admit`` the batch, checks the
identities that cross sessions (``store.crossing``), inserts the events (``_insert_events``) and
writes what the batch changes of the projections (``_after_insert``: operation and journal rows,
T1's evidence, the attempt rows). A mixin of ``LedgerStore``, whose attributes it uses
(``store.scope_sync``); if the transaction does not commit, the store's ``_abort`` drops every
scope, so none runs ahead of the database.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from sqlalchemy import Connection, RowMapping, select

from maka_core import failpoints
from maka_core.errors import CodecError, LedgerRejection
from maka_core.facts import canonical_json, codec
from maka_core.facts.clock import now_ms
from maka_core.facts.events import RuntimeEvent
from maka_core.ledger.projections import JournalRow, OperationRow, journal_rows, operation_row
from maka_core.ledger.scanner import Transition
from maka_core.store.chain import CHAIN_START, chain_digest
from maka_core.store.crossing import (
    Crossing,
    check_crossing,
    crossing_identities,
    foreign_terminal,
    read_batch_keys,
    refuse_after_terminal,
)
from maka_core.store.hot_sql import KeyFacts
from maka_core.store.reads import _detail
from maka_core.store.results import CommitResult, ToolAttempt, row_values
from maka_core.store.rows import event_columns, row_event
from maka_core.store.schema import runtime_events
from maka_core.store.scope_sync import ScopeSync
from maka_core.store.scopes import SessionScope
from maka_core.store.session_index import IndexUpkeep

BOUNDARY_TRANSITIONS: frozenset[str] = frozenset({"t1_prepare", "t2_outcome", "recovery_bundle"})

#: A writer's own statements, run in its transaction: ``precheck`` before the batch is admitted,
#: ``post`` after it is written (only when it created events).
Hook = Callable[[Connection], None]


class CommitPath(ScopeSync):
    """Admission, event inserts and projection upkeep, inside a writer transaction."""

    #: The driver's parameter marker for ``hot_sql.read_keys`` (``?`` or ``%s``).
    _mark: str
    #: The session index rows this transaction changes (``session_index.IndexUpkeep``).
    _index: IndexUpkeep

    if TYPE_CHECKING:

        def _write(self, body: Callable[[Connection], Any]) -> Any: ...

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
        lines = [canonical_line(e) for e in batch]
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
        unknown = [e for e in batch if e.id not in known]
        keys = read_batch_keys(conn, self._mark, scope, scanner, unknown, live)
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
            refuse_after_terminal(scope.view, [e for e, _ in fresh], foreign)
        t1_call_committed = transition == "t1_prepare" and [e.id for e, _ in fresh] == [batch[-1].id]
        if stored and not (t1_call_committed or partial_retry) and transition != "generic_append":
            # Only T1 may find its call already committed; any other partial retry is a conflict.
            # An import (``partial_retry``) checks only the rest, as the reference's transition
            # check does with the candidates an existing prefix does not hold.
            first = next(e for e in batch if e.id in stored)
            raise LedgerRejection("duplicate_event_id", "partial retry of an atomic batch", eventId=first.id)
        new_batch = [e for e, _ in fresh]
        crossing = crossing_identities(scanner, new_batch)
        # The admitted batch stays folded in the scanner (no second fold below): if this
        # transaction does not commit, ``_abort`` drops every scope anyway.
        scanned = {id(e) for e in scanner.admit(new_batch, transition, strict=strict, keep=True)}
        self._check_crossing(conn, crossing, keys)
        opening = scope.chain == CHAIN_START  # the session's first facts
        seq, stamp = self._insert_events(conn, transition, fresh, scope)
        for event in new_batch:
            scope.fold_written(event, scanned=id(event) in scanned)
        self._cursor = seq
        self._after_insert(conn, transition, new_batch, scope, evidence=evidence, attempt=attempt)
        self._index.saw(new_batch, stamp, first=opening)  # the session index follows (store/session_index.py)
        return CommitResult(True, ids, seq, tuple(e.id for e in new_batch))

    # The two cross-session checks stay methods of the store (``store.crossing`` does the work):
    # a subclass that takes one out is how the negative controls in ``test_ledger_scopes`` show
    # what each one catches.
    def _foreign_terminal(
        self, conn: Connection, scope: SessionScope, fresh: Sequence[tuple[RuntimeEvent, str]], keys: KeyFacts
    ) -> dict[str, str]:
        return foreign_terminal(conn, self._mark, scope, fresh, keys)

    def _check_crossing(self, conn: Connection, crossing: Crossing, keys: KeyFacts) -> None:
        check_crossing(conn, self._mark, crossing, keys)

    def _insert_events(
        self,
        conn: Connection,
        transition: Transition,
        fresh: list[tuple[RuntimeEvent, str]],
        scope: SessionScope,
    ) -> tuple[int, int]:
        """Insert the batch's rows; returns the ledger's high-water and the rows' commit stamp."""
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
        return seq, now

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
                    conn, {"operation_id": op_id, "phase": phase, "recorded_at": now, **row_values(attempt)}
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
        values = row_values(row)
        if row.dispatch_event_id in new_ids:
            self._sql.operation.run(conn, values)
        else:
            self._sql.operation_update.run(conn, values)
        self._sql.journal.run_many(
            conn,
            [{**row_values(e), "committed_at": now} for e in journal if e.runtime_event_id in new_ids],
        )

    def _commit(
        self,
        transition: Transition,
        batch: Sequence[RuntimeEvent],
        *,
        precheck: Hook | None = None,
        post: Hook | None = None,
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


def canonical_line(event: RuntimeEvent) -> str:
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


def _bundle_point(event: RuntimeEvent) -> str:
    recovery = event.actions.tool_recovery if event.actions is not None else None
    if recovery is None:
        return "after_recovery_outcome"
    if recovery.kind == "maka.tool.reconcile_result":
        return "after_recovery_reconcile"
    return "after_recovery_decision"


__all__ = ["BOUNDARY_TRANSITIONS", "CommitPath", "Hook", "canonical_line"]
