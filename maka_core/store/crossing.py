"""What a batch may meet outside its own session, checked against the database's keys.

A session's scanner folds every committed row of its session, so it judges a batch exactly as a
fold of the whole ledger would, except for the identities that cross sessions: an event id, an
invocation seen first under another spine, an operation id bound to another call, and the
terminal fact of a run another session uses. The commit path (``store.commit``) reads those keys
once per write (``read_batch_keys``), and the checks here refuse with the scanner's own codes.
``mark`` is the driver's parameter marker (``?`` on SQLite, ``%s`` on PostgreSQL).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from sqlalchemy import Connection

from maka_core.errors import LedgerRejection
from maka_core.facts.events import RuntimeEvent
from maka_core.ledger.committed import CommittedView
from maka_core.ledger.scanner import LedgerScanner
from maka_core.store.hot_sql import KeyFacts, read_keys
from maka_core.store.scopes import SessionScope


@dataclass(frozen=True)
class Crossing:
    """What a batch asks of sessions other than its own (``check_crossing``)."""

    first: RuntimeEvent
    sessions: int
    invocations: tuple[tuple[RuntimeEvent, tuple[str, str, str]], ...]
    operations: tuple[tuple[RuntimeEvent, str, str], ...]


def crossing_identities(scanner: LedgerScanner, batch: Sequence[RuntimeEvent]) -> Crossing:
    """Before ``admit``: the batch's invocations and operation ids its session has not seen."""
    invocations: dict[str, tuple[RuntimeEvent, tuple[str, str, str]]] = {}
    operations: list[tuple[RuntimeEvent, str, str]] = []
    for event in batch:
        if scanner.spine(event.invocation_id) is None and event.invocation_id not in invocations:
            invocations[event.invocation_id] = (event, (event.session_id, event.run_id, event.turn_id))
        td = event.actions.tool_dispatch if event.actions is not None else None
        if td is not None and scanner.operation(td.operation_id) is None:
            operations.append((event, td.operation_id, td.provider_tool_call_id))
    return Crossing(
        batch[0], len({e.session_id for e in batch}), tuple(invocations.values()), tuple(operations)
    )


def read_batch_keys(
    conn: Connection,
    mark: str,
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
    crossing = crossing_identities(scanner, unknown)
    runs = sorted({e.run_id for e in unknown} - scope.view.first_of_run.keys()) if live else []
    return read_keys(
        conn,
        mark,
        events=[e.id for e in unknown],
        invocations=[e.invocation_id for e, _ in crossing.invocations],
        operations=sorted({op for _, op, _ in crossing.operations}),
        runs=runs,
    )


def foreign_terminal(
    conn: Connection,
    mark: str,
    scope: SessionScope,
    fresh: Sequence[tuple[RuntimeEvent, str]],
    keys: KeyFacts,
) -> dict[str, str]:
    """The terminal facts of the batch's runs this session has never seen (a run id another
    session uses), from the run/terminal index: the full fold refuses what follows them too."""
    runs = sorted({e.run_id for e, _ in fresh} - scope.view.first_of_run.keys())
    if not keys.answers("t", runs):  # never today (the write's read covers the batch); kept as a net
        keys = read_keys(conn, mark, runs=runs)
    return {run: keys.terminals[run] for run in runs if run in keys.terminals}


def refuse_after_terminal(
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


def check_crossing(conn: Connection, mark: str, crossing: Crossing, keys: KeyFacts) -> None:
    """The fold's identity checks for what only another session can hold: an invocation seen
    first under another spine, an operation id bound to another call, a batch of two sessions
    (the scanner of the batch's session cannot see them; the database's keys can)."""
    invocations = [e.invocation_id for e, _ in crossing.invocations]
    operations = [op for _, op, _ in crossing.operations]
    if not (keys.answers("s", invocations) and keys.answers("o", operations)):  # a net, as above
        keys = read_keys(conn, mark, invocations=invocations, operations=operations)
    for event, spine in crossing.invocations:
        found = keys.spines.get(event.invocation_id)
        if found is not None and found != spine:
            raise _crossing_rejection("invocation_identity_conflict", event)
    for event, op_id, call_id in crossing.operations:
        if op_id in keys.owned:
            raise _crossing_rejection("duplicate_operation", event, op_id, call_id)
    if crossing.sessions > 1:
        raise _crossing_rejection("invocation_identity_conflict", crossing.first)


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


__all__ = [
    "Crossing",
    "check_crossing",
    "crossing_identities",
    "foreign_terminal",
    "read_batch_keys",
    "refuse_after_terminal",
]
