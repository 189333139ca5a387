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
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import select

from maka_core.events import RuntimeEvent
from maka_core.resolver import OperationResolution, resolve
from maka_core.scanner import LedgerScanner, OperationFacts

_Decide = Callable[[OperationFacts, LedgerScanner], OperationResolution]
_decide_one: _Decide | None
try:  # the per-call decision; falls back to resolving the whole session when unavailable
    from maka_core.resolver import _decide as _decide_one
except ImportError:  # pragma: no cover - depends on the resolver's internals
    _decide_one = None


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
        if _decide_one is not None:
            decided: OperationResolution = _decide_one(facts, self.scanner)
            return decided
        return resolve(self.scanner).for_call(invocation_id, tool_call_id)


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
        # Reads the store's table directly (an indexed range read past the cursor); every row is
        # still decoded and checked against its columns by the store's own row decoder.
        from maka_core.engine import read_tx
        from maka_core.ledger_rows import row_event
        from maka_core.schema import runtime_events

        query = (
            select(runtime_events)
            .where(runtime_events.c.session_id == session_id)
            .where(runtime_events.c.ledger_seq > after)
            .order_by(runtime_events.c.ledger_seq)
        )
        with read_tx(self.store.engine) as conn:
            return [(int(row["ledger_seq"]), row_event(row)) for row in conn.execute(query).mappings()]
