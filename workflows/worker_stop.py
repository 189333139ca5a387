"""A local model step on a stopping worker gives up its workflow task, never its turn.

A planned stop ends a model step on the stopping worker (``maka_core.runtime.model_calls``): no
provider request starts, and one in flight is cut at the worker's graceful timeout. A regular
attempt then fails retryable and Temporal runs it on another worker. A local attempt cannot move (it
runs on the worker that holds the workflow task) and a local retry would only run on the stopping
worker again, so it fails at once, ``worker_stopping``, and the workflow raises
``WorkflowTaskGivenUp`` here: not a Temporal failure, so the SDK fails the *workflow task*, not the
workflow and not the turn. The stopping worker lets go of it; the next worker replays the history
(the local attempt left no marker in it) and runs the step again, which finds its output in the
ledger if it was committed.

No recorded history takes this branch: a local step never failed ``worker_stopping`` before it.
"""

from __future__ import annotations

from collections.abc import Awaitable
from typing import TypeVar

from temporalio.exceptions import ActivityError, ApplicationError

from maka_temporal.workflows.contracts import WORKER_STOPPING

T = TypeVar("T")


class WorkflowTaskGivenUp(Exception):
    """Fails the workflow task (not the workflow): its worker is stopping."""


async def local_step(step: Awaitable[T]) -> T:
    """Await a local model step; ``worker_stopping`` gives up the workflow task (module docstring)."""
    try:
        return await step
    except (ActivityError, ApplicationError) as err:
        cause = err.cause if isinstance(err, ActivityError) else err
        if isinstance(cause, ApplicationError) and cause.type == WORKER_STOPPING:
            raise WorkflowTaskGivenUp(
                "the worker is stopping: its model step runs again on the next worker"
            ) from None
        raise
