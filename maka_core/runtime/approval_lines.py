"""The transcript's lines for an approval (``maka session show``): that a call asked for one, who
answered it, when and how, or that it closed unanswered. Read from the facts the ledger committed
(``permissionRequest``, ``permissionDecision``, ``permissionClosureAccepted``); every value a person
or a model chose prints as one inert line.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from maka_core.facts.events import RuntimeEvent
from maka_core.facts.printable import printable
from maka_core.governance.challenge import iso_ms

__all__ = ["approval_line"]


def _one(value: Any, limit: int = 500) -> str:
    text = printable("" if value is None else str(value))
    return text if len(text) <= limit else text[:limit] + "..."


def _when(ts: float) -> str:
    return iso_ms(datetime.fromtimestamp(ts / 1000, tz=UTC))


def approval_line(e: RuntimeEvent) -> str | None:
    """The line for ``e`` if it is an approval's fact, else None."""
    a = e.actions
    if a is None:
        return None
    if isinstance(a.permission_request, dict):
        r = a.permission_request
        return (
            f"  [approval] asked {_when(e.ts)}: {_one(r.get('toolName'))} needs approval "
            f"{_one(r.get('requestId'))} ({_one(r.get('reason'))}; {_one(r.get('hint'))})"
        )
    if isinstance(a.permission_decision, dict):
        d = a.permission_decision
        verb = "approved" if d.get("decision") == "allow" else "denied"
        by = _one(d.get("reviewer")) if d.get("reviewer") else "(unnamed)"
        why = f": {_one(d.get('rationale'))}" if d.get("rationale") else ""
        return f"  [approval] {_one(d.get('requestId'))} {verb} by {by} {_when(e.ts)}{why}"
    if a.permission_closure_accepted is not None:
        c = a.permission_closure_accepted
        return f"  [approval] {_one(c.request_id)} closed unanswered {_when(e.ts)} ({c.reason})"
    return None
