"""The per-session digest chain that makes an edited ledger row evident.

Each committed event stores ``chain_digest = sha256(DOMAIN || previous digest of its session || "\\n"
|| payload_json)``, computed by the writer in the same transaction as the row. A row changed behind
the writers' back (``sqlite3 ledger "update runtime_events set payload_json=..."``), a row deleted
from the middle of a session, or two rows swapped no longer match their chain, and ``verify``
names the first such row of each session; startup repair, ``maka resume`` and a run's begin check
the session's chain (``first_break``) before they act on its facts, and park or refuse with
``ledger_chain_broken`` instead. The chain is unkeyed: it catches a ledger edited by
anything that does not also recompute the chain, not an attacker who knows this code; keeping the
ledger out of the tools' reach (the bash sandbox, the workspace checks) is the barrier, the chain
is the evidence.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from maka_core.errors import LedgerRejection

#: Domain separation: a chain digest can never equal another digest maka computes over the same bytes.
CHAIN_DOMAIN = b"maka.ledger_chain.v1\n"
#: The "previous digest" of a session's first event.
CHAIN_START = ""


def chain_digest(previous: str, payload_json: str) -> str:
    """One sha256 per event: the session's previous digest bound to this event's canonical bytes."""
    h = hashlib.sha256(CHAIN_DOMAIN)
    h.update(previous.encode("ascii"))
    h.update(b"\n")
    h.update(payload_json.encode("utf-8"))
    return h.hexdigest()


@dataclass(frozen=True)
class ChainBreak:
    """The first row of a session whose stored digest is not the digest of its payload and its
    predecessor's stored digest (so an edit is pinned to the row edited, not to every later one)."""

    session_id: str
    event_id: str
    ledger_seq: int
    code: str = "ledger_chain_broken"

    def line(self) -> str:
        return (
            f"{self.code}: runtime_events {self.event_id} (session {self.session_id}, "
            f"ledger_seq {self.ledger_seq}): its chain digest does not match its payload and predecessor"
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "code": self.code,
            "sessionId": self.session_id,
            "eventId": self.event_id,
            "ledgerSeq": self.ledger_seq,
        }

    def refusal(self) -> LedgerRejection:
        """What a run's begin raises on a session it must not act on (non-retryable)."""
        return LedgerRejection(
            self.code,
            f"session {self.session_id}: runtime_events {self.event_id} (ledger_seq {self.ledger_seq}) "
            "no longer matches its chain digest (edited behind the writers); nothing acts on it",
            sessionId=self.session_id,
            eventId=self.event_id,
            ledgerSeq=self.ledger_seq,
        )


def chain_breaks(rows: Iterable[tuple[str, str, int, str, str | None]]) -> list[ChainBreak]:
    """Check ``(event_id, session_id, ledger_seq, payload_json, chain_digest)`` rows in ledger order;
    the first break of each session, in ledger order."""
    previous: dict[str, str] = {}
    broken: dict[str, ChainBreak] = {}
    for event_id, session_id, seq, payload, stored in rows:
        expected = chain_digest(previous.get(session_id, CHAIN_START), payload)
        if stored != expected and session_id not in broken:
            broken[session_id] = ChainBreak(session_id, event_id, int(seq))
        # The next row chains from what is stored, so one edit flags one row.
        previous[session_id] = stored if stored is not None else expected
    return sorted(broken.values(), key=lambda b: b.ledger_seq)


def first_break(session_id: str, rows: Iterable[Any]) -> ChainBreak | None:
    """The first break of one session's ``(event_id, ledger_seq, payload_json, chain_digest)`` rows,
    in ledger order (``chain_breaks`` for a single session, without the bookkeeping per session)."""
    previous = CHAIN_START
    for event_id, seq, payload, stored in rows:
        expected = chain_digest(previous, payload)
        if stored != expected:
            return ChainBreak(session_id, event_id, int(seq))
        previous = stored
    return None


def chain_all(rows: Iterable[tuple[str, str, str]]) -> list[tuple[str, str]]:
    """``(event_id, chain_digest)`` for ``(event_id, session_id, payload_json)`` rows in ledger order
    (the migration that gives an existing ledger its chain)."""
    previous: dict[str, str] = {}
    out: list[tuple[str, str]] = []
    for event_id, session_id, payload in rows:
        digest = chain_digest(previous.get(session_id, CHAIN_START), payload)
        previous[session_id] = digest
        out.append((event_id, digest))
    return out
