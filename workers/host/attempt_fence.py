"""A lost run is settled only once its old tool attempt cannot still be running.

``temporal workflow terminate`` (or a server that lost the execution) closes the workflow, not
its activities: a worker that is running the tool activity goes on. Settling the run at once (its
terminal fact) would race that zombie: its bash still runs, and its T2 and next model step would
follow the terminal fact. Two guards close the race:

- **the fence, here:** a worker learns that its activity is gone only from its next heartbeat (the
  server answers not-found and the SDK cancels the activity), and the SDK sends a heartbeat at
  least every 0.8 x the activity's heartbeat timeout. A cancelled tool attempt stops its tool
  (``runtime.cancellation``: the tool's heartbeat raises, bash's process group is killed) and never
  commits T2. So before a run that has a tool in flight (an operation with T1 and no T2) is
  settled, repair waits until the activity's heartbeat timeout plus ``FENCE_GRACE_S`` has passed
  since the execution closed: by then a live worker has stopped its tool, or committed its T2
  before the terminal fact (the settlement then sees a completed operation);
- **the writer:** a worker that is not live (partitioned, frozen) and wakes later is refused by the
  ledger: a run with a terminal fact accepts no further event (``run_already_terminal``).

The heartbeat timeout is the largest of the tool activities' in the closed execution's history,
else the runtime's own ``tool_heartbeat_timeout_s``; the wait is measured from the execution's close
time, else (no execution or no history to read) from now. It is bounded: at most that timeout plus
the grace, and never more than ``MAX_FENCE_S``. A run without a tool in flight is settled at once.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Final

from maka_core.facts.run_header import RunHeader
from maka_core.runtime.contracts import EXECUTE_TOOL, RECOVER_OPERATION

#: Seconds after the heartbeat timeout: the not-found answer, the cancellation reaching the
#: activity, the tool's own heartbeat tick (bash: 0.5 s) and the kill of its process group.
FENCE_GRACE_S: Final[float] = 3.0
#: The longest any fence waits, whatever heartbeat timeout a history records.
MAX_FENCE_S: Final[float] = 600.0
_TOOL_ACTIVITIES: Final[frozenset[str]] = frozenset({EXECUTE_TOOL, RECOVER_OPERATION})

Say = Callable[[str], None]


@dataclass(frozen=True)
class FenceWindow:
    """Until when (epoch seconds) a tool attempt of a closed execution may still be running."""

    until: float
    heartbeat_timeout_s: float
    #: The execution's close time (epoch seconds), None when it could not be read.
    closed_at: float | None


async def fence_window(client: Any, workflow_id: str, fallback_heartbeat_s: float) -> FenceWindow:
    """The window of the workflow id's latest execution (closed or gone)."""
    closed_at: float | None = None
    heartbeat: float | None = None
    try:
        handle = client.get_workflow_handle(workflow_id)
        desc = await handle.describe()
        closed_at = desc.close_time.timestamp() if desc.close_time is not None else None
        async for event in handle.fetch_history_events():
            if not event.HasField("activity_task_scheduled_event_attributes"):
                continue
            scheduled = event.activity_task_scheduled_event_attributes
            if scheduled.activity_type.name in _TOOL_ACTIVITIES and scheduled.HasField("heartbeat_timeout"):
                seconds = scheduled.heartbeat_timeout.ToTimedelta().total_seconds()
                heartbeat = seconds if heartbeat is None else max(heartbeat, seconds)
    except Exception:  # gone or unreadable: wait the runtime's own timeout from now
        closed_at = None
    timeout = heartbeat if heartbeat is not None and closed_at is not None else fallback_heartbeat_s
    start = closed_at if closed_at is not None else time.time()
    until = start + min(timeout + FENCE_GRACE_S, MAX_FENCE_S)
    return FenceWindow(until=until, heartbeat_timeout_s=timeout, closed_at=closed_at)


@dataclass
class AttemptFence:
    """Waits out a lost run's tool attempt before it is settled (see the module docstring).

    ``say`` reports progress (``maka resume`` prints it on stderr; a worker logs it); ``waited``
    adds up the seconds this fence waited.
    """

    client: Any
    fallback_heartbeat_s: float
    say: Say = lambda message: None
    waited: float = 0.0
    _windows: dict[str, FenceWindow] = field(default_factory=dict)

    async def __call__(self, run: RunHeader, operation_ids: list[str]) -> None:
        workflow_id = run.workflow_id or ""
        window = self._windows.get(workflow_id)
        if window is None:
            window = await fence_window(self.client, workflow_id, self.fallback_heartbeat_s)
            self._windows[workflow_id] = window
        began = time.monotonic()
        remaining = window.until - time.time()
        if remaining <= 0:
            return
        since = "its execution closed" if window.closed_at is not None else "now (no close time to read)"
        self.say(
            f"run {run.run_id}: operation {', '.join(operation_ids)} has T1 and no T2; waiting "
            f"{remaining:.1f}s (heartbeat timeout {window.heartbeat_timeout_s:g}s + {FENCE_GRACE_S:g}s "
            f"since {since}) so its old attempt cannot still be running"
        )
        step = 5.0
        while (remaining := window.until - time.time()) > 0:
            await asyncio.sleep(min(step, remaining))
            if remaining > step:
                self.say(f"run {run.run_id}: {max(0.0, window.until - time.time()):.1f}s left")
        self.waited += time.monotonic() - began
        self.say(f"run {run.run_id}: fenced after {time.monotonic() - began:.1f}s; settling it")


__all__ = ["FENCE_GRACE_S", "MAX_FENCE_S", "AttemptFence", "FenceWindow", "fence_window"]
