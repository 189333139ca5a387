"""A parent's cancel reaching its sub-agents' child sessions (issue 31 item 3; ``SUBAGENT_CANCEL_PATCH``).

``cancel_turn`` of a parent cancels its turn's task, and with it the wait of each sub-agent call
for its child session. Before the patch that wait was Temporal's own: a cancel of a child workflow,
which the child's session absorbed. Its running call ended ``tool_cancelled``, but its turn went on
(the model read that result and carried on), so the child kept running, and the parent's call
settled from a turn that was never cancelled.

Since the patch, the call's wait is shielded from the turn's cancel. The call asks its child to
cancel its own turn instead (the signal ``CANCEL_FROM_PARENT``; a workflow cannot send an Update),
which the child takes as its ``cancel_turn``: each of its running calls ends with its T2
``tool_cancelled``, a sub-agent of its own is asked in turn, and its run ends ``cancelled``. The
call then waits for the child's turn to settle and commits its T2 from it (``tool_cancelled``,
``outcome: cancelled``), so the parent's run ends ``cancelled`` naming the call. A cancel while the
child is being started waits for the start, then asks. A child whose turn ends otherwise first
(completed, or parked by recovery) is not cancelled: the call settles from what it did.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, TypeVar

from temporalio import workflow
from temporalio.exceptions import ApplicationError, FailureError

with workflow.unsafe.imports_passed_through():
    from maka_temporal.workflows.contracts import (
        CANCEL_FROM_PARENT,
        CancelTurn,
        InFlightTurn,
        RunIds,
    )

__all__ = ["SUBAGENT_CANCEL_PATCH", "ChildCancel", "ParentCancel"]

#: The patch under which a parent's cancel asks its children to cancel their turns.
SUBAGENT_CANCEL_PATCH = "maka-subagent-cancel-1"

T = TypeVar("T")


class ParentCancel:
    """The session workflow's side of both (a base of ``SessionWorkflow``, which sets every
    attribute below): what a call asks of its child, and a child's taking of it."""

    _cancel: CancelTurn | None
    _turn_task: asyncio.Task[None] | None
    _current: RunIds | None
    _pending: tuple[RunIds, str] | None
    _carried: InFlightTurn | None
    #: ``SessionWorkflow``'s Update handler (its type is the decorated one's).
    cancel_turn: Any
    _validate_cancel: Callable[[CancelTurn], None]

    def _child_cancel(self) -> CancelTurn | None:
        """What a sub-agent call asks of its child once this turn is cancelled: this turn's cancel
        (its reason and who asked); ``None`` in an execution recorded before the patch (Temporal's
        cancel of the child workflow, as then). Asked only when a cancel reaches a call."""
        if not workflow.patched(SUBAGENT_CANCEL_PATCH):
            return None
        asked = self._cancel
        return CancelTurn(reason=asked.reason if asked else None, by=asked.by if asked else None)

    @workflow.signal(name=CANCEL_FROM_PARENT)
    async def cancel_from_parent(self, inp: CancelTurn) -> None:
        """The parent's cancel: cancel this session's turn as ``cancel_turn`` does, once the turn
        can be cancelled (a signal that arrives with the child's start waits for its turn to
        begin). A turn that already ended, or is being cancelled already, is left as it is."""
        await workflow.wait_condition(
            lambda: self._turn_task is not None
            or (self._current is None and self._pending is None and self._carried is None)
        )
        try:
            self._validate_cancel(inp)
            await self.cancel_turn(inp)
        except ApplicationError as refused:  # a signal has no caller to refuse: the log says why
            workflow.logger.info("the parent's cancel was not taken: %s", refused.message)


class ChildCancel:
    """One sub-agent call's waits for its child (its start, then its settled turn) through the
    parent turn's cancel (the module docstring)."""

    def __init__(self, ask: Callable[[], CancelTurn | None]) -> None:
        self._ask = ask
        #: The cancel asked of the child, once the parent's turn was cancelled (since the patch).
        self.asked: CancelTurn | None = None

    async def wait(self, task: asyncio.Task[T], child: workflow.ChildWorkflowHandle[Any, Any] | None) -> T:
        """``task``'s result, whatever cancels the turn meanwhile; a cancel is asked of ``child``
        (when started) once. Before the patch, the cancel reaches ``task`` as it did then."""
        while True:
            try:
                return await asyncio.shield(task)
            except asyncio.CancelledError:
                if self.asked is not None:
                    continue  # asked already: the child's turn settles, the call waits for it
                asked = self._ask()
                if asked is None:
                    task.cancel()  # before the patch: Temporal's cancel of the child
                    return await task
                self.asked = asked
                if child is not None:
                    await self.tell(child)

    async def tell(self, child: workflow.ChildWorkflowHandle[Any, Any]) -> None:
        """Ask ``child`` to cancel its turn (after a cancel during its start: once started)."""
        assert self.asked is not None
        try:
            await child.signal(CANCEL_FROM_PARENT, self.asked)
        except FailureError as err:  # the child closed first: its settled turn is the outcome
            workflow.logger.info("sub-agent session %s was not asked to cancel: %s", child.id, err)
