"""Opening the ledger for a reader or a command: a path or URL in, a ``LedgerStore`` or a stable
refusal out (never a store traceback). Every room uses it: the CLI, ``SessionClient`` and resume."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sqlalchemy.exc import SQLAlchemyError

from maka_core.errors import MakaError, StoreError
from maka_core.store.engine import database_url, sqlite_file
from maka_core.store.writer import LedgerStore

__all__ = ["ensure_utf8", "open_ledger", "session_events"]


def open_ledger(target: str | Path, *, create: bool) -> LedgerStore:
    """Open the ledger at a path or URL; refuses instead of raising a store traceback.

    Only the commands that run turns (worker, dev, demo, session start) and ``ledger import`` may
    create it; every reader refuses a missing file (``ledger_not_found``) rather than leaving an
    empty database behind.

    Raises:
        MakaError: ``ledger_not_found``, ``store_unreadable`` (a directory, not SQLite, unreachable),
            ``schema_too_new``.
    """
    file = sqlite_file(database_url(target))
    if file is not None:
        if file.is_dir():
            raise StoreError("store_unreadable", f"{file} is a directory, not a ledger", path=str(file))
        if not create and not file.exists():
            raise MakaError("ledger_not_found", f"no ledger at {file}", path=str(file))
    try:
        return LedgerStore.open(target)
    except SQLAlchemyError as exc:
        raise StoreError(
            "store_unreadable", f"cannot open the ledger: {exc.__class__.__name__}: {exc}"
        ) from None


def session_events(target: str | Path, session_id: str, *, run_id: str | None = None) -> list[Any]:
    """A stored session's events (of one run, when given), read-only.

    Raises:
        MakaError: ``session_not_found`` when the ledger holds none; ``open_ledger``'s codes.
    """
    with open_ledger(target, create=False) as store:
        events: list[Any] = store.events(session_id=session_id, run_id=run_id)
    if not events:
        raise MakaError("session_not_found", f"no events for session {session_id}", sessionId=session_id)
    return events


def ensure_utf8(text: str, what: str) -> str:
    """Refuse text that did not decode as UTF-8 (arguments arrive with surrogate escapes)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise MakaError(f"{what}_invalid", f"the {what} is not valid UTF-8") from None
    return text
