"""The provider calls a worker has in flight, and the planned stop that ends them.

A model step holds no side effect and is idempotent through the ledger, so on a planned stop
(SIGTERM or Ctrl-C to ``maka worker``, a deploy) it can simply be given up and run again by the next
worker. What it must not do is keep the stopping worker alive or call the vendor again: a local step
holds its worker's workflow task until it ends, so a vendor that accepts a request and never answers
held the worker for the step's whole timeout (up to an hour with ``--step-timeout 3600``), and each
retry of the step sent a new request after the stop.

So, as for tools (``runtime.ToolSlots``), the stop has two moments:

- at once (``stop``): no provider request starts on this worker any more; a step (or a compaction)
  about to call its vendor is refused before the request, ``WorkerStopping`` (``worker_stopping``);
- after the worker's graceful timeout, the same a tool call gets (``cut``): a call still in flight
  is cancelled, and its step ends ``WorkerStopping`` too. Until then it may answer, and its output
  commits as usual (a call the vendor already did is not paid for twice).

Either way nothing of the step commits. Where the step goes on is Temporal's: a regular attempt is
retried on another worker; a local one fails at once and the workflow gives up the workflow task it
ran in (``workflows.worker_stop``), which the next worker replays, running the step again.

It also remembers the answers this worker refused after the vendor gave them (``refuse``:
``usage_invalid``, ``model_output_too_large``, never retried). A step that rode in a tool activity
and failed there is run again by its workflow as a step of its own, on the same worker; asking the
vendor again would pay for a second answer no one can count (under a token cap, one past it), so
the step fails with the same refusal instead (``refusal``).

Everything here runs on the worker's event loop (the provider call is I/O on it; the stop comes from
the host's shutdown on the same loop), so no lock is needed.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import Any, Final, TypeVar

from maka_core.errors import WorkerStopping
from maka_core.providers.base import ProviderError

T = TypeVar("T")

#: How many refused answers a worker remembers (the latest; a step's workflow re-runs it at once).
REFUSALS_KEPT: Final = 256


class ModelCalls:
    """This worker's provider calls in flight, and whether it still starts new ones."""

    def __init__(self) -> None:
        self._stopping = False
        self._in_flight: set[asyncio.Future[Any]] = set()
        self._cut: set[asyncio.Future[Any]] = set()
        self._timer: asyncio.TimerHandle | None = None
        self._refused: OrderedDict[str, ProviderError] = OrderedDict()

    @property
    def stopping(self) -> bool:
        return self._stopping

    async def call(self, call_id: str, make: Callable[[], Awaitable[T]]) -> T:
        """Make the provider call ``make`` builds, unless the worker is stopping.

        Raises:
            WorkerStopping: the worker stopped before the call began (``make`` is never called: no
                request), or cut it at the graceful timeout.
        """
        if self._stopping:
            raise WorkerStopping(
                message=f"{call_id}: the worker is stopping; the provider call did not begin",
                callId=call_id,
            )
        task: asyncio.Future[T] = asyncio.ensure_future(make())
        self._in_flight.add(task)
        try:
            return await task
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if task in self._cut and not (current is not None and current.cancelling()):
                cut = "the worker stopped; the provider call was cut at its graceful timeout"
                raise WorkerStopping(message=f"{call_id}: {cut}", callId=call_id) from None
            raise
        finally:
            self._in_flight.discard(task)
            self._cut.discard(task)

    def refuse(self, step_id: str, refusal: ProviderError) -> None:
        """Remember that this worker refused step ``step_id``'s answer (not retryable)."""
        self._refused[step_id] = refusal
        while len(self._refused) > REFUSALS_KEPT:
            self._refused.popitem(last=False)

    def refusal(self, step_id: str) -> ProviderError | None:
        """The refusal of step ``step_id``'s answer on this worker, as a fresh error, or ``None``."""
        refused = self._refused.get(step_id)
        if refused is None:
            return None
        return ProviderError(refused.code, refused.message, retryable=False, **refused.detail)

    def stop(self, grace_s: float) -> None:
        """No new provider call from now; the calls in flight are cut after ``grace_s`` seconds
        (the worker's graceful timeout). Safe to repeat (the first grace stands)."""
        self._stopping = True
        if self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(grace_s, self.cut)

    def cut(self) -> None:
        """Cancel every provider call in flight now (each step ends ``WorkerStopping``)."""
        for task in list(self._in_flight):
            if not task.done():
                self._cut.add(task)
                task.cancel()

    def close(self) -> None:
        """The worker is gone: a pending cut has nothing left to do."""
        if self._timer is not None:
            self._timer.cancel()
