"""An incremental, per-session mirror of committed events, so per-call ledger reads stay O(new events).

Re-reading and re-scanning a whole session for every model step and every tool guard makes a turn
of N tool calls cost O(N²) (1,000 calls would spend seconds per call just decoding). Events are
immutable and ``ledger_seq`` grows in commit order (writers commit one at a time under ``BEGIN
IMMEDIATE``), so a mirror that fetches only rows past its cursor is exactly the committed ledger,
whichever process wrote them. The mirror folds the same ``LedgerScanner`` the store and the
Resolver use; the guard asks it about one call instead of resolving every operation again.

All access happens on the activity set's single ledger thread.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from maka_core.facts.events import RuntimeEvent
from maka_core.ledger.resolver import OperationResolution, decide
from maka_core.ledger.scanner import LedgerScanner


@dataclass
class SessionLedger:
    """The committed events of one session, folded as they arrive."""

    session_id: str
    cursor: int = 0
    events: list[RuntimeEvent] = field(default_factory=list)
    scanner: LedgerScanner = field(default_factory=lambda: LedgerScanner(protocol_scope="run"))
    steps: dict[str, list[RuntimeEvent]] = field(default_factory=dict)
    first_of_run: dict[str, RuntimeEvent] = field(default_factory=dict)

    def fold(self, event: RuntimeEvent) -> None:
        self.events.append(event)
        self.scanner.apply(event)
        self.first_of_run.setdefault(event.run_id, event)
        if event.role == "model" and event.refs is not None and event.refs.step_id is not None:
            self.steps.setdefault(event.refs.step_id, []).append(event)

    def decide(self, invocation_id: str, tool_call_id: str) -> OperationResolution | None:
        """The Resolver's decision for one call."""
        facts = self.scanner.operation_for_call(invocation_id, tool_call_id)
        if facts is None:
            return None
        return decide(facts, self.scanner)


class LedgerCache:
    """Session mirrors over one store (least recently used evicted past ``capacity``)."""

    def __init__(self, store: Any, capacity: int = 128) -> None:
        self.store = store
        self.capacity = capacity
        self._sessions: OrderedDict[str, SessionLedger] = OrderedDict()

    def session(self, session_id: str) -> SessionLedger:
        """The session's mirror, brought up to date with the ledger."""
        view = self._sessions.get(session_id)
        if view is None:
            view = SessionLedger(session_id)
            self._sessions[session_id] = view
            while len(self._sessions) > self.capacity:
                self._sessions.popitem(last=False)
        else:
            self._sessions.move_to_end(session_id)
        for seq, event in self._fetch(session_id, view.cursor):
            view.fold(event)
            view.cursor = seq
        return view

    def forget(self, session_id: str) -> None:
        self._sessions.pop(session_id, None)

    def _fetch(self, session_id: str, after: int) -> list[tuple[int, RuntimeEvent]]:
        fetched: list[tuple[int, RuntimeEvent]] = self.store.events_since(session_id, after)
        return fetched
