"""Read every Temporal execution of a session's workflow id into the audit's pure model.

The executions are the union of what visibility lists for the workflow id and what the histories
link: the continue-as-new chain (``WorkflowExecutionContinuedAsNew.new_execution_run_id`` and the
started event's ``continued_execution_run_id``) and every execution a resume started under the same
id. Each history is read in full, activity inputs and results are decoded with the pydantic data
converter into the contract models (ids only: no transcript ever enters a history). Read-only.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from google.protobuf.timestamp_pb2 import Timestamp
from temporalio.api.enums.v1 import EventType, WorkflowExecutionStatus
from temporalio.api.history.v1 import HistoryEvent
from temporalio.client import Client
from temporalio.service import RPCError, RPCStatusCode

from maka_core.audit.model import ActivityFact, ActivityOutcome, Execution, ExecutionStatus, read_ledger
from maka_core.audit.report import AuditReport, audit
from maka_core.errors import MakaError
from maka_temporal.workers.client.connect import server_gone
from maka_temporal.workflows.contracts import (
    BEGIN_CONTINUATION,
    BEGIN_RUN,
    EXECUTE_TOOL,
    EXECUTE_TOOL_LOCAL,
    FINISH_RUN,
    LOCAL_TOOL_ID_PREFIX,
    MODEL_STEP,
    RECOVER_OPERATION,
    SUBAGENT_BEGIN,
    BeginContinuationInput,
    BeginRunInput,
    BeginRunResult,
    Contract,
    FinishRunInput,
    FinishRunResult,
    LocalToolResult,
    ModelStepResult,
    RecoverInput,
    RecoverResult,
    SessionInput,
    SubAgentBegin,
    SubAgentBegun,
    ToolInput,
    ToolOutcome,
    workflow_id_for,
)

#: Input and result model of each activity type (decoded with the client's data converter).
CONTRACTS: dict[str, tuple[type[Contract] | None, type[Contract]]] = {
    BEGIN_RUN: (BeginRunInput, BeginRunResult),
    BEGIN_CONTINUATION: (BeginContinuationInput, BeginRunResult),
    MODEL_STEP: (None, ModelStepResult),
    EXECUTE_TOOL: (ToolInput, ToolOutcome),
    EXECUTE_TOOL_LOCAL: (None, LocalToolResult),
    RECOVER_OPERATION: (RecoverInput, RecoverResult),
    FINISH_RUN: (FinishRunInput, FinishRunResult),
    SUBAGENT_BEGIN: (SubAgentBegin, SubAgentBegun),
}
LOCAL_ACTIVITY_MARKER = "core_local_activity"
_TASK_LOST = (EventType.EVENT_TYPE_WORKFLOW_TASK_TIMED_OUT, EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED)
_STATUS: dict[int, ExecutionStatus] = {
    WorkflowExecutionStatus.WORKFLOW_EXECUTION_STATUS_RUNNING: "running",
    WorkflowExecutionStatus.WORKFLOW_EXECUTION_STATUS_COMPLETED: "completed",
    WorkflowExecutionStatus.WORKFLOW_EXECUTION_STATUS_FAILED: "failed",
    WorkflowExecutionStatus.WORKFLOW_EXECUTION_STATUS_CANCELED: "cancelled",
    WorkflowExecutionStatus.WORKFLOW_EXECUTION_STATUS_TERMINATED: "terminated",
    WorkflowExecutionStatus.WORKFLOW_EXECUTION_STATUS_CONTINUED_AS_NEW: "continued_as_new",
    WorkflowExecutionStatus.WORKFLOW_EXECUTION_STATUS_TIMED_OUT: "timed_out",
}
_CLOSE: dict[int, ExecutionStatus] = {
    EventType.EVENT_TYPE_WORKFLOW_EXECUTION_COMPLETED: "completed",
    EventType.EVENT_TYPE_WORKFLOW_EXECUTION_FAILED: "failed",
    EventType.EVENT_TYPE_WORKFLOW_EXECUTION_CANCELED: "cancelled",
    EventType.EVENT_TYPE_WORKFLOW_EXECUTION_TERMINATED: "terminated",
    EventType.EVENT_TYPE_WORKFLOW_EXECUTION_CONTINUED_AS_NEW: "continued_as_new",
    EventType.EVENT_TYPE_WORKFLOW_EXECUTION_TIMED_OUT: "timed_out",
}


async def session_executions(client: Client, session_id: str, named: Sequence[str] = ()) -> list[Execution]:
    """Every execution of the session's workflow id, each with its history read (or marked gone).

    ``named``: execution run ids the ledger names (run headers, attempt rows). One the server no
    longer knows is an execution whose history is gone, not one that never was.

    Raises:
        MakaError: ``temporal_unavailable`` when the server does not answer.
    """
    workflow_id = workflow_id_for(session_id)
    listed: dict[str, ExecutionStatus] = {}
    try:
        try:
            async for info in client.list_workflows(f'WorkflowId = "{workflow_id}"'):
                listed[info.run_id] = _STATUS.get(int(info.status or 0), "unknown")
        except RPCError as exc:
            # A server without list queries still answers describe and history: follow the chain.
            if server_gone(exc):
                raise
        try:
            desc = await client.get_workflow_handle(workflow_id).describe()
            listed.setdefault(desc.run_id, _STATUS.get(int(desc.status or 0), "unknown"))
            first = desc.raw_description.workflow_execution_info.first_run_id
            if first:
                listed.setdefault(first, "unknown")
        except RPCError as exc:
            if exc.status != RPCStatusCode.NOT_FOUND:
                raise
    except RPCError as exc:
        raise _unavailable(exc) from None
    except RuntimeError as exc:
        raise MakaError("temporal_unavailable", f"Temporal did not answer: {exc}") from None
    executions: dict[str, Execution] = {}
    todo = list(dict.fromkeys([*listed, *named]))
    while todo:
        run_id = todo.pop(0)
        if run_id in executions:
            continue
        execution = await read_execution(client, workflow_id, run_id, listed.get(run_id, "unknown"))
        executions[run_id] = execution
        for linked in (execution.continued_from, execution.continued_to):
            if linked and linked not in executions and linked not in todo:
                todo.append(linked)
    return list(executions.values())


def _unavailable(exc: RPCError) -> MakaError:
    return MakaError("temporal_unavailable", f"Temporal refused the read: {exc.status.name}: {exc.message}")


async def read_execution(
    client: Client, workflow_id: str, run_id: str, status: ExecutionStatus = "unknown"
) -> Execution:
    """One execution's full history in the audit's model (``history_available=False`` when gone)."""
    try:
        history = await client.get_workflow_handle(workflow_id, run_id=run_id).fetch_history()
    except RPCError as exc:
        if exc.status in (RPCStatusCode.NOT_FOUND, RPCStatusCode.INVALID_ARGUMENT):
            return Execution(
                workflow_id, run_id, status, history_available=False, unavailable_reason=exc.message
            )
        raise _unavailable(exc) from None
    if not history.events:
        return Execution(
            workflow_id, run_id, status, history_available=False, unavailable_reason="empty history"
        )
    return normalize_history(client, workflow_id, run_id, list(history.events), status)


def normalize_history(
    client: Client, workflow_id: str, run_id: str, events: list[HistoryEvent], status: ExecutionStatus
) -> Execution:
    """Fold a history's events into ordered ``ActivityFact``s (one per schedule or local marker)."""
    converter = client.data_converter.payload_converter
    scheduled: dict[int, dict[str, Any]] = {}
    order: list[int] = []
    start_ms = close_ms = None
    continued_from = continued_to = None
    current_run: str | None = None
    lost_tasks, task_open = 0, False
    for event in events:
        kind = event.event_type
        if kind == EventType.EVENT_TYPE_WORKFLOW_TASK_STARTED:
            task_open = True
        elif kind == EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED:
            task_open = False
        elif kind in _TASK_LOST:
            lost_tasks, task_open = lost_tasks + (1 if task_open else 0), False
        if kind == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_STARTED:
            attrs = event.workflow_execution_started_event_attributes
            start_ms = _ms(event.event_time)
            continued_from = attrs.continued_execution_run_id or None
            inp = _decode(converter, attrs.input.payloads, SessionInput)
            in_flight = inp.get("in_flight") if inp else None
            if isinstance(in_flight, Mapping):
                current_run = in_flight.get("ids", {}).get("run_id")
        elif kind == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            attrs_s = event.activity_task_scheduled_event_attributes
            name = attrs_s.activity_type.name
            in_model = CONTRACTS.get(name, (None, None))[0]
            inputs = _decode(converter, attrs_s.input.payloads, in_model) if in_model else {}
            inputs = _tool_input(inputs)
            current_run = _run_of(inputs) or current_run
            scheduled[event.event_id] = {
                "activity_type": name,
                "activity_id": attrs_s.activity_id,
                "seq": event.event_id,
                "outcome": "pending",
                "scheduled_at": _ms(event.event_time),
                "inputs": inputs,
                "run_id": _run_of(inputs),
                **_call_of(inputs),
            }
            order.append(event.event_id)
        elif kind == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED:
            a = event.activity_task_started_event_attributes
            if a.scheduled_event_id in scheduled:
                scheduled[a.scheduled_event_id].update(attempt=a.attempt or 1, identity=a.identity or None)
        elif kind == EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED:
            c = event.activity_task_completed_event_attributes
            entry = scheduled.get(c.scheduled_event_id)
            if entry is not None:
                result_model = CONTRACTS.get(entry["activity_type"], (None, None))[1]
                result = _decode(converter, c.result.payloads, result_model) if result_model else {}
                entry.update(outcome="completed", closed_at=_ms(event.event_time), result=result)
                entry.setdefault("identity", c.identity or None)
        elif kind in (
            EventType.EVENT_TYPE_ACTIVITY_TASK_FAILED,
            EventType.EVENT_TYPE_ACTIVITY_TASK_TIMED_OUT,
        ):
            failed = kind == EventType.EVENT_TYPE_ACTIVITY_TASK_FAILED
            attrs_f: Any = (
                event.activity_task_failed_event_attributes
                if failed
                else event.activity_task_timed_out_event_attributes
            )
            entry = scheduled.get(attrs_f.scheduled_event_id)
            if entry is not None:
                outcome: ActivityOutcome = "failed" if failed else "timed_out"
                entry.update(
                    outcome=outcome, closed_at=_ms(event.event_time), failure=attrs_f.failure.message
                )
        elif kind == EventType.EVENT_TYPE_ACTIVITY_TASK_CANCELED:
            entry = scheduled.get(event.activity_task_canceled_event_attributes.scheduled_event_id)
            if entry is not None:
                entry.update(outcome="cancelled", closed_at=_ms(event.event_time))
        elif kind == EventType.EVENT_TYPE_MARKER_RECORDED:
            marker = _local_activity(converter, event, current_run)
            if marker is not None:
                scheduled[event.event_id] = marker
                order.append(event.event_id)
        elif kind in _CLOSE:
            close_ms = _ms(event.event_time)
            status = _CLOSE[kind]
            if kind == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_CONTINUED_AS_NEW:
                continued_to = event.workflow_execution_continued_as_new_event_attributes.new_execution_run_id
    if close_ms is None:
        status = "running"
    elif task_open:
        lost_tasks += 1  # closed (terminated, reset) while a workflow task ran
    facts = tuple(ActivityFact(**scheduled[i]) for i in order)
    return Execution(
        workflow_id,
        run_id,
        status,
        start_ms=start_ms,
        close_ms=close_ms,
        continued_from=continued_from,
        continued_to=continued_to or None,
        activities=facts,
        lost_workflow_tasks=lost_tasks,
    )


def _local_activity(converter: Any, event: HistoryEvent, current_run: str | None) -> dict[str, Any] | None:
    attrs = event.marker_recorded_event_attributes
    if attrs.marker_name != LOCAL_ACTIVITY_MARKER or "data" not in attrs.details:
        return None
    try:
        data = json.loads(attrs.details["data"].payloads[0].data)
    except (ValueError, IndexError):
        return None
    name = str(data.get("activity_type", ""))
    result_model = CONTRACTS.get(name, (None, None))[1]
    result: dict[str, Any] = {}
    if "result" in attrs.details and result_model is not None:
        result = _decode(converter, attrs.details["result"].payloads, result_model)
    failed = attrs.HasField("failure")
    activity_id = str(data.get("activity_id", event.event_id))
    outcome: ActivityOutcome = "failed" if failed else "completed"
    call: dict[str, Any] = {}
    if name == EXECUTE_TOOL_LOCAL:
        # The marker holds no input: its id names the operation (the index finds the call).
        if activity_id.startswith(LOCAL_TOOL_ID_PREFIX):
            call = {"operation_id": activity_id[len(LOCAL_TOOL_ID_PREFIX) :]}
        if result.get("deferred"):
            outcome = "deferred"
        deferred = {"deferred": result["deferred"]} if "deferred" in result else {}
        result = {**result.get("outcome", {}), **deferred}
    return {
        "activity_type": name,
        "activity_id": activity_id,
        "seq": event.event_id,
        "outcome": outcome,
        "attempt": int(data.get("attempt", 1) or 1),
        "local": True,
        "closed_at": _ms(event.event_time),
        "run_id": current_run,
        "result": result,
        "failure": attrs.failure.message if failed else None,
        **call,
    }


def _decode(converter: Any, payloads: Any, model: type[Contract] | None) -> dict[str, Any]:
    if not payloads or model is None:
        return {}
    try:
        value = converter.from_payloads(list(payloads), [model])[0]
    except Exception:  # an undecodable payload is a fact the audit reports by its absence of ids
        return {}
    dumped: dict[str, Any] = value.model_dump(exclude_none=True)
    return dumped


def _run_of(inputs: Mapping[str, Any]) -> str | None:
    ids = inputs.get("ids")
    if isinstance(ids, Mapping):
        return ids.get("run_id")
    run = inputs.get("run_id")
    return run if isinstance(run, str) else None


def _tool_input(inputs: dict[str, Any]) -> dict[str, Any]:
    """A sub-agent's ``maka.subagent_begin`` carries its call's ``ToolInput`` as ``call``."""
    inner = inputs.get("call")
    return inner if isinstance(inner, dict) and isinstance(inner.get("call"), Mapping) else inputs


def _call_of(inputs: Mapping[str, Any]) -> dict[str, Any]:
    call = inputs.get("call")
    if not isinstance(call, Mapping):
        return {}
    return {"operation_id": call.get("operation_id"), "tool_call_id": call.get("tool_call_id")}


def _ms(ts: Timestamp) -> int:
    return ts.seconds * 1000 + ts.nanos // 1_000_000


async def audit_session(
    client: Client, store: Any, session_id: str, *, verify_problems: list[str] | None = None
) -> AuditReport:
    """Audit one session: its ledger facts against every execution of its workflow id.

    Raises:
        MakaError: ``session_not_found`` (the ledger has no event and no run for it),
            ``temporal_unavailable``.
    """
    ledger = read_ledger(store, session_id, verify_problems=verify_problems)
    if not ledger.events and not ledger.headers:
        raise MakaError("session_not_found", f"no events for session {session_id}", sessionId=session_id)
    named = [h.workflow_run_id for h in ledger.headers if h.workflow_run_id]
    named += [str(a["workflow_run_id"]) for a in ledger.attempts if a.get("workflow_run_id")]
    return audit(ledger, await session_executions(client, session_id, named))
