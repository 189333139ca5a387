"""``run_session``: a maka session as a child workflow of your own workflow, for one message.

Workflow code (deterministic, sandbox-safe): the session id comes from ``workflow.uuid4``; the
disk and ledger work (the checks of ``maka session start``, the session policy, the workspace
marker) runs in the ``maka.prepare_session`` activity, and the reply is read from the ledger by
``maka.session_reply``, both registered by ``MakaPlugin`` on your worker. The child is the session
workflow itself (``maka.session``, workflow id ``maka-session-<id>``), on your worker's queue, with
every guarantee of a session started from the CLI: ``maka session status|show|send`` and
``maka audit`` read it like any other. It closes when its turn settles; a later ``send`` reopens
the session from the ledger, and a parked one waits for ``maka session resolve`` and
``maka resume`` as after any closed execution.

Its parent close policy is ``ABANDON``: a parent that is terminated or times out never cuts a
turn short (a cut turn would be a lost execution for repair to settle); the turn finishes and the
session closes on its own.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta
from typing import Literal

from pydantic import BaseModel, ConfigDict
from temporalio import workflow
from temporalio.common import RetryPolicy, WorkflowIDReusePolicy
from temporalio.exceptions import ActivityError, ApplicationError, WorkflowAlreadyStartedError

with workflow.unsafe.imports_passed_through():
    from maka_temporal.workflows.contracts import (
        PREPARE_SESSION,
        SESSION_REPLY,
        SESSION_WORKFLOW,
        PrepareSession,
        SessionInput,
        SessionReply,
        SessionReplyInput,
        SessionStatus,
        TurnStatus,
        workflow_id_for,
    )
    from maka_temporal.workflows.session_policy import initial_search_attributes

__all__ = ["ChildOutcome", "SessionResult", "run_session"]

#: How a child's turn ended: its run's ``TurnStatus``, or ``parked`` (an operator must act).
ChildOutcome = TurnStatus | Literal["parked"]

#: A parked child's result says ``parked`` and carries no text (the model's interim line is not
#: its answer); histories recorded before it keep their ``failed`` and interim text on replay.
CHILD_PARKED_PATCH = "maka-child-parked-1"

#: Preparing is file and ledger work of milliseconds; a refusal (a bad input) is not retried.
PREPARE_TIMEOUT = timedelta(seconds=30)
PREPARE_RETRY = RetryPolicy(initial_interval=timedelta(milliseconds=200), maximum_attempts=5)


class SessionResult(BaseModel):
    """How the child's turn settled: ``state`` ``idle`` (done), ``parked`` (``park_reason``: an
    operator must act) or ``failed``; ``outcome`` how its run ended (``completed``, ``cancelled``
    by ``cancel_turn``, ``failed``, ``parked``; ``None`` in a history recorded before it);
    ``text`` is the model's final text of the turn, ``None`` for a parked one (its interim line
    is no answer; ``failed`` and that line in a history recorded before)."""

    model_config = ConfigDict(frozen=True)

    session_id: str
    state: str
    park_reason: str | None = None
    run_id: str | None = None
    text: str | None = None
    outcome: ChildOutcome | None = None


async def run_session(
    message: str,
    *,
    workspace: str,
    script: str | None = None,
    model: str | None = None,
    policy: str | None = None,
    session_id: str | None = None,
    host: str | None = None,
    offer: Sequence[str] | None = None,
) -> SessionResult:
    """Run a maka session for ``message`` as a child workflow; returns when its turn settles.

    ``workspace``, ``script``, ``policy``: paths on the worker's machine (``MakaPlugin``'s);
    ``model``: ``openai:NAME`` or ``anthropic:NAME``; ``host``: the workspace's host (default the
    worker's); ``offer``: the tool set the model is offered (``tools.offer``; default every
    tool). Refused inputs raise ``ApplicationError`` whose ``type`` is the CLI's code
    (``workspace_not_found``, ``config_invalid``, ``session_id_invalid``...), before any session
    exists; a ``session_id`` already taken is ``session_exists``.
    """
    sid = session_id or f"sess-{workflow.uuid4()}"
    queue = workflow.info().task_queue
    try:
        inp = await workflow.execute_activity(
            PREPARE_SESSION,
            PrepareSession(
                session_id=sid,
                message=message,
                workspace=workspace,
                task_queue=queue,
                script=script,
                model=model,
                policy=policy,
                host=host,
                offer=tuple(offer) if offer is not None else None,
            ),
            result_type=SessionInput,
            start_to_close_timeout=PREPARE_TIMEOUT,
            retry_policy=PREPARE_RETRY,
        )
    except ActivityError as err:
        cause = err.cause
        if isinstance(cause, ApplicationError) and cause.details and isinstance(cause.details[0], dict):
            code = str(cause.details[0].get("code") or cause.type)
            raise ApplicationError(cause.message, cause.details[0], type=code, non_retryable=True) from None
        raise
    child = inp.model_copy(update={"first_message": message, "close_after_turn": True})
    try:
        handle = await workflow.start_child_workflow(
            SESSION_WORKFLOW,
            child,
            id=workflow_id_for(sid),
            task_queue=queue,
            result_type=SessionStatus,
            search_attributes=initial_search_attributes(sid),
            # A session id names one session: a taken one is refused, as ``maka session start`` does.
            id_reuse_policy=WorkflowIDReusePolicy.REJECT_DUPLICATE,
            parent_close_policy=workflow.ParentClosePolicy.ABANDON,
        )
    except WorkflowAlreadyStartedError:
        raise ApplicationError(
            f"session {sid} already exists", type="session_exists", non_retryable=True
        ) from None
    status = await handle
    run_id = status.last_turn.run_id if status.last_turn is not None else None
    text: str | None = None
    outcome: ChildOutcome | None = None
    if run_id is not None:
        reply = await workflow.execute_activity(
            SESSION_REPLY,
            SessionReplyInput(session_id=sid, run_id=run_id),
            result_type=SessionReply,
            start_to_close_timeout=PREPARE_TIMEOUT,
            retry_policy=PREPARE_RETRY,
        )
        text, outcome = reply.text, reply.outcome
        if status.state == "parked" and workflow.patched(CHILD_PARKED_PATCH):
            text, outcome = None, "parked"
    return SessionResult(
        session_id=sid,
        state=status.state,
        park_reason=status.park_reason,
        run_id=run_id,
        text=text,
        outcome=outcome,
    )
