"""Run-header persistence for ``LedgerStore`` (a mixin).

A terminal header needs its run's terminal RuntimeEvent already committed (the event is the
fact; the header follows it), and a terminal header never changes status again.
"""

from __future__ import annotations

from sqlalchemy import Connection, select, update

from maka_core.errors import LedgerRejection
from maka_core.facts import canonical_json
from maka_core.facts.clock import now_ms
from maka_core.facts.run_header import RunHeader
from maka_core.store.reads import LedgerReads
from maka_core.store.rows import header_of
from maka_core.store.schema import agent_runs, runtime_events


class RunHeaderStore(LedgerReads):
    """``put_run``, ``get_run``, ``list_runs``."""

    def put_run(self, header: RunHeader) -> RunHeader:
        """Insert or update a run header. A terminal header needs the run's terminal event first.

        Raises:
            LedgerRejection: ``terminal_event_missing`` or ``run_already_terminal``.
        """

        def body(conn: Connection) -> RunHeader:
            self._touch_session(header.session_id)
            return write_run_header(conn, header)

        result: RunHeader = self._write(body)
        return result

    def _touch_session(self, session_id: str) -> None:
        """A write of this transaction changes what the session index shows of the session
        (``LedgerStore`` keeps the index; a bare reader has none)."""

    def get_run(self, run_id: str) -> RunHeader | None:
        with self._lock, self._reading() as conn:
            return _run_row(conn, run_id)

    def list_runs(self, session_id: str | None = None, nonterminal: bool = False) -> list[RunHeader]:
        query = select(agent_runs).order_by(agent_runs.c.created_at, agent_runs.c.run_id)
        if session_id is not None:
            query = query.where(agent_runs.c.session_id == session_id)
        if nonterminal:
            query = query.where(agent_runs.c.status.in_(("running", "parked")))
        with self._lock, self._reading() as conn:
            return [header_of(r) for r in conn.execute(query).mappings()]


def _run_row(conn: Connection, run_id: str) -> RunHeader | None:
    row = conn.execute(select(agent_runs).where(agent_runs.c.run_id == run_id)).mappings().first()
    return None if row is None else header_of(row)


def write_run_header(conn: Connection, header: RunHeader) -> RunHeader:
    """``put_run``'s write, inside a transaction the caller holds (a writer's post hook, so a run
    header commits with the run's terminal fact)."""
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
