"""A value derived from a frozen fact, computed once for as long as the fact lives.

A model step rebuilds its request from the session's whole history: each event's size estimate,
each call's arguments as JSON. The events a step reads are the resident scope's own objects, the
same from one step to the next (``store.scope_sync.session_events``), and frozen, so what is
derived from one never changes: ``once`` keeps it beside the object, keyed by the object itself
and dropped with it (a weak reference), so memory follows the live events, and a long session's
step no longer re-serializes every earlier event.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")

#: (id(obj), id(derive)) -> (a weak reference to obj, the value). The reference's callback drops
#: the entries when the object is collected, so an id is never read back for another object.
_kept: dict[tuple[int, int], tuple[weakref.ref[Any], Any]] = {}
_lock = threading.Lock()


def once(obj: Any, derive: Callable[[Any], T]) -> T:
    """``derive(obj)``, computed at the first call for this object and read back after. ``obj`` must
    be immutable (a frozen model) and ``derive`` a pure function of it, defined once (at module level)."""
    key = (id(obj), id(derive))
    kept = _kept.get(key)
    if kept is not None and kept[0]() is obj:
        value: T = kept[1]
        return value
    value = derive(obj)

    def forget(_: weakref.ref[Any], key: tuple[int, int] = key) -> None:
        with _lock:
            entry = _kept.get(key)
            if entry is not None and entry[0]() is None:
                del _kept[key]

    with _lock:
        _kept[key] = (weakref.ref(obj, forget), value)
    return value


def held() -> int:
    """How many derived values are held (one small entry each, beside a live object)."""
    return len(_kept)


__all__ = ["held", "once"]
