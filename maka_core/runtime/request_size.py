"""What an event weighs in a model request: its content as canonical JSON, measured once per event.

A step estimates the history it sends (``compaction.estimate_tokens``) before every provider call,
and the history is the session's: serializing every event again at every step made a long
session's steps cost O(session). The events a step reads are the resident scope's own objects
(``store.scope_sync.session_events``), the same from one step to the next, so each one's size is
kept beside it, keyed by the object and dropped with it (a weak reference): memory follows the
live events, and an event is never measured twice while it lives.
"""

from __future__ import annotations

import threading
import weakref

from maka_core.facts import canonical_json
from maka_core.facts.events import RuntimeEvent

#: The framing each event adds to a request, beyond its content's bytes.
FRAMING = 8

#: id(event) -> (a weak reference to it, its size). The reference's callback removes the entry
#: when the event is collected, so an id is never read back for another object.
_sizes: dict[int, tuple[weakref.ref[RuntimeEvent], int]] = {}
_lock = threading.Lock()


def event_size(event: RuntimeEvent) -> int:
    """The event's share of a request, in bytes: its content as canonical JSON plus framing (0: no
    content). Measured at the event's first use, then read back."""
    key = id(event)
    kept = _sizes.get(key)
    if kept is not None and kept[0]() is event:
        return kept[1]
    size = (
        len(canonical_json.dumps(event.content.to_wire()).encode("utf-8")) + FRAMING
        if event.content is not None
        else 0
    )

    def forget(_: weakref.ref[RuntimeEvent], key: int = key) -> None:
        with _lock:
            entry = _sizes.get(key)
            if entry is not None and entry[0]() is None:
                del _sizes[key]

    with _lock:
        _sizes[key] = (weakref.ref(event, forget), size)
    return size


def cached() -> int:
    """How many events' sizes are held (the memory this module costs: one small entry each)."""
    return len(_sizes)


__all__ = ["FRAMING", "cached", "event_size"]
