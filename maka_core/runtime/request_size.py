"""What an event weighs in a model request: its content as canonical JSON, measured once per event.

A step estimates the history it sends (``compaction.estimate_tokens``) before every provider call,
and the history is the session's: serializing every event again at every step made a long
session's steps cost O(session). The size is derived once per event object (``facts.memo``).
"""

from __future__ import annotations

from maka_core.facts import canonical_json
from maka_core.facts.events import RuntimeEvent
from maka_core.facts.memo import once

#: The framing each event adds to a request, beyond its content's bytes.
FRAMING = 8


def _measure(event: RuntimeEvent) -> int:
    if event.content is None:
        return 0
    return len(canonical_json.dumps(event.content.to_wire()).encode("utf-8")) + FRAMING


def event_size(event: RuntimeEvent) -> int:
    """The event's share of a request, in bytes: its content as canonical JSON plus framing (0: no
    content), measured at the event's first use."""
    return once(event, _measure)


__all__ = ["FRAMING", "event_size"]
