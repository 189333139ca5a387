"""The ledger's health, checked rather than assumed.

A store remembers which file it opened (device and inode) and the ledger's identity (``ledger_id``
in ``maka_meta``, written once at creation). Before every writer transaction it stats the path
once: a ledger deleted or replaced under a live process would otherwise keep taking writes into an
unlinked inode that no other process (and no restart) will ever see, and a restarted worker would
start a new ledger and re-run side effects the lost one recorded. Faults the database reports
mid-write (a read-only file or directory, a full disk) are classified once, in
``maka_core.store.engine.translate``. Whichever way a fault is found, the store records it and
refuses every later write with the same code: the worker's watchdog reads ``failure`` and stops
the process loudly instead of serving sessions against a ledger that cannot keep their facts.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, NoReturn, get_args

from maka_core.errors import StoreError

HealthCode = Literal["ledger_replaced", "ledger_unwritable", "ledger_full"]
HEALTH_CODES: frozenset[str] = frozenset(get_args(HealthCode))


@dataclass(frozen=True)
class FileIdentity:
    """Which file a path named when it was opened."""

    device: int
    inode: int

    @classmethod
    def of(cls, path: Path) -> FileIdentity | None:
        try:
            st = os.stat(path)
        except FileNotFoundError:
            return None
        return cls(st.st_dev, st.st_ino)


class LedgerHealth:
    """One store's view of its ledger's health; ``failure`` is sticky once set."""

    def __init__(self, file: Path | None, ledger_id: str | None) -> None:
        # Absolute: the check must name the same file whatever the process's directory later is.
        self.file = None if file is None else Path(os.path.abspath(file))
        self.ledger_id = ledger_id
        self.identity = FileIdentity.of(file) if file is not None else None
        self.failure: StoreError | None = None
        #: The start scan's progress (``store.verification``), when one runs.
        self.progress: Callable[[], dict[str, Any]] | None = None

    @property
    def ok(self) -> bool:
        return self.failure is None

    def check(self) -> None:
        """One stat: the path still names the file this store opened.

        Raises:
            StoreError: ``ledger_replaced``, or the failure already recorded.
        """
        if self.failure is not None:
            raise _again(self.failure)
        if self.file is None:
            return
        now = FileIdentity.of(self.file)
        if now is None:
            self._fail("ledger_replaced", "the ledger file was deleted under this process")
        if now != self.identity:
            self._fail("ledger_replaced", "the ledger path now names another file than the one opened")

    def check_id(self, found: str | None) -> None:
        """The database answering is still the ledger this store opened (same ``ledger_id``)."""
        if self.failure is None and found != self.ledger_id:
            self._fail("ledger_replaced", "the ledger's identity changed under this process", foundId=found)

    def note(self, error: StoreError) -> None:
        """Record a health fault the database reported (other store errors pass by)."""
        if error.code in HEALTH_CODES and self.failure is None:
            self.failure = error

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"ok": self.ok, "ledgerId": self.ledger_id}
        if self.failure is not None:
            out.update(code=self.failure.code, message=self.failure.message)
        if self.progress is not None:
            out["verification"] = self.progress()
        return out

    def _fail(self, code: HealthCode, message: str, **detail: Any) -> NoReturn:
        path = None if self.file is None else str(self.file)
        self.failure = StoreError(code, message, path=path, ledgerId=self.ledger_id, **detail)
        raise _again(self.failure)


def _again(error: StoreError) -> StoreError:
    """A fresh exception each time (one instance raised twice would chain its own tracebacks)."""
    return StoreError(error.code, error.message, **error.detail)


def create_private(file: Path) -> None:
    """Create a new ledger file ``0600`` in a ``0700`` directory before SQLite opens it: SQLite gives
    its ``-wal`` and ``-shm`` files the database file's mode, so all three stay the owner's."""
    if not file.parent.exists():
        file.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    try:
        fd = os.open(file, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    except FileExistsError:
        return
    os.close(fd)


def unwritable(file: Path) -> StoreError | None:
    """``ledger_unwritable`` when the ledger or its directory cannot be written (a read-only file,
    directory or file system), so a failed open says why instead of ``store_unreadable``."""
    target = file if file.exists() else file.parent
    for path in (target, file.parent):
        if path.exists() and not os.access(path, os.W_OK):
            return StoreError("ledger_unwritable", f"{path} is not writable", path=str(path))
    return None


#: Less free space than this on the ledger's file system is reported as ``ledger_full``.
LOW_SPACE_BYTES = 1 << 20


def probe_path(file: Path) -> dict[str, Any]:
    """The ledger's health as a reader can see it without writing (``maka session status``):
    ``{"ok": true}`` or ``{"ok": false, "code": ..., "message": ...}``."""
    cause = unwritable(file)
    if cause is None and file.exists():
        st = os.statvfs(file)
        if st.f_bavail * st.f_frsize < LOW_SPACE_BYTES:
            cause = StoreError("ledger_full", f"less than 1 MiB free where {file} lives", path=str(file))
    if cause is None:
        return {"ok": True}
    return {"ok": False, "code": cause.code, "message": cause.message}


def probe_url(url: str) -> dict[str, Any]:
    """``probe_path`` for a server ledger (PostgreSQL), also without writing: a server in recovery (a
    standby), a session that defaults to read-only, or a role without the writers' privileges is
    ``ledger_unwritable``; an unreachable server is ``store_unreadable``."""
    from sqlalchemy import create_engine, text
    from sqlalchemy.exc import DBAPIError

    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            row = conn.execute(
                text(
                    "SELECT current_setting('transaction_read_only') = 'on', pg_is_in_recovery(), "
                    "has_table_privilege('maka_meta', 'UPDATE') "
                    "AND has_table_privilege('runtime_events', 'INSERT')"
                )
            ).one()
    except DBAPIError as exc:
        return {"ok": False, "code": "store_unreadable", "message": str(exc.orig)}
    finally:
        engine.dispose()
    read_only, standby, privileged = row
    if read_only or standby:
        return {"ok": False, "code": "ledger_unwritable", "message": "the ledger's server takes no writes"}
    if not privileged:
        return {"ok": False, "code": "ledger_unwritable", "message": "this role may not write the ledger"}
    return {"ok": True}
