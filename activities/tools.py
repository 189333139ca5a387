"""``maka.execute_tool``: Resolver guard -> preflight -> evidence + T1 -> run (heartbeating) -> T2.

The guard comes first and is absolute: an operation the ledger already settled returns its committed
outcome; an operation with a dispatch fact and no outcome is never run again from here (it is
indeterminate: only ``recover_operation`` may settle it, by evidence or by parking). Only a call the
Resolver proves ``definitely_not_dispatched`` reaches preflight. No argument and no tool output
crosses into workflow history: arguments are read from the committed call, results go to the ledger.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities import facts
from maka_core import failpoints
from maka_core.errors import MakaError
from maka_core.facts.events import RuntimeEvent
from maka_core.ledger.resolver import OperationResolution
from maka_core.tools import ToolRefusal, ToolResult
from workflows.contracts import DISPATCH_WITHOUT_OUTCOME, RunIds, ToolInput, ToolOutcome

if TYPE_CHECKING:
    from activities import MakaActivities

T = TypeVar("T")

#: Test-only switch for the kill matrix's negative control (never set in production).
GUARD_DISABLED_ENV = "MAKA_TEST_DISABLE_RESOLVER_GUARD"


async def resolve_call(
    host: MakaActivities, session_id: str, run_id: str, tool_call_id: str
) -> tuple[OperationResolution | None, RuntimeEvent | None, RunIds | None]:
    """The Resolver's decision for one call, its committed call event, and the run's identities
    (read from the ledger rather than carried in workflow history)."""

    def lookup() -> tuple[OperationResolution | None, RuntimeEvent | None, RunIds | None]:
        view = host.cache.session(session_id)
        first = view.first_of_run.get(run_id)
        if first is None:
            return None, None, None
        ids = RunIds(
            session_id=session_id, turn_id=first.turn_id, run_id=run_id, invocation_id=first.invocation_id
        )
        facts = view.scanner.operation_for_call(ids.invocation_id, tool_call_id)
        return view.decide(ids.invocation_id, tool_call_id), (facts.call if facts else None), ids

    return await host.ledger(lookup, _phase="guard", _heartbeat=True)


async def run_heartbeating(host: MakaActivities, fn: Callable[..., T], *args: Any, interval: float) -> T:
    """Run a blocking tool body on the tool pool, heartbeating from the event loop meanwhile.

    The heartbeat proves the worker process is alive; a SIGKILLed worker stops heartbeating and
    Temporal times the attempt out within ``heartbeat_timeout``, which sends the workflow to recovery.
    """
    loop = asyncio.get_running_loop()
    future = loop.run_in_executor(host.tool_pool, lambda: fn(*args))
    while True:
        done, _ = await asyncio.wait({future}, timeout=interval)
        if done:
            return future.result()
        activity.heartbeat()


def _settled(op: OperationResolution, operation_id: str, replayed: bool) -> ToolOutcome:
    return ToolOutcome(
        operation_id=op.operation_id or operation_id,
        status="refused" if op.settlement_origin == "pre_t1_synthetic" else "completed",
        is_error=bool(op.response_is_error) or None,
        dispatch_event_id=op.dispatch_event_id,
        response_event_id=op.response_event_id,
        replayed=replayed or None,
    )


async def execute_tool(host: MakaActivities, inp: ToolInput) -> ToolOutcome:
    """Run one committed function call at most once."""
    call = inp.call
    op, call_event, ids = await resolve_call(host, inp.session_id, inp.run_id, call.tool_call_id)
    if op is None or ids is None:
        raise ApplicationError(
            f"no committed call {call.tool_call_id}", type="CallNotFound", non_retryable=True
        )
    if op.status == "completed":
        return _settled(op, call.operation_id, replayed=True)
    guard_disabled = _guard_disabled()
    if op.status != "definitely_not_dispatched" and not guard_disabled:
        raise ApplicationError(
            f"operation {call.operation_id} is {op.status} ({op.reason}); refusing to run it again",
            {"operationId": call.operation_id, "status": op.status, "reason": op.reason},
            type=DISPATCH_WITHOUT_OUTCOME,
            non_retryable=True,
        )
    assert (
        call_event is not None
        and call_event.content is not None
        and call_event.content.kind == "function_call"
    )
    if not isinstance(call_event.content.args, dict):
        # The wire allows any JSON value as args; every tool here takes an object.
        refusal = ToolResult.error("invalid_arguments", "tool arguments must be a JSON object")
        return await _commit_refusal(host, ids, call, refusal)
    args: dict[str, Any] = dict(call_event.content.args)
    tool = host.tools.get(call.tool_name)

    refusal = _preflight(host, inp, tool, args)
    if refusal is not None:
        return await _commit_refusal(host, ids, call, refusal)

    assert tool is not None  # preflight refused unknown tools
    ws = host.workspace(inp.workspace)
    try:
        evidence = await run_heartbeating(
            host, tool.capture_evidence, args, ws, interval=host.heartbeat_interval()
        )
    except ToolRefusal as exc:  # the target changed after preflight so the call no longer applies
        return await _commit_refusal(host, ids, call, exc.to_result())
    dispatch = facts.dispatch_event(
        ids, call.operation_id, call.tool_call_id, call.tool_name, args, tool.recovery_mode, facts.now_ms()
    )
    if guard_disabled and op.dispatch_event_id is not None:
        pass  # negative control only: the dispatch fact already exists; run the tool again anyway
    else:
        await host.ledger(
            host.store.commit_tool_prepared,
            dispatch,
            evidence=None if evidence is None else evidence.to_json(),
            attempt=facts.attempt_record("t1"),
            _phase="t1",
            _heartbeat=True,
        )
    failpoints.hit("P2", tag=call.tool_name)

    result, response = await run_and_commit_outcome(host, ids, call, tool, args, ws)
    failpoints.hit("P5", tag=call.tool_name)
    outcome = ToolOutcome(
        operation_id=call.operation_id,
        status="completed",
        is_error=result.is_error or None,
        dispatch_event_id=dispatch.id,
        response_event_id=response.id,
    )
    failpoints.hit("P6", tag=call.tool_name)
    return outcome


async def run_and_commit_outcome(
    host: MakaActivities, ids: RunIds, call: Any, tool: Any, args: dict[str, Any], ws: Any
) -> tuple[Any, RuntimeEvent]:
    """Run the tool (heartbeating), then T2: its outcome commits before anyone sees the result."""
    result = await run_heartbeating(
        host, tool.run, args, ws, lambda: None, interval=host.heartbeat_interval()
    )
    response = facts.response_event(
        ids,
        f"{call.operation_id}_response",
        call.tool_call_id,
        call.tool_name,
        result.result,
        result.is_error,
        facts.now_ms(),
        call.operation_id,
    )
    await host.ledger(
        host.store.commit_tool_outcome,
        response,
        attempt=facts.attempt_record("t2"),
        _phase="t2",
        _heartbeat=True,
    )
    return result, response


async def _commit_refusal(host: MakaActivities, ids: RunIds, call: Any, refusal: Any) -> ToolOutcome:
    """A pre-T1 refusal is an ordinary committed error result: the tool never ran."""
    response = facts.response_event(
        ids,
        f"{call.operation_id}_refused",
        call.tool_call_id,
        call.tool_name,
        refusal.result,
        True,
        facts.now_ms(),
        None,  # pre-T1: unbound; no operation was dispatched
    )
    await host.ledger(host.store.append, [response])
    return ToolOutcome(
        operation_id=call.operation_id, status="refused", is_error=True, response_event_id=response.id
    )


def _preflight(host: MakaActivities, inp: ToolInput, tool: Any, args: dict[str, Any]) -> Any:
    """The pre-T1 refusal to commit, or None when admitted (tool exists, workspace, args, policy)."""
    if tool is None:
        return ToolResult.error("tool_not_found", f"no tool named {inp.call.tool_name!r}")
    try:
        ws = host.workspace(inp.workspace)
    except MakaError as exc:
        return ToolResult.error(exc.code, exc.message)
    if ws.identity != inp.workspace_identity:
        return ToolResult.error(
            "workspace_identity_mismatch",
            f"the workspace at {inp.workspace} is {ws.identity}, not the session's {inp.workspace_identity}",
        )
    refusal = tool.preflight(args, ws)
    if refusal is not None:
        return refusal
    decision = host.policy.evaluate(tool, args)
    if not decision.allowed:
        return decision.to_result()
    return None


def _guard_disabled() -> bool:
    return os.environ.get(GUARD_DISABLED_ENV) == "1"
