"""The committed view in session scopes: what live runs read, bounded, loaded on demand.

Every fact the scanner relates lives in one session: a call with its dispatch, outcome and
recovery facts (one invocation), a run's protocol marker and terminal fact, a model step. So a
fold of one session's rows, in ledger order, answers every question about that session exactly as
a fold of the whole ledger does, and the store keeps one such fold per session it is asked about
instead of one of the whole history. A scope is loaded from one indexed read of its session's rows
the first time a writer or a reader names the session, and then follows the session's commits
(``LedgerStore._fold_rows``). The identities that do cross sessions (event id, invocation,
operation) are the database's unique keys, and the writers check them there. A store starts by
folding every session with an open run (the live work; the rest of the history is verified by
the start scan, ``store.verification``); a
session found corrupt stops every tool boundary, also after its scope is evicted (the record
lives on the store, ``LedgerStore._corrupt``, never on a scope set an abort drops).

Memory follows live sessions: settled scopes (every run has its terminal fact) are evicted least
recently used first once more than ``settled`` are held; open ones only past ``limit`` (1,024,
logged as a warning: a run whose scope is evicted reloads it, identically, on its next read).
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from maka_core.facts.events import RuntimeEvent
from maka_core.ledger.committed import CommittedView
from maka_core.store.chain import CHAIN_START, chain_digest
from maka_core.store.rows import row_event

log = logging.getLogger(__name__)

#: Settled sessions kept warm (a session read again soon after its turn, as a status or an
#: approval answer does, stays resident), and open ones held before the bound grows.
SETTLED_SCOPES = 64
OPEN_SCOPES = 1024


@dataclass
class SessionScope:
    """One session's committed events, folded (``CommittedView``), with its writer counters."""

    session_id: str
    view: CommittedView = field(default_factory=CommittedView)
    #: invocation id -> highest event_seq (saves a query per event).
    event_seq: dict[str, int] = field(default_factory=dict)
    #: the session's last committed chain digest.
    chain: str = CHAIN_START
    #: The session's own events in ledger order, each decoded and checked once, when folded: what a
    #: model step replays (``store.scope_sync.session_events``), never re-read. The same objects the
    #: scanner holds, so a resident session costs one reference (8 bytes) per event more.
    events: list[RuntimeEvent] = field(default_factory=list)

    @property
    def settled(self) -> bool:
        """Every run of the session has its terminal fact (nothing live reads it)."""
        return len(self.view.terminal_of_run) >= len(self.view.first_of_run)

    def fold_row(self, row: Any) -> None:
        """Fold one committed row (decoded and checked against its columns, fail closed)."""
        event = row_event(row)
        self.view.fold(event)
        if event.session_id == self.session_id:
            self.events.append(event)
        inv = row["invocation_id"]
        self.event_seq[inv] = max(self.event_seq.get(inv, 0), int(row["event_seq"]))
        if row["session_id"] == self.session_id:
            # A NULL digest (a row planted below the writers) chains on as verify would recompute it.
            self.chain = row["chain_digest"] or chain_digest(self.chain, row["payload_json"])

    def fold_written(self, event: RuntimeEvent, *, scanned: bool) -> None:
        """Fold an event this store's writer just inserted (``scanned``: admitted by the scanner)."""
        self.view.fold(event, scanned=scanned)
        if event.session_id == self.session_id:
            self.events.append(event)


class SessionScopes:
    """The resident scopes, least recently used first."""

    def __init__(self, settled: int = SETTLED_SCOPES, limit: int = OPEN_SCOPES) -> None:
        self._scopes: OrderedDict[str, SessionScope] = OrderedDict()
        self._settled = settled
        self._limit = max(limit, settled)

    def __len__(self) -> int:
        return len(self._scopes)

    def __contains__(self, session_id: object) -> bool:
        return session_id in self._scopes

    def peek(self, session_id: str) -> SessionScope | None:
        """The resident scope, without counting as a use (a sync folding other writers' rows)."""
        return self._scopes.get(session_id)

    def use(self, session_id: str) -> SessionScope | None:
        scope = self._scopes.get(session_id)
        if scope is not None:
            self._scopes.move_to_end(session_id)
        return scope

    def put(self, session_id: str, scope: SessionScope) -> None:
        self._scopes[session_id] = scope
        self._scopes.move_to_end(session_id)
        if len(self._scopes) > self._settled:
            self._trim(keep=session_id)

    def _trim(self, keep: str) -> None:
        settled = [sid for sid, scope in self._scopes.items() if scope.settled and sid != keep]
        for sid in settled[: max(0, len(settled) - self._settled)]:
            del self._scopes[sid]
        if len(self._scopes) > self._limit:
            for sid in list(self._scopes)[: len(self._scopes) - self._limit]:
                if sid != keep:
                    # Correct (its next read reloads it) but a reload per turn: the bound is low.
                    log.warning("ledger view: open session %s evicted past %d open scopes", sid, self._limit)
                    del self._scopes[sid]
