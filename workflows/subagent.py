"""A sub-agent's call, dispatched as a child session (issue 31 item 3; ``SUBAGENTS_PATCH``).

``maka.subagent_begin`` admits the call and commits its T1 (or refuses it, before any T1, past
``maxAgentDepth``) and returns the child session's input: its id derived from the call's operation
id (``tools.subagent.child_session_id``), its lineage in its config, the task as its first message.
The child is the session workflow itself (``maka-session-<child id>``), a Temporal child workflow of
this one on its queue, closing once its turn settles. ``maka.subagent_settle`` then commits the
call's T2 from the child's settled turn (its reply and session id) before the model sees it.

A worker crash replays this execution: the child's start is in its history, so the call waits for
the same child. A start that meets the id already taken (an earlier execution of the parent started
it: a reset history) is never a second child: the call parks ``subagent_parked`` naming it (waiting
for that child from a new execution is not built yet). A parked child parks the call
``subagent_parked``; the worker's log names the child. A cancel of the parent's turn asks the
child to cancel its own (``workflows.subagent_cancel``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from datetime import timedelta

from temporalio import workflow
from temporalio.common import WorkflowIDReusePolicy
from temporalio.exceptions import WorkflowAlreadyStartedError

with workflow.unsafe.imports_passed_through():
    from maka_core.tools.subagent import DEFAULT_MAX_AGENT_DEPTH
    from maka_temporal.workflows.contracts import (
        CHILD_NOT_STARTED,
        SESSION_WORKFLOW,
        SUBAGENT_BEGIN,
        SUBAGENT_SETTLE,
        ApprovalWait,
        CancelTurn,
        RunIds,
        SessionInput,
        SessionStatus,
        SubAgentBegin,
        SubAgentBegun,
        SubAgentSettle,
        ToolInput,
        ToolOutcome,
        workflow_id_for,
    )
    from maka_temporal.workflows.session_policy import (
        LEDGER_RETRY,
        LEDGER_TIMEOUT,
        Cancelled,
        Park,
        initial_search_attributes,
    )
    from maka_temporal.workflows.subagent_cancel import ChildCancel

__all__ = ["SUBAGENTS_PATCH", "dispatch_subagent"]

#: The patch under which a session dispatches ``agent__`` calls as child sessions.
SUBAGENTS_PATCH = "maka-subagents-1"
#: Preparing a child is file and ledger work of milliseconds.
BEGIN_TIMEOUT = timedelta(seconds=60)


async def dispatch_subagent(
    parent: SessionInput,
    tool_input: ToolInput,
    await_approval: Callable[[RunIds, ApprovalWait], Awaitable[None]],
    ids: RunIds,
    child_cancel: Callable[[], CancelTurn | None],
) -> ToolOutcome:
    """The call's outcome once its child session's turn has settled and T2 committed (see the
    module docstring); ``Park("subagent_parked")`` when the child parked. ``child_cancel``: what
    to ask of the child once the turn is cancelled (``ParentCancel._child_cancel``)."""
    through = ChildCancel(child_cancel)
    while True:
        # A cancel while the call is admitted lets the admission finish: a T1 it committed gets
        # its T2 (``tool_cancelled``, not started) below, and no child starts.
        begun: SubAgentBegun = await through.wait(
            workflow.start_activity(
                SUBAGENT_BEGIN,
                SubAgentBegin(
                    call=tool_input,
                    max_depth=DEFAULT_MAX_AGENT_DEPTH,
                    parent=parent.config,
                ),
                result_type=SubAgentBegun,
                start_to_close_timeout=BEGIN_TIMEOUT,
                retry_policy=LEDGER_RETRY,
            ),
            None,
        )
        if begun.outcome is not None and begun.outcome.status == "awaiting_approval":
            assert begun.outcome.approval is not None
            if through.asked is not None:
                raise Cancelled()  # nothing dispatched; the run's terminal fact closes the request
            await await_approval(ids, begun.outcome.approval)
            continue
        break
    if begun.outcome is not None:
        return begun.outcome  # settled before, or refused before any T1
    child = begun.child
    assert child is not None
    if through.asked is not None:
        return await _settle(ids, tool_input, child.session_id, CHILD_NOT_STARTED, None, None)
    starting = asyncio.create_task(
        workflow.start_child_workflow(
            SESSION_WORKFLOW,
            child,
            id=workflow_id_for(child.session_id),
            task_queue=parent.task_queue,
            result_type=SessionStatus,
            search_attributes=initial_search_attributes(child.session_id),
            # The derived id names one child: a second start of it is refused, never a second child.
            id_reuse_policy=WorkflowIDReusePolicy.REJECT_DUPLICATE,
            parent_close_policy=workflow.ParentClosePolicy.ABANDON,
        )
    )
    try:
        handle = await through.wait(starting, None)
    except WorkflowAlreadyStartedError:
        # Started by an earlier execution of this session (a reset history): that child is the
        # call's one child. Waiting for it from here is not built yet: the call parks, naming it.
        workflow.logger.warning(
            "sub-agent call %s parked: its child session %s was started by an earlier execution",
            tool_input.call.operation_id,
            child.session_id,
        )
        raise Park("subagent_parked", tool_input.call.operation_id) from None
    if through.asked is not None:
        await through.tell(handle)  # the turn was cancelled while the child was being started
    status: SessionStatus = await through.wait(handle, handle)
    if status.state == "parked":
        workflow.logger.warning(
            "sub-agent call %s parked: child session %s parked (%s)",
            tool_input.call.operation_id,
            child.session_id,
            status.park_reason,
        )
        raise Park("subagent_parked", tool_input.call.operation_id)
    run_id = status.last_turn.run_id if status.last_turn is not None else None
    return await _settle(ids, tool_input, child.session_id, status.state, run_id, status.park_reason)


async def _settle(
    ids: RunIds,
    tool_input: ToolInput,
    child_session_id: str,
    child_state: str,
    child_run_id: str | None,
    park_reason: str | None,
) -> ToolOutcome:
    """The call's T2 from how its child settled (``maka.subagent_settle``)."""
    settled: ToolOutcome = await workflow.execute_activity(
        SUBAGENT_SETTLE,
        SubAgentSettle(
            session_id=ids.session_id,
            run_id=ids.run_id,
            tool_call_id=tool_input.call.tool_call_id,
            operation_id=tool_input.call.operation_id,
            child_session_id=child_session_id,
            child_state=child_state,
            child_run_id=child_run_id,
            child_park_reason=park_reason,
        ),
        result_type=ToolOutcome,
        start_to_close_timeout=LEDGER_TIMEOUT,
        retry_policy=LEDGER_RETRY,
    )
    return settled
