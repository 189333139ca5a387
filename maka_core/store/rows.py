"""How one RuntimeEvent maps to a ``runtime_events`` row, and back (fail closed).

The identity columns exist for indexed lookups only; the payload is the fact. Reading a row
re-decodes the payload and re-derives the columns: any disagreement (a hand-edited row, a bug in
another writer) is refused rather than trusted, because every later decision would be built on it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from maka_core.errors import CodecError, StoreError
from maka_core.facts import canonical_json, codec
from maka_core.facts.events import FunctionCallContent, FunctionResponseContent, RuntimeEvent
from maka_core.facts.run_header import RunHeader

#: Domain separation for the prefix digest, so it can never equal another digest of the same lines.
PREFIX_DOMAIN = "maka.runtime_prefix.v1\n"

_CHECKED = (
    "event_id",
    "session_id",
    "invocation_id",
    "run_id",
    "turn_id",
    "event_kind",
    "operation_id",
    "tool_call_id",
    "terminal",
)


def event_columns(event: RuntimeEvent) -> dict[str, Any]:
    """The identity columns a row stores beside the payload."""
    operation_id = event.refs.operation_id if event.refs is not None else None
    tool_call_id = event.refs.tool_call_id if event.refs is not None else None
    if event.actions is not None:
        if operation_id is None and event.actions.tool_dispatch is not None:
            operation_id = event.actions.tool_dispatch.operation_id
        if operation_id is None and event.actions.tool_recovery is not None:
            operation_id = event.actions.tool_recovery.payload.operation_id
    content = event.content
    if tool_call_id is None and isinstance(content, (FunctionCallContent, FunctionResponseContent)):
        tool_call_id = content.id
    return {
        "event_id": event.id,
        "session_id": event.session_id,
        "invocation_id": event.invocation_id,
        "run_id": event.run_id,
        "turn_id": event.turn_id,
        "event_kind": event.event_kind,
        "operation_id": operation_id,
        "tool_call_id": tool_call_id,
        "terminal": event.is_terminal,
    }


def row_event(row: Any) -> RuntimeEvent:
    """Decode a row's payload and check it against the row's identity columns.

    Raises:
        StoreError: ``row_payload_undecodable`` or ``row_payload_identity_mismatch``.
    """
    event_id = row["event_id"]
    payload = row["payload_json"]
    try:
        event = codec.decode(payload)
    except CodecError as exc:
        raise StoreError(
            "row_payload_undecodable", f"stored payload does not decode: {exc.code}", eventId=event_id
        ) from None
    columns = event_columns(event)
    for name in _CHECKED:
        if name in row and _norm(row[name]) != _norm(columns[name]):
            raise StoreError(
                "row_payload_identity_mismatch",
                f"row/payload identity mismatch on column {name}",
                eventId=event_id,
                column=name,
            )
    # Canonical bytes are not re-checked on every read (re-encoding doubles the cost of a scan): a
    # decodable, identity-consistent payload means the same event. ``verify`` reports
    # non-canonical rows, and an exact retry against one is refused (its bytes differ).
    return event


def _norm(value: Any) -> Any:
    # SQLite returns booleans as 0/1.
    return int(value) if isinstance(value, bool) else value


@dataclass(frozen=True)
class Prefix:
    """An immutable committed prefix of one run: its events, high-water and digest."""

    session_id: str
    run_id: str
    events: tuple[RuntimeEvent, ...]
    high_water: int
    prefix_digest: str

    @property
    def last_event_id(self) -> str | None:
        return self.events[-1].id if self.events else None


def prefix_digest(events: Sequence[RuntimeEvent]) -> str:
    """The run prefix's digest as the planner computes it (``maka.runtime-prefix.v1``: identity,
    then each event framed with its seq), so a claim made from a plan matches the store's check.
    A prefix the planner cannot read (empty, mixed identities) gets a digest no plan produces."""
    from maka_core.ledger.digests import PrefixUnreadable, read_prefix

    try:
        return read_prefix(list(events)).digest
    except PrefixUnreadable:
        return codec.digest(PREFIX_DOMAIN + "".join(codec.encode(e) + "\n" for e in events))


def make_prefix(session_id: str, run_id: str, events: Sequence[RuntimeEvent]) -> Prefix:
    return Prefix(session_id, run_id, tuple(events), len(events), prefix_digest(events))


def header_of(row: Mapping[Any, Any]) -> RunHeader:
    """An ``agent_runs`` row as its header."""
    values = dict(row)
    if values["continuation_source"] is not None:
        values["continuation_source"] = canonical_json.loads(values["continuation_source"])
    return RunHeader(**values)
