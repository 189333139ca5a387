"""Attempt fences: an operation recovery has taken over, so its original attempt writes nothing.

A worker frozen before its write (a SIGSTOP, a VM paused, a long GC) may wake after recovery
settled its call and the session went on. Its write is guarded by the T1 before-state, which a
user who set the file back restores, so the before-state alone cannot tell the late original
from the live one. The fence does: recovery records ``fence_operation`` before it looks at the
target, and the original attempt reads ``fenced`` holding the target folder's lock, the lock its
exchange holds (``tools.guarded_replace``). Recovery then waits for that lock once before it
observes, so either the original saw no fence and finished its write first (recovery observes
it), or it sees the fence and writes nothing.
"""

from __future__ import annotations

from sqlalchemy import Connection, insert, select

from maka_core.facts.clock import now_ms
from maka_core.store.reads import LedgerReads
from maka_core.store.schema import operation_fences


class FenceRecords(LedgerReads):
    """``operation_fences``: written by recovery, read by an attempt about to write."""

    def fence_operation(self, operation_id: str) -> None:
        """Record, durably, that recovery has taken ``operation_id`` over (idempotent)."""

        def body(conn: Connection) -> None:
            if not _fenced(conn, operation_id):
                conn.execute(insert(operation_fences).values(operation_id=operation_id, fenced_at=now_ms()))

        self._write(body)

    def fenced(self, operation_id: str) -> bool:
        """Whether recovery has taken ``operation_id`` over (any thread: reads hold the store's lock)."""
        with self._lock, self._reading() as conn:
            return _fenced(conn, operation_id)


def _fenced(conn: Connection, operation_id: str) -> bool:
    found = conn.execute(
        select(operation_fences.c.operation_id).where(operation_fences.c.operation_id == operation_id)
    ).first()
    return found is not None
