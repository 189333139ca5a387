"""Every value that crosses the Temporal boundary: workflow input, update, query and activity models.

These models and the activity names are persisted compatibility data: they are written into
workflow histories, and a replaying worker must decode what an older worker wrote. Add optional
fields with defaults; never rename or remove a field or an activity name (``tests/test_activity_names.py``
pins them). Nothing here carries a transcript or a tool result: activities pass ledger identifiers
(run, operation and event ids), and the ledger holds the facts.
"""

from __future__ import annotations

from typing import Annotated, Any, Final

from pydantic import ConfigDict, ModelWrapValidatorHandler, ValidationError, model_validator
from pydantic.alias_generators import to_camel

from maka_core.facts.bounds import (
    APPROVAL_PHRASE,
    IDENTIFIER,
    INPUT_INVALID,
    OPERATOR_NAME,
    OPERATOR_REASON,
    USER_MESSAGE,
    WAIT_SECONDS,
)

# The activity contracts live with the runtime that implements them; re-exported here so the
# workflow imports every model it puts into history from one module.
from maka_core.runtime.contracts import (
    ACTIVITY_NAMES,
    ANSWER_APPROVAL,
    BEGIN_CONTINUATION,
    BEGIN_RUN,
    CLOSE_APPROVAL,
    DEFAULT_MAX_STEPS_PER_TURN,
    DEFAULT_STEP_TIMEOUT_S,
    EXECUTE_TOOL,
    EXECUTE_TOOL_LOCAL,
    FINISH_RUN,
    HOST_PARK,
    LOCAL_TOOL_ID_PREFIX,
    MODEL_STEP,
    RECOVER_OPERATION,
    SESSION_CONTINUE,
    SUBAGENT_BEGIN,
    SUBAGENT_SETTLE,
    AnswerInput,
    AnswerResult,
    ApprovalWait,
    BeginContinuationInput,
    BeginRunInput,
    BeginRunResult,
    CallRef,
    CloseApprovalInput,
    Contract,
    FinishRunInput,
    FinishRunResult,
    HoldsConfig,
    HostParkInput,
    LocalToolInput,
    LocalToolResult,
    ModelStepInput,
    ModelStepMode,
    ModelStepResult,
    NextStep,
    ParkReason,
    RecoverInput,
    RecoverResult,
    RunIds,
    SessionConfig,
    SessionState,
    ToolInput,
    ToolMode,
    ToolOutcome,
    ToolSettings,
    TurnStatus,
)
from maka_core.runtime.wake import WakeAnswer, WakeInput

__all__ = [
    "ACTIVITY_NAMES",
    "SESSION_CONTINUE",
    "WAKE",
    "Wake",
    "WakeAnswer",
    "WakeInput",
    "ANSWER_APPROVAL",
    "APPROVE",
    "AnswerInput",
    "AnswerResult",
    "Approve",
    "ApprovalWait",
    "CANCEL_FROM_PARENT",
    "CHILD_NOT_STARTED",
    "CANCEL_TURN",
    "CLOSE_APPROVAL",
    "CancelTurn",
    "CloseApprovalInput",
    "DENY",
    "Deny",
    "TurnCancelled",
    "BEGIN_CONTINUATION",
    "BEGIN_RUN",
    "BeginContinuationInput",
    "CHILD_ACTIVITY_NAMES",
    "PREPARE_SESSION",
    "PrepareSession",
    "SESSION_REPLY",
    "SUBAGENT_ACTIVITY_NAMES",
    "SUBAGENT_BEGIN",
    "SUBAGENT_SETTLE",
    "SubAgentBegin",
    "SubAgentBegun",
    "SubAgentSettle",
    "SessionReply",
    "SessionReplyInput",
    "BeginRunInput",
    "BeginRunResult",
    "CallRef",
    "DEFAULT_MAX_STEPS_PER_TURN",
    "DEFAULT_STEP_TIMEOUT_S",
    "Contract",
    "DISPATCH_WITHOUT_OUTCOME",
    "EXECUTE_TOOL",
    "EXECUTE_TOOL_LOCAL",
    "LOCAL_TOOL_ID_PREFIX",
    "LocalToolInput",
    "LocalToolResult",
    "ToolMode",
    "FINISH_RUN",
    "FinishRunInput",
    "FinishRunResult",
    "HOST_PARK",
    "HoldsConfig",
    "HostParkInput",
    "InFlightTurn",
    "LEDGER_CHAIN_BROKEN",
    "MODEL_STEP",
    "ModelStepInput",
    "ModelStepMode",
    "ModelStepResult",
    "NextStep",
    "ParkReason",
    "RECOVER_OPERATION",
    "RESUME_HOST",
    "RESUME_REQUIRED",
    "RecoverInput",
    "RecoverResult",
    "RunIds",
    "SA_PARK_REASON",
    "SA_SESSION_ID",
    "SA_STATE",
    "SEARCH_ATTRIBUTES",
    "SEND_MESSAGE",
    "SESSION_WORKFLOW",
    "STATUS_QUERY",
    "SendMessage",
    "SessionConfig",
    "SessionInput",
    "SessionState",
    "SessionStatus",
    "ToolInput",
    "ToolOutcome",
    "ToolSettings",
    "TurnAccepted",
    "UpdateInput",
    "WAIT_SETTLED",
    "WaitSettled",
    "TurnStatus",
    "USAGE_LIMIT_REACHED",
    "TOOL_SET_UNAVAILABLE",
    "host_queue",
    "workflow_id_for",
]

#: Workflow type, update and query names.
SESSION_WORKFLOW: Final = "maka.session"
SEND_MESSAGE: Final = "send_message"
STATUS_QUERY: Final = "status"
#: A long-poll Update for clients waiting on a turn (``maka session ... --wait``). It changes no
#: workflow state, so histories recorded before it existed replay unchanged.
WAIT_SETTLED: Final = "wait_settled"
#: The activities of a session run as a child of a user's workflow (``activities/child.py``).
PREPARE_SESSION: Final = "maka.prepare_session"
SESSION_REPLY: Final = "maka.session_reply"
CHILD_ACTIVITY_NAMES: Final[tuple[str, ...]] = (PREPARE_SESSION, SESSION_REPLY)
#: The activities of a sub-agent's call (``activities/subagent.py``).
SUBAGENT_ACTIVITY_NAMES: Final[tuple[str, ...]] = (SUBAGENT_BEGIN, SUBAGENT_SETTLE)
#: ``maka resume`` of a session parked with ``workspace_host_unavailable``: the operator says the
#: host is back; the turn goes on in the same execution, on the same host.
RESUME_HOST: Final = "resume_host"
#: Answers to the permission request a turn waits on (``Approve``, ``Deny``): the validator refuses
#: with the ledger's codes, the handler commits the answer in the ledger (``maka.answer_approval``)
#: and the waiting turn goes on. Refusals: ``approval_id_mismatch``, ``approval_phrase_mismatch``,
#: ``approval_expired``, ``approval_action_digest_mismatch`` (approve only), ``approval_not_pending``.
#: Every Update also refuses an input outside its fields' bounds (``maka_core.facts.bounds``):
#: ``input_invalid`` (``message_invalid`` for a message's text), before any other check.
APPROVE: Final = "approve"
DENY: Final = "deny"
#: Stop the running turn (``CancelTurn``): the run ends ``cancelled``. Refusal: ``turn_not_running``.
CANCEL_TURN: Final = "cancel_turn"
#: A parent session's cancel reaching its sub-agent's child session (a signal: a workflow cannot send
#: an Update); the child cancels its turn as ``cancel_turn`` does (``workflows.subagent_cancel``).
CANCEL_FROM_PARENT: Final = "maka.cancel_from_parent"
#: A Signal to a parked session (``Wake``): ask the ledger again whether its turn may go on
#: (``workflows.session_wake``). Sent by ``maka session resolve``, ``maka resume`` and a worker's
#: startup check; a Signal, so an execution on older code drops it (nothing fails, nothing moves).
WAKE: Final = "wake"

#: Search attribute names (Keyword), registered by ``maka dev`` and documented in deploy/README.md.
SA_SESSION_ID: Final = "MakaSessionId"
SA_STATE: Final = "MakaState"
SA_PARK_REASON: Final = "MakaParkReason"
SEARCH_ATTRIBUTES: Final[tuple[str, ...]] = (SA_SESSION_ID, SA_STATE, SA_PARK_REASON)

#: ApplicationError types raised by activities (the workflow branches on them).
DISPATCH_WITHOUT_OUTCOME: Final = "DispatchWithoutOutcome"
#: ``begin_run`` found its run begun by another execution (a reset replayed the turn): this
#: execution hands the session over to ``maka resume`` and closes.
RESUME_REQUIRED: Final = "ResumeRequired"
#: ``begin_run`` / ``begin_continuation`` found a row of the session edited behind the writers
#: (``ledger_chain_broken``): the turn parks with that reason before anything acts on the session.
LEDGER_CHAIN_BROKEN: Final = "LedgerChainBroken"
#: ``model_step`` refused a call that would pass a token cap of the session's policy: the turn
#: parks ``usage_limit_reached`` (no provider call was made).
USAGE_LIMIT_REACHED: Final = "UsageLimitReached"
#: A step or call of a session whose tool set names a tool or server this worker does not serve
#: (``tools.offer.ToolSetUnavailable``): one worker's view, so nothing is committed; the turn parks
#: ``tool_set_unavailable`` (like a catalog mismatch) until a worker serving the set resumes it.
TOOL_SET_UNAVAILABLE: Final = "tool_set_unavailable"
#: A model step on a stopping worker (``maka_core.runtime.model_calls``): nothing was committed. A
#: regular attempt is retried elsewhere; a local one gives up its workflow task (``worker_stop``).
WORKER_STOPPING: Final = "worker_stopping"


def workflow_id_for(session_id: str) -> str:
    """The one workflow id of a session."""
    return f"maka-session-{session_id}"


def host_queue(task_queue: str, host: str) -> str:
    """The task queue of one workspace host: tool and recovery activities of the sessions pinned to
    ``host`` go there, and only that host's workers poll it. Derived here, once, from the shared
    queue and the host name (a worker and a workflow can never disagree on it)."""
    return f"{task_queue}@host:{host}"


class InFlightTurn(Contract):
    """A turn carried across a mid-turn continue-as-new (very long tool loops)."""

    ids: RunIds
    next_step: int
    settings: ToolSettings


class SessionInput(HoldsConfig):
    """Workflow input; also the carried state for continue-as-new (small by construction).

    The session's settings are ``config`` (``SessionConfig``), whose fields the history holds at
    this object's top level, as it always did (``HoldsConfig``)."""

    session_id: str
    workspace: str
    workspace_identity: str
    task_queue: str
    config: SessionConfig
    # carried state
    state: SessionState = "idle"
    park_reason: str | None = None
    parked_operation_id: str | None = None
    turns: int = 0
    last_turn: RunIds | None = None
    in_flight: InFlightTurn | None = None
    continued_runs: int = 0
    #: A new execution started by ``maka resume``: its first turn is this claimed and started
    #: continuation run (never set by continue-as-new).
    continuation: RunIds | None = None
    #: A session run as a child workflow (``maka_temporal.workflow.run_session``): its first
    #: message, taken as if sent (consumed: a continue-as-new carries ``None``) ...
    first_message: str | None = None
    #: ... and the execution closes once a turn has settled, returning its status to the parent
    #: (the session goes on as any other: a ``send`` reopens it from the ledger).
    close_after_turn: bool = False


class PrepareSession(Contract):
    """Input of ``maka.prepare_session``: a child session's inputs, checked as the CLI checks them."""

    session_id: str
    message: str
    workspace: str
    task_queue: str
    script: str | None = None
    model: str | None = None
    policy: str | None = None
    host: str | None = None
    #: The child's tool set (``tools.offer``); absent: every tool.
    offer: tuple[str, ...] | None = None


class SubAgentBegin(Contract):
    """Input of ``maka.subagent_begin``: the call, the depth limit, and the parent's config (the
    child runs where the parent runs, as it runs: its host, tool mode and limits; its provider
    when the sub-agent names neither a model nor a script; its depth, from its lineage)."""

    call: ToolInput
    max_depth: int
    parent: SessionConfig


class SubAgentBegun(Contract):
    """The call settled or refused before any child (``outcome``), or its child session's input
    (``child``: its first message is the task; the call's T1 is committed)."""

    outcome: ToolOutcome | None = None
    child: SessionInput | None = None


#: A sub-agent call's ``child_state`` when its turn was cancelled before its child started.
CHILD_NOT_STARTED: Final = "not_started"


class SubAgentSettle(Contract):
    """Input of ``maka.subagent_settle``: the call and how its child's turn settled
    (``child_state`` ``CHILD_NOT_STARTED``: cancelled before the child started)."""

    session_id: str
    run_id: str
    tool_call_id: str
    operation_id: str
    child_session_id: str
    child_state: str
    child_run_id: str | None = None
    child_park_reason: str | None = None


class SessionReplyInput(Contract):
    session_id: str
    run_id: str


class SessionReply(Contract):
    """The final assistant text of a turn (``None``: the model gave none) and how its run ended,
    from the run's header (``None``: recorded before the field existed, or not ended)."""

    text: str | None = None
    outcome: TurnStatus | None = None


class UpdateInput(Contract):
    """Base of every Update's input. Its fields declare their bounds (``maka_core.facts.bounds``) as
    metadata the decoder does not enforce (an accepted Update in a history must decode on replay);
    the session's validators refuse on them. A value that does not decode as the model at all (a
    wrong type, a missing field, not an object) is refused ``input_invalid`` here, an
    ``ApplicationError`` whose type is the code, so the workflow rejects the Update (no event in
    history) with it rather than the SDK's ``Failed decoding arguments``."""

    @model_validator(mode="wrap")
    @classmethod
    def _refuse_undecodable(cls, data: Any, handler: ModelWrapValidatorHandler[Any]) -> Any:
        try:
            return handler(data)
        except ValidationError as exc:
            # Imported here: the ledger-only commands read these models and load no Temporal SDK
            # (``tests/test_cli_startup.py``); a refusal is the only path that needs it.
            from temporalio.exceptions import ApplicationError

            why = "; ".join(
                f"{'.'.join(str(p) for p in e['loc']) or 'input'}: {e['msg']}" for e in exc.errors()[:3]
            )
            raise ApplicationError(
                f"{cls.__name__} input does not decode: {why}", type=INPUT_INVALID, non_retryable=True
            ) from None


class SendMessage(UpdateInput):
    """Update input: one user message starts one turn."""

    text: Annotated[str, USER_MESSAGE]


class WaitSettled(UpdateInput):
    """Input of ``wait_settled``: the turn's run id (from ``TurnAccepted``); ``timeout_s`` bounds
    the wait with a workflow timer (None: no timer, so a wait adds no history event but its own)."""

    run_id: Annotated[str, IDENTIFIER]
    timeout_s: Annotated[float | None, WAIT_SECONDS] = None


class _UpdateInput(UpdateInput):
    """An Update input people type (``temporal workflow update execute --input``): camelCase keys,
    the field names accepted too."""

    model_config = ConfigDict(frozen=True, extra="ignore", alias_generator=to_camel, populate_by_name=True)


class Approve(_UpdateInput):
    """``approve``: ``{"approvalId", "phrase", "by"}``."""

    approval_id: Annotated[str, IDENTIFIER]
    phrase: Annotated[str, APPROVAL_PHRASE]
    by: Annotated[str | None, OPERATOR_NAME] = None


class Deny(_UpdateInput):
    """``deny``: ``{"approvalId", "by", "reason"}``."""

    approval_id: Annotated[str, IDENTIFIER]
    by: Annotated[str | None, OPERATOR_NAME] = None
    reason: Annotated[str | None, OPERATOR_REASON] = None


class CancelTurn(_UpdateInput):
    """``cancel_turn``: ``{"reason", "by"}``, both optional."""

    reason: Annotated[str | None, OPERATOR_REASON] = None
    by: Annotated[str | None, OPERATOR_NAME] = None


class TurnCancelled(Contract):
    """``cancel_turn``'s result: the cancelled run and how its end was recorded."""

    run_id: str
    terminal_event_id: str
    #: Calls whose cancellation the runtime observed (``tool_cancelled`` in their T2).
    cancelled_operations: list[str] = []


class Wake(Contract):
    """The ``wake`` Signal's input: who woke the session (for the worker's log), nothing else."""

    by: str | None = None


class TurnAccepted(Contract):
    """Update result: the identities of the turn that the message started."""

    turn_id: str
    run_id: str
    invocation_id: str


class SessionStatus(Contract):
    """Query result: the workflow's small state (the ledger has the rest)."""

    session_id: str
    state: SessionState
    park_reason: str | None = None
    parked_operation_id: str | None = None
    turns: int = 0
    current_turn: RunIds | None = None
    last_turn: RunIds | None = None
    accepting: bool = True
    continued_runs: int = 0
    host: str | None = None
    #: The permission request the turn waits on (the workflow holds the wait).
    awaiting_approval: ApprovalWait | None = None
    #: The ``wake`` Signals this execution has answered; ``None``: it cannot be woken (older code,
    #: or it replayed a wake that older code dropped): terminate it, then ``maka resume``.
    wakes: int | None = None
    #: What the last wake-up decided (``WakeAnswer``).
    last_wake: WakeAnswer | None = None


InFlightTurn.model_rebuild()
