"""The start scan: the ledger's history, verified in the background, session by session.

A store folds only the sessions it serves (``store.scopes``), so corruption in a settled session
nobody names would otherwise never be seen, while the rule is that corruption anywhere in the
ledger stops every tool boundary. At open the store reads its high-water H and starts this scan:
on its own thread and its own connections, never under the write lock, it lists the sessions with
a row at or below H (a page of ids at a time) and folds each session's rows up to H into a
throwaway scope, keeping only the session's first issue (memory: one session's fold at a time).
A corrupt session is recorded on the store, sticky, so every tool boundary stops from then on.
Rows past H are the store's own to check: each one it syncs is folded in its session's scope,
resident or loaded for the purpose (``LedgerStore._fold_rows``).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any, Literal

from sqlalchemy import Engine

from maka_core.errors import MakaError
from maka_core.ledger.scanner import LedgerIssue
from maka_core.store.engine import read_tx
from maka_core.store.hot_sql import HotSQL, rows_since
from maka_core.store.scopes import SessionScope

log = logging.getLogger(__name__)

VerificationState = Literal["verifying", "verified", "corrupt", "stopped", "failed"]

#: Session ids listed per read.
PAGE = 256


class LedgerVerification:
    """One scan of every session with a row at or below ``upto``."""

    def __init__(
        self,
        engine: Engine,
        sql: HotSQL,
        upto: int,
        record: Callable[[str, LedgerIssue], None],
        *,
        own: bool = False,
    ) -> None:
        self._engine = engine
        #: the engine is the scan's own, disposed when it ends
        self._own = own
        self._sql = sql
        self.upto = upto
        self._record = record
        self.state: VerificationState = "verifying"
        self.sessions = 0
        self.corrupt = 0
        #: sessions holding a row that fails closed (``row_payload_identity_mismatch``)
        self.unreadable = 0
        self.seconds: float | None = None
        self.error: str | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self.run, name="maka-ledger-verification", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout)

    def wait(self, timeout: float) -> bool:
        """True once the scan has ended (whatever its state)."""
        if self._thread is not None:
            self._thread.join(timeout)
            return not self._thread.is_alive()
        return self.state != "verifying"

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"state": self.state, "upToLedgerSeq": self.upto, "sessions": self.sessions}
        if self.corrupt:
            out["corruptSessions"] = self.corrupt
        if self.unreadable:
            out["unreadableSessions"] = self.unreadable
        if self.seconds is not None:
            out["seconds"] = round(self.seconds, 3)
        if self.error is not None:
            out["error"] = self.error
        return out

    def run(self) -> None:
        try:
            self._scan()
        finally:
            if self._own:
                self._engine.dispose()

    def _scan(self) -> None:
        began = time.monotonic()
        if self.upto == 0:
            self.state, self.seconds = "verified", 0.0
            return
        try:
            after = ""
            while not self._stop.is_set():
                with read_tx(self._engine) as conn:
                    page = rows_since(conn, self._sql.sessions_page, self.upto, after, PAGE)
                if not page:
                    break
                for row in page:
                    if self._stop.is_set():
                        break
                    self._verify(str(row["session_id"]))
                after = str(page[-1]["session_id"])
        except Exception as exc:  # a scan that cannot finish says so; it never verifies by default
            self.state, self.error = "failed", f"{type(exc).__name__}: {exc}"
            log.warning("ledger verification failed after %d sessions: %s", self.sessions, self.error)
            return
        self.seconds = time.monotonic() - began
        if self._stop.is_set():
            self.state = "stopped"
        else:
            self.state = "corrupt" if self.corrupt else "verified"

    def _verify(self, session_id: str) -> None:
        with read_tx(self._engine) as conn:
            rows = rows_since(conn, self._sql.session_events, session_id, self.upto)
        scope = SessionScope(session_id)
        self.sessions += 1
        try:
            for row in rows:
                scope.fold_row(row)
        except MakaError as exc:
            # A row that disagrees with its columns fails closed where it is read, as before (a
            # repaired row reads again), so it is reported here, not recorded as corruption.
            self.unreadable += 1
            log.warning("ledger verification: session %s fails closed: %s", session_id, exc)
            return
        scanner = scope.view.scanner
        if scanner.has_corruption:
            self.corrupt += 1
            self._record(session_id, scanner.issues[0])
