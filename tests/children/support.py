"""Test-side access to a ledger below the writers: raw rows (to plant corruption the writers
would refuse), reopening, and a byte-level snapshot of a SQLite file."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

from sqlalchemy import func, select, update

from maka_core.facts import codec
from maka_core.facts.events import RuntimeEvent
from maka_core.store.rows import event_columns
from maka_core.store.schema import runtime_events
from maka_core.store.writer import LedgerStore


def raw_insert(store: LedgerStore, *events: RuntimeEvent, payload: str | None = None) -> None:
    """Insert events as rows without any validation (what a buggy or foreign writer could do)."""
    with store.engine.begin() as conn:
        for event in events:
            seq = conn.execute(select(func.coalesce(func.max(runtime_events.c.ledger_seq), 0))).scalar_one()
            eseq = conn.execute(
                select(func.coalesce(func.max(runtime_events.c.event_seq), 0)).where(
                    runtime_events.c.invocation_id == event.invocation_id
                )
            ).scalar_one()
            conn.execute(
                runtime_events.insert().values(
                    **event_columns(event),
                    event_seq=eseq + 1,
                    ledger_seq=seq + 1,
                    payload_json=payload if payload is not None else codec.encode(event),
                    committed_at=0,
                )
            )


def raw_update(store: LedgerStore, event_id: str, **values: Any) -> None:
    """Rewrite columns of one stored row behind the store's back."""
    with store.engine.begin() as conn:
        conn.execute(update(runtime_events).where(runtime_events.c.event_id == event_id).values(**values))


def reopen(store: LedgerStore) -> LedgerStore:
    """A fresh store over the same database (a memory database keeps its one connection)."""
    if store.url == "sqlite://":
        return LedgerStore(store.engine, store.url)
    store.close()
    return LedgerStore.open(store.url)


def file_digest(path: Path) -> str:
    """sha256 of a SQLite file and its WAL/SHM sidecars (what "not mutated" means on disk)."""
    h = hashlib.sha256()
    for suffix in ("", "-wal"):
        p = Path(str(path) + suffix)
        h.update(suffix.encode())
        h.update(p.read_bytes() if p.exists() else b"<absent>")
    return h.hexdigest()
