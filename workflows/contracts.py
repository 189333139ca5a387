"""Every value that crosses the Temporal boundary: workflow input, update, query and activity models.

These models and the activity names below are persisted compatibility data: they are written into
workflow histories, and a replaying worker must decode what an older worker wrote. Add optional
fields with defaults; never rename or remove a field or an activity name (``tests/test_activity_names.py``
pins them). Nothing here carries a transcript or a tool result: activities pass ledger identifiers
(run, operation and event ids), and the ledger holds the facts.
"""

from __future__ import annotations

from typing import Any, Final, Literal

from pydantic import BaseModel, ConfigDict, Field, SerializerFunctionWrapHandler, model_serializer

#: Activity type names (persisted in histories; pinned by a test).
BEGIN_RUN: Final = "maka.begin_run"
MODEL_STEP: Final = "maka.model_step"
EXECUTE_TOOL: Final = "maka.execute_tool"
RECOVER_OPERATION: Final = "maka.recover_operation"
FINISH_RUN: Final = "maka.finish_run"
ACTIVITY_NAMES: Final[tuple[str, ...]] = (BEGIN_RUN, MODEL_STEP, EXECUTE_TOOL, RECOVER_OPERATION, FINISH_RUN)

#: Workflow type, update and query names.
SESSION_WORKFLOW: Final = "maka.session"
SEND_MESSAGE: Final = "send_message"
STATUS_QUERY: Final = "status"

#: Search attribute names (Keyword), registered by ``maka dev`` and documented in deploy/README.md.
SA_SESSION_ID: Final = "MakaSessionId"
SA_STATE: Final = "MakaState"
SA_PARK_REASON: Final = "MakaParkReason"
SEARCH_ATTRIBUTES: Final[tuple[str, ...]] = (SA_SESSION_ID, SA_STATE, SA_PARK_REASON)

#: ApplicationError types raised by activities (the workflow branches on them).
DISPATCH_WITHOUT_OUTCOME: Final = "DispatchWithoutOutcome"

SessionState = Literal["idle", "running", "parked", "failed"]
RunStatus = Literal["completed", "failed"]
ModelStepMode = Literal["local", "activity"]


def workflow_id_for(session_id: str) -> str:
    """The one workflow id of a session."""
    return f"maka-session-{session_id}"


class Contract(BaseModel):
    """Base of every contract model: frozen, unknown fields ignored (an older worker reading a newer
    history must not fail on a field it does not know)."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    @model_serializer(mode="wrap")
    def _drop_nulls(self, handler: SerializerFunctionWrapHandler) -> Any:
        # Absent beats null in history: every byte here is paid once per event, forever.
        data = handler(self)
        return {k: v for k, v in data.items() if v is not None} if isinstance(data, dict) else data


class RunIds(Contract):
    """The identities of one Maka run (one user turn)."""

    session_id: str
    turn_id: str
    run_id: str
    invocation_id: str


class InFlightTurn(Contract):
    """A turn carried across a mid-turn continue-as-new (very long tool loops)."""

    ids: RunIds
    next_step: int
    settings: ToolSettings


class ToolSettings(Contract):
    """Tool activity timeouts chosen by the worker that began the run (recorded in history by
    ``begin_run``'s result, so replay sees the same values whatever the current worker's flags)."""

    heartbeat_timeout_s: float = 20.0
    start_to_close_timeout_s: float = 900.0


class SessionInput(Contract):
    """Workflow input; also the carried state for continue-as-new (small by construction)."""

    session_id: str
    workspace: str
    workspace_identity: str
    provider: dict[str, Any]
    task_queue: str
    #: Continue-as-new after this many turns in one execution (``None``: only when Temporal suggests).
    continue_as_new_after_turns: int | None = None
    #: Within a long turn, continue-as-new at a step boundary after this many model steps in one
    #: execution (``None``: only when Temporal suggests it).
    continue_as_new_after_steps: int | None = None
    model_step_mode: ModelStepMode = "local"
    max_steps_per_turn: int = 100_000
    # carried state
    state: SessionState = "idle"
    park_reason: str | None = None
    parked_operation_id: str | None = None
    turns: int = 0
    last_turn: RunIds | None = None
    in_flight: InFlightTurn | None = None
    continued_runs: int = 0


class SendMessage(Contract):
    """Update input: one user message starts one turn."""

    text: str


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


# --- activities -------------------------------------------------------------------------------


class BeginRunInput(Contract):
    ids: RunIds
    text: str
    ts: int
    workflow_id: str
    workflow_run_id: str
    task_queue: str
    workspace: str


class BeginRunResult(Contract):
    user_event_id: str
    tool_settings: ToolSettings


class ModelStepInput(Contract):
    ids: RunIds
    step: int = Field(ge=0)
    workspace: str
    provider: dict[str, Any]
    #: True when the previous step of this run produced tool results (failpoint P7's place).
    after_tools: bool = False


class CallRef(Contract):
    """One committed function call: ids only, never arguments."""

    tool_call_id: str
    operation_id: str
    tool_name: str
    #: A read-only tool (replay_safe, no mutation) may be retried by Temporal; others never.
    read_only: bool | None = None


class ModelStepResult(Contract):
    step_id: str
    calls: list[CallRef] = []
    final: bool
    replayed: bool | None = None


class ToolInput(Contract):
    """The turn and invocation ids come from the ledger (less history per call)."""

    session_id: str
    run_id: str
    call: CallRef
    workspace: str
    workspace_identity: str


class ToolOutcome(Contract):
    """How one call settled. ``refused``: preflight said no before T1 (an ordinary error result)."""

    operation_id: str
    status: Literal["completed", "refused"]
    is_error: bool | None = None
    dispatch_event_id: str | None = None
    response_event_id: str | None = None
    replayed: bool | None = None


class RecoverInput(Contract):
    session_id: str
    run_id: str
    call: CallRef
    workspace: str
    workspace_identity: str


class RecoverResult(Contract):
    """``completed``: continue with the committed outcome; ``not_dispatched``: the tool never ran and
    may be dispatched again; ``parked``: the run and session park with ``reason``."""

    operation_id: str
    status: Literal["completed", "not_dispatched", "parked"]
    reason: str
    is_error: bool = False
    response_event_id: str | None = None


class FinishRunInput(Contract):
    ids: RunIds
    status: RunStatus
    ts: int
    park_reason: str | None = None
    parked_operation_id: str | None = None
    error: str | None = None


class FinishRunResult(Contract):
    terminal_event_id: str
    status: RunStatus


InFlightTurn.model_rebuild()
