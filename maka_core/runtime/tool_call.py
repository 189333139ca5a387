"""One tool call, at most once: its admission (guard ... guarantee) -> T1 -> the effect -> T2.

Policy is MELRA's decision (``runtime.governed``): a denial commits an ordinary ``policy_blocked``
result with its decision and receipt; ``confirm`` commits a permission request and the call
waits for its answer (``_await_answer``); an allowed call records its decision with T1, and its
evidence is evaluated before T2 commits the (possibly ``partial``) result with its receipt.

The guard comes first and is absolute: an operation the ledger already settled returns its committed
outcome; an operation with a dispatch fact and no outcome is never run again from here (it is
indeterminate: only recovery may settle it, by evidence or by parking). Only a call the Resolver
proves ``definitely_not_dispatched`` reaches preflight. Arguments are read from the committed call
(never carried by the orchestrator), and the result goes to the ledger before anyone sees it.

An attempt that is cancelled while its effect runs (Temporal cancels it when a heartbeat learns
that its workflow execution is gone: ``temporal workflow terminate``, a heartbeat timeout) stops
the effect: the tool's heartbeat raises ``AttemptCancelled`` from then on (``bash`` kills its
process group), the effect leg ends as ``Abandoned`` and T2 never commits, so a repair that waited
out the heartbeat timeout (``workers.host.attempt_fence``) settles a run whose tool is no longer running.
A cancellation its workflow asked for (``cancel_turn``; ``Attempt.cancel_requested``) stops the
effect the same way, but the runtime observed the end, so T2 commits it as ``tool_cancelled`` and
the attempt completes with that outcome (``ToolOutcome.cancelled``), for the model to see.

The call's steps live beside this module: ``runtime.admission`` (the admission, computed once:
guard, arguments, offer, preflight, policy decision and approval, network, evidence, guarantee,
one module each), ``runtime.tool_admission`` (T1: the admission committed), ``runtime.tool_effect``
(the effect, then T2) and ``runtime.cancellation`` (stopping a tool whose attempt is cancelled).
This module runs them as one relay and waits out an approval.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import TypeVar

from maka_core import failpoints
from maka_core.errors import LedgerRejection
from maka_core.runtime import approvals
from maka_core.runtime.cancellation import Abandoned, AttemptCancelled, Cancellation, cancelling
from maka_core.runtime.contracts import LocalDeferral, ToolInput, ToolOutcome
from maka_core.runtime.runtime import Attempt, Leg, Runtime, ToolSlot
from maka_core.runtime.tool_admission import AwaitingApproval, Dispatched, NotRun, admit_call
from maka_core.runtime.tool_effect import Ran, run_effect, t2_leg, timed

T = TypeVar("T")


class Deferred(Exception):
    """A local attempt hands its call to the regular activity (``runtime.local_calls``): raised
    before T1 (no thread free, the worker stopping, an approval asked for), never after."""

    def __init__(self, reason: LocalDeferral) -> None:
        super().__init__(reason)
        self.reason: LocalDeferral = reason



async def execute_tool(rt: Runtime, inp: ToolInput, attempt: Attempt) -> ToolOutcome:
    """Run one committed function call at most once."""
    outcome, _ = await execute_tool_then(rt, inp, attempt, None)
    return outcome


async def execute_tool_then(
    rt: Runtime, inp: ToolInput, attempt: Attempt, then: Callable[[], T] | None, *, local: bool = False
) -> tuple[ToolOutcome, T | None]:
    """``execute_tool``, and ``then`` on the ledger thread in T2's own hop, right after T2 commits;
    its value is None when the call did not run here (refused, or settled before). A riding model
    step reads its ledger state this way, saving a hand-off and a return per call (``runtime``).
    ``then`` must not raise: inside a group commit its failure would undo T2 with it.

    ``local``: a local attempt (``runtime.local_calls``): it takes a tool thread only if one is free
    and raises ``Deferred`` where the regular attempt would wait (for a thread or an approval)."""
    began = time.perf_counter()
    try:
        return await _execute(rt, inp, attempt, then, local)
    finally:
        rt.timings["tool_call"] += time.perf_counter() - began
        rt.timings["calls"] += 1


async def _execute(
    rt: Runtime, inp: ToolInput, attempt: Attempt, then: Callable[[], T] | None, local: bool = False
) -> tuple[ToolOutcome, T | None]:
    spent: list[float] = []

    loop = asyncio.get_running_loop()  # an async tool is awaited here, on the worker's own loop

    def admit(_: None) -> Dispatched | NotRun:
        return timed(rt, "t1", spent, lambda: admit_call(rt, inp, attempt, loop))

    cancellation = Cancellation()

    def effect(slot: ToolSlot) -> Callable[[Dispatched | NotRun], Ran | NotRun]:
        def run(admitted: Dispatched | NotRun) -> Ran | NotRun:
            try:
                if not isinstance(admitted, Dispatched):
                    return admitted  # settled, refused or waiting: nothing runs
                failpoints.hit("P2", tag=inp.call.tool_name)
                return run_effect(admitted, inp.call, cancellation)
            finally:
                slot.give_back()  # the thread is free: the next call may begin its T1

        return run

    while True:
        # The call's tool thread is reserved before T1, so a durable T1 never queues for one.
        if local:
            free = rt.tool_slots.try_take()
            if free is None:
                raise Deferred("stopping" if rt.tool_slots.stopping else "busy")
            slot = free
        else:
            slot = await rt.tool_slots.take(attempt, rt.settings.heartbeat_interval)
        relay = rt.relay(
            [
                Leg("ledger", admit, "t1"),
                Leg("tool_pool", effect(slot), "effect"),
                Leg("ledger", t2_leg(rt, attempt, spent, then), "t2"),
            ],
            attempt=attempt,
            # T1 failed and the effect leg never ran: the relay's end gives the slot back.
            finished=slot.give_back,
        )
        settled = await cancelling(relay, cancellation, attempt)
        if not isinstance(settled, AwaitingApproval):
            break
        if local:  # the request is committed, no T1: the regular attempt finds it and waits
            raise Deferred("approval")
        if inp.approval_wait == "workflow":  # the workflow waits, holding no thread (``approvals``)
            waiting = ToolOutcome(
                operation_id=inp.call.operation_id, status="awaiting_approval", approval=settled.wait
            )
            return waiting, None
        await _await_answer(rt, settled, attempt)
    if isinstance(settled, ToolOutcome):
        return settled, None
    if isinstance(settled, Abandoned):  # only a cancelled attempt abandons, and its await raised
        raise AttemptCancelled(message="the attempt was cancelled", operationId=settled.operation_id)
    ran, after = settled
    rt.call_ledger_s.append(sum(spent))
    failpoints.hit("P5", tag=inp.call.tool_name)
    outcome = ToolOutcome(
        operation_id=inp.call.operation_id,
        status="completed",
        is_error=ran.result.is_error or None,
        dispatch_event_id=ran.call.dispatch_event_id,
        response_event_id=ran.response.id,
        cancelled=ran.cancelled or None,
    )
    failpoints.hit("P6", tag=inp.call.tool_name)
    return outcome, after


async def _await_answer(rt: Runtime, waiting: AwaitingApproval, attempt: Attempt) -> None:
    """Wait, heartbeating, until the request is answered in the ledger or expires (then close it).

    The wait is the activity's, not the workflow's: the answer is a ledger fact (``maka session
    approve``/``deny`` validate and commit it there), so a worker or server crash loses nothing:
    the next attempt of this call finds the same request and waits on (or acts on its answer).
    """
    while True:
        record = await rt.on_ledger(lambda: rt.ledger.decision(waiting.operation_id), attempt=attempt)
        if record is None or record["state"] != "awaiting_approval":
            return
        if datetime.now(UTC) >= waiting.expires_at:
            try:
                await rt.on_ledger(
                    functools.partial(approvals.close_expired, rt.ledger, record), attempt=attempt
                )
            except LedgerRejection as exc:
                if exc.code != "approval_not_pending":
                    raise
            return
        attempt.heartbeat()
        await asyncio.sleep(approvals.POLL_S)



__all__ = ["Deferred", "execute_tool", "execute_tool_then"]
