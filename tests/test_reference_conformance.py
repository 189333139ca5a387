"""Conformance with the reference implementation's own source (Apache Maka), rule by rule.

Each test names the reference rule it pins (file under ``github.com/apache/maka``). The rules were
read from the reference source; the cases here are written for this project's API. They cover
what the facts summary and the six example ledgers left open: decoder strictness, which event a
duplicate id resolves to, the args-identity bytes, and the Phase 0 plan's lookups.
"""

from __future__ import annotations

import copy
import hashlib
from typing import Any

import pytest

from maka_core.errors import CodecError, LedgerRejection
from maka_core.facts import canonical_json
from maka_core.facts.codec import canonical_args_hash, decode, digest, encode, from_json_object
from maka_core.facts.events import RuntimeEvent
from maka_core.ledger.resolver import resolve
from maka_core.ledger.resume_plan import plan_resume
from maka_core.ledger.scanner import writer_admission
from maka_core.store.writer import LedgerStore
from tests.ledger_factory import (
    call,
    completed_bundle,
    decision,
    dispatch,
    event,
    parked_bundle,
    reconcile,
    response,
    t1,
    terminal,
    text,
    user,
)

DIGEST = "sha256:" + "a" * 64
RUNTIME_EVENT = "packages/core/src/runtime-event.ts"
RECOVERY_FACT = "packages/core/src/tool-recovery-fact.ts"


def _base(**overrides: Any) -> dict[str, Any]:
    wire: dict[str, Any] = {
        "id": "event-1",
        "invocationId": "invocation-1",
        "runId": "run-1",
        "sessionId": "session-1",
        "turnId": "turn-1",
        "ts": 1000,
        "partial": False,
        "role": "model",
        "author": "agent",
    }
    wire.update(overrides)
    return wire


def _decision_payload(**overrides: Any) -> dict[str, Any]:
    payload: dict[str, Any] = {
        "protocol": "tool_recovery_v1",
        "operationId": "operation-1",
        "disposition": "completed",
        "reasonCode": "reconcile_matches_expected_state",
        "outcomeEventId": "event-2",
        "evidenceEventIds": ["event-1"],
    }
    payload.update(overrides)
    return {k: v for k, v in payload.items() if v is not _ABSENT}


_ABSENT: Any = object()


def _with_decision(payload: dict[str, Any]) -> dict[str, Any]:
    return _base(
        actions={"toolRecovery": {"kind": "maka.tool.recovery_decision", "version": 1, "payload": payload}}
    )


def _accepts(wire: dict[str, Any]) -> bool:
    try:
        from_json_object(copy.deepcopy(wire))
    except CodecError:
        return False
    return True


# --- the RuntimeEvent decoder (runtime-event.ts decodeRuntimeEvent) -----------------------


@pytest.mark.parametrize("key", ["id", "invocationId", "runId", "sessionId", "turnId"])
def test_envelope_identities_must_be_non_empty(key: str) -> None:
    """runtime-event.ts decodeRuntimeEvent: every envelope identity is a non-empty string."""
    assert not _accepts(_base(**{key: ""}))


@pytest.mark.parametrize("ts", [1000.5, -1, 0])
def test_ts_is_any_finite_number(ts: float) -> None:
    """runtime-event.ts decodeRuntimeEvent: ``ts`` need only be a finite number."""
    event = decode(canonical_json.dumps(_base(ts=ts)))
    assert decode(encode(event)) == event
    assert canonical_json.loads(encode(event))["ts"] == ts


def test_overflowing_ts_is_refused() -> None:
    """runtime-event.ts decodeRuntimeEvent: a ``ts`` that overflows a double is not finite."""
    with pytest.raises(CodecError):
        decode(
            '{"id":"e","invocationId":"i","runId":"r","sessionId":"s","turnId":"t","ts":1e400,'
            '"partial":false,"role":"model","author":"agent"}'
        )


@pytest.mark.parametrize("args", [[1, 2], "raw", None, 7, {}])
def test_function_call_args_may_be_any_json_value(args: Any) -> None:
    """runtime-event.ts isRuntimeEventContent: ``function_call.args`` is present, of any JSON type."""
    wire = _base(content={"kind": "function_call", "id": "c1", "name": "Bash", "args": args})
    event = from_json_object(wire)
    assert event.to_wire() == wire


def test_function_call_args_must_be_present() -> None:
    """runtime-event.ts isRuntimeEventContent: ``args`` is a required key."""
    assert not _accepts(_base(content={"kind": "function_call", "id": "c1", "name": "Bash"}))


def test_function_response_provider_output_may_be_null() -> None:
    """runtime-event.ts isRuntimeEventContent: ``providerOutput`` is unchecked, so null decodes."""
    wire = _base(
        role="tool",
        author="tool",
        content={
            "kind": "function_response",
            "id": "c1",
            "name": "Bash",
            "result": None,
            "providerOutput": None,
        },
    )
    assert from_json_object(wire).to_wire() == wire


def test_dispatch_args_hash_is_only_a_string_to_the_decoder() -> None:
    """runtime-event.ts isRuntimeToolDispatch: ``canonicalArgsHash`` is typed string, not a digest.

    A malformed hash decodes; the scanner then reports ``canonical_args_hash_conflict``
    (tool-ledger-scanner.ts), which is what the reference plans on.
    """
    fact = {
        "protocol": "t1_after_preflight_v1",
        "operationId": "operation-1",
        "providerToolCallId": "provider-call-1",
        "toolName": "Bash",
        "canonicalArgsHash": "sha256:args",
        "recoveryMode": "replay_safe",
    }
    assert _accepts(_base(actions={"toolDispatch": fact}))
    ledger = [user(), call(), dispatch(args_hash="sha256:args")]
    assert [(i.code, i.event_id) for i in resolve(ledger).issues] == [
        ("canonical_args_hash_conflict", "op-call-1_dispatch")
    ]


def test_unknown_runtime_protocol_marker_does_not_decode() -> None:
    """runtime-event.ts isRuntimeProtocolMarker: ``toolBoundary`` must be ``t1_after_preflight_v1``."""
    assert not _accepts(_base(actions={"runtimeProtocol": {"toolBoundary": "unknown"}}))
    assert _accepts(_base(actions={"runtimeProtocol": {"toolBoundary": "t1_after_preflight_v1"}}))


@pytest.mark.parametrize(
    "payload",
    [
        _decision_payload(outcomeEventId=_ABSENT),
        _decision_payload(outcomeEventId=""),
        _decision_payload(reasonCode="reconcile_diverged"),
        _decision_payload(disposition="parked", reasonCode="reconcile_diverged"),
        _decision_payload(
            disposition="parked", outcomeEventId=_ABSENT, reasonCode="reconcile_matches_expected_state"
        ),
        _decision_payload(evidenceEventIds=[]),
        _decision_payload(evidenceEventIds=["event-1", "event-1"]),
        _decision_payload(evidenceEventIds=["event-1", ""]),
        _decision_payload(operationId=""),
    ],
    ids=[
        "completed-without-outcome",
        "completed-empty-outcome",
        "completed-with-park-reason",
        "parked-with-outcome",
        "parked-with-expected-state-reason",
        "empty-evidence",
        "duplicate-evidence",
        "empty-evidence-id",
        "empty-operation-id",
    ],
)
def test_recovery_decision_shape_depends_on_disposition(payload: dict[str, Any]) -> None:
    """tool-recovery-fact.ts isToolRecoveryDecisionFact: exact keys per disposition, distinct evidence."""
    assert not _accepts(_with_decision(payload))


def test_valid_recovery_decisions_decode() -> None:
    """tool-recovery-fact.ts isToolRecoveryDecisionFact: the two legal shapes."""
    assert _accepts(_with_decision(_decision_payload()))
    parked = _decision_payload(
        disposition="parked", outcomeEventId=_ABSENT, reasonCode="reconcile_unreadable"
    )
    assert _accepts(_with_decision(parked))


def test_reconcile_operation_id_must_be_non_empty() -> None:
    """tool-recovery-fact.ts isToolReconcileResultFact: ``operationId`` is a non-empty string."""
    payload = {
        "protocol": "tool_reconcile_v1",
        "operationId": "",
        "observation": "diverged",
        "observationSchema": "state_identity_v1",
        "observationDigest": DIGEST,
    }
    fact = {"kind": "maka.tool.reconcile_result", "version": 1, "payload": payload}
    assert not _accepts(_base(actions={"toolRecovery": fact}))


@pytest.mark.parametrize(
    "actions",
    [
        {"transferToAgent": 3},
        {"artifactDelta": {"nested": {}}},
        {"artifactDelta": {"list": [1]}},
        {"stateDelta": []},
        {"permissionAnswerAccepted": {"requestId": ""}},
        {"userQuestionAnswerAccepted": {"requestId": ""}},
        {"permissionClosureAccepted": {"requestId": "", "reason": "timed_out"}},
    ],
)
def test_action_value_types(actions: dict[str, Any]) -> None:
    """runtime-event.ts isRuntimeEventActions: typed action values and non-empty request ids."""
    assert not _accepts(_base(actions=actions))


def test_valid_action_values_decode() -> None:
    """runtime-event.ts isRuntimeEventActions: string/boolean/number artifact deltas, string transfer."""
    actions = {
        "stateDelta": {"nested": {"value": 1}},
        "artifactDelta": {"name": "artifact", "ready": True, "bytes": 42},
        "transferToAgent": "agent-2",
        "endInvocation": True,
    }
    assert _accepts(_base(actions=actions))


@pytest.mark.parametrize("details", [["a", "b"], {"k": 1}])
def test_error_details_are_strings_or_an_object(details: Any) -> None:
    """runtime-event.ts isRuntimeEventContent: ``error.details`` is a string array or a record."""
    assert _accepts(_base(content={"kind": "error", "message": "m", "details": details}))


@pytest.mark.parametrize("details", [1, "text", [1], True])
def test_other_error_details_are_refused(details: Any) -> None:
    """runtime-event.ts isRuntimeEventContent: any other ``error.details`` is refused."""
    assert not _accepts(_base(content={"kind": "error", "message": "m", "details": details}))


def test_source_message_digest_is_a_sha256_digest() -> None:
    """runtime-event.ts isRuntimeEventRefs: ``sourceMessageDigest`` has the ``sha256:<hex>`` form."""
    assert _accepts(_base(refs={"sourceMessageDigest": DIGEST}))
    assert not _accepts(_base(refs={"sourceMessageDigest": "sha256:abc"}))


@pytest.mark.parametrize(("value", "ok"), [(0, True), (1.0, True), (1.5, False), (-1, False), (True, False)])
def test_source_high_water_is_a_non_negative_integer(value: Any, ok: bool) -> None:
    """runtime-event.ts isRuntimeEventRefs: ``sourceRuntimeEventHighWater`` is a safe integer >= 0."""
    line = canonical_json.dumps(_base()).replace(
        "}", f',"refs":{{"sourceRuntimeEventHighWater":{_js(value)}}}}}'
    )
    try:
        decode(line)
    except CodecError:
        accepted = False
    else:
        accepted = True
    assert accepted is ok


def _js(value: Any) -> str:
    if value is True:
        return "true"
    return repr(value)


def test_continuation_start_may_carry_its_protocol_tag() -> None:
    """runtime-event.ts isRuntimeContinuationStart: the v2 fact is tagged ``continuation_start_v2``."""
    start = {
        "protocol": "continuation_start_v2",
        "provenance": "runtime_admission",
        "claimId": "claim-1",
        "boundaryDigest": DIGEST,
        "immediateSource": {
            "sessionId": "s",
            "invocationId": "i",
            "runId": "r",
            "turnId": "t",
            "highWater": 3,
            "prefixDigest": DIGEST,
        },
        "replayManifestDigest": DIGEST,
        "providerProjectionVersion": 1,
        "providerReplayDigest": DIGEST,
    }
    wire = _base(role="system", author="system", actions={"continuationStart": start})
    assert from_json_object(wire).to_wire() == wire
    assert not _accepts(_base(actions={"continuationStart": {**start, "protocol": "continuation_start_v3"}}))


# --- canonicalToolArgsHash (tool-args-identity.ts) ------------------------------------------


def _sha(text: str) -> str:
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()


def test_args_identity_sorts_required_and_enum_arrays() -> None:
    """tool-args-identity.ts canonicalizeMainlineV1: arrays under ``required``/``enum`` are sorted."""
    args = {"enum": ["b", "a"], "items": ["b", "a"], "schema": {"required": ["path", "content"]}}
    expected = (
        '{"args":{"enum":["a","b"],"items":["b","a"],"schema":{"required":["content","path"]}},'
        '"toolName":"T"}'
    )
    assert canonical_args_hash("T", args) == _sha(expected)


def test_args_identity_sorts_with_locale_order_not_code_units() -> None:
    """tool-args-identity.ts canonicalizeMainlineV1: the sort is ``localeCompare`` (``a`` before ``B``)."""
    assert canonical_args_hash("T", {"enum": ["B", "a"]}) == _sha(
        '{"args":{"enum":["a","B"]},"toolName":"T"}'
    )
    assert canonical_args_hash("T", {"enum": ["b", "_x", "1"]}) == _sha(
        '{"args":{"enum":["_x","1","b"]},"toolName":"T"}'
    )


def test_args_identity_drops_proto_keys() -> None:
    """tool-args-identity.ts canonicalizeMainlineV1: a ``__proto__`` key never reaches the bytes."""
    assert canonical_args_hash("T", {"__proto__": 1, "a": 2}) == canonical_args_hash("T", {"a": 2})


def test_args_identity_needs_a_tool_name() -> None:
    """tool-args-identity.ts canonicalToolArgsHash: an empty tool name has no identity, so no T1
    can authenticate it (the scanner reports ``canonical_args_hash_conflict``)."""
    with pytest.raises(ValueError):
        canonical_args_hash("", {"a": 1})
    forged = _sha('{"args":{"command":"ls"},"toolName":""}')
    ledger = [user(), call(name=""), dispatch(name="", args_hash=forged)]
    assert [i.code for i in resolve(ledger).issues] == ["canonical_args_hash_conflict"]


# --- Resolver (recovery-resolver.ts) --------------------------------------------------------


def test_empty_tool_name_and_operation_id_are_reported_absent() -> None:
    """recovery-resolver.ts decisionFromOperation: ``toolName``/``operationId`` only when truthy."""
    op = resolve([user(), call(name="")]).to_json()["operations"][0]
    assert op["toolName"] is None
    assert op["status"] == "definitely_not_dispatched"


def test_recovery_order_uses_the_last_position_of_a_duplicated_id() -> None:
    """recovery-resolver.ts resolveRuntimeRecovery: ``eventOrder`` maps an id to its last position.

    A call id repeated after a valid bundle moves the call after its own decision, so the
    bundle's causal order fails (tool-recovery-bundle.ts interpretScannedToolRecovery).
    """
    first_call, first_dispatch = t1(recovery_mode="reconcile")
    ledger = [user(), first_call, first_dispatch, *completed_bundle(), first_call]
    resolution = resolve(ledger)
    op = resolution.operations[0]
    assert (op.status, op.reason, op.settlement_origin) == ("corruption", "recovery_fact_corruption", None)
    assert [(i.code, i.event_id) for i in resolution.issues] == [("duplicate_event_id", "evt-call-1")]


def test_recovery_order_is_unchanged_without_duplicates() -> None:
    """Negative control for the rule above: the same bundle with no repeated id completes."""
    first_call, first_dispatch = t1(recovery_mode="reconcile")
    op = resolve([user(), first_call, first_dispatch, *completed_bundle()]).operations[0]
    assert (op.status, op.reason) == ("completed", "recovery_bundle_completed")


def test_parked_bundle_with_duplicated_dispatch_id_is_recovery_corruption() -> None:
    """recovery-resolver.ts: the dispatch's last position follows the decision -> order conflict."""
    first_call, first_dispatch = t1(recovery_mode="reconcile")
    ledger = [user(), first_call, first_dispatch, *parked_bundle(), first_dispatch]
    op = resolve(ledger).operations[0]
    assert (op.status, op.reason) == ("corruption", "recovery_fact_corruption")


# --- Phase 0 plan (runtime-resume.ts) -------------------------------------------------------


def test_hidden_check_reads_the_last_event_with_the_call_id() -> None:
    """runtime-resume.ts hasHiddenIndeterminateOperation: ``eventsById`` keeps the last event per id.

    The hidden call is followed by a visible event reusing its id, so the reference does not see
    a hidden indeterminate operation: no verification, no hidden-call diagnostic.
    """
    hidden_call = call(model_visibility="hidden")
    reuse = text(id=hidden_call.id)
    plan = plan_resume([user(), hidden_call, dispatch(), reuse])
    assert plan.requires_verification is False
    assert plan.directive is None
    assert [d["code"] for d in plan.diagnostics] == ["duplicate_event_id"]
    assert plan.kind == "blocked"


def test_hidden_check_with_the_hidden_event_last() -> None:
    """runtime-resume.ts hasHiddenIndeterminateOperation: the later hidden event is the one read."""
    visible_call = call()
    reuse = text(id=visible_call.id, model_visibility="hidden")
    plan = plan_resume([user(), visible_call, dispatch(), reuse])
    assert plan.requires_verification is True
    assert [d["code"] for d in plan.diagnostics] == [
        "pending_tool_result",
        "duplicate_event_id",
        "pending_tool_result",
    ]
    assert (
        plan.diagnostics[2]["message"]
        == "hidden nested tool call has no matching committed function_response"
    )


def test_orphan_dispatch_diagnostic_omits_an_empty_tool_name() -> None:
    """runtime-resume.ts collectResumeDiagnostics: an orphan's ``toolName`` appears only when truthy."""
    plan = plan_resume([user(), dispatch(name="", args_hash=DIGEST)])
    orphan = [d for d in plan.diagnostics if d["code"] == "tool_recovery_corruption"]
    assert orphan == [
        {
            "code": "tool_recovery_corruption",
            "message": "tool recovery fact is corrupt: orphan_dispatch",
            "eventId": "op-call-1_dispatch",
            "toolCallId": "call-1",
        }
    ]


def test_replay_pairs_calls_by_call_id_across_invocations() -> None:
    """runtime-resume.ts collectPairedCallIds: pairing keys on the provider call id alone."""
    other = {"invocation_id": "inv-2", "run_id": "run-1", "turn_id": "turn-1"}
    ledger = [user(), *t1(), response(), call(id="evt-call-1b", **other), text()]
    plan = plan_resume(ledger)
    # The second invocation's call shares id call-1 with a paired call, so it is replayed too;
    # a dispatch has no content and is kept like any contentless event.
    assert plan.replay_event_ids == (
        "evt-user-1",
        "evt-call-1",
        "op-call-1_dispatch",
        "op-call-1_response",
        "evt-call-1b",
        "evt-model-1",
    )


def test_non_object_args_plan_like_any_call() -> None:
    """runtime-resume.ts projectToolOperations: a call's ``args`` are carried as they were committed."""
    wire = _base(
        id="evt-call-1",
        content={"kind": "function_call", "id": "call-1", "name": "Bash", "args": ["ls"]},
    )
    weird = from_json_object(wire)
    plan = plan_resume([user(), weird])
    assert plan.operations[0].args == ["ls"]
    assert plan.operations[0].status == "not_dispatched"


def test_event_factory_still_builds_reference_shapes() -> None:
    """Sanity: the factories used above produce events that pass the tightened decoder."""
    ledger: list[RuntimeEvent] = [user(), *t1(recovery_mode="reconcile"), *completed_bundle()]
    for item in ledger:
        assert decode(encode(item)) == item
    assert writer_admission(ledger)["admissible"] is True
    assert event("x", role="user", author="user").id == "x"


# --- text content (events.ts normalizeMessageContent / isMessageContent) --------------------


def _user_text(**content: Any) -> dict[str, Any]:
    return _base(role="user", author="user", content={"kind": "text", "text": "hello", **content})


def test_display_text_equal_to_text_is_dropped_from_the_canonical_line() -> None:
    """events.ts normalizeMessageContent: ``displayText`` is kept only when it differs from ``text``."""
    line = canonical_json.dumps(_user_text(displayText="hello"))
    canonical = encode(decode(line))
    assert "displayText" not in canonical
    assert canonical == canonical_json.dumps(_user_text())
    assert '"displayText":"Hello!"' in encode(decode(canonical_json.dumps(_user_text(displayText="Hello!"))))


def test_empty_attachments_and_quotes_are_dropped_but_empty_inline_references_kept() -> None:
    """events.ts normalizeMessageContent: empty attachments/quotes are omitted; an empty
    ``inlineReferences`` array is a marker and survives."""
    event = decode(canonical_json.dumps(_user_text(attachments=[], quotes=[], inlineReferences=[])))
    assert event.content is not None and event.content.to_wire() == {
        "kind": "text",
        "text": "hello",
        "inlineReferences": [],
    }


@pytest.mark.parametrize(
    ("origin", "ok"),
    [
        ({"kind": "automation", "automationId": "automation-1"}, True),
        ({"kind": "agent_graph", "graphId": "g", "wakeId": "w", "attemptId": "a"}, True),
        ({"kind": "scheduled_task", "scheduledTaskId": "t"}, True),
        ({"kind": "automation", "automationId": "automation-1", "extra": True}, False),
        ({"kind": "agent_graph", "graphId": "g", "wakeId": "w"}, False),
        ({"kind": "cron"}, False),
        ("automation", False),
    ],
)
def test_text_origin_is_a_turn_origin(origin: Any, ok: bool) -> None:
    """turn-origin.ts decodeTurnOrigin: each origin kind has an exact key set of strings."""
    assert _accepts(_user_text(origin=origin)) is ok


@pytest.mark.parametrize(
    ("attachment", "ok"),
    [
        (
            {
                "kind": "code",
                "name": "",
                "mimeType": "",
                "bytes": 0,
                "ref": {"kind": "workspace_file", "relativePath": ""},
            },
            True,
        ),
        (
            {
                "kind": "image",
                "name": "a.png",
                "mimeType": "image/png",
                "bytes": 9007199254740991,
                "ref": {"kind": "session_file", "sessionId": "s", "relativePath": "a.png"},
            },
            True,
        ),
        (
            {
                "kind": "code",
                "name": "a",
                "mimeType": "t",
                "bytes": 9007199254740992,
                "ref": {"kind": "workspace_file", "relativePath": "a"},
            },
            False,
        ),
        (
            {"kind": "code", "name": "a", "mimeType": "t", "bytes": 1, "ref": {"kind": "web", "url": "x"}},
            False,
        ),
        (
            {
                "kind": "movie",
                "name": "a",
                "mimeType": "t",
                "bytes": 1,
                "ref": {"kind": "external_file", "absolutePath": "/a"},
            },
            False,
        ),
    ],
)
def test_attachments_are_attachment_refs(attachment: dict[str, Any], ok: bool) -> None:
    """events.ts isAttachmentRef: exact keys, known kind, safe non-negative byte count, storage ref."""
    assert _accepts(_user_text(attachments=[attachment])) is ok


def test_inline_references_must_point_at_their_token() -> None:
    """events.ts isMessageContent: each inline reference's ``value`` sits at ``start`` in the shown text."""
    text = "run /skill:deploy on @src/app.py"
    skill = {"kind": "skill", "value": "/skill:deploy", "label": "deploy", "start": 4}
    path = {"kind": "workspace_file", "value": "@src/app.py", "label": "app.py", "start": 21}
    assert _accepts(_user_text(text=text, inlineReferences=[skill, path]))
    assert not _accepts(_user_text(text=text, inlineReferences=[{**skill, "start": 5}]))
    assert not _accepts(_user_text(text=text, inlineReferences=[path, skill]))  # out of order
    bad_path = {**path, "value": "@../etc", "start": 21}
    assert not _accepts(_user_text(text="run /skill:deploy on @../etc", inlineReferences=[bad_path]))


def test_inline_reference_offsets_count_utf16_units() -> None:
    """events.ts inlineReferencesMatchText: offsets are JavaScript (UTF-16) string offsets."""
    text = "😀 /skill:x"
    ref = {"kind": "skill", "value": "/skill:x", "label": "x", "start": 3}
    assert _accepts(_user_text(text=text, inlineReferences=[ref]))
    assert not _accepts(_user_text(text=text, inlineReferences=[{**ref, "start": 2}]))


def test_quotes_have_text_and_optional_label_and_source() -> None:
    """events.ts isQuoteRef: ``{text, label?, sourceTurnId?}`` strings only."""
    assert _accepts(_user_text(quotes=[{"text": "q", "label": "l", "sourceTurnId": "t"}]))
    assert not _accepts(_user_text(quotes=[{"label": "l"}]))
    assert not _accepts(_user_text(quotes=[{"text": "q", "page": 1}]))


# --- action payloads (usage-record-schema.ts, interaction-record-schema.ts) ----------------

_TOOL_PERMISSION = {
    "kind": "tool_permission",
    "requestId": "req-1",
    "toolUseId": "use-1",
    "toolName": "Bash",
    "category": "shell_unsafe",
    "reason": "shell_dangerous",
    "args": {"command": "rm -rf build"},
    "rememberForTurnAllowed": False,
}
_ESCALATION = {
    "kind": "sandbox_escalation",
    "requestId": "req-2",
    "toolUseId": "use-2",
    "toolName": "Bash",
    "category": "shell_unsafe",
    "reason": "sandbox_escalation",
    "command": "make",
    "cwd": "/w",
    "justification": "build",
    "intentHash": "h1",
    "commandHash": "h2",
    "trigger": "sandbox_denial",
    "risk": {
        "unsandboxedExecution": True,
        "unrestrictedFileSystem": True,
        "unrestrictedNetwork": True,
        "protectedMetadataExposed": True,
    },
    "alsoApprovesToolExecution": False,
    "availableDecisions": ["allow_once", "deny"],
}


@pytest.mark.parametrize(
    ("usage", "ok"),
    [
        ({"input": 3, "output": 1}, True),
        (
            {
                "input": 3,
                "output": 1.5,
                "costUsd": 0.1,
                "rawFinishReason": "stop",
                "prefixChangeReason": "stable",
            },
            True,
        ),
        (
            {
                "input": 3,
                "output": 1,
                "promptSegments": [{"kind": "current_user", "chars": 2, "estimatedTokens": 1}],
            },
            True,
        ),
        ({"input": 3}, False),
        ({"input": 3, "output": "1"}, False),
        ({"input": 3, "output": 1, "surprise": 1}, False),
        ({"input": 3, "output": 1, "prefixChangeReason": "because"}, False),
        ({"input": 3, "output": 1, "cacheMissInputSource": "guessed"}, False),
        (
            {
                "input": 3,
                "output": 1,
                "promptSegments": [{"kind": "other", "chars": 2, "estimatedTokens": 1}],
            },
            False,
        ),
        ({"input": 3, "output": 1, "contextBudget": {"enabled": "yes"}}, False),
    ],
)
def test_token_usage_shape(usage: dict[str, Any], ok: bool) -> None:
    """usage-record-schema.ts isTokenUsageFields: numeric input/output, typed optional fields."""
    assert _accepts(_base(actions={"tokenUsage": usage})) is ok


@pytest.mark.parametrize(
    ("request_", "ok"),
    [
        (_TOOL_PERMISSION, True),
        ({**_TOOL_PERMISSION, "hint": "careful"}, True),
        (_ESCALATION, True),
        ({}, False),
        ({**_TOOL_PERMISSION, "reason": "whim"}, False),
        ({**_TOOL_PERMISSION, "rememberForTurnAllowed": "no"}, False),
        ({k: v for k, v in _TOOL_PERMISSION.items() if k != "args"}, False),
        ({**_ESCALATION, "risk": {**_ESCALATION["risk"], "unrestrictedNetwork": False}}, False),
        ({**_ESCALATION, "toolName": "Write"}, False),
        ({**_ESCALATION, "availableDecisions": ["deny", "allow_once"]}, False),
    ],
)
def test_permission_request_shape(request_: dict[str, Any], ok: bool) -> None:
    """interaction-record-schema.ts isPermissionRequestPayload: the key set and rules of each kind."""
    assert _accepts(_base(actions={"permissionRequest": request_})) is ok


@pytest.mark.parametrize(
    ("decision", "ok"),
    [
        ({"requestId": "r", "decision": "allow", "rememberForTurn": True, "toolName": "Bash"}, True),
        ({"requestId": "r", "decision": "maybe"}, False),
        ({"requestId": "r", "decision": "deny", "toolName": ""}, False),
        ({"requestId": "r", "decision": "deny", "extra": 1}, False),
    ],
)
def test_permission_decision_shape(decision: dict[str, Any], ok: bool) -> None:
    """runtime-event.ts isRuntimeEventPermissionDecision: allow/deny, typed optional fields."""
    assert _accepts(_base(actions={"permissionDecision": decision})) is ok


def test_user_question_request_shape() -> None:
    """interaction-record-schema.ts isUserQuestionRequest: questions of labelled options."""
    question = {"question": "Go?", "options": [{"label": "Yes", "description": "go"}, {"label": "No"}]}
    request = {"requestId": "q", "toolUseId": "u", "questions": [question]}
    assert _accepts(_base(actions={"userQuestionRequest": request}))
    bad = {**request, "questions": [{**question, "options": [{"label": 1}]}]}
    assert not _accepts(_base(actions={"userQuestionRequest": bad}))


# --- writer admission (tool-ledger-scanner.ts validateToolLedgerTransition) ----------------


def _retry_pair(first: dict[str, Any], second: dict[str, Any]) -> str | None:
    from maka_core.errors import LedgerRejection
    from maka_core.ledger.scanner import LedgerScanner

    scanner = LedgerScanner()
    scanner.apply(from_json_object(_base(id="evt-c9", content=_CALL_C9)))
    scanner.apply(from_json_object(first))
    try:
        scanner.admit([from_json_object(second)], "generic_append")
    except LedgerRejection as rejection:
        return rejection.code
    return None


_CALL_C9 = {"kind": "function_call", "id": "c9", "name": "Bash", "args": {}}


def test_exact_retry_compares_values_strictly() -> None:
    """tool-ledger-scanner.ts validateToolLedgerTransition: a committed id is skipped only when the
    candidate is deep-strict-equal; ``null`` versus absent and ``true`` versus ``1`` differ."""
    response_ = {"kind": "function_response", "id": "c9", "name": "Bash", "result": "ok"}
    plain = _base(role="tool", author="tool", content=response_)
    with_null = _base(role="tool", author="tool", content={**response_, "providerOutput": None})
    assert _retry_pair(plain, plain) is None
    assert _retry_pair(plain, with_null) == "duplicate_event_id"
    assert _retry_pair(
        _base(actions={"stateDelta": {"x": True}}), _base(actions={"stateDelta": {"x": 1}})
    ) == ("duplicate_event_id")


# --- ledger import = Maka's writers, transition by transition (sqlite-runtime-store.ts) -------

BUNDLE = "packages/core/src/tool-recovery-bundle.ts"


def _import_refusal(store: LedgerStore, ledger: list[RuntimeEvent]) -> LedgerRejection:
    before = store.events()
    with pytest.raises(LedgerRejection) as err:
        store.import_events(ledger)
    assert store.events() == before, "a refused import must write nothing"
    return err.value


def _prepared() -> list[RuntimeEvent]:
    return [user(), *t1(recovery_mode="reconcile")]


def _bad_outcome_bundle() -> list[RuntimeEvent]:
    rec, out, dec = completed_bundle()
    failed = response(result="boom", id=out.id, is_error=True)
    return [rec, failed, dec]


def _evidence_out_of_order() -> list[RuntimeEvent]:
    rec, _ = parked_bundle()
    dec = decision(
        evidence=["op-call-1_dispatch", "evt-call-1", rec.id],
        disposition="parked",
        reason_code="reconcile_matches_prior_state",
    )
    return [rec, dec]


def _completed_without_expected_state() -> list[RuntimeEvent]:
    _, out, dec = completed_bundle()
    return [reconcile(observation="diverged"), out, dec]


def _parked_reason_mismatch() -> list[RuntimeEvent]:
    rec = reconcile(observation="diverged")
    dec = decision(disposition="parked", reason_code="reconcile_matches_prior_state")
    return [rec, dec]


def _outcome_for_parked() -> list[RuntimeEvent]:
    rec, dec = parked_bundle()
    return [rec, response(result="ok", id="op-call-1_recovered"), dec]


INVALID_BUNDLES = {
    "outcome_not_successful": (_prepared, _bad_outcome_bundle),
    "evidence_order_conflict": (_prepared, _evidence_out_of_order),
    "reconcile_decision_conflict": (_prepared, _completed_without_expected_state),
    "reconcile_decision_conflict-parked": (_prepared, _parked_reason_mismatch),
    "recovery_mode_unsupported": (lambda: [user(), *t1()], parked_bundle),
    "outcome_for_parked": (_prepared, _outcome_for_parked),
}


@pytest.mark.parametrize("case", INVALID_BUNDLES)
def test_import_refuses_a_bundle_the_bundle_writer_refuses(store: LedgerStore, case: str) -> None:
    """tool-recovery-bundle.ts validateToolRecoveryEventBundle: the bare transition check admits
    each of these bundles, the bundle writer (and so import, which admits a bundle as the live
    bundle writer does) does not."""
    prefix, bundle = INVALID_BUNDLES[case]
    ledger = [*prefix(), *bundle()]
    assert writer_admission(ledger)["admissible"] is True
    refusal = _import_refusal(store, ledger)
    assert refusal.code == case.split("-")[0]
    assert refusal.detail["eventId"] == "op-call-1_reconcile"
    assert refusal.detail["operationId"] == "op-call-1"


@pytest.mark.parametrize("bundle", [completed_bundle, parked_bundle])
def test_import_admits_a_valid_bundle(store: LedgerStore, bundle: Any) -> None:
    """Negative control for the refusals above: the same prefix with a valid bundle imports."""
    ledger = [*_prepared(), *bundle(), terminal()]
    assert store.import_events(ledger).imported == len(ledger)
    assert store.verify() == []


class _BundleFirstStore(LedgerStore):
    """Today's (issue 23) import order, kept as the negative control: the bundle writer's own
    validation ahead of the transition check."""

    def _admit_group(self, conn: Any, transition: Any, batch: Any, **kwargs: Any) -> Any:
        if transition == "recovery_bundle":
            self._scope(conn, batch[0].session_id).view.scanner.check_bundle(batch)
        return super()._admit_group(conn, transition, batch, **kwargs)


def _name_mismatch() -> list[RuntimeEvent]:
    rec, out, dec = completed_bundle()
    return [rec, response(name="Read", id=out.id), dec]


def _reconcile_of_another_turn() -> list[RuntimeEvent]:
    _, dec = parked_bundle()
    return [reconcile(turn_id="turn-2"), dec]


def _decision_id_collides() -> list[RuntimeEvent]:
    rec, out, dec = _bad_outcome_bundle()
    return [rec, out, dec.model_copy(update={"id": "evt-user-1"})]


TRANSITION_FIRST = {
    # case: (bundle, the reference's code and event, the bundle rules' code alone)
    "recovered-response-of-another-tool": (
        _name_mismatch,
        ("identity_conflict", "op-call-1_recovered"),
        "outcome_identity_conflict",
    ),
    "reconcile-of-another-turn": (
        _reconcile_of_another_turn,
        ("invocation_identity_conflict", "op-call-1_reconcile"),
        "recovery_fact_identity_conflict",
    ),
    "decision-id-already-committed": (
        _decision_id_collides,
        ("duplicate_event_id", "evt-user-1"),
        "outcome_not_successful",
    ),
}


@pytest.mark.parametrize("case", TRANSITION_FIRST)
def test_a_bundle_gets_the_transition_check_before_the_bundle_rules(
    store: LedgerStore, tmp_path: Any, case: str
) -> None:
    """tool-ledger-scanner.ts validateToolLedgerTransition comes first: the reference's answers
    (issue 23, hidden ledgers) report the scan's code for a bundle that also breaks the bundle
    rules of tool-recovery-bundle.ts. The live bundle writer and import share that admission."""
    build, (code, event_id), bundle_code = TRANSITION_FIRST[case]
    store.import_events(_prepared())
    refusal = _import_refusal(store, build())
    assert (refusal.code, refusal.detail["eventId"]) == (code, event_id)
    assert refusal.detail["transition"] == "recovery_bundle"
    rec, *rest = build()
    live = _live_bundle_refusal(store, rec, rest)
    assert (live.code, live.detail["eventId"]) == (code, event_id), "the live writer must agree"
    # Negative control: the bundle rules run first (today's import) answer the other code.
    with _BundleFirstStore.open(tmp_path / "bundle-first.sqlite") as first:
        first.import_events(_prepared())
        assert _import_refusal(first, build()).code == bundle_code


def _live_bundle_refusal(store: LedgerStore, rec: RuntimeEvent, rest: list[RuntimeEvent]) -> LedgerRejection:
    outcome, dec = (rest[0], rest[1]) if len(rest) == 2 else (None, rest[0])
    with pytest.raises(LedgerRejection) as err:
        store.commit_recovery_bundle(rec, dec, outcome)
    return err.value


def _oracle(ledger: list[RuntimeEvent]) -> tuple[bool, str | None, str | None, list[str] | None]:
    """The repository's reproduction of the reference oracle's ``writerAdmission``."""
    answer = writer_admission(ledger)
    first = answer.get("firstRejection") or {}
    return answer["admissible"], first.get("code"), first.get("eventId"), first.get("eventIds")


@pytest.mark.parametrize(
    "ledger",
    [
        [user(), user()],
        [user(), call(), terminal(), terminal()],
        [user(), *t1(), *t1()],
        [*_prepared(), *completed_bundle(), *completed_bundle()],
    ],
    ids=["first-user-event-twice", "terminal-twice-at-the-end", "t1-pair-twice", "bundle-twice"],
)
def test_a_repeat_on_the_last_line_is_an_exact_retry(store: LedgerStore, ledger: list[RuntimeEvent]) -> None:
    """Issue 23, the reference's answer: a line repeating an earlier admitted event is an
    idempotent retry; with nothing after it the file imports, and the event is stored once."""
    result = store.import_events(ledger)
    unique = list({e.id: e for e in ledger}.values())
    assert (result.imported, result.existing) == (len(unique), len(ledger) - len(unique))
    assert store.events() == unique
    assert _oracle(ledger)[0] is True


@pytest.mark.parametrize(
    ("ledger", "repeated", "refused"),
    [
        ([user(), call(), call(), terminal()], "evt-call-1", ["evt-terminal-1"]),
        ([user(), user(), text()], "evt-user-1", ["evt-model-1"]),
        ([user(), user(), *t1()], "evt-user-1", ["evt-call-1", "op-call-1_dispatch"]),
        ([*_prepared(), *t1(recovery_mode="reconcile"), *completed_bundle()], "evt-call-1", None),
    ],
    ids=["call-twice", "user-twice-then-text", "user-twice-then-t1", "t1-twice-then-bundle"],
)
def test_every_transition_after_a_repeat_is_duplicate_event_id(
    store: LedgerStore, ledger: list[RuntimeEvent], repeated: str, refused: list[str] | None
) -> None:
    """tool-ledger-scanner.ts validateToolLedgerTransition: the prefix read so far holds the
    repeated id twice, so its scan is corrupt and the next transition (whatever it is) is
    refused with that scan's first issue: ``duplicate_event_id`` at the repeated id."""
    refusal = _import_refusal(store, ledger)
    assert (refusal.code, refusal.detail["eventId"]) == ("duplicate_event_id", repeated)
    assert _oracle(ledger)[1:3] == ("duplicate_event_id", repeated)
    if refused is not None:
        assert refusal.detail["eventIds"] == refused == _oracle(ledger)[3]
    # Negative control: without the repeat the same file imports.
    seen: set[str] = set()
    deduped = [e for e in ledger if not (e.id in seen or seen.add(e.id))]  # type: ignore[func-returns-value]
    assert store.import_events(deduped).imported == len(deduped)


def test_a_repeat_of_an_event_committed_before_the_import_poisons_nothing(store: LedgerStore) -> None:
    """A file's event already in the ledger is a retried write (re-importing is idempotent);
    only a file that repeats its own line holds an id twice."""
    store.import_events([user()])
    assert store.import_events([user(), *t1(), response(), terminal()]).imported == 4


def _bundle_missing_its_decision() -> list[RuntimeEvent]:
    rec, dec = parked_bundle()
    return [*_prepared(), rec, text(), dec]


FIRST_FAILURE = {
    # case: (ledger ending in a repeated first event, the failing transition's code and event)
    "invalid-bundle": (
        lambda: [*_prepared(), *_bad_outcome_bundle()],
        "outcome_not_successful",
        "op-call-1_reconcile",
    ),
    "orphan-response": (
        lambda: [user(), response(), call(), dispatch()],
        "orphan_response",
        "op-call-1_response",
    ),
    "unsupported-mode": (
        lambda: [user(), *t1(), *parked_bundle()],
        "recovery_mode_unsupported",
        "op-call-1_reconcile",
    ),
    "duplicate-dispatch": (
        lambda: [user(), call(), dispatch(), dispatch(id="op-call-1_dispatch_dup")],
        "duplicate_dispatch",
        "op-call-1_dispatch_dup",
    ),
    "reconcile-without-its-decision": (
        _bundle_missing_its_decision,
        "transition_shape_conflict",
        "op-call-1_reconcile",
    ),
    "semantic-lane": (
        lambda: [user(), call(role="user", author="user")],
        "semantic_lane_conflict",
        "evt-call-1",
    ),
    "invocation-identity": (
        lambda: [user(), text(turn_id="turn-2")],
        "invocation_identity_conflict",
        "evt-model-1",
    ),
    "dispatch-before-call": (
        lambda: [user(), dispatch(), call(operation_id="op-call-1")],
        "event_order_conflict",
        "op-call-1_dispatch",
    ),
    "second-call-of-a-prepared-operation": (
        lambda: [user(), *t1(), call(id="evt-call-1b", operation_id="op-call-1")],
        "duplicate_call",
        "evt-call-1b",
    ),
}


@pytest.mark.parametrize("case", FIRST_FAILURE)
def test_the_first_failing_transition_reports_its_own_code(store: LedgerStore, case: str) -> None:
    """Issue 23, the reference's answer: import replays the file in order and the refusal is the
    first transition that fails, with that transition's code; a repeat later in the file does
    not make it ``duplicate_event_id`` (nothing is checked across the whole file first)."""
    build, code, event_id = FIRST_FAILURE[case]
    ledger = [*build(), user()]
    refusal = _import_refusal(store, ledger)
    assert (refusal.code, refusal.detail["eventId"]) == (code, event_id)
    if case not in ("invalid-bundle", "unsupported-mode"):  # the bundle rules are not the oracle's
        assert _oracle(ledger)[1:3] == (code, event_id)
    # Negative control: the repeat moved ahead of the failing transition is what refuses the file.
    first, *rest = build()
    assert _import_refusal(store, [first, first, *rest]).code == "duplicate_event_id"


_BIG_ARGS_LINE = (
    '{"author":"agent","content":{"args":{"count":9007199254740993,"seed":123456789012345678901234567890},'
    '"id":"call-1","kind":"function_call","name":"Bash"},"id":"evt-call-1","invocationId":"inv-1",'
    '"partial":false,"refs":{"operationId":"op-call-1","toolCallId":"call-1"},"role":"model",'
    '"runId":"run-1","sessionId":"sess-1","ts":1767225600000,"turnId":"turn-1"}'
)
#: What Maka hashes: JSON.stringify of the doubles JSON.parse read.
_BIG_ARGS_HASH = digest('{"args":{"count":9007199254740992,"seed":1.2345678901234568e+29},"toolName":"Bash"}')


def test_integer_args_past_2_53_decode_to_doubles_and_plan_normally(store: LedgerStore) -> None:
    """runtime-event.ts decodeRuntimeEvent reads the line with JSON.parse, so an integer literal
    past 2**53 is the nearest double; tool-args-identity.ts hashes that double."""
    big_call = decode(_BIG_ARGS_LINE)
    assert big_call.content is not None and big_call.content.kind == "function_call"
    assert canonical_args_hash("Bash", big_call.content.args) == _BIG_ARGS_HASH
    ledger = [user(), big_call, dispatch(args_hash=_BIG_ARGS_HASH), response(), terminal()]
    assert writer_admission(ledger)["admissible"] is True
    assert store.import_events(ledger).imported == len(ledger)
    stored = store.events()
    assert encode(stored[1]) == _BIG_ARGS_LINE.replace("9007199254740993", "9007199254740992").replace(
        "123456789012345678901234567890", "1.2345678901234568e+29"
    )
    plan = plan_resume(stored)
    assert plan.kind == "safe_replay"
    assert [op.status for op in plan.operations] == ["succeeded"]
    # Negative control: a dispatch that hashed the literal's own digits does not authenticate T1.
    wrong = digest(
        '{"args":{"count":9007199254740993,"seed":123456789012345678901234567890},"toolName":"Bash"}'
    )
    assert [i.code for i in resolve([user(), big_call, dispatch(args_hash=wrong)]).issues] == [
        "canonical_args_hash_conflict"
    ]


def test_a_parked_operation_takes_only_its_exact_bundle_again(store: LedgerStore) -> None:
    """recovery-persistence-authority.test.ts "makes one parked bundle terminal and only permits
    its exact retry": the exact bundle again is idempotent, a different one is refused."""
    store.import_events([*_prepared(), *parked_bundle()])
    assert store.import_events(parked_bundle()).imported == 0
    assert _import_refusal(store, parked_bundle(observation="diverged")).code == "duplicate_event_id"
    # A second, self-consistent bundle under fresh ids is refused too (the operation is settled).
    _import_refusal(store, parked_bundle(observation="diverged", suffix="-2"))
    assert store.operation("op-call-1").current_state == "recovery_parked"  # type: ignore[union-attr]


# --- ``maka ledger plan FILE``: the file is one ledger (runtime-resume.ts, recovery-resolver.ts) ---

_RUN_2 = {"session_id": "sess-1", "run_id": "run-2", "invocation_id": "inv-2", "turn_id": "turn-2"}


def _plan_file(tmp_path: Any, ledger: list[RuntimeEvent], *flags: str) -> dict[str, Any]:
    import json

    from click.testing import CliRunner

    from maka_temporal.workers.cli.ledger import ledger as ledger_group

    path = tmp_path / "ledger.jsonl"
    path.write_text("".join(encode(e) + "\n" for e in ledger))
    result = CliRunner().invoke(ledger_group, ["plan", str(path), "--json", *flags])
    assert result.exit_code == 0, result.output
    out: dict[str, Any] = json.loads(result.output)
    return out


def test_plan_file_plans_two_invocations_of_one_session_as_one_ledger(tmp_path: Any) -> None:
    """Issue 23, the reference's answer: a file holding two runs of one session, one protocol
    marker on its first event, is planned whole: that marker is the file's protocol, both
    operations complete, both turns replay, high-water 7."""
    ledger = [user(), *t1(), response(), *t1("call-2", **_RUN_2), response("call-2", **_RUN_2)]
    out = _plan_file(tmp_path, ledger)
    recovery, plan = out["recovery"], out["resumePlan"]
    assert recovery["toolBoundaryProtocol"] == "t1_after_preflight_v1"
    assert [(op["toolCallId"], op["status"]) for op in recovery["operations"]] == [
        ("call-1", "completed"),
        ("call-2", "completed"),
    ]
    assert (plan["kind"], plan["highWater"]) == ("safe_replay", 7)
    assert plan["replayEventIds"] == [e.id for e in ledger]
    assert "runs" not in out
    # Negative control: the per-run view (main's answer for a FILE, now behind --per-run) plans
    # only the latest run, whose first event carries no marker.
    per_run = _plan_file(tmp_path, ledger, "--per-run")
    assert per_run["recovery"]["toolBoundaryProtocol"] is None
    assert per_run["resumePlan"]["highWater"] == 3 and [r["runId"] for r in per_run["runs"]] == [
        "run-1",
        "run-2",
    ]


def test_plan_file_reports_an_invocation_crossing_runs_as_corruption(tmp_path: Any) -> None:
    """Issue 23, the reference's answer: one invocation id on two runs is a ledger issue of the
    whole file, so the plan blocks with dangling_tool_state / tool_ledger_corruption."""
    ledger = [user(), text(run_id="run-2", turn_id="turn-2")]
    plan = _plan_file(tmp_path, ledger)["resumePlan"]
    assert (plan["kind"], plan["rejectionReasons"]) == ("blocked", ["dangling_tool_state"])
    assert [(d["code"], d["detail"]["issueCode"]) for d in plan["diagnostics"]] == [
        ("tool_ledger_corruption", "invocation_identity_conflict")
    ]
    # Negative control: run by run, each run alone is clean (main's safe_replay).
    assert _plan_file(tmp_path, ledger, "--per-run")["resumePlan"]["kind"] == "safe_replay"


# --- ``maka ledger plan-continuation``: the INPUT document is read with JSON.parse ---------------


def _continuation_text(*, high_water: str = "5", ts: str | None = None, tail: str = "") -> str:
    """A document whose source run continues, as INPUT.json text; ``high_water``, ``ts`` (of
    the first ledger event) and ``tail`` (extra observation keys) are spliced in as raw JSON."""
    import json

    from tests.ledger_factory import CWD, RUN, SESSION, WORKSPACE, run_header, wire

    ledger = wire([user(), *t1(), response(), terminal()])
    if ts is not None:
        ledger[0]["ts"] = "@TS@"
    doc = {
        "sessionId": SESSION,
        "sourceRunId": RUN,
        "observation": {
            "currentCwd": CWD,
            "sourceWorkspaceIdentity": WORKSPACE,
            "currentWorkspaceIdentity": WORKSPACE,
            "backgroundOperationsSettled": True,
            "availableToolNames": ["Bash"],
            "expectedRuntimeEventHighWater": "@HW@",
        },
        "runs": {RUN: run_header(createdAt="@CREATED@")},
        "ledgers": {RUN: ledger},
        "ids": ["inv-2", "run-2", "turn-2", "claim-2"],
    }
    text = json.dumps(doc).replace('"@HW@"', high_water + tail).replace('"@CREATED@"', "-0")
    return text.replace('"@TS@"', ts or "")


def _plan_text(text: str) -> dict[str, Any]:
    from maka_core.ledger.continuation_document import parse_document, plan_continuation_document

    return plan_continuation_document(parse_document(text.encode()))


def test_plan_continuation_reads_minus_zero_as_javascript_does() -> None:
    """Issue 23, the reference's answer: its JSON.parse reads ``-0`` as a number equal to 0 and
    plans normally (``-0 !== 5`` is a runtime_offset_mismatch park, printed as 0); a ``-0`` the
    planner only carries (a header's createdAt here) changes nothing."""
    result = _plan_text(_continuation_text(high_water="-0"))
    assert (result["disposition"], result["rejectionReasons"]) == ("park", ["runtime_offset_mismatch"])
    assert result["diagnostics"][0]["detail"] == {"expected": 0, "actual": 5}
    assert str(result["diagnostics"][0]["detail"]["expected"]) == "0"
    assert _plan_text(_continuation_text())["disposition"] == "continue"
    # Negative control: the ledger's lossless reading (main's) refuses the same document.
    with pytest.raises(CodecError):
        canonical_json.loads(_continuation_text(high_water="-0"))


def test_a_minus_zero_inside_a_ledger_event_leaves_the_ledger_unreadable() -> None:
    """canonical-runtime-event.ts encodeCanonicalRuntimeEvent: an event whose stable JSON does not
    give it back (``ts: -0`` comes back as 0) fails canonical decoding, so the source prefix is
    unreadable (runtime-resume.ts: runtime_ledger_unreadable), while the same event with 0 plans."""
    result = _plan_text(_continuation_text(ts="-0"))
    assert (result["disposition"], result["rejectionReasons"]) == ("park", ["runtime_ledger_unreadable"])
    assert _plan_text(_continuation_text(ts="0"))["disposition"] == "continue"


@pytest.mark.parametrize(
    ("high_water", "tail", "expected"),
    [
        ("5.0", "", None),  # 1.0 is the number 1
        ("5", ', "backgroundOperationsSettled": false', "background_operation_pending"),  # last key wins
        ("1e400", "", "runtime_offset_mismatch"),  # Infinity, printed null
        ("9007199254740993", "", "runtime_offset_mismatch"),  # the nearest double
    ],
    ids=["integral-double", "duplicate-key-last-wins", "overflow-is-infinity", "past-2-53"],
)
def test_plan_continuation_reads_other_javascript_numbers_and_keys(
    high_water: str, tail: str, expected: str | None
) -> None:
    """JSON.parse: doubles for every number, the last of a repeated key (at its first place)."""
    result = _plan_text(_continuation_text(high_water=high_water, tail=tail))
    assert result["rejectionReasons"] == ([] if expected is None else [expected])
    if high_water == "1e400":
        assert result["diagnostics"][0]["detail"] == {"expected": None, "actual": 5}
    if high_water == "9007199254740993":
        expected_value = result["diagnostics"][0]["detail"]["expected"]
        assert (expected_value, type(expected_value)) == (2**53, int)  # printed 9007199254740992


@pytest.mark.parametrize("text", ['{"a": NaN}', '{"a": Infinity}', '{"a": "\\ud800"}', "{", '\ufeff{"a": 1}'])
def test_plan_continuation_refuses_what_is_not_json_text(text: str) -> None:
    """JSON.parse refuses NaN, Infinity, truncated text and a BOM; a lone surrogate, which it
    accepts, is refused here too (no UTF-8 form to print or hash), with the same stable code."""
    from maka_core.errors import ConfigError
    from maka_core.ledger.continuation_document import parse_document

    with pytest.raises(ConfigError) as err:
        parse_document(text.encode("utf-8", "surrogatepass"))
    assert err.value.code == "continuation_input_invalid"
