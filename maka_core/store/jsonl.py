"""JSONL import and export of a session's ledger in Maka's wire shape.

One event per line, each line Maka-canonical on export. Reading reports every bad line with the
codec's stable code instead of stopping at the first, so an operator sees the whole damage; a
caller that imports refuses the file if any line is bad (nothing is half-imported).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from maka_core.errors import CodecError
from maka_core.facts import codec
from maka_core.facts.events import RuntimeEvent
from maka_core.facts.session_id import check_session_id

if TYPE_CHECKING:
    from maka_core.store.writer import LedgerStore


def parse_jsonl(data: bytes) -> tuple[list[RuntimeEvent], list[dict[str, Any]]]:
    """Decode JSONL bytes into events, and ``{"line": n, "code": ...}`` for each bad line.

    The final newline and blank lines at the end are not lines; any other blank line is an error.
    """
    raw_lines = data.split(b"\n")
    while raw_lines and raw_lines[-1].strip() == b"":
        raw_lines.pop()
    events: list[RuntimeEvent] = []
    errors: list[dict[str, Any]] = []
    for number, raw in enumerate(raw_lines, start=1):
        line = raw[:-1] if raw.endswith(b"\r") else raw
        if not line.strip():
            errors.append({"line": number, "code": "blank_line", "message": "empty line"})
            continue
        try:
            events.append(codec.decode(line))
        except CodecError as exc:
            errors.append({"line": number, "code": exc.code, "message": exc.message})
    return events, errors


def check_session_ids(events: list[RuntimeEvent]) -> None:
    """Refuse a file holding a session id ``--session-id`` would refuse (the same rule): such a
    session could not be named by a workflow id, a command line or a table row. ``events`` are a
    whole decoded file, line n being ``events[n - 1]``.

    Raises:
        MakaError: ``session_id_invalid`` at the first such line.
    """
    for line, event in enumerate(events, start=1):
        check_session_id(event.session_id, line=line, eventId=event.id)


def read_jsonl(path: str | Path) -> tuple[list[RuntimeEvent], list[dict[str, Any]]]:
    """Read a JSONL ledger file (see ``parse_jsonl``)."""
    return parse_jsonl(Path(path).read_bytes())


def dumps_jsonl(events: list[RuntimeEvent]) -> str:
    """Maka-canonical lines, each ending in a newline."""
    return "".join(codec.encode(e) + "\n" for e in events)


def export_jsonl(store: LedgerStore, session_id: str) -> str:
    """A session's events as Maka-canonical JSONL, in ledger order."""
    return dumps_jsonl(store.events(session_id=session_id))
