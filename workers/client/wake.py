"""Waking a parked session's open execution (the ``wake`` Signal, ``workflows.session_wake``).

``maka session resolve`` sends it once its resolution has committed; ``maka resume`` sends it to an
open execution parked on a call, and waits for the execution's answer; a worker's startup check
sends it to each open parked session whose parked calls the ledger calls settled (a wake-up lost
between a resolution and its Signal). The Signal carries no decision: the execution asks the ledger.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, Literal

from temporalio.service import RPCError

from maka_core.errors import MakaError
from maka_temporal.workers.client.session_client import describe_execution, query_status
from maka_temporal.workflows.contracts import WAKE, Wake, workflow_id_for
from maka_temporal.workflows.session_policy import HOST_UNAVAILABLE

__all__ = ["WakeSent", "await_wake", "send_wake", "unwakeable_park"]

#: What became of a resolution's wake-up: ``sent`` to the open execution; ``execution_closed`` (a
#: child session, or a lost execution: ``maka resume`` continues it); ``temporal_unavailable`` (no
#: server answered: ``maka resume`` sends it later); ``no_client`` (a ledger-only ``SessionClient``).
WakeSent = Literal["sent", "execution_closed", "temporal_unavailable", "no_client"]

#: How long ``maka resume`` waits for an open execution's answer to its wake (the answer is one
#: ledger activity on the session's worker).
ANSWER_TIMEOUT_S = 30.0


def _parked_on_call(status: Any) -> bool:
    """Parked on a call (a host park waits inside its turn for ``resume_host``, not for a wake)."""
    return bool(status.state == "parked" and status.park_reason != HOST_UNAVAILABLE)


async def send_wake(client: Any, session_id: str, *, by: str | None = None) -> WakeSent:
    """Signal the session's open execution to ask the ledger whether its parked turn may go on."""
    if client is None:
        return "no_client"
    try:
        execution = await describe_execution(client, session_id)
        if not execution.open:
            return "execution_closed"
        await client.get_workflow_handle(workflow_id_for(session_id)).signal(WAKE, Wake(by=by))
    except (MakaError, RPCError):
        return "temporal_unavailable"
    return "sent"


async def await_wake(
    client: Any, session_id: str, *, by: str, timeout: float = ANSWER_TIMEOUT_S
) -> dict[str, Any] | None:
    """Wake an open execution parked on a call and return ``maka resume``'s output for its answer;
    ``None`` when it is not parked on a call or cannot be woken (older code: ``wakes`` is unset),
    for the caller's own answer.

    Raises:
        MakaError: ``session_busy`` when the execution has not answered within ``timeout``.
    """
    try:
        status = await query_status(client, session_id)
    except Exception:  # an execution that cannot answer is busy as far as resume goes
        return None
    if not _parked_on_call(status) or status.wakes is None:
        return None
    before = status.wakes
    await client.get_workflow_handle(workflow_id_for(session_id)).signal(WAKE, Wake(by=by))
    deadline = time.monotonic() + timeout
    while status.wakes is not None and status.wakes <= before:
        if time.monotonic() > deadline:
            raise MakaError(
                "session_busy",
                f"session {session_id} was woken but has not answered within {timeout:.0f} s "
                "(is a worker polling its queue?); `maka session status` shows its answer",
                sessionId=session_id,
            )
        await asyncio.sleep(0.1)
        status = await query_status(client, session_id)
    answer = status.last_wake
    continuing = answer is not None and answer.decision == "continue"
    unsettled = list(answer.unsettled) if answer is not None else []
    return {
        "ok": continuing,
        "sessionId": session_id,
        "workflowId": workflow_id_for(session_id),
        "decision": "continue" if continuing else "park",
        "parkReason": None if continuing else status.park_reason,
        "rejectionReasons": list(answer.rejection_reasons) if answer is not None else [],
        "diagnostics": [],
        "sourceRunId": answer.source_run_id if answer is not None else None,
        "continuationRunId": answer.continuation_run_id if continuing and answer is not None else None,
        "highWater": None,
        "state": str(status.state),
        "woken": True,
        "unsettledOperations": unsettled,
    }


async def unwakeable_park(client: Any, session_id: str) -> bool:
    """Whether the open execution is parked on a call and cannot be woken: it runs code from before
    the wake (``wakes`` unset), or it replayed a wake that such code dropped. ``maka resume`` then
    closes it and continues the session from the ledger, as an operator did by hand before."""
    try:
        status = await query_status(client, session_id)
    except Exception:
        return False
    return _parked_on_call(status) and status.wakes is None
