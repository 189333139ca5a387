"""``SessionClient.list`` (and ``maka session list``): the ledger's sessions, one summary each, from
the session index (``maka_core.store.session_index``), newest activity first.

The ledger answers, not Temporal: the index follows every fact and run header as it commits, so a
lost or closed execution shows what became of it, and its state is the one ``maka session status``
derives from the same ledger (``ledger.session_state.derive_state``, plus ``awaiting_approval``
while a running turn's request waits). One indexed read, whatever the ledger's size: nothing is
folded from events at list time.

The JSON contract of one summary (``SessionSummary.to_json``; pinned by ``tests/test_session_list``):
``sessionId``, ``workflowId``, ``state``, ``parkReason``, ``host`` and ``usage`` as ``session status
--json`` names them, ``eventCount`` (status's too), ``turnCount`` (the length of status's ``turns``)
and ``lastActivity`` (an ISO-8601 UTC time, milliseconds, ``Z``).
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from typing import Any

from pydantic import BaseModel, ConfigDict

from maka_core.errors import ConfigError
from maka_core.facts import canonical_json
from maka_core.ledger.session_state import SHOWN_STATES
from maka_core.store.session_index import SessionRow
from maka_temporal.workers.client.ledger import open_ledger
from maka_temporal.workflows.contracts import workflow_id_for

__all__ = [
    "DEFAULT_LIMIT",
    "MAX_LIMIT",
    "SUMMARY_KEYS",
    "ListQuery",
    "SessionSummary",
    "list_query",
    "list_sessions",
    "parse_since",
]

DEFAULT_LIMIT = 100
#: The most summaries one answer holds (page with ``since`` for more).
MAX_LIMIT = 10_000
#: The keys of one summary, in order (the JSON contract).
SUMMARY_KEYS = (
    "sessionId",
    "workflowId",
    "state",
    "parkReason",
    "lastActivity",
    "host",
    "turnCount",
    "eventCount",
    "usage",
)

_DURATION = re.compile(r"(\d{1,9})([smhdw])")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


class SessionSummary(BaseModel):
    """One session as ``maka session list`` shows it."""

    model_config = ConfigDict(frozen=True)

    session_id: str
    state: str
    park_reason: str | None = None
    #: Epoch milliseconds of the session's latest fact or run header change.
    last_activity_ms: int
    host: str | None = None
    turn_count: int
    event_count: int
    usage: dict[str, Any] | None = None

    @property
    def last_activity(self) -> str:
        """``last_activity_ms`` as ISO-8601 UTC, to the millisecond (``2026-12-04T06:10:31.123Z``)."""
        moment = datetime.fromtimestamp(self.last_activity_ms / 1000, UTC)
        return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")

    def to_json(self) -> dict[str, Any]:
        """The ``maka session list --json`` contract object (``SUMMARY_KEYS``)."""
        return {
            "sessionId": self.session_id,
            "workflowId": workflow_id_for(self.session_id),
            "state": self.state,
            "parkReason": self.park_reason,
            "lastActivity": self.last_activity,
            "host": self.host,
            "turnCount": self.turn_count,
            "eventCount": self.event_count,
            "usage": self.usage,
        }

    @classmethod
    def of_row(cls, row: SessionRow) -> SessionSummary:
        return cls(
            session_id=row.session_id,
            state=row.state,
            park_reason=row.park_reason,
            last_activity_ms=row.last_activity_at,
            host=row.host,
            turn_count=row.turns,
            event_count=row.event_count,
            usage=canonical_json.loads(row.usage_json) if row.usage_json is not None else None,
        )


class ListQuery(BaseModel):
    """A validated ``list``: which sessions, at most how many."""

    model_config = ConfigDict(frozen=True)

    state: str | None = None
    host: str | None = None
    since_ms: int | None = None
    limit: int = DEFAULT_LIMIT


def _refuse(option: str, message: str) -> ConfigError:
    return ConfigError("config_invalid", f"{option} {message}", option=option)


def parse_since(value: str | datetime, now: datetime | None = None) -> int:
    """``since`` as epoch milliseconds: an ISO-8601 time (one without an offset is UTC) or a
    duration back from ``now`` (``90s``, ``30m``, ``2h``, ``7d``, ``1w``).

    Raises:
        ConfigError: ``config_invalid`` naming ``--since``.
    """
    if isinstance(value, datetime):
        moment = value
    else:
        text = value.strip()
        match = _DURATION.fullmatch(text)
        if match is not None:
            amount = int(match.group(1))
            if amount == 0:
                raise _refuse("--since", f"must be a duration above zero, not {text!r}")
            moment = (now or datetime.now(UTC)) - timedelta(seconds=amount * _UNITS[match.group(2)])
        else:
            try:
                moment = datetime.fromisoformat(text)
            except ValueError:
                raise _refuse(
                    "--since",
                    f"must be an ISO-8601 time (2026-12-04T06:00:00Z) or a duration (30m, 2h, 7d), "
                    f"not {_CONTROL.sub('?', text)[:80]!r}",
                ) from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return int(moment.timestamp() * 1000)


def list_query(
    state: str | None = None,
    host: str | None = None,
    since: str | datetime | None = None,
    limit: int | str | None = None,
    now: datetime | None = None,
) -> ListQuery:
    """Check every filter before the ledger is read.

    Raises:
        ConfigError: ``config_invalid`` naming the option (``--state``, ``--host``, ``--since``,
            ``--limit``) and what it takes.
    """
    if state is not None and state not in SHOWN_STATES:
        raise _refuse(
            "--state", f"must be one of {', '.join(SHOWN_STATES)}, not {_CONTROL.sub('?', state)[:40]!r}"
        )
    if host is not None and (not host.strip() or _CONTROL.search(host) or len(host) > 255):
        raise _refuse("--host", "must be a host name: 1 to 255 printable characters")
    if limit is None:
        limit = DEFAULT_LIMIT
    elif isinstance(limit, str):
        if not re.fullmatch(r"\d{1,9}", limit.strip()):
            raise _refuse("--limit", f"must be a whole number from 1 to {MAX_LIMIT}")
        limit = int(limit)
    if isinstance(limit, bool) or not 1 <= limit <= MAX_LIMIT:
        raise _refuse("--limit", f"must be a whole number from 1 to {MAX_LIMIT}")
    since_ms = parse_since(since, now) if since is not None else None
    return ListQuery(state=state, host=host, since_ms=since_ms, limit=limit)


def list_sessions(ledger: Any, query: ListQuery) -> tuple[SessionSummary, ...]:
    """The summaries ``query`` asks for, from the ledger's session index.

    Raises:
        MakaError: ``open_ledger``'s codes (``ledger_not_found``...).
    """
    with open_ledger(ledger, create=False) as store:
        rows = store.list_sessions(
            state=query.state, host=query.host, since_ms=query.since_ms, limit=query.limit
        )
    return tuple(SessionSummary.of_row(r) for r in rows)
