"""The Temporal side of a session: start it, send a message, query it, wait for a turn.

Waiting for a turn to settle uses a long-poll Update (``wait_settled``) in bounded rounds.

The workflow answers the Update when the turn has settled (or when it continues as new); the CLI
waits on it in rounds of ``ROUND_S`` seconds, re-attaching to the same Update by its id, so the
server does the waiting (no Query every few milliseconds), the history gains one Update per
execution rather than events per round, and the CLI still prints progress between rounds. An
answer that comes from a continue-as-new is followed by a new Update on the next execution. A
worker that predates the Update answers with a failed Update; the wait then polls the status Query.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any, Final

from temporalio.client import (
    WorkflowExecutionStatus,
    WorkflowQueryFailedError,
    WorkflowUpdateFailedError,
    WorkflowUpdateRPCTimeoutOrCancelledError,
)
from temporalio.common import WorkflowIDConflictPolicy, WorkflowIDReusePolicy
from temporalio.exceptions import ApplicationError, WorkflowAlreadyStartedError
from temporalio.service import RPCError, RPCStatusCode

from maka_core.errors import MakaError
from maka_core.providers.spec import ProviderSpec
from maka_core.runtime.contracts import (
    DEFAULT_MAX_PARALLEL_TOOLS,
    DEFAULT_MAX_STEPS_PER_TURN,
    DEFAULT_STEP_TIMEOUT_S,
    NEW_SESSION_TOOL_MODE,
    SessionConfig,
)
from maka_core.settings import load_settings
from maka_core.workspace import Workspace
from maka_temporal.workers.client.session_start import new_session_config
from maka_temporal.workflows.contracts import (
    RESUME_HOST,
    SEND_MESSAGE,
    STATUS_QUERY,
    WAIT_SETTLED,
    SendMessage,
    SessionInput,
    SessionStatus,
    TurnAccepted,
    WaitSettled,
    workflow_id_for,
)
from maka_temporal.workflows.session import SessionWorkflow
from maka_temporal.workflows.session_policy import initial_search_attributes

log = logging.getLogger("maka.wait")

#: One round of the long poll, in seconds: the CLI re-attaches to the same Update after each.
ROUND_S = 10.0
#: How long the progress line waits for the state between rounds.
PEEK_S = 2.0

#: What a wait reports as it goes: the turn's state, and the seconds since the wait began.
StateListener = Callable[[str, float], None]


def settled(status: Any, run_id: str) -> bool:
    """The same test the workflow's handler makes, on a status snapshot."""
    if status.state == "parked" and status.park_reason == "workspace_host_unavailable":
        return True  # the turn waits for its host: settled until an operator resumes it
    busy = status.current_turn is not None and status.current_turn.run_id == run_id
    return not busy and status.state != "running"


async def wait_settled(
    client: Any,
    session_id: str,
    run_id: str,
    *,
    timeout: float = 600.0,
    on_state: StateListener | None = None,
) -> Any:
    """Wait until the turn ``run_id`` has settled (idle, parked or failed); returns SessionStatus.

    One ``wait_settled`` Update per workflow execution, re-attached by its id after each bounded
    round: a round adds nothing to the workflow's history, only the Update itself does.
    ``on_state`` hears the state after each round that did not settle (``waiting for a worker``
    while no worker answers); a listener that raises is logged and the wait goes on.

    Raises:
        MakaError: ``wait_timeout`` (the session keeps running), ``session_not_found``,
            ``temporal_unavailable``.
    """
    began = time.monotonic()
    deadline = began + timeout

    def show(now: str) -> None:
        if on_state is None:
            return
        try:
            on_state(now, time.monotonic() - began)
        except Exception:  # a caller's broken listener must not end the wait
            log.exception("wait %s: on_state raised; the wait goes on", run_id)

    use_query = False
    not_found = 0
    state = "waiting for a worker"
    update_id = f"wait-{run_id}-{uuid.uuid4().hex[:8]}"
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise MakaError(
                "wait_timeout",
                f"turn {run_id} did not settle in {timeout:.0f}s ({state}); the session continues",
                sessionId=session_id,
                runId=run_id,
                state=state,
            )
        handle = client.get_workflow_handle(workflow_id_for(session_id))
        round_s = min(ROUND_S, remaining)
        try:
            if use_query:
                status = await asyncio.wait_for(query_status(client, session_id), round_s)
            else:
                # The same id re-attaches to the Update a previous round left waiting.
                status = await asyncio.wait_for(
                    handle.execute_update(
                        WAIT_SETTLED, WaitSettled(run_id=run_id), id=update_id, result_type=SessionStatus
                    ),
                    round_s,
                )
        except (TimeoutError, WorkflowUpdateRPCTimeoutOrCancelledError):
            state = await _peek_state(client, session_id)
            show(state)
            continue
        except WorkflowUpdateFailedError:
            use_query = True  # a worker without the Update: poll its status Query instead
            continue
        except RPCError as exc:
            # NOT_FOUND between two executions of a continue-as-new is brief; for longer, it is gone.
            if exc.status == RPCStatusCode.NOT_FOUND and not_found < 3:
                not_found += 1
                await asyncio.sleep(0.2)
                continue
            if exc.status == RPCStatusCode.NOT_FOUND:
                raise MakaError("session_not_found", str(exc), sessionId=session_id) from None
            raise MakaError("temporal_unavailable", str(exc), sessionId=session_id) from None
        not_found = 0
        state = status.state
        if settled(status, run_id):
            return status
        show(state)
        if use_query:
            await asyncio.sleep(0.2)
        else:  # answered unsettled: the execution continued as new; wait on the next one
            update_id = f"wait-{run_id}-{uuid.uuid4().hex[:8]}"


async def _peek_state(client: Any, session_id: str) -> str:
    """The state for the progress line between rounds (a Query adds nothing to history)."""
    try:
        return str((await asyncio.wait_for(query_status(client, session_id), PEEK_S)).state)
    except Exception:
        return "waiting for a worker"


# --- start, send, query --------------------------------------------------------------------------


async def start_session(
    client: Any,
    *,
    workspace: Path,
    provider: ProviderSpec | dict[str, Any],
    task_queue: str,
    message: str,
    session_id: str | None = None,
    continue_as_new_after: int | None = None,
    continue_as_new_after_steps: int | None = None,
    model_step_mode: str = "with_tool",
    max_steps_per_turn: int = DEFAULT_MAX_STEPS_PER_TURN,
    step_timeout_s: float = DEFAULT_STEP_TIMEOUT_S,
    task_timeout: Any = None,
    accept_timeout: float | None = None,
    refusals: bool = False,
    host: str | None = None,
    host_wait_s: float | None = None,
    config: SessionConfig | None = None,
    tool_mode: str = NEW_SESSION_TOOL_MODE,
    max_parallel_tools: int = DEFAULT_MAX_PARALLEL_TOOLS,
    stream: bool | None = None,
) -> tuple[str, Any]:
    """Start a session workflow and send its first message; returns (session id, TurnAccepted).

    The settings (provider, step mode and timeout, step limit, continue-as-new thresholds, host and
    host wait) become the session's ``SessionConfig``: every later execution of the session runs
    with them. ``tool_mode``: ``NEW_SESSION_TOOL_MODE`` (``hybrid``), as ``maka session start`` and
    ``SessionClient.start``: every path to a new session starts it in the same mode.
    ``host`` pins the session to a workspace host (its tools and recoveries run only on
    that host's queue); ``host_wait_s`` bounds how long the host has to start one (default
    ``MAKA_HOST_WAIT``, read now and recorded with the session). No ``host``: an unpinned session
    whose tools run on ``task_queue`` (library callers, as before host affinity).

    With ``refusals`` (the CLI) Temporal's errors become ``MakaError`` codes; without, library
    callers get Temporal's own exceptions, as before.

    Raises:
        ConfigError: ``provider_spec_invalid``, ``config_invalid`` (a setting out of its bounds),
            before anything is written or started.
        MakaError: ``wait_timeout`` (no worker accepted the message within ``accept_timeout``; the
            session keeps it), workspace codes; with ``refusals`` also ``session_exists`` and the
            codes of ``send_message``.
    """
    # ``config``: one checked already (``workers.client.session_start``: with the policy digest), taken whole.
    config = config or new_session_config(
        provider,
        model_step_mode=model_step_mode,
        step_timeout_s=step_timeout_s,
        max_steps_per_turn=max_steps_per_turn,
        continue_as_new_after_turns=continue_as_new_after,
        continue_as_new_after_steps=continue_as_new_after_steps,
        host=host,
        host_wait_s=(host_wait_s or load_settings().host_wait) if host else None,
        tool_mode=tool_mode,
        max_parallel_tools=max_parallel_tools,
        stream=stream,
    )
    ws = Workspace.open(workspace, create=True)
    if task_timeout is None:
        env_timeout = load_settings().workflow_task_timeout
        if env_timeout is not None:
            # Drills: a killed worker's in-flight workflow task (a local model step) is retried after this.
            task_timeout = timedelta(seconds=env_timeout)
    session_id = session_id or f"sess-{uuid.uuid4()}"
    inp = SessionInput(
        session_id=session_id,
        workspace=str(ws.root),
        workspace_identity=ws.identity,
        task_queue=task_queue,
        config=config,
    )
    try:
        await client.start_workflow(
            SessionWorkflow.run,
            inp,
            id=workflow_id_for(session_id),
            task_queue=task_queue,
            search_attributes=initial_search_attributes(session_id),
            task_timeout=task_timeout,
            # A new session never reuses an id: a session whose execution is gone is resumed
            # (through the planner) or messaged (``send`` checks the ledger), never started again.
            id_reuse_policy=WorkflowIDReusePolicy.REJECT_DUPLICATE,
            id_conflict_policy=WorkflowIDConflictPolicy.FAIL,
        )
    except WorkflowAlreadyStartedError:
        if not refusals:
            raise
        raise MakaError(
            "session_exists", f"session {session_id} already exists", sessionId=session_id
        ) from None
    except RPCError as exc:
        if not refusals:
            raise
        raise start_refusal(exc, client.namespace, session_id) from None
    accepted = await send_message(
        client, session_id, message, accept_timeout=accept_timeout, task_queue=task_queue, refusals=refusals
    )
    return session_id, accepted


async def send_message(
    client: Any,
    session_id: str,
    message: str,
    *,
    accept_timeout: float | None = None,
    task_queue: str | None = None,
    refusals: bool = False,
) -> Any:
    """Send one message (the ``send_message`` Update); returns ``TurnAccepted``.

    Raises:
        MakaError: ``wait_timeout``; with ``refusals``, also the validator's refusal
            (``session_parked``, ``turn_in_flight``...), ``session_not_found``, ``temporal_unavailable``.
    """
    handle = client.get_workflow_handle(workflow_id_for(session_id))
    update = handle.execute_update(SEND_MESSAGE, SendMessage(text=message), result_type=TurnAccepted)
    try:
        if accept_timeout is None:
            return await update
        return await asyncio.wait_for(update, accept_timeout)
    except (TimeoutError, WorkflowUpdateRPCTimeoutOrCancelledError):
        # Cancelled by our timeout, or the server's own RPC deadline: nobody accepted it in time.
        where = f" on task queue {task_queue!r}" if task_queue else ""
        raise MakaError(
            "wait_timeout",
            f"no worker accepted the message within {accept_timeout or 0:.0f}s "
            f"(is `maka worker` running{where}?); the session keeps the message for when one polls",
            sessionId=session_id,
        ) from None
    except Exception as exc:
        if not refusals:
            raise
        code, text = update_error(exc)
        # A failed update leaves a core RPC callback in flight for a moment; leaving the process
        # under it can crash it at finalization (seen as SIGSEGV/SIGABRT).
        await asyncio.sleep(0.2)
        raise MakaError(code, text, sessionId=session_id) from None


async def resume_host(client: Any, session_id: str) -> Any:
    """Tell a session parked with ``workspace_host_unavailable`` that its host is back (the
    ``resume_host`` Update); returns its status. Raises the Update's failure (``NotParkedOnHost``)."""
    handle = client.get_workflow_handle(workflow_id_for(session_id))
    return await handle.execute_update(RESUME_HOST, result_type=SessionStatus)


#: The SDK's code for a workflow task that held its thread past the deadlock bound (2 s): a worker
#: starved of CPU, not a session fault. The worker evicts the run and replays it at the next task.
DEADLOCK_CODE: Final = "TMPRL1101"
#: Pauses before asking again after such a refusal (three asks in all, ~3 s).
QUERY_RETRY_PAUSES_S: Final = (1.0, 2.0)


async def query_status(
    client: Any, session_id: str, *, pauses: tuple[float, ...] = QUERY_RETRY_PAUSES_S
) -> Any:
    """The live session's status Query. A refusal of the worker's deadlock detector (its run was
    starved past 2 s; the SDK evicts it and the next ask replays it) is asked again after each of
    ``pauses``; every other failure, and the last deadlock refusal, is raised as it came."""
    handle = client.get_workflow_handle(workflow_id_for(session_id))
    for pause in pauses:
        try:
            return await handle.query(STATUS_QUERY, result_type=SessionStatus)
        except WorkflowQueryFailedError as exc:
            if DEADLOCK_CODE not in str(exc):
                raise
            log.warning(
                "status query of %s met a starved worker (%s); asking again", session_id, DEADLOCK_CODE
            )
            await asyncio.sleep(pause)
    return await handle.query(STATUS_QUERY, result_type=SessionStatus)


def update_error(exc: BaseException) -> tuple[str, str]:
    """A stable snake_case code for an Update or RPC failure."""
    # The validator's refusal types (SessionParked -> session_parked, TurnInFlight ->
    # turn_in_flight, ...) and the server's answers.
    if isinstance(exc, WorkflowUpdateFailedError) and isinstance(exc.cause, ApplicationError):
        return _snake(exc.cause.type or "update_rejected"), exc.cause.message
    if isinstance(exc, RPCError) and exc.status == RPCStatusCode.NOT_FOUND:
        return "session_not_found", str(exc)
    if isinstance(exc, RPCError):
        return "temporal_unavailable", str(exc)
    return _snake(type(exc).__name__), str(exc)


#: The codes of ``start_refusal`` that mean the server created nothing: the namespace is unknown or
#: lacks maka's search attributes. (``temporal_unavailable`` may hide a start that happened.)
START_NEVER_HAPPENED = frozenset({"namespace_not_found", "search_attributes_missing"})


def start_refusal(exc: Any, namespace: str, session_id: str) -> MakaError:
    """A stable code for a workflow start the server refused (an ``RPCError``).

    The namespace must exist and carry maka's search attributes (``deploy/README.md``); anything
    else the server answers is ``temporal_unavailable``.
    """
    text = str(exc)
    if exc.status == RPCStatusCode.NOT_FOUND:
        return MakaError(
            "namespace_not_found",
            f"no namespace {namespace!r}: {text}",
            namespace=namespace,
            sessionId=session_id,
        )
    if exc.status == RPCStatusCode.INVALID_ARGUMENT and "search attribute" in text:
        return MakaError(
            "search_attributes_missing",
            f"{text} (create maka's search attributes in namespace {namespace!r}: deploy/README.md)",
            namespace=namespace,
            sessionId=session_id,
        )
    return MakaError("temporal_unavailable", text, namespace=namespace, sessionId=session_id)


def _snake(name: str) -> str:
    return "".join("_" + c.lower() if c.isupper() and i else c.lower() for i, c in enumerate(name))


# --- executions: describe, start over a ledger ---------------------------------------------------

#: A workflow task that failed this many times in a row is reported as failing (a bad deploy).
TASK_FAILING_ATTEMPTS = 2


@dataclass(frozen=True)
class Execution:
    """The latest Temporal execution of a session's workflow id, as the server describes it."""

    exists: bool
    open: bool
    status: str | None = None
    run_id: str | None = None
    task_attempt: int = 0
    #: The task queue the execution's workflow tasks go to (its workers poll it).
    task_queue: str | None = None

    @property
    def task_failing(self) -> bool:
        """The execution is open but its workflow task keeps failing (terminate, then resume)."""
        return self.open and self.task_attempt >= TASK_FAILING_ATTEMPTS

    def to_json(self) -> dict[str, Any]:
        return {
            "executionStatus": self.status if self.exists else "not_found",
            "workflowTaskFailing": self.task_failing,
            "workflowTaskAttempt": self.task_attempt,
        }


async def describe_execution(client: Any, session_id: str) -> Execution:
    """Describe the session's latest execution.

    Raises:
        MakaError: ``temporal_unavailable``.
    """
    try:
        desc = await client.get_workflow_handle(workflow_id_for(session_id)).describe()
    except RPCError as exc:
        if exc.status == RPCStatusCode.NOT_FOUND:
            return Execution(exists=False, open=False)
        raise MakaError("temporal_unavailable", str(exc), sessionId=session_id) from None
    status = desc.status
    pending = desc.raw_description.pending_workflow_task
    attempt = pending.attempt if desc.raw_description.HasField("pending_workflow_task") else 0
    return Execution(
        exists=True,
        open=status == WorkflowExecutionStatus.RUNNING,
        status=status.name.lower() if status is not None else None,
        run_id=desc.run_id,
        task_attempt=attempt,
        task_queue=desc.task_queue or None,
    )


async def start_execution(
    client: Any,
    session_id: str,
    *,
    workspace: str,
    workspace_identity: str,
    config: SessionConfig,
    task_queue: str,
    continuation: Any = None,
) -> str:
    """Start a NEW execution of a session whose previous one is closed or gone (same workflow id).

    Only two callers: ``maka resume`` after the planner approved and claimed a continuation
    (``continuation`` = its run ids), and ``maka session send`` after the ledger shows the last
    run ended cleanly. The reuse policy allows a closed id, the conflict policy refuses an open
    one: a running execution is never replaced. ``config`` is the session's recorded one, whole
    (a new execution never moves a session to another host, nor changes its model or limits).
    Returns the new execution's run id.

    Raises:
        MakaError: ``session_busy`` (an execution is open), ``temporal_unavailable``.
    """
    inp = SessionInput(
        session_id=session_id,
        workspace=workspace,
        workspace_identity=workspace_identity,
        task_queue=task_queue,
        config=config,
        continuation=continuation,
    )
    env_timeout = load_settings().workflow_task_timeout
    try:
        handle = await client.start_workflow(
            SessionWorkflow.run,
            inp,
            id=workflow_id_for(session_id),
            task_queue=task_queue,
            search_attributes=initial_search_attributes(session_id),
            task_timeout=timedelta(seconds=env_timeout) if env_timeout is not None else None,
            id_reuse_policy=WorkflowIDReusePolicy.ALLOW_DUPLICATE,
            id_conflict_policy=WorkflowIDConflictPolicy.FAIL,
        )
    except WorkflowAlreadyStartedError:
        raise MakaError(
            "session_busy", f"session {session_id} has an open execution", sessionId=session_id
        ) from None
    except RPCError as exc:
        raise MakaError("temporal_unavailable", str(exc), sessionId=session_id) from None
    return str(handle.result_run_id or handle.first_execution_run_id or "")
