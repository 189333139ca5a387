"""Whether any worker polls a task queue, as Temporal's task-queue description lists its pollers:
``maka session start`` and ``send`` say so within seconds instead of waiting in silence, and
``maka session status`` says why an open execution does not answer its Query.

Temporal lists the workers that polled the queue's workflow tasks in the last few minutes; an empty
list means no worker of that queue is up (or none has been for minutes), so no message sent to a
session of that queue will be accepted until one starts.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

__all__ = ["NO_POLLER_NOTICE_S", "unpolled_notice", "warn_while_unpolled", "workflow_pollers"]

#: How long a message may wait for its acceptance before the queue's pollers are looked at: a
#: worker that polls accepts within a second or two, so a longer wait is worth a look.
NO_POLLER_NOTICE_S = 3.0


async def workflow_pollers(client: Any, task_queue: str, *, timeout: float = 5.0) -> int | None:
    """How many workers poll ``task_queue``'s workflow tasks; None when the server does not say
    (it does not answer within ``timeout``, or refuses the description)."""
    # Loaded here, not with the module: the ledger-only commands import this one (``maka session
    # show`` runs without the Temporal SDK, ``tests/test_cli_startup.py``).
    from temporalio.api.enums.v1 import TaskQueueKind, TaskQueueType
    from temporalio.api.taskqueue.v1 import TaskQueue
    from temporalio.api.workflowservice.v1 import DescribeTaskQueueRequest

    request = DescribeTaskQueueRequest(
        namespace=client.namespace,
        task_queue=TaskQueue(name=task_queue, kind=TaskQueueKind.TASK_QUEUE_KIND_NORMAL),
        task_queue_type=TaskQueueType.TASK_QUEUE_TYPE_WORKFLOW,
    )
    try:
        described = await asyncio.wait_for(client.workflow_service.describe_task_queue(request), timeout)
    except Exception:  # a notice, never a refusal: the caller's own wait goes on
        return None
    return len(described.pollers)


def unpolled_notice(session_id: str, task_queue: str) -> str:
    return (
        f"maka: no worker polls task queue {task_queue!r}: session {session_id} waits until one "
        f"does (start `maka worker --task-queue {task_queue}`, or `maka dev`)"
    )


async def warn_while_unpolled(
    client: Any,
    session_id: str,
    task_queue: str,
    say: Callable[[str], None],
    *,
    after_s: float = NO_POLLER_NOTICE_S,
) -> None:
    """After ``after_s``, tell ``say`` once if no worker polls ``task_queue``. Run beside a wait for
    a message's acceptance and cancelled when it ends: a worker that polls accepts before the look."""
    await asyncio.sleep(after_s)
    if await workflow_pollers(client, task_queue) == 0:
        say(unpolled_notice(session_id, task_queue))
