"""The calls of one model step, side by side (issue 31 item 2; ``PARALLEL_TOOLS_PATCH``).

A step's calls run concurrently, up to the session's ``max_parallel_tools`` at once. Which calls may
overlap is each tool's declaration (``CallRef.parallel``, from ``tools.contract.parallel_safe``):
the calls that are not parallel-safe run one at a time, in the model's call order, while the
parallel-safe ones run beside them; once one of those lone calls parks or fails, the lone calls
after it are never dispatched (no T1), as the loop of before never reached them. Each call is
dispatched exactly as a lone call is (``CallDispatch._tool``: a hybrid call's local attempt,
approvals, host waits, recovery), so each keeps its own T1 before its effect and its own T2 before
any result reaches the model; the ledger's commit path serializes the writers of one session
(``tests/test_parallel_commit.py``).

Two calls that touch the same workspace name (``CallRef.targets``, ``tools.targets``), not both
read-only, keep the model's order (``PARALLEL_ORDER_PATCH``): a read of a file asked for after its
write waits for the write, and a write asked for after a read waits for the read; if the earlier one
parks or fails, the later one is never dispatched.

The step is done when every call has its outcome or has parked: a call waiting for an approval or
its host holds back no other call. Then, in the model's call order: a cancel (``cancel_turn``
cancels every call still running; each cancelled call's T2 says ``tool_cancelled``) ends the turn
cancelled; else the first parked call parks the turn (the others' outcomes stay committed; the
worker logs every parked call, and recovery classifies each of them call by call on ``maka
resume``); else the first other failure fails the run. The next model step reads the results from
the ledger, in the model's call order whatever order they finished in. No step rides with a call
here (``with_tool``): it must wait for every call, so the loop runs it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from maka_temporal.workflows.contracts import CallRef, RunIds, ToolOutcome, ToolSettings
    from maka_temporal.workflows.session_calls import CallDispatch
    from maka_temporal.workflows.session_policy import (
        PARALLEL_ORDER_PATCH,
        PARALLEL_TOOLS_PATCH,
        Cancelled,
        Park,
    )

__all__ = ["FanOut", "conflicts"]


def conflicts(calls: Sequence[CallRef]) -> list[list[int]]:
    """For each call, the earlier calls of the step it must wait for: those that share a target with
    it, unless both are read-only."""
    waits: list[list[int]] = []
    for i, call in enumerate(calls):
        mine = set(call.targets or ())
        waits.append(
            [
                j
                for j, earlier in enumerate(calls[:i])
                if mine.intersection(earlier.targets or ()) and not (call.read_only and earlier.read_only)
            ]
        )
    return waits


class FanOut(CallDispatch):
    """The session workflow's dispatch of a step's calls side by side (a base of ``SessionWorkflow``)."""

    _cancelled_operations: list[str]

    def _fans_out(self, calls: Sequence[CallRef]) -> bool:
        """Whether this step's calls run side by side: several calls, a session that allows more
        than one at a time, and an execution since the patch (``_since``)."""
        return (
            len(calls) > 1
            and self._inp.config.max_parallel_tools > 1
            and any(call.parallel for call in calls)
            and self._since(PARALLEL_TOOLS_PATCH)
        )

    def _must_wait(self, calls: Sequence[CallRef]) -> list[list[int]]:
        """For each call, the earlier calls of the step it waits for (``conflicts``)."""
        return conflicts(calls)

    async def _fan_out(self, ids: RunIds, calls: Sequence[CallRef], settings: ToolSettings) -> None:
        """Run ``calls`` side by side until each has its outcome or has parked; then end the step
        as the class docstring says (``Cancelled``, ``Park`` or the first failure)."""
        gate = asyncio.Semaphore(self._inp.config.max_parallel_tools)
        lane = asyncio.Lock()  # the calls that are not parallel-safe: one at a time, in order
        ended: list[BaseException | None] = [None] * len(calls)
        broken: list[CallRef] = []  # a lone call that parked or failed: the later ones never start
        waits = self._must_wait(calls)
        if not any(waits) or not self._since(PARALLEL_ORDER_PATCH):
            waits = [[] for _ in calls]
        done = [asyncio.Event() for _ in calls]
        skipped = [False] * len(calls)  # never dispatched: what it waited for parked or failed

        async def after(index: int) -> bool:
            """Wait for the earlier calls ``index`` conflicts with; False (and the call is skipped)
            if one of them parked, failed or was skipped."""
            for j in waits[index]:
                await done[j].wait()
            skipped[index] = any(ended[j] is not None or skipped[j] for j in waits[index])
            return not skipped[index]

        async def one(index: int, call: CallRef) -> None:
            try:
                if call.parallel:
                    if not await after(index):
                        return  # never dispatched (no T1): what it waited for parked or failed
                    async with gate:
                        result = await self._tool(ids, call, settings, None)
                else:
                    async with lane:
                        if broken or not await after(index):
                            return  # never dispatched (no T1): as after a park in the loop of before
                        try:
                            async with gate:
                                result = await self._tool(ids, call, settings, None)
                        except Exception:
                            broken.append(call)
                            raise
            except Exception as err:  # every call ends first; then `_end_step` judges them
                ended[index] = err
                return
            finally:
                done[index].set()
            if isinstance(result, ToolOutcome) and result.cancelled:
                self._cancelled_operations.append(result.operation_id)

        # Tasks start in creation order, so the lane and the gate are taken in the model's order.
        tasks = [asyncio.create_task(one(i, call)) for i, call in enumerate(calls)]
        try:
            await asyncio.gather(*tasks)
        except asyncio.CancelledError:
            # ``cancel_turn``: every call still running was cancelled with this task and waited
            # for (``WAIT_CANCELLATION_COMPLETED``); what each of them returned is recorded above.
            raise
        self._end_step(calls, ended)

    def _end_step(self, calls: Sequence[CallRef], ended: Sequence[BaseException | None]) -> None:
        if self._cancel is not None:
            raise Cancelled()
        parked = [(call, err) for call, err in zip(calls, ended, strict=True) if isinstance(err, Park)]
        if parked:
            first = parked[0][1]
            assert isinstance(first, Park)
            if len(parked) > 1:
                workflow.logger.warning(
                    "turn parked with %d calls parked: %s",
                    len(parked),
                    ", ".join(f"{call.operation_id} ({err.reason})" for call, err in parked),
                )
            raise first
        for err in ended:
            if isinstance(err, Cancelled):
                raise err
        for err in ended:
            if err is not None:
                raise err
