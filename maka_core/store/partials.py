"""A streamed model step's text so far (a ``LedgerStore`` mixin): the ``step_partials`` table.

Beside the ledger, never in it: a row is mutable, overwritten while the vendor streams the step and
deleted once the step's output commits. It is no event, so no digest, cursor, ``verify`` rebuild or
replay ever reads it; the step's committed output stays the one fact. A crash mid-stream leaves a
stale row: the re-run step overwrites it from its first token, and a reader ignores the row of a
step that has committed, so a partial never outlives its fact.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import Connection, delete, select, update

from maka_core.store.reads import LedgerReads
from maka_core.store.schema import step_partials


class StepPartials(LedgerReads):
    """Write, clear and read the partial snapshots of streamed steps."""

    def put_partial(
        self, step_id: str, *, session_id: str, run_id: str, text: str, started_at: int, now: int
    ) -> None:
        """Overwrite step ``step_id``'s text so far (the first write of an attempt starts the row
        over: a re-run step's text never continues a crashed attempt's)."""

        def body(conn: Connection) -> None:
            row = conn.execute(
                select(step_partials.c.started_at).where(step_partials.c.step_id == step_id)
            ).first()
            if row is not None and int(row[0]) == started_at:
                conn.execute(
                    update(step_partials)
                    .where(step_partials.c.step_id == step_id)
                    .values(text=text, updated_at=now)
                )
                return
            if row is not None:
                conn.execute(delete(step_partials).where(step_partials.c.step_id == step_id))
            conn.execute(
                step_partials.insert().values(
                    step_id=step_id,
                    session_id=session_id,
                    run_id=run_id,
                    text=text,
                    started_at=started_at,
                    first_token_at=now,
                    updated_at=now,
                )
            )

        self._write(body)

    def clear_partial(self, step_id: str) -> None:
        """Delete step ``step_id``'s row (its output has committed, or it ended without one)."""
        self._write(
            lambda conn: conn.execute(delete(step_partials).where(step_partials.c.step_id == step_id))
        )

    def partials(self, session_id: str) -> list[dict[str, Any]]:
        """The session's rows, oldest first: ``{stepId, runId, text, startedAt, firstTokenAt,
        updatedAt}``. A row whose step has committed may be among them (a crash between the commit
        and the delete): the reader leaves out a step its events hold (``session_follow``)."""
        with self._lock, self._reading() as conn:
            rows = conn.execute(
                select(step_partials)
                .where(step_partials.c.session_id == session_id)
                .order_by(step_partials.c.started_at, step_partials.c.step_id)
            ).all()
        return [
            {
                "stepId": row.step_id,
                "runId": row.run_id,
                "text": row.text,
                "startedAt": int(row.started_at),
                "firstTokenAt": None if row.first_token_at is None else int(row.first_token_at),
                "updatedAt": int(row.updated_at),
            }
            for row in rows
        ]
