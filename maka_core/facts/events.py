"""The RuntimeEvent: Maka's only canonical recovery fact, as frozen pydantic models.

The shape is Maka's wire shape exactly (``reference/maka-runtime-facts.md`` §2): camelCase keys,
exact key sets (unknown keys are refused), ``content`` discriminated by ``kind``, and
``actions``/``refs`` with their own closed key sets. Optional keys are *absent*, never null:
a null where the reference writes nothing is refused, and ``to_wire`` leaves unset fields out,
so an event means the same after a round trip. Free-form payloads (``args``, ``result``,
``stateDelta``...) are JSON values checked by ``canonical_json.check``.
"""

from __future__ import annotations

import functools
import math
from typing import Annotated, Any, ClassVar, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, model_validator

from maka_core.errors import CodecError
from maka_core.facts.canonical_json import check as check_json
from maka_core.facts.payloads import check_action_payloads, check_message_extras

JsonObject = dict[str, Any]

TOOL_BOUNDARY_PROTOCOL: Literal["t1_after_preflight_v1"] = "t1_after_preflight_v1"

Role = Literal["user", "model", "tool", "system"]
Author = Literal["user", "host", "agent", "tool", "system"]
Origin = Literal["provider", "code_mode"]
Visibility = Literal["visible", "hidden"]
EventStatus = Literal["streaming", "completed", "failed", "aborted", "cancelled"]
TERMINAL_STATUSES: frozenset[str] = frozenset({"completed", "failed", "aborted", "cancelled"})
RecoveryMode = Literal[
    "replay_safe", "idempotent", "reconcile", "reattach", "outcome_unknown", "never_auto_retry"
]
Observation = Literal["matches_expected_state", "matches_prior_state", "diverged", "unreadable"]
ParkReasonCode = Literal["reconcile_matches_prior_state", "reconcile_diverged", "reconcile_unreadable"]
Sha256Digest = Annotated[str, Field(pattern=r"^sha256:[0-9a-f]{64}$")]
#: The reference refuses an empty string wherever it asks for an identity.
NonEmpty = Annotated[str, Field(min_length=1)]


class WireModel(BaseModel):
    """Base of every wire model: frozen, strict, camelCase, no unknown keys, no stray nulls."""

    model_config = ConfigDict(
        frozen=True, extra="forbid", strict=True, populate_by_name=True, serialize_by_alias=True
    )

    #: Field names (python) whose value is a JSON value that may legitimately be null.
    _nullable: ClassVar[frozenset[str]] = frozenset()
    #: Field names (python) holding free-form JSON, checked for losslessness.
    _json_fields: ClassVar[frozenset[str]] = frozenset()

    @model_validator(mode="before")
    @classmethod
    def _refuse_nulls(cls, data: Any) -> Any:
        if isinstance(data, dict):
            by_alias = _aliases(cls)
            for key, value in data.items():
                name = by_alias.get(key, key)
                if value is None and name not in cls._nullable:
                    raise ValueError(f"{key} may be absent but not null")
                if name in cls._json_fields:
                    try:
                        check_json(value, key)
                    except CodecError as exc:  # surface as a validation error, like any bad field
                        raise ValueError(exc.message) from None
        return data

    def to_wire(self) -> JsonObject:
        """The wire JSON object: set fields only, by alias, nested models expanded."""
        out: JsonObject = {}
        for name, key, nullable in _wire_fields(type(self)):
            value = getattr(self, name)
            if value is None and (not nullable or name not in self.model_fields_set):
                continue
            out[key] = _wire_value(value)
        return out


# Every event is validated and serialized several times per tool call (built, encoded, decoded
# again by the lossless check), and each nested model did this per-class work each time.
@functools.cache
def _aliases(cls: type[WireModel]) -> dict[str, str]:
    """wire key -> python field name."""
    return {f.alias or n: n for n, f in cls.model_fields.items()}


@functools.cache
def _wire_fields(cls: type[WireModel]) -> tuple[tuple[str, str, bool], ...]:
    """(python name, wire key, may be null) per field, in declaration order."""
    return tuple((n, f.alias or n, n in cls._nullable) for n, f in cls.model_fields.items())


def _wire_value(value: Any) -> Any:
    if isinstance(value, WireModel):
        return value.to_wire()
    if isinstance(value, list):
        return [_wire_value(v) for v in value]
    return value


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(p[:1].upper() + p[1:] for p in rest)


class Wire(WireModel):
    """Wire model whose python snake_case fields map to camelCase keys."""

    model_config = ConfigDict(alias_generator=_camel)


# --- content -------------------------------------------------------------------------------


class TextContent(Wire):
    """User or model text. Decoding normalizes it as the reference's message content does:
    a ``displayText`` equal to ``text`` and empty ``attachments``/``quotes`` are dropped, so
    the canonical line omits them (reference ``normalizeMessageContent``)."""

    kind: Literal["text"] = "text"
    text: str
    display_text: str | None = None
    origin: Any = None
    attachments: list[Any] | None = None
    quotes: list[Any] | None = None
    inline_references: list[Any] | None = None
    steering: Literal[True] | None = None
    provider_options: JsonObject | None = None
    _json_fields = frozenset({"origin", "attachments", "quotes", "inline_references", "provider_options"})

    @model_validator(mode="before")
    @classmethod
    def _normalize_message(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        out = dict(data)
        for wire, name in (
            ("displayText", "display_text"),
            ("attachments", "attachments"),
            ("quotes", "quotes"),
        ):
            key = wire if wire in out else name
            if key not in out:
                continue
            value = out[key]
            if (wire == "displayText" and value == out.get("text") and isinstance(value, str)) or value == []:
                del out[key]
        check_message_extras(out)
        return out


class ThinkingContent(Wire):
    kind: Literal["thinking"] = "thinking"
    text: str
    signature: str | None = None
    provider_options: JsonObject | None = None
    _json_fields = frozenset({"provider_options"})


class FunctionCallContent(Wire):
    kind: Literal["function_call"] = "function_call"
    id: str
    name: str
    # The reference types ``args`` as unknown: any JSON value, null included, but present.
    args: Any
    provider_options: JsonObject | None = None
    provider_executed: bool | None = None
    _nullable = frozenset({"args"})
    _json_fields = frozenset({"args", "provider_options"})


class FunctionResponseContent(Wire):
    kind: Literal["function_response"] = "function_response"
    id: str
    name: str
    result: Any
    is_error: bool | None = None
    provider_executed: bool | None = None
    provider_output: Any = None
    # ``providerOutput`` is unchecked by the reference decoder, so an explicit null is data.
    _nullable = frozenset({"result", "provider_output"})
    _json_fields = frozenset({"result", "provider_output"})


class ErrorContent(Wire):
    kind: Literal["error"] = "error"
    message: str
    code: str | None = None
    reason: str | None = None
    details: list[str] | JsonObject | None = None
    _json_fields = frozenset({"details"})


Content = Annotated[
    Union[TextContent, ThinkingContent, FunctionCallContent, FunctionResponseContent, ErrorContent],
    Field(discriminator="kind"),
]


# --- actions -------------------------------------------------------------------------------


class ToolDispatch(Wire):
    """The T1 fact: the runtime passed every pre-execution guard for this operation."""

    protocol: Literal["t1_after_preflight_v1"] = TOOL_BOUNDARY_PROTOCOL
    operation_id: str
    provider_tool_call_id: str
    tool_name: str
    # Only a string to the decoder: a malformed hash must decode so the scanner can report
    # ``canonical_args_hash_conflict`` against the committed call (reference isRuntimeToolDispatch).
    canonical_args_hash: str
    recovery_mode: RecoveryMode


class ReconcileResult(Wire):
    protocol: Literal["tool_reconcile_v1"] = "tool_reconcile_v1"
    operation_id: NonEmpty
    observation: Observation
    observation_schema: Literal["state_identity_v1"] = "state_identity_v1"
    observation_digest: Sha256Digest


class RecoveryDecision(Wire):
    protocol: Literal["tool_recovery_v1"] = "tool_recovery_v1"
    operation_id: NonEmpty
    disposition: Literal["completed", "parked"]
    reason_code: Literal["reconcile_matches_expected_state"] | ParkReasonCode
    outcome_event_id: NonEmpty | None = None
    evidence_event_ids: list[NonEmpty]

    @model_validator(mode="after")
    def _shape_matches_disposition(self) -> RecoveryDecision:
        # The key set depends on the disposition: only a completed decision names an outcome.
        if len(set(self.evidence_event_ids)) != len(self.evidence_event_ids) or not self.evidence_event_ids:
            raise ValueError("evidenceEventIds must be a non-empty list of distinct event ids")
        if self.disposition == "completed":
            if self.reason_code != "reconcile_matches_expected_state" or self.outcome_event_id is None:
                raise ValueError("a completed decision needs its reason and outcomeEventId")
        elif self.reason_code == "reconcile_matches_expected_state" or self.outcome_event_id is not None:
            raise ValueError("a parked decision has a park reason and no outcomeEventId")
        return self


class ToolRecovery(Wire):
    """A recovery fact envelope; only the recovery-bundle writer may persist one."""

    kind: Literal["maka.tool.reconcile_result", "maka.tool.recovery_decision"]
    version: Literal[1] = 1
    payload: ReconcileResult | RecoveryDecision

    @model_validator(mode="after")
    def _payload_matches_kind(self) -> ToolRecovery:
        expected = ReconcileResult if self.kind == "maka.tool.reconcile_result" else RecoveryDecision
        if not isinstance(self.payload, expected):
            raise ValueError(f"payload does not match kind {self.kind}")
        return self


class RuntimeProtocol(Wire):
    # The reference decoder refuses any other marker (isRuntimeProtocolMarker); the scanner's
    # own check still covers markers built in code without validation.
    tool_boundary: Literal["t1_after_preflight_v1"]


class PermissionAnswerAccepted(Wire):
    """An answer-accepted audit fact (permission or user question): ``{requestId}`` only."""

    request_id: NonEmpty


class PermissionClosureAccepted(Wire):
    request_id: NonEmpty
    reason: Literal["timed_out"]


class ImmediateSource(Wire):
    session_id: str
    invocation_id: str
    run_id: str
    turn_id: str
    high_water: Annotated[int, Field(gt=0)]
    prefix_digest: Sha256Digest


class ContinuationStart(Wire):
    # Optional: the tag's presence is preserved as read, so either spelling round-trips.
    protocol: Literal["continuation_start_v2"] | None = None
    provenance: Literal["runtime_admission", "claim_repair"]
    claim_id: str
    boundary_digest: Sha256Digest
    immediate_source: ImmediateSource
    replay_manifest_digest: Sha256Digest
    provider_projection_version: Literal[1] = 1
    provider_replay_digest: Sha256Digest


class Actions(Wire):
    state_delta: JsonObject | None = None
    artifact_delta: JsonObject | None = None
    permission_request: JsonObject | None = None
    permission_decision: JsonObject | None = None
    permission_answer_accepted: PermissionAnswerAccepted | None = None
    permission_closure_accepted: PermissionClosureAccepted | None = None
    user_question_request: JsonObject | None = None
    user_question_answer_accepted: PermissionAnswerAccepted | None = None
    transfer_to_agent: str | None = None
    end_invocation: bool | None = None
    token_usage: JsonObject | None = None
    tool_dispatch: ToolDispatch | None = None
    tool_recovery: ToolRecovery | None = None
    runtime_protocol: RuntimeProtocol | None = None
    continuation_start: ContinuationStart | None = None
    workspace_fact: Any = None
    _json_fields = frozenset(
        {
            "state_delta",
            "artifact_delta",
            "permission_request",
            "permission_decision",
            "user_question_request",
            "token_usage",
            "workspace_fact",
        }
    )

    @model_validator(mode="before")
    @classmethod
    def _payload_shapes(cls, data: Any) -> Any:
        if isinstance(data, dict):
            check_action_payloads(data)
        return data

    @model_validator(mode="after")
    def _closure_alone(self) -> Actions:
        for value in (self.artifact_delta or {}).values():
            # Artifact deltas are primitive counters and labels (reference isRuntimeEventActions).
            if not isinstance(value, str | bool | int | float) or (
                isinstance(value, float) and not math.isfinite(value)
            ):
                raise ValueError("artifactDelta values are strings, booleans or finite numbers")
        if self.permission_closure_accepted is not None and self.keys() != {"permissionClosureAccepted"}:
            raise ValueError("permissionClosureAccepted must be the only action key")
        return self

    def keys(self) -> set[str]:
        """The wire keys present on this actions object."""
        return set(self.to_wire())


class Refs(Wire):
    stored_message_id: str | None = None
    trace_event_id: str | None = None
    tool_call_id: str | None = None
    provider_event_id: str | None = None
    source_message_digest: Sha256Digest | None = None
    provider_request_trace_id: str | None = None
    artifact_id: str | None = None
    operation_id: str | None = None
    parent_tool_call_id: str | None = None
    parent_operation_id: str | None = None
    step_id: str | None = None
    source_invocation_id: str | None = None
    source_run_id: str | None = None
    source_turn_id: str | None = None
    source_runtime_event_high_water: Annotated[int, Field(ge=0)] | None = None

    def keys(self) -> set[str]:
        """The wire keys present on this refs object."""
        return set(self.to_wire())


# --- the envelope --------------------------------------------------------------------------


class RuntimeEvent(Wire):
    """One immutable fact in a session's ledger."""

    id: NonEmpty
    invocation_id: NonEmpty
    run_id: NonEmpty
    session_id: NonEmpty
    turn_id: NonEmpty
    # Unix ms; the reference decoder asks only for a finite number (isFiniteNumber).
    ts: int | float
    partial: bool
    role: Role
    author: Author
    branch: str | None = None
    origin: Origin | None = None
    model_visibility: Visibility | None = None
    status: EventStatus | None = None
    content: Content | None = None
    actions: Actions | None = None
    refs: Refs | None = None

    @model_validator(mode="after")
    def _finite_ts(self) -> RuntimeEvent:
        if isinstance(self.ts, float) and not math.isfinite(self.ts):
            raise ValueError("ts must be a finite number")
        return self

    @property
    def is_terminal(self) -> bool:
        """Terminal if its status is terminal or it ends the invocation."""
        return (self.status in TERMINAL_STATUSES) or bool(
            self.actions is not None and self.actions.end_invocation
        )

    @property
    def event_kind(self) -> str:
        """The SQLite ``event_kind`` column: the first of the reference's rules that applies."""
        if self.content is not None:
            return self.content.kind
        if self.status is not None:
            return self.status
        if self.actions is not None:
            if self.actions.workspace_fact is not None:
                return "workspace_fact"
            if self.actions.tool_dispatch is not None:
                return "tool_dispatch"
            if self.actions.end_invocation:
                return "invocation_end"
        return "runtime_fact"

    @property
    def hidden(self) -> bool:
        return self.model_visibility == "hidden"
