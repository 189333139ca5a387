"""Stopping a tool whose attempt is cancelled.

Temporal cancels an attempt when a heartbeat learns that its workflow execution is gone
(``temporal workflow terminate``, a heartbeat timeout), or when the workflow asks
(``cancel_turn``; ``Attempt.cancel_requested``). ``cancelling`` awaits a call's relay and, on a
cancel, sets the call's ``Cancellation``: the tool's heartbeat raises ``AttemptCancelled`` inside
the tool thread from then on (``bash`` kills its process group). A cancel nobody asked for leaves
the effect leg ``Abandoned`` (T2 never commits); one that was asked for waits for the relay's end,
so the stopped effect's T2 (``tool_cancelled``) commits before the attempt reports.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable
from dataclasses import dataclass
from typing import TypeVar

from maka_core.errors import MakaError
from maka_core.runtime.runtime import Attempt

T = TypeVar("T")


class AttemptCancelled(MakaError):
    """Raised by a cancelled attempt's tool heartbeat, inside the tool thread: stop the effect."""

    default_code = "attempt_cancelled"


@dataclass(frozen=True)
class Abandoned:
    """The effect leg of a cancelled attempt: the tool stopped (or never started) and nobody waits
    for its outcome. T2 does not commit; the operation stays dispatched without a response."""

    operation_id: str


class Cancellation:
    """Set when the attempt awaiting a relay is cancelled; the tool's heartbeat then raises."""

    def __init__(self) -> None:
        self._set = threading.Event()
        #: The cancel was asked for and its end is awaited: the effect's end is recorded in T2.
        self.observed = False

    def cancel(self, *, observed: bool = False) -> None:
        self.observed = observed
        self._set.set()

    @property
    def cancelled(self) -> bool:
        return self._set.is_set()

    def heartbeat(self) -> None:
        if self._set.is_set():
            raise AttemptCancelled(message="the attempt was cancelled; the tool is stopped")


async def cancelling(work: Awaitable[T], cancellation: Cancellation, attempt: Attempt | None = None) -> T:
    """Await a relay; a cancelled attempt tells its tool to stop before the cancellation goes on.
    A cancel that was asked for (``attempt.cancel_requested``) waits for the relay's end: the
    stopped effect's T2 (``tool_cancelled``) commits before the attempt reports."""
    task = asyncio.ensure_future(work)
    try:
        return await asyncio.shield(task)
    except asyncio.CancelledError:
        observed = attempt is not None and attempt.cancel_requested()
        cancellation.cancel(observed=observed)
        if not observed:
            task.cancel()
            raise
    return await task



__all__ = ["Abandoned", "AttemptCancelled", "Cancellation", "cancelling"]
