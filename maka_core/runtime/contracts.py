"""The runtime's contract models: every value an activity takes or returns, and the closed sets
the turn protocol speaks in (declared here once; the workflow and the views import them).

These models cross the Temporal boundary and are written into workflow histories, so they are
persisted compatibility data: a replaying worker must decode what an older worker wrote. Add
optional fields with defaults; never rename or remove a field (``tests/test_activity_names.py``
pins the activity names). Nothing here carries a transcript or a tool result: the runtime passes
ledger identifiers (run, operation and event ids), and the ledger holds the facts. pydantic only:
``maka_core`` never imports temporalio.
"""

from __future__ import annotations

from typing import Annotated, Any, Final, Literal, get_args

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    ValidationError,
    model_serializer,
    model_validator,
)
from pydantic.alias_generators import to_camel, to_snake

from maka_core.facts.bounds import APPROVAL_PHRASE, IDENTIFIER, OPERATOR_NAME, OPERATOR_REASON
from maka_core.providers.spec import RecordedSpec

#: A session as people see it (the workflow's state; the ledger derives the same one).
SessionState = Literal["idle", "running", "parked", "failed"]
#: How a run ended, as the workflow reports it to ``finish_run`` (``cancelled``: ``cancel_turn``).
TurnStatus = Literal["completed", "failed", "cancelled"]
#: Where a model step runs: ``local`` (a local activity), ``activity`` (a regular activity), or
#: ``with_tool`` (the first step of a turn as a local activity; each later step rides in the tool
#: activity of its previous step's last call, after that call's T2: one activity task and one
#: workflow activation per call instead of two; a local activity whenever the ride did not happen).
ModelStepMode = Literal["local", "activity", "with_tool"]
#: Where a tool call runs (``SessionConfig.tool_mode``): ``activity``, every dispatch a regular
#: activity; ``hybrid``, a bounded call's first dispatch a local activity (``runtime.local_calls``).
ToolMode = Literal["activity", "hybrid"]
#: Why a local attempt handed its call to the regular activity, before any ledger read or write.
LocalDeferral = Literal["off_host", "stopping", "busy", "approval"]
#: The tool mode of a session started now, on every path (``maka session start --tool-mode``,
#: ``SessionClient.start``, ``session_client.start_session``): ``hybrid`` measured 0.37-0.49x of
#: ``activity`` per call (README "Benchmarks"). A recorded config without one is ``activity``
#: (``SessionConfig.tool_mode``).
NEW_SESSION_TOOL_MODE: Final[ToolMode] = "hybrid"
#: Why a resume parked (the host's wire union, ``maka-runtime-facts.md`` §3e in its post-#3506
#: form); the planner's own codes travel beside it as ``rejectionReasons``.
HostParkReason = Literal[
    "resume_feature_disabled",
    "continuation_authority_unavailable",
    "safety_observation_unavailable",
    "resume_candidate_missing",
    "source_run_unreadable",
    "safety_check_failed",
    "continuation_already_exists",
    "continuation_repair_required",
    "continuation_started_indeterminate",
    "session_busy",
    # a row of the session no longer matches its chain digest (edited behind the writers): no
    # repair, resume or replay acts on the session's facts
    "ledger_chain_broken",
]
HOST_PARK_REASONS: frozenset[str] = frozenset(get_args(HostParkReason))
#: Why a run (and its session) parked. The Resolver's own codes stay on the operation; a park
#: names the way forward an operator needs.
ParkReason = Literal[
    # a reconciler observed the target (the recovery decision's reasonCode)
    "reconcile_matches_prior_state",
    "reconcile_diverged",
    "reconcile_unreadable",
    # dispatched, no outcome, and no way to settle it from evidence (bash, network...)
    "dispatch_without_response",
    # a dispatch written by a writer without the tool-boundary protocol: nobody can tell
    "legacy_dispatch_unknown",
    # the workflow names a call the ledger does not hold
    "call_not_found",
    "workspace_unavailable",
    "workspace_identity_mismatch",
    # recovery itself could not run (its activity failed for good)
    "recovery_unavailable",
    # a call that never dispatched kept failing before T1
    "dispatch_attempts_exhausted",
    # the turn asked for more model steps than the session allows (``max_steps_per_turn``)
    "max_steps_exceeded",
    # the next model call would take the turn or session past a token cap of its policy
    # (``usage.maxTokensPerTurn``/``maxTokensPerSession``); checked before the call, never mid-call
    "usage_limit_reached",
    # the ledger holds a contradiction for this operation (the Resolver's code is on the operation)
    "ledger_corruption",
    # a parked recovery decision with a reason code this runtime does not write (an imported ledger)
    "recovery_parked",
    # the session's workspace host did not pick a tool or recovery activity up within the
    # session's host wait (schedule-to-start); ``maka resume`` continues once the host is back
    "workspace_host_unavailable",
    # the session's tool set names a tool or MCP server the worker that took its step or call
    # does not serve (``tools.offer``); nothing was committed, a worker that serves it resumes
    "tool_set_unavailable",
    # a sub-agent's child session parked (``SubAgent``): its operator acts on the child, whose
    # session id the parent's log and the call's derivation name (``tools.subagent``)
    "subagent_parked",
    # a session whose execution was lost and whose resume parked (the host's union, above)
    HostParkReason,
]
PARK_REASONS: frozenset[str] = frozenset(get_args(ParkReason))
#: The code of the terminal fact of a turn ``cancel_turn`` stopped: only such a run leaves the session
#: ``idle``; a MELRA ``aborted``/``cancelled`` end written before it (reference ledgers, imports)
#: still derives ``failed``.
TURN_CANCELLED = "turn_cancelled"

#: A sub-agent's call (``tools.subagent``, ``workflows.subagent``): its admission and T1 with the
#: child session's input, then its T2 from the child's settled turn (``activities/subagent.py``).
#: Registered beside a child session's two (``CHILD_ACTIVITY_NAMES``); the audit reads them.
SUBAGENT_BEGIN: Final = "maka.subagent_begin"
SUBAGENT_SETTLE: Final = "maka.subagent_settle"

#: Activity type names (persisted in histories; pinned by ``tests/test_activity_names.py``). Declared
#: here, beside the models they carry, so the workflow, the activities and the audit (which reads
#: them back out of histories) share one spelling.
BEGIN_RUN: Final = "maka.begin_run"
MODEL_STEP: Final = "maka.model_step"
EXECUTE_TOOL: Final = "maka.execute_tool"
RECOVER_OPERATION: Final = "maka.recover_operation"
FINISH_RUN: Final = "maka.finish_run"
#: The first activity of a continuation turn (``maka resume``): binds the claimed run.
BEGIN_CONTINUATION: Final = "maka.begin_continuation"
#: Ledger-only: a run parks on (or leaves the park on) its workspace host (``HostParkInput``).
HOST_PARK: Final = "maka.host_park"
#: Ledger-only: the ``approve``/``deny`` Update's answer, validated and committed (``AnswerInput``).
ANSWER_APPROVAL: Final = "maka.answer_approval"
#: Ledger-only: close a request unanswered at its ``expiresAt`` (the workflow's timer fired).
CLOSE_APPROVAL: Final = "maka.close_approval"
#: A bounded tool call's first dispatch as a local activity (``tool_mode="hybrid"``); its
#: activity id is ``lt:<operationId>`` (``LOCAL_TOOL_ID_PREFIX``).
EXECUTE_TOOL_LOCAL: Final = "maka.execute_tool_local"
#: Ledger-only: a parked session's wake-up decides from the ledger whether its turn goes on
#: (``runtime.wake``: ``WakeInput`` -> ``WakeAnswer``).
SESSION_CONTINUE: Final = "maka.session_continue"
LOCAL_TOOL_ID_PREFIX: Final = "lt:"
ACTIVITY_NAMES: Final[tuple[str, ...]] = (
    BEGIN_RUN,
    MODEL_STEP,
    EXECUTE_TOOL,
    RECOVER_OPERATION,
    FINISH_RUN,
    BEGIN_CONTINUATION,
    HOST_PARK,
    ANSWER_APPROVAL,
    CLOSE_APPROVAL,
    EXECUTE_TOOL_LOCAL,
    SESSION_CONTINUE,
)

RecoverStatus = Literal["completed", "not_dispatched", "parked"]
#: ``awaiting_approval``: the call's permission request is committed and unanswered, and the
#: workflow holds the wait (``ToolInput.approval_wait``); nothing ran.
ToolOutcomeStatus = Literal["completed", "refused", "awaiting_approval"]


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


class ToolSettings(Contract):
    """Tool activity timeouts chosen by the worker that began the run (recorded in history by
    ``begin_run``'s result, so replay sees the same values whatever the current worker's flags)."""

    heartbeat_timeout_s: float = 20.0
    start_to_close_timeout_s: float = 900.0


# --- the session's settings -------------------------------------------------------------------

#: The model step's start-to-close when a session names none (what every session had before
#: ``--step-timeout``; a recorded history without the field replays with exactly this one).
DEFAULT_STEP_TIMEOUT_S: Final = 120.0
#: The bounds of a new session's ``--step-timeout`` (a recorded value is taken as it is).
STEP_TIMEOUT_BOUNDS_S: Final = (1.0, 3600.0)
DEFAULT_MAX_STEPS_PER_TURN: Final = 100_000
#: Calls of one model step running at once in a new session (``--max-parallel-tools``).
DEFAULT_MAX_PARALLEL_TOOLS: Final = 8
#: The bounds of ``max_parallel_tools`` (1: one call at a time, as before issue 31).
MAX_PARALLEL_TOOLS_BOUNDS: Final = (1, 64)


class AgentLineage(Contract):
    """A child session's place in its tree: the parent's session and the call that started it
    (``parentSessionId``, ``parentOperationId``), and how deep it sits (a user's session is 0)."""

    parent_session_id: str
    parent_operation_id: str
    depth: int = Field(ge=1)

    def to_json(self) -> dict[str, Any]:
        return {
            "parentSessionId": self.parent_session_id,
            "parentOperationId": self.parent_operation_id,
            "depth": self.depth,
        }


class SessionConfig(Contract):
    """Every setting of a session, declared once: what the session was started with, as opposed to
    the state it carries. ``SessionInput`` (workflow histories), ``BeginRunInput`` and the ledger's
    session record (``lost_run.SessionRecord``) hold this one model, so every new execution of a
    session (``maka resume``, a ``session send`` over a closed one, a continue-as-new) runs with the
    settings it was started with.

    The model's parameters (system prompt, temperature, max tokens, the HTTP timeout) live in the
    provider spec, where the provider reads them. Field names are the history's keys (the flat keys
    ``SessionInput`` always had); ``to_json`` gives the camelCase keys of the ledger record and of
    ``session status --json`` (no pydantic aliases: Temporal's converter serializes by alias). No
    bound is checked here: a recorded value must always decode, so a new session's values are
    checked where they enter (``session_start.new_session_config``)."""

    #: The model the session talks to (``maka_core.providers.spec``: tagged by ``kind``; every
    #: object recorded as a plain dict before the union decodes unchanged, an invalid one as an
    #: ``UnrecognizedSpec`` that fails the model step, as it always did).
    provider: RecordedSpec
    #: Every recorded input spells its mode out (defaults are serialized), so this default reaches
    #: only new sessions and continuations, never a history recorded in ``local``.
    model_step_mode: ModelStepMode = "with_tool"
    #: The model step's start-to-close, in seconds (a riding step is bounded by its tool activity).
    model_step_timeout_s: float = DEFAULT_STEP_TIMEOUT_S
    max_steps_per_turn: int = DEFAULT_MAX_STEPS_PER_TURN
    #: Continue-as-new after this many turns in one execution (``None``: only when Temporal suggests).
    continue_as_new_after_turns: int | None = None
    #: Within a long turn, continue-as-new at a step boundary after this many model steps in one
    #: execution (``None``: only when Temporal suggests it).
    continue_as_new_after_steps: int | None = None
    #: The session's workspace host (``maka session start --host``, ``MAKA_HOST``): every tool and
    #: recovery activity goes to ``host_queue(task_queue, host)``. ``None`` (sessions started before
    #: host affinity): tools stay on ``task_queue``, as they always did.
    host: str | None = None
    #: Seconds the host has to pick a tool or recovery activity up (schedule-to-start) before the
    #: session parks with ``workspace_host_unavailable`` (``MAKA_HOST_WAIT`` at session start).
    host_wait_s: float | None = None
    #: The digest of the governance policy recorded for the session at its start
    #: (``session_policies``): which policy every execution of the session decides by. ``None``:
    #: a session started before the config held it (its policy row still says).
    policy_digest: str | None = None
    #: The tools the session offers the model (``tools.offer``: groups and tool names, checked at
    #: its start); ``None``: every tool the worker serves (sessions started before sets existed).
    tool_set: tuple[str, ...] | None = None
    #: ``hybrid``: bounded calls' first dispatch runs as a local activity (``--tool-mode``). Absent
    #: from every history recorded before it, which therefore decodes as ``activity``.
    tool_mode: ToolMode = "activity"
    #: How many calls of one model step run at once (``--max-parallel-tools``; only calls whose
    #: tools are ``parallel``). Absent from every history recorded before it, which therefore
    #: decodes as 1: one call at a time, as those sessions always ran.
    max_parallel_tools: int = 1
    #: Ask the provider to stream each step's text into its partial snapshot (``--stream``;
    #: ``runtime.step_stream``). Absent from every config recorded before it, which therefore
    #: decodes as no streaming, as those sessions always ran.
    stream: bool = False
    #: A sub-agent's child session (``tools.subagent``): its parent and depth. ``None``: a session
    #: a user started (absent from every record and history of one).
    lineage: AgentLineage | None = None

    def to_json(self) -> dict[str, Any]:
        """The camelCase object of the ledger record and of ``session status --json``."""
        dumped = self.model_dump(mode="json")
        dumped.pop("lineage", None)  # a user's session: its record keeps the keys it always had
        if self.lineage is not None:
            dumped["lineage"] = self.lineage.to_json()
        return {_JSON_KEYS[k]: v for k, v in dumped.items()}

    def status_json(self) -> dict[str, Any]:
        """The ``config`` of ``session status --json``: ``to_json`` with the status names of
        issue 19 (``continueAsNewAfter`` for the turn threshold); the ledger keeps its keys."""
        return {_STATUS_KEYS.get(k, k): v for k, v in self.to_json().items()}

    @classmethod
    def from_json(cls, raw: Any) -> SessionConfig | None:
        """The config of a camelCase object (``to_json``; older records hold only its first keys;
        a status ``config`` too), or ``None`` when it holds no provider or a value of the wrong type."""
        if not isinstance(raw, dict) or not isinstance(raw.get("provider"), dict):
            return None
        for stored, shown in _STATUS_KEYS.items():
            if stored not in raw and shown in raw:
                raw = {**raw, stored: raw[shown]}
        lineage = raw.get("lineage")
        if isinstance(lineage, dict):
            raw = {**raw, "lineage": {to_snake(k): v for k, v in lineage.items()}}
        try:
            return cls.model_validate({k: raw[j] for k, j in _JSON_KEYS.items() if j in raw})
        except ValidationError:
            return None


#: The keys of the config's fields in a flat history object.
_CONFIG_KEYS: Final = tuple(SessionConfig.model_fields)
#: Their camelCase keys (``hostWait`` as the record has always spelled it).
_JSON_KEYS: Final = {
    k: {"host_wait_s": "hostWait", "model_step_timeout_s": "modelStepTimeout"}.get(k, to_camel(k))
    for k in _CONFIG_KEYS
}
#: The keys ``session status --json`` names otherwise than the ledger record (which keeps its own,
#: so every record written before reads unchanged).
_STATUS_KEYS: Final = {"continueAsNewAfterTurns": "continueAsNewAfter"}


class HoldsConfig(Contract):
    """A contract whose history object keeps the config's fields at its top level.

    ``SessionInput`` and ``BeginRunInput`` spelled the settings out as their own fields before
    ``SessionConfig`` existed; keeping that flat shape means every recorded history decodes into
    the model (the flat keys are gathered into ``config``) and an older worker still reads what a
    newer one writes (the same keys, and new ones it ignores)."""

    @model_validator(mode="before")
    @classmethod
    def _gather_config(cls, data: Any) -> Any:
        if not isinstance(data, dict) or "config" in data:
            return data
        flat = {k: v for k, v in data.items() if k not in _CONFIG_KEYS}
        if data.get("provider") is not None:
            flat["config"] = {k: data[k] for k in _CONFIG_KEYS if k in data}
        return flat

    @model_serializer(mode="wrap")
    def _drop_nulls(self, handler: SerializerFunctionWrapHandler) -> Any:
        # The config's fields spread at the top level, as the history has always held them.
        data = handler(self)
        if not isinstance(data, dict):
            return data
        config = data.pop("config", None) or {}
        return {k: v for k, v in {**data, **config}.items() if v is not None}


# --- activities -------------------------------------------------------------------------------


class BeginRunInput(HoldsConfig):
    ids: RunIds
    text: str
    ts: int
    workflow_id: str
    workflow_run_id: str
    task_queue: str
    workspace: str
    #: The session's settings, recorded on the user event (``lost_run.session_record``) so the
    #: ledger alone can carry the session when its Temporal history is gone (absent in histories
    #: recorded before the record existed).
    workspace_identity: str | None = None
    config: SessionConfig | None = None


class BeginContinuationInput(Contract):
    """The continuation turn's first activity: its run was claimed and started by ``maka resume``
    (header and ``continuationStart`` fact committed); this records the hosting execution."""

    ids: RunIds
    workflow_id: str
    workflow_run_id: str
    task_queue: str


class BeginRunResult(Contract):
    user_event_id: str
    tool_settings: ToolSettings


class ModelStepInput(Contract):
    ids: RunIds
    step: int = Field(ge=0)
    workspace: str
    provider: RecordedSpec
    #: True when the previous step of this run produced tool results (failpoint P7's place).
    after_tools: bool = False
    #: The session's tool set (``SessionConfig.tool_set``); absent: every tool.
    tool_set: tuple[str, ...] | None = None
    #: Stream the step's text into its partial snapshot (``SessionConfig.stream``); absent: no.
    stream: bool | None = None


class CallRef(Contract):
    """One committed function call: ids only, never arguments (its targets are digests)."""

    tool_call_id: str
    operation_id: str
    tool_name: str
    #: A read-only tool (replay_safe, no mutation) may be retried by Temporal; others never.
    read_only: bool | None = None
    #: A bounded tool (``runtime.local_calls.is_bounded``): in a hybrid session its first dispatch
    #: may run as a local activity.
    bounded: bool | None = None
    #: The tool may run beside the step's other calls (``tools.contract.parallel_safe``).
    parallel: bool | None = None
    #: Digests of the workspace names the call touches (``tools.targets``; None: it declares none):
    #: two calls of one step that share one, not both read-only, keep the model's order.
    targets: list[str] | None = None


class ModelStepResult(Contract):
    step_id: str
    calls: list[CallRef] = []
    final: bool
    replayed: bool | None = None


class NextStep(Contract):
    """The model step a tool activity runs once its call has settled (``with_tool`` mode). Its run
    ids and workspace are the call's own (the turn and invocation ids from the ledger), so history
    holds only the step index and the provider spec."""

    step: int = Field(ge=0)
    provider: RecordedSpec
    #: Stream the step (``SessionConfig.stream``); absent: no.
    stream: bool | None = None


class ToolInput(Contract):
    """The turn and invocation ids come from the ledger (less history per call)."""

    session_id: str
    run_id: str
    call: CallRef
    workspace: str
    workspace_identity: str
    #: ``with_tool`` mode: the model step to run in this activity once the call has settled (T2
    #: committed); its result comes back as ``ToolOutcome.next_step``.
    next_step: NextStep | None = None
    #: ``workflow``: an unanswered approval is the workflow's to wait for (a condition and a timer
    #: at its expiry): the activity returns ``awaiting_approval`` at once. Absent (histories
    #: recorded before it): the activity waits itself, polling the ledger.
    approval_wait: Literal["workflow"] | None = None
    #: The session's tool set: a call to a tool it does not offer is refused before T1 (absent:
    #: every tool, as histories recorded before sets existed).
    tool_set: tuple[str, ...] | None = None


class ApprovalWait(Contract):
    """The request a call waits on: what the ``approve``/``deny`` validators check (the phrase is
    the one ``maka session status`` shows; no argument of the call is here)."""

    approval_id: str
    operation_id: str
    phrase: str
    #: The challenge's ``expiresAt``, epoch milliseconds (the workflow's timer fires there).
    expires_at_ms: int
    #: The challenge's action digest equals the one recomputed from the committed call.
    digest_matches: bool = True


class ToolOutcome(Contract):
    """How one call settled. ``refused``: preflight said no before T1 (an ordinary error result)."""

    operation_id: str
    status: ToolOutcomeStatus
    is_error: bool | None = None
    dispatch_event_id: str | None = None
    response_event_id: str | None = None
    replayed: bool | None = None
    #: The output of ``ToolInput.next_step`` (absent when the step was not asked for or did not
    #: come back: the workflow then runs it on its own).
    next_step: ModelStepResult | None = None
    #: ``awaiting_approval``: the request to wait on.
    approval: ApprovalWait | None = None
    #: The attempt was cancelled (``cancel_turn``) and its T2 records ``tool_cancelled``.
    cancelled: bool | None = None


class LocalToolInput(ToolInput):
    """``maka.execute_tool_local``: the call and the session's host (a local activity's input is
    never recorded in history, so it costs nothing there)."""

    host: str | None = None


class LocalToolResult(Contract):
    """A local attempt's end: the call's outcome, or why it handed the call to the regular
    activity (before any ledger read or write, so the regular attempt is the call's first)."""

    outcome: ToolOutcome | None = None
    deferred: LocalDeferral | None = None


class AnswerInput(Contract):
    """``maka.answer_approval``: one answer to one request, as the Update received it. Its bounds
    (the Update's, ``maka_core.facts.bounds``) are checked again by the ledger (``approvals.answer``)."""

    session_id: str
    approval_id: Annotated[str, IDENTIFIER]
    allow: bool
    phrase: Annotated[str | None, APPROVAL_PHRASE] = None
    by: Annotated[str | None, OPERATOR_NAME] = None
    reason: Annotated[str | None, OPERATOR_REASON] = None


class AnswerResult(Contract):
    """What the ledger committed for an answer (``maka session approve --json`` prints it). It is
    the ``approve``/``deny`` Update's result, which people read (``temporal workflow update
    execute``), so its JSON is camelCase like every ``--json`` output (``approvalId``, ``toolName``);
    the snake_case keys of results recorded before are read too (a history replays)."""

    model_config = ConfigDict(frozen=True, extra="ignore", alias_generator=to_camel, populate_by_name=True)

    approval_id: str
    operation_id: str
    decision: Literal["allow", "deny"]
    tool_name: str | None = None


class CloseApprovalInput(Contract):
    session_id: str
    approval_id: str


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
    status: RecoverStatus
    reason: str

    @property
    def park_reason(self) -> ParkReason:
        """The park this result means (recovery writes only park reasons when it parks; a reason
        from an older worker that is not one reads as ``recovery_parked``)."""
        return self.reason if self.reason in PARK_REASONS else "recovery_parked"  # type: ignore[return-value]

    is_error: bool = False
    response_event_id: str | None = None


class HostParkInput(Contract):
    """``parked``: the run waits for its workspace host (the header says ``parked`` with
    ``workspace_host_unavailable``); not ``parked``: the host is back and the run goes on."""

    ids: RunIds
    parked: bool
    operation_id: str | None = None


class FinishRunInput(Contract):
    ids: RunIds
    status: TurnStatus
    ts: int
    park_reason: ParkReason | None = None
    parked_operation_id: str | None = None
    error: str | None = None
    #: The run is a continuation (its crash points carry the failpoint tag ``continuation``).
    continuation: bool | None = None


class FinishRunResult(Contract):
    terminal_event_id: str
    status: TurnStatus
