"""The ledger store's read side: events, projections, headers, prefixes, rebuild and verify.

A mixin of ``LedgerStore`` so the writer module stays about writing. Every event read goes
through ``row_event`` (fail closed on a row that disagrees with its payload).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import asdict
from pathlib import Path
from typing import Any

from sqlalchemy import Connection, Engine, RowMapping, func, select

from maka_core.errors import LedgerRejection, StoreError
from maka_core.facts import canonical_json, codec
from maka_core.facts.clock import now_ms
from maka_core.facts.events import RuntimeEvent
from maka_core.ledger.projections import JournalRow, OperationRow, project
from maka_core.ledger.scanner import scan
from maka_core.store.chain import ChainBreak, chain_breaks, first_break
from maka_core.store.engine import read_tx
from maka_core.store.rows import Prefix, make_prefix, row_event
from maka_core.store.schema import (
    agent_runs,
    runtime_events,
    session_index,
    tool_attempts,
    tool_decisions,
    tool_evidence,
    tool_journal_events,
    tool_operations,
)
from maka_core.store.session_index import SessionRow, rebuild_index, session_rows


class LedgerReads:
    """Reads, rebuild and verify over ``engine``."""

    engine: Engine
    _lock: threading.RLock

    def _write(self, body: Callable[[Connection], Any]) -> Any:
        raise NotImplementedError

    def _reading(self) -> AbstractContextManager[Connection]:
        """A read transaction (``LedgerStore`` reads through its open write group instead)."""
        return read_tx(self.engine)

    @classmethod
    def open(cls, target: str | Path) -> Any:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError

    # --- reads -----------------------------------------------------------------------------

    def events(
        self, session_id: str | None = None, run_id: str | None = None, invocation_id: str | None = None
    ) -> list[RuntimeEvent]:
        """Events in ledger order, each re-checked against its row (fails closed)."""
        query = select(runtime_events).order_by(runtime_events.c.ledger_seq)
        for column, value in (
            ("session_id", session_id),
            ("run_id", run_id),
            ("invocation_id", invocation_id),
        ):
            if value is not None:
                query = query.where(runtime_events.c[column] == value)
        with self._lock, self._reading() as conn:
            return [row_event(r) for r in conn.execute(query).mappings()]

    def events_since(self, session_id: str, after_seq: int) -> list[tuple[int, RuntimeEvent]]:
        """A session's events committed past ``after_seq``, with their ledger_seq, in ledger order.

        Writers commit one at a time and ``ledger_seq`` grows in commit order, so a reader that
        keeps its cursor sees exactly the committed ledger, whichever process wrote it.
        """
        query = (
            select(runtime_events)
            .where(runtime_events.c.session_id == session_id)
            .where(runtime_events.c.ledger_seq > after_seq)
            .order_by(runtime_events.c.ledger_seq)
        )
        with self._lock, self._reading() as conn:
            return [(int(r["ledger_seq"]), row_event(r)) for r in conn.execute(query).mappings()]

    def event(self, event_id: str) -> RuntimeEvent | None:
        with self._lock, self._reading() as conn:
            row = (
                conn.execute(select(runtime_events).where(runtime_events.c.event_id == event_id))
                .mappings()
                .first()
            )
            return None if row is None else row_event(row)

    def sessions(self) -> list[str]:
        """Session ids in order of their first event."""
        query = (
            select(runtime_events.c.session_id)
            .group_by(runtime_events.c.session_id)
            .order_by(func.min(runtime_events.c.ledger_seq))
        )
        with self._lock, self._reading() as conn:
            return list(conn.execute(query).scalars())

    def operation(self, operation_id: str) -> OperationRow | None:
        return self._operation_where(tool_operations.c.operation_id == operation_id)

    def operation_for_call(self, invocation_id: str, tool_call_id: str) -> OperationRow | None:
        return self._operation_where(
            (tool_operations.c.invocation_id == invocation_id)
            & (tool_operations.c.provider_tool_call_id == tool_call_id)
        )

    def _operation_where(self, clause: Any) -> OperationRow | None:
        with self._lock, self._reading() as conn:
            row = conn.execute(select(tool_operations).where(clause)).mappings().first()
            return None if row is None else OperationRow(**dict(row))

    def operations(self) -> list[OperationRow]:
        with self._lock, self._reading() as conn:
            rows = conn.execute(select(tool_operations).order_by(tool_operations.c.operation_id)).mappings()
            return [OperationRow(**dict(r)) for r in rows]

    def journal(self, operation_id: str | None = None) -> list[JournalRow]:
        """Journal rows in commit order (``journal_seq``)."""
        query = select(tool_journal_events).order_by(tool_journal_events.c.journal_seq)
        if operation_id is not None:
            query = query.where(tool_journal_events.c.operation_id == operation_id)
        with self._lock, self._reading() as conn:
            return [_journal(r) for r in conn.execute(query).mappings()]

    def evidence(self, operation_id: str) -> dict[str, Any] | None:
        with self._lock, self._reading() as conn:
            value = conn.execute(
                select(tool_evidence.c.evidence_json).where(tool_evidence.c.operation_id == operation_id)
            ).scalar()
        return None if value is None else dict(canonical_json.loads(value))

    def attempts(self, operation_id: str | None = None) -> list[dict[str, Any]]:
        query = select(tool_attempts).order_by(tool_attempts.c.attempt_seq)
        if operation_id is not None:
            query = query.where(tool_attempts.c.operation_id == operation_id)
        with self._lock, self._reading() as conn:
            return [dict(r) for r in conn.execute(query).mappings()]

    def session_index(self) -> list[SessionRow]:
        """Every ``session_index`` row (the projection ``maka session list`` reads), by session id."""
        with self._lock, self._reading() as conn:
            return [
                SessionRow(**dict(r))
                for r in conn.execute(select(session_index).order_by(session_index.c.session_id)).mappings()
            ]

    def list_sessions(
        self,
        *,
        state: str | None = None,
        host: str | None = None,
        since_ms: int | None = None,
        limit: int = 100,
    ) -> list[SessionRow]:
        """Sessions from the session index, newest activity first (``session_index.session_rows``)."""
        with self._lock, self._reading() as conn:
            return session_rows(conn, state=state, host=host, since_ms=since_ms, limit=limit)

    def prefix(self, session_id: str, run_id: str) -> Prefix:
        """The committed prefix of one run: events, high-water and ``prefix_digest``."""
        with self._lock, self._reading() as conn:
            return self._prefix(conn, session_id, run_id)

    @staticmethod
    def _prefix(conn: Connection, session_id: str, run_id: str) -> Prefix:
        rows = conn.execute(
            select(runtime_events)
            .where(runtime_events.c.session_id == session_id, runtime_events.c.run_id == run_id)
            .order_by(runtime_events.c.ledger_seq)
        ).mappings()
        return make_prefix(session_id, run_id, [row_event(r) for r in rows])

    # --- rebuild and verify ----------------------------------------------------------------

    def rebuild(self) -> tuple[list[OperationRow], list[JournalRow]]:
        """Projections derived from the events alone.

        Raises:
            LedgerRejection: the first corruption issue (e.g. ``duplicate_call``,
                ``event_order_conflict``): a corrupt ledger has no canonical projection.
        """
        scanner = scan(self.events())
        if scanner.has_corruption:
            issue = scanner.issues[0]
            raise LedgerRejection(
                issue.code, "cannot rebuild projections of a corrupt ledger", **_detail(issue)
            )
        return project(scanner)

    def rebuild_projections(self, target: str | Path | None = None) -> LedgerReads | None:
        """Rebuild projections from events: in place (``target=None``) or into a scratch ledger.

        With a target, the events are copied row for row into a fresh ledger there and its
        projections are written from the rebuild; the new store is returned (the caller closes it).
        The session index follows the run headers and waiting requests too, so they are copied
        with the events.
        """
        ops, journal = self.rebuild()
        dest: LedgerReads = self if target is None else type(self).open(target)

        def body(conn: Connection) -> None:
            conn.execute(tool_journal_events.delete())
            conn.execute(tool_operations.delete())
            if dest is not self:
                with self._reading() as src:
                    for src_row in src.execute(
                        select(runtime_events).order_by(runtime_events.c.ledger_seq)
                    ).mappings():
                        conn.execute(runtime_events.insert(), dict(src_row))
                    for table in (agent_runs, tool_decisions):
                        copied = [dict(r) for r in src.execute(select(table)).mappings()]
                        if copied:
                            conn.execute(table.insert(), copied)
            now = now_ms()
            for row in ops:
                conn.execute(tool_operations.insert(), asdict(row))
            for entry in journal:
                conn.execute(tool_journal_events.insert(), {**asdict(entry), "committed_at": now})
            rebuild_index(conn)

        dest._write(body)
        return None if dest is self else dest

    def verify_chain(self) -> list[ChainBreak]:
        """Recompute every session's digest chain; the first row of each session that differs."""
        query = select(
            runtime_events.c.event_id,
            runtime_events.c.session_id,
            runtime_events.c.ledger_seq,
            runtime_events.c.payload_json,
            runtime_events.c.chain_digest,
        ).order_by(runtime_events.c.ledger_seq)
        with self._lock, self._reading() as conn:
            return chain_breaks((a, b, int(c), d, e) for a, b, c, d, e in conn.execute(query))

    def session_chain_break(self, session_id: str) -> ChainBreak | None:
        """The first row of one session whose chain digest does not match (None: intact). Read
        before repair, resume and a run's begin act on the session's facts."""
        query = (
            select(
                runtime_events.c.event_id,
                runtime_events.c.ledger_seq,
                runtime_events.c.payload_json,
                runtime_events.c.chain_digest,
            )
            .where(runtime_events.c.session_id == session_id)
            .order_by(runtime_events.c.ledger_seq)
        )
        with self._lock, self._reading() as conn:
            return first_break(session_id, conn.execute(query))

    def verify(self) -> list[str]:
        """Recompute the digest chains, then rebuild projections from events in a scratch ledger and
        diff them with the online ones.

        Returns the differences (empty when equal): the first ``ledger_chain_broken`` row of each
        session (an edited, deleted or reordered row), a corrupt ledger, a row whose payload is not
        in canonical form, and every projection row that differs from its rebuild.
        """
        chain = [b.line() for b in self.verify_chain()]
        try:
            scratch = self.rebuild_projections("sqlite://")
        except (LedgerRejection, StoreError) as exc:
            return [*chain, f"ledger: {exc.code} {exc.detail}"]
        assert scratch is not None
        try:
            problems = chain + self._non_canonical_rows()
            return (
                problems
                + _diff(self.operations(), self.journal(), scratch.operations(), scratch.journal())
                + _diff_index(self.session_index(), scratch.session_index())
            )
        finally:
            scratch.close()

    def _non_canonical_rows(self) -> list[str]:
        query = select(runtime_events.c.event_id, runtime_events.c.payload_json).order_by(
            runtime_events.c.ledger_seq
        )
        with self._lock, self._reading() as conn:
            return [
                f"runtime_events {event_id}: payload is not in canonical form"
                for event_id, payload in conn.execute(query)
                if codec.encode(codec.decode(payload)) != payload
            ]


def _diff(
    online_ops: list[OperationRow],
    online_j: list[JournalRow],
    rebuilt_ops: list[OperationRow],
    rebuilt_j: list[JournalRow],
) -> list[str]:
    problems: list[str] = []
    a_ops = {r.operation_id: r for r in online_ops}
    b_ops = {r.operation_id: r for r in rebuilt_ops}
    for op_id in sorted(a_ops.keys() | b_ops.keys()):
        if a_ops.get(op_id) != b_ops.get(op_id):
            problems.append(
                f"tool_operations {op_id}: online={_brief(a_ops.get(op_id))} "
                f"rebuilt={_brief(b_ops.get(op_id))}"
            )
    a_j = {r.journal_event_id: r for r in online_j}
    b_j = {r.journal_event_id: r for r in rebuilt_j}
    for jid in sorted(a_j.keys() | b_j.keys()):
        if a_j.get(jid) != b_j.get(jid):
            problems.append(
                f"tool_journal_events {jid}: online={_brief(a_j.get(jid))} rebuilt={_brief(b_j.get(jid))}"
            )
    # Per operation, the online journal must also keep the rebuilt order.
    for op_id in sorted(b_ops):
        want = [r.journal_event_id for r in rebuilt_j if r.operation_id == op_id]
        got = [r.journal_event_id for r in online_j if r.operation_id == op_id]
        if want != got and set(want) == set(got):
            problems.append(f"tool_journal_events {op_id}: order online={got} rebuilt={want}")
    return problems


def _diff_index(online: list[SessionRow], rebuilt: list[SessionRow]) -> list[str]:
    a = {r.session_id: r for r in online}
    b = {r.session_id: r for r in rebuilt}
    return [
        f"session_index {sid}: online={_brief(a.get(sid))} rebuilt={_brief(b.get(sid))}"
        for sid in sorted(a.keys() | b.keys())
        if a.get(sid) != b.get(sid)
    ]


def _brief(value: object) -> str:
    return "missing" if value is None else repr(asdict(value))  # type: ignore[call-overload]


def _detail(issue: Any) -> dict[str, str]:
    detail = issue.to_json()
    detail.pop("code", None)
    return dict(detail)


def _journal(row: RowMapping) -> JournalRow:
    values = dict(row)
    values.pop("journal_seq", None)
    values.pop("committed_at", None)
    return JournalRow(**values)
