"""One tool call, at most once: Resolver guard -> preflight -> policy -> evidence + T1 -> run -> T2.

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
"""

from __future__ import annotations

import asyncio
import functools
import logging
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, TypeVar

from maka_core import failpoints
from maka_core.errors import AttemptSuperseded, LedgerRejection, MakaError
from maka_core.facts.clock import now_ms
from maka_core.facts.events import RuntimeEvent
from maka_core.governance.evidence import TaskStatus
from maka_core.ledger.committed import CommittedView
from maka_core.ledger.lanes import args_hash_or_none
from maka_core.ledger.resolver import OperationResolution
from maka_core.ledger.scanner import OperationFacts
from maka_core.runtime import approvals, builders, governed, melra
from maka_core.runtime.contracts import ApprovalWait, CallRef, LocalDeferral, RunIds, ToolInput, ToolOutcome
from maka_core.runtime.runtime import Attempt, Leg, Runtime, ToolSlot
from maka_core.tools import Tool, ToolRefusal, ToolResult, bound_call, contract
from maka_core.tools.base import FileEvidence, GuardedWrite
from maka_core.workspace import Workspace

log = logging.getLogger("maka.runtime")
T = TypeVar("T")


class CallNotFound(MakaError):
    """The orchestrator names a call the ledger does not hold (the model step never committed it)."""

    default_code = "call_not_found"


class DispatchWithoutOutcome(MakaError):
    """The call has a dispatch fact and no outcome: running it again could repeat its effect."""

    default_code = "dispatch_without_outcome"


class Deferred(Exception):
    """A local attempt hands its call to the regular activity (``runtime.local_calls``): raised
    before T1 (no thread free, the worker stopping, an approval asked for), never after."""

    def __init__(self, reason: LocalDeferral) -> None:
        super().__init__(reason)
        self.reason: LocalDeferral = reason


class AttemptCancelled(MakaError):
    """Raised by a cancelled attempt's tool heartbeat, inside the tool thread: stop the effect."""

    default_code = "attempt_cancelled"


@dataclass(frozen=True)
class Abandoned:
    """The effect leg of a cancelled attempt: the tool stopped (or never started) and nobody waits
    for its outcome. T2 does not commit; the operation stays dispatched without a response."""

    operation_id: str


class Cancellation:
    """Set when the attempt awaiting a relay is cancelled; the tool's heartbeat then raises."""

    def __init__(self) -> None:
        self._set = threading.Event()
        #: The cancel was asked for and its end is awaited: the effect's end is recorded in T2.
        self.observed = False

    def cancel(self, *, observed: bool = False) -> None:
        self.observed = observed
        self._set.set()

    @property
    def cancelled(self) -> bool:
        return self._set.is_set()

    def heartbeat(self) -> None:
        if self._set.is_set():
            raise AttemptCancelled(message="the attempt was cancelled; the tool is stopped")


async def _cancelling(work: Awaitable[T], cancellation: Cancellation, attempt: Attempt | None = None) -> T:
    """Await a relay; a cancelled attempt tells its tool to stop before the cancellation goes on.
    A cancel that was asked for (``attempt.cancel_requested``) waits for the relay's end: the
    stopped effect's T2 (``tool_cancelled``) commits before the attempt reports."""
    task = asyncio.ensure_future(work)
    try:
        return await asyncio.shield(task)
    except asyncio.CancelledError:
        observed = attempt is not None and attempt.cancel_requested()
        cancellation.cancel(observed=observed)
        if not observed:
            task.cancel()
            raise
    return await task


@dataclass(frozen=True)
class CallState:
    """A call as the committed ledger knows it: identities, the Resolver's decision, its facts."""

    ids: RunIds
    op: OperationResolution
    facts: OperationFacts


@dataclass(frozen=True)
class Dispatched:
    """A call past T1: what the effect needs, and the dispatch fact it runs under."""

    ids: RunIds
    tool: Tool
    args: dict[str, Any]
    ws: Workspace
    dispatch_event_id: str
    #: The recorded policy decision (None only for an operation dispatched before governance).
    decision: dict[str, Any] | None = None
    gov: governed.SessionGovernance | None = None
    started_ms: int = 0
    #: Which run of the effect this is, for a guarantee that may run it again (its receipt lists
    #: the runs); None for every other call.
    run_number: int | None = None


@dataclass(frozen=True)
class AwaitingApproval:
    """A ``confirm`` decision whose permission request is committed and not yet answered."""

    operation_id: str
    approval_id: str
    expires_at: datetime
    wait: ApprovalWait | None = None


#: A call that did not run here: settled or refused (its outcome), waiting for an approval, or
#: abandoned by a cancelled attempt.
NotRun = ToolOutcome | AwaitingApproval | Abandoned


def run_ids(view: CommittedView, session_id: str, run_id: str) -> RunIds | None:
    """The run's ids as its first event committed them (None: the ledger does not hold the run)."""
    first = view.first_of_run.get(run_id)
    if first is None:
        return None
    return RunIds(
        session_id=session_id, turn_id=first.turn_id, run_id=run_id, invocation_id=first.invocation_id
    )


def call_state(view: CommittedView, session_id: str, run_id: str, tool_call_id: str) -> CallState | None:
    """Look a call up in the committed view (None: the ledger does not hold it)."""
    ids = run_ids(view, session_id, run_id)
    if ids is None:
        return None
    found = view.call(ids.invocation_id, tool_call_id)
    if found is None:
        return None
    op, facts = found
    return CallState(ids, op, facts)


def settled_outcome(op: OperationResolution, operation_id: str, *, replayed: bool) -> ToolOutcome:
    return ToolOutcome(
        operation_id=op.operation_id or operation_id,
        status="refused" if op.settlement_origin == "pre_t1_synthetic" else "completed",
        is_error=bool(op.response_is_error) or None,
        dispatch_event_id=op.dispatch_event_id,
        response_event_id=op.response_event_id,
        replayed=replayed or None,
    )


def committed_args(facts: OperationFacts) -> Any:
    """The arguments of the committed call (any JSON value on the wire)."""
    call = facts.call
    assert call is not None and call.content is not None and call.content.kind == "function_call"
    return call.content.args


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
        return _timed(rt, "t1", spent, lambda: _admit(rt, inp, attempt, loop))

    cancellation = Cancellation()

    def effect(slot: ToolSlot) -> Callable[[Dispatched | NotRun], Ran | NotRun]:
        def run(admitted: Dispatched | NotRun) -> Ran | NotRun:
            try:
                if not isinstance(admitted, Dispatched):
                    return admitted  # settled, refused or waiting: nothing runs
                failpoints.hit("P2", tag=inp.call.tool_name)
                return _run_effect(admitted, inp.call, cancellation)
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
                Leg("ledger", _t2(rt, attempt, spent, then), "t2"),
            ],
            attempt=attempt,
            # T1 failed and the effect leg never ran: the relay's end gives the slot back.
            finished=slot.give_back,
        )
        settled = await _cancelling(relay, cancellation, attempt)
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


def _admit(
    rt: Runtime, inp: ToolInput, attempt: Attempt, loop: asyncio.AbstractEventLoop | None = None
) -> Dispatched | NotRun:
    """On the ledger thread: guard, preflight, policy, evidence and T1 (or a committed refusal)."""
    call = inp.call
    view = rt.ledger.view(inp.session_id)
    state = call_state(view, inp.session_id, inp.run_id, call.tool_call_id)
    if state is None:
        raise CallNotFound(message=f"no committed call {call.tool_call_id}", toolCallId=call.tool_call_id)
    op, ids = state.op, state.ids
    if op.status == "completed":
        return settled_outcome(op, call.operation_id, replayed=True)
    if not rt.guard.may_dispatch(op):
        raise DispatchWithoutOutcome(
            message=f"operation {call.operation_id} is {op.status} ({op.reason}); refusing to run it again",
            operationId=call.operation_id,
            status=op.status,
            reason=op.reason,
        )
    args = committed_args(state.facts)
    if not isinstance(args, dict):
        # The wire allows any JSON value as args; every tool here takes an object.
        invalid = ToolResult.error("invalid_arguments", "tool arguments must be a JSON object")
        return _commit_refusal(rt, ids, call, invalid)
    tool = rt.tools.get(call.tool_name)
    if tool is None:
        return _commit_refusal(
            rt, ids, call, ToolResult.error("tool_not_found", f"no tool named {call.tool_name!r}")
        )
    # ToolSetUnavailable (this worker lacks a tool the set names) is one worker's view, not the
    # call's outcome: it propagates, non-retryable, and the turn parks with nothing committed.
    offered = rt.offered(ids.session_id, inp.tool_set)
    if offered is not None and call.tool_name not in offered:
        # The model named a tool its request never held: refused like an unknown one, before T1.
        message = f"tool {call.tool_name!r} is not offered in this session"
        return _commit_refusal(rt, ids, call, ToolResult.error("tool_not_offered", message))
    tool = melra.bind(rt, tool, ids.session_id, call.operation_id, offered)
    tool = bound_call.for_call(tool, bound_call.CallContext(ids.session_id, call.operation_id, loop=loop))
    try:
        ws = rt.workspace(inp.workspace)
    except MakaError as exc:
        return _commit_refusal(rt, ids, call, ToolResult.error(exc.code, exc.message))
    if ws.identity != inp.workspace_identity:
        message = (
            f"the workspace at {inp.workspace} is {ws.identity}, not the session's {inp.workspace_identity}"
        )
        return _commit_refusal(rt, ids, call, ToolResult.error("workspace_identity_mismatch", message))
    refusal = tool.preflight(args, ws)
    if refusal is None:
        limits = rt.policy.evaluate(tool, args)  # the worker's own switches come first
        refusal = None if limits.allowed else limits.to_result()
    if refusal is not None:
        return _commit_refusal(rt, ids, call, refusal)
    gov = rt.session_governance(ids.session_id)
    admitted = approvals.admit(rt, gov, ids, call, tool, args)
    if isinstance(admitted, approvals.Refused):
        return _commit_refusal(
            rt,
            ids,
            call,
            admitted.result,
            decision=admitted.record,
            gov=gov,
            args=args,
            fresh=admitted.fresh,
            status=admitted.status,
        )
    if isinstance(admitted, approvals.Waiting):
        return AwaitingApproval(
            call.operation_id, admitted.approval_id, admitted.expires_at, admitted.contract
        )
    record = admitted.record
    started = now_ms()
    try:
        tool = governed.bound_network(tool, record)  # the sandbox is built per call, from its decision
        evidence = tool.capture_evidence(args, ws)
        if isinstance(evidence, FileEvidence) and isinstance(tool, GuardedWrite):
            tool = tool.with_evidence(evidence)  # its write is conditional on this before-state
            # ... and on its call not taken over by recovery since (a worker frozen before it wrote)
            op_id = call.operation_id
            tool = tool.with_fence(lambda: not rt.from_tool_thread(lambda: rt.ledger.fenced(op_id)))
    except ToolRefusal as exc:  # the target changed after preflight, or a network grant this worker lacks
        return _commit_refusal(rt, ids, call, exc.to_result())
    if op.dispatch_event_id is not None:
        # Only a broken guard admits a call that already has its dispatch fact (a second T1 would be
        # refused as a conflicting dispatch): it runs the effect again under the first one.
        return Dispatched(ids, tool, args, ws, op.dispatch_event_id, record, gov, started)
    committed = state.facts.call
    assert committed is not None and committed.content is not None
    args_hash = (
        view.scanner.call_args_hash(committed)
        if committed.content.kind == "function_call" and committed.content.name == call.tool_name
        else args_hash_or_none(call.tool_name, args)
    )
    assert args_hash is not None  # the call was admitted by the ledger, so its args are strict JSON
    dispatch = builders.dispatch_event(
        ids, call.operation_id, call.tool_call_id, call.tool_name, tool.recovery_mode, args_hash, now_ms()
    )
    rt.ledger.commit_tool_prepared(
        dispatch,
        evidence=None if evidence is None else evidence.to_json(),
        attempt=attempt.record,
        decision=record if admitted.fresh else None,
    )
    keyed = record.get("executionGuarantee") in contract.KEYED_GUARANTEES
    return Dispatched(ids, tool, args, ws, dispatch.id, record, gov, started, 1 if keyed else None)


@dataclass(frozen=True)
class Ran:
    """A dispatched call after its effect: what the model is told, its sealed receipt, and the
    response T2 commits."""

    call: Dispatched
    result: ToolResult
    receipt: dict[str, Any] | None
    response: RuntimeEvent
    #: The effect was stopped by a cancel that was asked for: ``result`` is ``tool_cancelled``.
    cancelled: bool = False


async def run_and_commit_outcome(
    rt: Runtime, call: Dispatched, ref: CallRef, attempt: Attempt
) -> tuple[ToolResult, RuntimeEvent]:
    """Run the effect, verify its evidence, then T2: the outcome and its receipt commit before
    anyone sees the result (one relay: tool pool, then ledger thread)."""
    cancellation = Cancellation()
    relay = rt.relay(
        [
            Leg("tool_pool", lambda _: _run_effect(call, ref, cancellation), "effect"),
            Leg("ledger", _t2(rt, attempt, None, None), "t2"),
        ],
        attempt=attempt,
    )
    ran, _ = await _cancelling(relay, cancellation)
    assert isinstance(ran, Ran)
    return ran.result, ran.response


def _run_effect(call: Dispatched, ref: CallRef, cancellation: Cancellation) -> Ran | Abandoned:
    """On the tool pool: the effect, its evidence verified and its receipt sealed, and the response
    event that will carry the result; ``Abandoned`` when the attempt was cancelled meanwhile (the
    tool's heartbeat stopped it)."""
    started, stopped = not cancellation.cancelled, False
    try:
        if not started:
            raise AttemptCancelled(message="cancelled before the tool started")
        result = call.tool.run(call.args, call.ws, cancellation.heartbeat)
    except AttemptSuperseded as late:
        # Woken after recovery took the call over (``store.fences``): nothing written, no outcome.
        log.warning("%s: operation %s: %s", late.code, ref.operation_id, late.message)
        raise
    except AttemptCancelled as exc:
        if not cancellation.observed:
            return Abandoned(ref.operation_id)
        result, stopped = _cancelled_result(started, exc.detail), True
    receipt = None
    if call.decision is not None and call.gov is not None:
        status, items = governed.verify(call.decision, result, call.ws)
        receipt = governed.receipt(
            operation_id=ref.operation_id,
            gov=call.gov,
            record=call.decision,
            args=call.args,
            started_ms=call.started_ms or now_ms(),
            ended_ms=now_ms(),
            status=status,
            items=items,
            error=result.error_code,
            redactions=governed.redactions_of(result),
            attempts=call.run_number,
        )
        result = governed.told(result, status, items)
        present = getattr(call.tool, "present", None)
        if present is not None:  # a tool that tells its own outcome (a task: its status, receipt)
            result = present(result, status, items)
    response = builders.response_event(
        call.ids,
        f"{ref.operation_id}_response",
        ref.tool_call_id,
        ref.tool_name,
        result.result,
        result.is_error,
        now_ms(),
        ref.operation_id,
    )
    return Ran(call, result, receipt, response, cancelled=stopped)


def _cancelled_result(started: bool, seen: dict[str, Any]) -> ToolResult:
    """What the model is told about a call its turn's cancel stopped (an ordinary error result),
    with what the tool saw of its end (``bash``: ``exitSignal``, the output until then)."""
    if not started:
        return ToolResult.error(
            "tool_cancelled", "the turn was cancelled before the tool started", started=False
        )
    observed = {k: v for k, v in seen.items() if k != "message"}
    return ToolResult.error(
        "tool_cancelled",
        "the turn was cancelled; the tool was stopped while it ran",
        started=True,
        **observed,
    )


def _t2(
    rt: Runtime, attempt: Attempt, spent: list[float] | None, then: Callable[[], T] | None
) -> Callable[[Any], Any]:
    """The T2 leg: commit the outcome and its receipt, then run ``then`` in the same hop; a value
    that is not a ``Ran`` (nothing ran) passes through untouched."""

    def commit(ran: Ran | NotRun) -> tuple[Ran, T | None] | NotRun:
        if not isinstance(ran, Ran):
            return ran
        _timed(
            rt,
            "t2",
            spent,
            lambda: rt.ledger.commit_tool_outcome(ran.response, attempt=attempt.record, receipt=ran.receipt),
        )
        return ran, None if then is None else then()

    return commit


def _timed(rt: Runtime, phase: str, spent: list[float] | None, fn: Callable[[], T]) -> T:
    """``fn()``, its seconds added to ``rt.timings[phase]`` and appended to ``spent`` (the call's
    ledger time, ``Runtime.call_ledger_s``)."""
    began = time.perf_counter()
    try:
        return fn()
    finally:
        elapsed = time.perf_counter() - began
        rt.timings[phase] += elapsed
        if spent is not None:
            spent.append(elapsed)


def _commit_refusal(
    rt: Runtime,
    ids: RunIds,
    call: CallRef,
    refusal: ToolResult,
    *,
    decision: dict[str, Any] | None = None,
    gov: governed.SessionGovernance | None = None,
    args: dict[str, Any] | None = None,
    fresh: bool = True,
    status: TaskStatus = "policy_blocked",
) -> ToolOutcome:
    """A pre-T1 refusal is an ordinary committed error result: the tool never ran. A policy
    refusal commits its decision and receipt in the same transaction."""
    response = builders.response_event(
        ids,
        f"{call.operation_id}_refused",
        call.tool_call_id,
        call.tool_name,
        refusal.result,
        True,
        now_ms(),
        None,  # pre-T1: unbound; no operation was dispatched
    )
    if decision is None or gov is None:
        rt.ledger.append([response])
    else:
        ts = now_ms()
        sealed = governed.receipt(
            operation_id=call.operation_id,
            gov=gov,
            record=decision,
            args=args or {},
            started_ms=ts,
            ended_ms=ts,
            status=status,
            error=refusal.error_code,
        )
        rt.ledger.commit_refusal(
            response, operation_id=call.operation_id, decision=decision if fresh else None, receipt=sealed
        )
    return ToolOutcome(
        operation_id=call.operation_id, status="refused", is_error=True, response_event_id=response.id
    )
