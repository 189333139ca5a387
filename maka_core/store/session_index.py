"""The session index: one ``session_index`` row per session, what ``maka session list`` reads.

A projection, kept by the writers in the transaction of each fact or header that changes it
(``IndexUpkeep``, flushed by ``LedgerStore``'s one commit path before it commits) and rebuilt equal
from the ledger alone (``rebuild_index``: the migration's backfill, ``rebuild_projections``, and
``verify``'s diff). It never overrides what it follows.

A row has two parts:

- what the session's events say, folded batch by batch: the last commit time, the event count, the
  token usage summed over every model step (``facts.usage``), and the host of the latest session
  record (``runtime.session_record``);
- the state, recomputed from the session's run headers whenever a transaction touches the session,
  by the same ``ledger.session_state.derive_state`` ``maka session status`` uses when Temporal cannot
  answer, plus ``awaiting_approval`` while a running turn's request waits (as
  ``workers.client.policy.governance_status`` says it). Only a session whose latest turn ended
  reads its events for this (an ended turn may leave an unresolved call, which parks the session);
  a running or parked one reads its headers and its waiting requests, both indexed.

The state depends on the run headers because status's does: a header is running before its run's
first fact, and a host park is a header, not a fact. So the rebuild reads events, run headers and
the waiting requests (``agent_runs``, ``tool_decisions``): the ledger's records, nothing else.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, fields, replace
from functools import partial
from typing import Any, TypeVar

from sqlalchemy import Connection, or_, select

from maka_core.facts import canonical_json
from maka_core.facts.events import RuntimeEvent
from maka_core.facts.run_header import RunHeader
from maka_core.facts.usage import Usage, add_usage
from maka_core.ledger.session_state import ShownState, derive_state, latest_run, operations
from maka_core.runtime.resolution import RESOLUTION_PREFIX, is_resolution_run
from maka_core.runtime.session_record import record_of
from maka_core.store.engine import driver_execute
from maka_core.store.hot_sql import rows_since
from maka_core.store.rows import header_of, row_event
from maka_core.store.schema import agent_runs, runtime_events, session_index, tool_decisions

__all__ = ["IndexUpkeep", "SessionRow", "rebuild_index", "rebuild_rows", "session_rows"]


@dataclass(frozen=True)
class SessionRow:
    """One ``session_index`` row (times in epoch milliseconds)."""

    session_id: str
    state: str
    park_reason: str | None
    last_activity_at: int
    last_event_at: int
    host: str | None
    turns: int
    event_count: int
    usage_json: str | None


T = TypeVar("T")

_FIELDS = tuple(f.name for f in fields(SessionRow))
_COLUMNS = ", ".join(_FIELDS)


@dataclass(frozen=True)
class _Tally:
    """The part of a row the session's events say, folded in ledger order."""

    last_event_at: int = 0
    event_count: int = 0
    usage: Usage | None = None
    host: str | None = None

    def plus(self, events: Iterable[tuple[RuntimeEvent, int]]) -> _Tally:
        tally = self
        for event, committed_at in events:
            usage = event.actions.token_usage if event.actions is not None else None
            record = record_of(event)
            tally = replace(
                tally,
                last_event_at=max(tally.last_event_at, committed_at),
                event_count=tally.event_count + 1,
                usage=add_usage(dict(tally.usage or {}), usage) if usage else tally.usage,
                # The latest valid record's host, as ``session_record`` reads it (None: not pinned).
                host=record.config.host if record is not None else tally.host,
            )
        return tally

    @classmethod
    def of_row(cls, row: Mapping[str, Any]) -> _Tally:
        usage = canonical_json.loads(row["usage_json"]) if row["usage_json"] is not None else None
        return cls(int(row["last_event_at"]), int(row["event_count"]), usage, row["host"])


def _session_events(conn: Connection, session_id: str) -> list[tuple[RuntimeEvent, int]]:
    rows = conn.execute(
        select(runtime_events)
        .where(runtime_events.c.session_id == session_id)
        .order_by(runtime_events.c.ledger_seq)
    ).mappings()
    return [(row_event(r), int(r["committed_at"])) for r in rows]


def _all(events: list[tuple[RuntimeEvent, int]], run_id: str) -> list[tuple[RuntimeEvent, int]]:
    """A session's events, already read, serving as its last turn's (``_row``'s ``events``)."""
    return events


def _turn_events(conn: Connection, session_id: str, run_id: str) -> list[tuple[RuntimeEvent, int]]:
    """What the state of a session whose latest turn ``run_id`` ended depends on: that run's events
    and the operators' resolutions (which settle its calls from runs of their own). Not the whole
    session: a long session's state costs what its last turn costs."""
    rows = conn.execute(
        select(runtime_events)
        .where(
            runtime_events.c.session_id == session_id,
            or_(runtime_events.c.run_id == run_id, runtime_events.c.run_id.startswith(RESOLUTION_PREFIX)),
        )
        .order_by(runtime_events.c.ledger_seq)
    ).mappings()
    return [(row_event(r), int(r["committed_at"])) for r in rows]


def _row(
    session_id: str,
    tally: _Tally,
    runs: list[RunHeader],
    waiting_runs: Callable[[], set[str]],
    events: Callable[[str], list[tuple[RuntimeEvent, int]]],
) -> SessionRow:
    """A session's row. Read only when the state needs them: ``events(run_id)``, the events its
    latest turn's state depends on once that turn ended (``_turn_events``: the session's events
    serve as well), ``waiting_runs``, the runs of its requests still awaiting an answer (a running
    one)."""
    last = latest_run(runs)
    ended = (
        last is not None and last.status != "running" and not (last.park_reason or last.status == "parked")
    )
    if ended and last is not None:
        facts = [e for e, _ in events(last.run_id)]
        derived, park_reason = derive_state(runs, operations(facts), facts)
    else:
        derived, park_reason = derive_state(runs)
    state: ShownState = derived
    running = {r.run_id for r in runs if r.status == "running"}
    if state == "running" and waiting_runs() & running:
        state = "awaiting_approval"
    last_run_at = max((r.updated_at for r in runs), default=0)
    return SessionRow(
        session_id=session_id,
        state=state,
        park_reason=park_reason,
        last_activity_at=max(tally.last_event_at, last_run_at),
        last_event_at=tally.last_event_at,
        host=tally.host,
        turns=sum(1 for r in runs if not is_resolution_run(r.run_id)),
        event_count=tally.event_count,
        usage_json=canonical_json.dumps(tally.usage) if tally.usage is not None else None,
    )


def _waiting_runs(conn: Connection, session_id: str | None = None) -> dict[str, set[str]]:
    """session id -> the runs with a request still awaiting an answer."""
    query = select(tool_decisions.c.session_id, tool_decisions.c.run_id).where(
        tool_decisions.c.state == "awaiting_approval"
    )
    if session_id is not None:
        query = query.where(tool_decisions.c.session_id == session_id)
    out: dict[str, set[str]] = {}
    for sid, run_id in conn.execute(query):
        out.setdefault(str(sid), set()).add(str(run_id))
    return out


#: The states an event alone cannot change: a running turn's state follows its headers (a
#: ``touch``) and its waiting requests (their writers ``touch`` too), never the facts it commits.
_STEADY = ("running", "awaiting_approval")


@dataclass
class _Pending:
    """What one transaction did to a session: its new events (stamped), and whether a header or
    request changed (``touched``) or the batch holds the session's very first events (``first``)."""

    events: list[tuple[RuntimeEvent, int]]
    touched: bool = False
    first: bool = False


class IndexUpkeep:
    """The sessions one writer transaction touched and the events it committed, written into the
    index by ``flush`` inside that transaction (``reset`` when it does not commit).

    A T1 or a T2 of a running turn reads nothing for the index: one ``UPDATE ... RETURNING`` adds
    the batch to the session's row and says whether its state could have moved. Only a header or
    request change, a settled session's new facts, or a row the index lacks read the ledger."""

    def __init__(self) -> None:
        self._pending: dict[str, _Pending] = {}

    def reset(self) -> None:
        self._pending = {}

    def _of(self, session_id: str) -> _Pending:
        return self._pending.setdefault(session_id, _Pending([]))

    def touch(self, session_id: str) -> None:
        """A header or request of the session changed."""
        self._of(session_id).touched = True

    def saw(self, events: Sequence[RuntimeEvent], committed_at: int, *, first: bool = False) -> None:
        """These events, one session's, were inserted in this transaction (ledger order) at
        ``committed_at``; ``first``: the session had no events before them."""
        for event in events:
            pending = self._of(event.session_id)
            pending.first = pending.first or (first and not pending.events)
            pending.events.append((event, committed_at))

    def following(self, write: Callable[[Connection], T]) -> Callable[[Connection], T]:
        """``write`` and then the index rows it changed, as one transaction body."""

        def body(conn: Connection) -> T:
            try:
                out = write(conn)
            except BaseException:
                self.reset()  # rolled back (a group member's savepoint too): nothing to follow
                raise
            self.flush(conn)
            return out

        return body

    def flush(self, conn: Connection) -> None:
        try:
            for session_id, pending in self._pending.items():
                _follow(conn, session_id, pending)
        finally:
            self.reset()


def _mark(conn: Connection) -> str:
    return "?" if conn.dialect.paramstyle == "qmark" else "%s"


def _follow(conn: Connection, session_id: str, pending: _Pending) -> None:
    # The driver's own SQL (``hot_sql``'s reason: this runs in every writer transaction).
    if pending.touched or not pending.events:
        _refresh(conn, session_id, pending.events)
        return
    batch = _Tally().plus(pending.events)
    mark = _mark(conn)
    last = batch.last_event_at
    sql = (
        f"UPDATE session_index SET event_count = event_count + {mark}, last_event_at = {mark}, "
        f"last_activity_at = CASE WHEN last_activity_at > {mark} THEN last_activity_at ELSE {mark} END "
        f"WHERE session_id = {mark} RETURNING state, usage_json, host"
    )
    found = driver_execute(conn, sql, (batch.event_count, last, last, last, session_id)).fetchone()
    if found is None:
        if pending.first:
            # The session's first facts and no row: it has no run header either (a header makes
            # its row), so the row is the batch's alone.
            _put(conn, _row(session_id, batch, [], set, lambda _run: []), None)
        else:
            _refresh(conn, session_id, pending.events, added=False)
        return
    state, usage_json, host = found
    usage = canonical_json.loads(usage_json) if usage_json is not None else None
    folded = replace(batch, usage=usage, host=host).plus(
        (e, at) for e, at in pending.events if record_of(e) is not None or _usage_of(e)
    )
    if folded.usage != usage or folded.host != host:
        sql = f"UPDATE session_index SET usage_json = {mark}, host = {mark} WHERE session_id = {mark}"
        dumped = canonical_json.dumps(folded.usage) if folded.usage is not None else None
        driver_execute(conn, sql, (dumped, folded.host, session_id))
    if state not in _STEADY:
        _refresh(conn, session_id, [])  # a settled session's facts may move its state


def _usage_of(event: RuntimeEvent) -> Usage | None:
    return event.actions.token_usage if event.actions is not None else None


def _refresh(
    conn: Connection, session_id: str, new: list[tuple[RuntimeEvent, int]], *, added: bool = True
) -> None:
    """Recompute the session's row from its current row (or its events), its headers and its
    waiting requests, folding ``new`` in unless the row already counts it."""
    mark = _mark(conn)
    found = rows_since(conn, f"SELECT {_COLUMNS} FROM session_index WHERE session_id = {mark}", session_id)
    current = found[0] if found else None
    if current is None:
        # The session's first row (or one a rebuild left out): fold all of its events once.
        tally = _Tally().plus(_session_events(conn, session_id))
    else:
        tally = _Tally.of_row(current).plus(new if added else [])
    runs = [
        header_of(r)
        for r in rows_since(conn, f"SELECT * FROM agent_runs WHERE session_id = {mark}", session_id)
    ]
    if not runs and tally.event_count == 0:
        return  # nothing of the session is in the ledger
    row = _row(
        session_id,
        tally,
        runs,
        lambda: _waiting_runs(conn, session_id).get(session_id, set()),
        lambda run_id: _turn_events(conn, session_id, run_id),
    )
    _put(conn, row, current)


def _put(conn: Connection, row: SessionRow, current: Mapping[str, Any] | None) -> None:
    mark, values = _mark(conn), asdict(row)
    if current is None:
        sql = f"INSERT INTO session_index ({_COLUMNS}) VALUES ({', '.join([mark] * len(_FIELDS))})"
        driver_execute(conn, sql, tuple(values[f] for f in _FIELDS))
    elif dict(current) != values:
        sets = ", ".join(f"{f} = {mark}" for f in _FIELDS[1:])
        sql = f"UPDATE session_index SET {sets} WHERE session_id = {mark}"
        driver_execute(conn, sql, (*(values[f] for f in _FIELDS[1:]), row.session_id))


def rebuild_rows(conn: Connection) -> list[SessionRow]:
    """Every session's row from the ledger's events, run headers and waiting requests alone, in
    session id order (one read of each table)."""
    events: dict[str, list[tuple[RuntimeEvent, int]]] = {}
    for r in conn.execute(select(runtime_events).order_by(runtime_events.c.ledger_seq)).mappings():
        events.setdefault(str(r["session_id"]), []).append((row_event(r), int(r["committed_at"])))
    runs: dict[str, list[RunHeader]] = {}
    for r in conn.execute(select(agent_runs)).mappings():
        runs.setdefault(str(r["session_id"]), []).append(header_of(r))
    waiting = _waiting_runs(conn)
    out = []
    for sid in sorted(events.keys() | runs.keys()):
        mine = events.get(sid, [])
        asks = waiting.get(sid, set())
        out.append(_row(sid, _Tally().plus(mine), runs.get(sid, []), partial(set, asks), partial(_all, mine)))
    return out


def rebuild_index(conn: Connection) -> None:
    """Replace every ``session_index`` row with its rebuild (the v6 migration's backfill)."""
    conn.execute(session_index.delete())
    rows = [asdict(r) for r in rebuild_rows(conn)]
    if rows:
        conn.execute(session_index.insert(), rows)


def session_rows(
    conn: Connection,
    *,
    state: str | None = None,
    host: str | None = None,
    since_ms: int | None = None,
    limit: int = 100,
) -> list[SessionRow]:
    """Index rows, newest activity first (ties by session id), filtered, at most ``limit``."""
    query = select(session_index)
    if state is not None:
        query = query.where(session_index.c.state == state)
    if host is not None:
        query = query.where(session_index.c.host == host)
    if since_ms is not None:
        query = query.where(session_index.c.last_activity_at >= since_ms)
    query = query.order_by(session_index.c.last_activity_at.desc(), session_index.c.session_id.desc())
    return [SessionRow(**dict(r)) for r in conn.execute(query.limit(limit)).mappings()]
