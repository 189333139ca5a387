"""Waiting for a turn to settle: a long-poll Update (``wait_settled``) in bounded rounds.

Each round asks the workflow to answer when the turn has settled or after ``ROUND_S`` seconds,
whichever is first, so the server does the waiting (no Query every few milliseconds) while the
CLI still prints progress between rounds. A round that ends in a continue-as-new is re-issued by
workflow id, i.e. against the new execution. A worker that predates the Update answers with a
failed Update; the wait then falls back to polling the status Query.
"""

from __future__ import annotations

import asyncio
import sys
import time
from typing import Any

from maka_core.errors import MakaError

#: One round of the long poll, in seconds (the workflow holds its handler at most this long).
ROUND_S = 10.0
#: Extra seconds the client allows a round before it counts as unanswered (no worker polling).
ROUND_SLACK_S = 5.0
#: Lines in a log: one per state change, otherwise one every this many seconds.
LOG_EVERY_S = 10.0


class Progress:
    """A self-updating Rich status line on a terminal; otherwise log lines on stderr."""

    def __init__(self, enabled: bool = True) -> None:
        self.enabled = enabled
        self.start = time.monotonic()
        self._live: Any = None
        self._last: tuple[str, float] = ("", -LOG_EVERY_S)
        if enabled and sys.stderr.isatty():
            from rich.console import Console

            self._live = Console(stderr=True).status("waiting for the turn…")
            self._live.start()

    def elapsed(self) -> float:
        return time.monotonic() - self.start

    def show(self, state: str) -> None:
        if not self.enabled:
            return
        elapsed = self.elapsed()
        if self._live is not None:
            self._live.update(f"[{elapsed:5.1f}s] {state}…")
        elif state != self._last[0] or elapsed - self._last[1] >= LOG_EVERY_S:
            print(f"[{elapsed:5.1f}s] {state}", file=sys.stderr, flush=True)
            self._last = (state, elapsed)

    def done(self, state: str) -> None:
        if self._live is not None:
            self._live.stop()
            self._live = None
        if self.enabled:
            print(f"[{self.elapsed():5.1f}s] {state}", file=sys.stderr, flush=True)


def settled(status: Any, run_id: str) -> bool:
    """The same test the workflow's handler makes, on a status snapshot."""
    busy = status.current_turn is not None and status.current_turn.run_id == run_id
    return not busy and status.state != "running"


async def wait_settled(
    client: Any, session_id: str, run_id: str, *, timeout: float = 600.0, progress: bool = True
) -> Any:
    """Wait until the turn ``run_id`` has settled (idle, parked or failed); returns SessionStatus.

    Raises:
        MakaError: ``wait_timeout`` (the session keeps running), ``session_not_found``,
            ``temporal_unavailable``.
    """
    from temporalio.client import WorkflowUpdateFailedError, WorkflowUpdateRPCTimeoutOrCancelledError
    from temporalio.service import RPCError, RPCStatusCode

    from workflows.contracts import SessionStatus, workflow_id_for
    from workflows.session import WAIT_SETTLED, WaitSettled

    shown = Progress(progress)
    deadline = time.monotonic() + timeout
    use_query = False
    not_found = 0
    state = "waiting for a worker"
    try:
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise MakaError(
                    "wait_timeout",
                    f"turn {run_id} did not settle in {timeout:.0f}s ({state}); the session continues",
                    sessionId=session_id,
                    runId=run_id,
                    state=state,
                )
            handle = client.get_workflow_handle(workflow_id_for(session_id))
            round_s = min(ROUND_S, remaining)
            try:
                if use_query:
                    from workers.session_cli import query_status

                    status = await asyncio.wait_for(query_status(client, session_id), round_s + ROUND_SLACK_S)
                else:
                    status = await asyncio.wait_for(
                        handle.execute_update(
                            WAIT_SETTLED,
                            WaitSettled(run_id=run_id, timeout_s=round_s),
                            result_type=SessionStatus,
                        ),
                        round_s + ROUND_SLACK_S,
                    )
            except (TimeoutError, WorkflowUpdateRPCTimeoutOrCancelledError):
                state = "waiting for a worker"  # nobody ran the handler this round
                shown.show(state)
                continue
            except WorkflowUpdateFailedError:
                use_query = True  # a worker without the Update: poll its status Query instead
                continue
            except RPCError as exc:
                # NOT_FOUND between two executions of a continue-as-new is brief; for longer, it is gone.
                if exc.status == RPCStatusCode.NOT_FOUND and not_found < 3:
                    not_found += 1
                    await asyncio.sleep(0.2)
                    continue
                if exc.status == RPCStatusCode.NOT_FOUND:
                    raise MakaError("session_not_found", str(exc), sessionId=session_id) from None
                raise MakaError("temporal_unavailable", str(exc), sessionId=session_id) from None
            not_found = 0
            state = status.state
            if settled(status, run_id):
                shown.done(state)
                return status
            shown.show(state)
            if use_query:
                await asyncio.sleep(0.2)
    finally:
        if shown._live is not None:
            shown._live.stop()
