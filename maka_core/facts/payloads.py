"""Shapes the reference decoder checks inside free-form parts of a RuntimeEvent.

Text content: attachments, quotes, inline references and origin (reference ``isMessageContent``
in ``packages/core/src/events.ts``, ``decodeTurnOrigin`` in ``turn-origin.ts``); offsets and
lengths count UTF-16 code units, as JavaScript strings do. Actions: token usage, permission
requests and decisions, user questions (``usage-record-schema.ts``,
``interaction-record-schema.ts``). Where the reference leans on vocabularies defined elsewhere
(tool categories, reviewers, risk levels, permission profiles) only the JSON type is checked,
so a ledger the reference wrote is never refused here.
"""

from __future__ import annotations

import re
from typing import Any

_MAX_SAFE = 2**53 - 1
_ATTACHMENT_KINDS = frozenset({"image", "pdf", "doc", "code", "other"})
_STORAGE_REF_KEYS = {
    "session_file": frozenset({"kind", "sessionId", "relativePath"}),
    "workspace_file": frozenset({"kind", "relativePath"}),
    "external_file": frozenset({"kind", "absolutePath"}),
}
_ORIGIN_KEYS = {
    "scheduled_task": frozenset({"kind", "scheduledTaskId"}),
    "automation": frozenset({"kind", "automationId"}),
    "legacy_automation": frozenset({"kind", "automationId"}),
    "goal": frozenset({"kind", "goalId"}),
    "agent_graph": frozenset({"kind", "graphId", "wakeId", "attemptId"}),
    "workhub_result": frozenset(
        {"kind", "eventId", "actionId", "delegationId", "targetSessionId", "targetTurnId"}
    ),
}
_SKILL_TOKEN = re.compile(r"/skill:[A-Za-z0-9._-]+")


def _storage_keys(ref: dict[str, Any]) -> frozenset[str]:
    return _STORAGE_REF_KEYS.get(str(ref.get("kind")), frozenset())


def _utf16(text: str) -> bytes:
    # JavaScript string lengths and offsets count UTF-16 code units.
    return text.encode("utf-16-le", "surrogatepass")


def _safe_index(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= _MAX_SAFE


def _all_str(value: dict[str, Any], keys: frozenset[str]) -> bool:
    return set(value) == keys and all(isinstance(value[k], str) for k in keys)


def _canonical_relative_path(path: str) -> bool:
    return (
        bool(path)
        and "\0" not in path
        and "\\" not in path
        and not path.startswith("/")
        and re.match(r"[A-Za-z]:", path) is None
        and all(seg not in ("", ".", "..") for seg in path.split("/"))
    )


def _inline_reference_ok(ref: Any) -> bool:
    if not isinstance(ref, dict) or set(ref) != {"kind", "value", "label", "start"}:
        return False
    value, label = ref["value"], ref["label"]
    if not (isinstance(value, str) and isinstance(label, str) and _safe_index(ref["start"])):
        return False
    if not (0 < len(_utf16(value)) // 2 <= 4096 and 0 < len(_utf16(label)) // 2 <= 200):
        return False
    if ref["kind"] == "skill":
        return _SKILL_TOKEN.fullmatch(value) is not None
    return ref["kind"] == "workspace_file" and value.startswith("@") and _canonical_relative_path(value[1:])


def check_message_extras(data: dict[str, Any]) -> None:
    """Refuse what the reference's ``isMessageContent`` and ``decodeTurnOrigin`` refuse."""

    def get(wire: str, name: str) -> Any:
        return data.get(wire, data.get(name))

    for attachment in get("attachments", "attachments") or []:
        ok = (
            isinstance(attachment, dict)
            and set(attachment) == {"kind", "name", "mimeType", "bytes", "ref"}
            and attachment["kind"] in _ATTACHMENT_KINDS
            and isinstance(attachment["name"], str)
            and isinstance(attachment["mimeType"], str)
            and _safe_index(attachment["bytes"])
            and isinstance(attachment["ref"], dict)
            and _all_str(attachment["ref"], _storage_keys(attachment["ref"]))
        )
        if not ok:
            raise ValueError("attachment is not an AttachmentRef")
    for quote in get("quotes", "quotes") or []:
        if not (isinstance(quote, dict) and "text" in quote and _all_str(quote, frozenset(quote))) or not set(
            quote
        ) <= {"text", "label", "sourceTurnId"}:
            raise ValueError("quote is not a QuoteRef")
    refs = get("inlineReferences", "inline_references")
    if refs is not None:
        if not isinstance(refs, list) or len(refs) > 32 or not all(_inline_reference_ok(r) for r in refs):
            raise ValueError("inlineReferences are not valid inline references")
        shown = get("displayText", "display_text")
        text = shown if isinstance(shown, str) else data.get("text")
        encoded, previous_end = _utf16(text if isinstance(text, str) else ""), 0
        for ref in refs:
            token = _utf16(ref["value"])
            start = 2 * ref["start"]
            if start < previous_end or encoded[start : start + len(token)] != token:
                raise ValueError("inline reference does not match the message text")
            previous_end = start + len(token)
    origin = data.get("origin")
    if origin is not None:
        keys = _ORIGIN_KEYS.get(str(origin.get("kind"))) if isinstance(origin, dict) else None
        if keys is None or not _all_str(origin, keys):
            raise ValueError("origin is not a TurnOrigin")
        if origin["kind"] == "workhub_result" and not all(0 < len(origin[k]) <= 256 for k in keys):
            raise ValueError("origin is not a TurnOrigin")


# --- actions ---------------------------------------------------------------------------------

_TOKEN_NUMBERS = frozenset(
    {
        "cacheHitInput",
        "cacheMissInput",
        "cacheWriteInput",
        "reasoning",
        "total",
        "runtimeSteps",
        "cacheRead",
        "cacheCreation",
        "costUsd",
        "contextRemaining",
    }
)
_TOKEN_STRINGS = frozenset(
    {"rawFinishReason", "systemPromptHash", "prefixHash", "requestShapeHash", "providerRequestTraceId"}
)
_PREFIX_REASONS = frozenset(
    {
        "first_turn",
        "system_prompt_changed",
        "tool_schema_changed",
        "provider_options_changed",
        "model_or_provider_changed",
        "history_projection_changed",
        "stable",
        "unknown",
    }
)
_TOKEN_KEYS = (
    _TOKEN_NUMBERS
    | _TOKEN_STRINGS
    | {
        "input",
        "output",
        "cacheMissInputSource",
        "prefixChangeReason",
        "requestShapeChangeReason",
        "promptSegments",
        "contextBudget",
    }
)
_SEGMENT_KINDS = frozenset({"system_prompt", "tool_schema", "prior_history", "current_user", "turn_tail"})
_BUDGET_REQUIRED = frozenset(
    {
        "estimatedTokensBefore",
        "estimatedTokensAfter",
        "keptTurns",
        "droppedTurns",
        "keptEvents",
        "droppedEvents",
    }
)
_PERMISSION_COMMON = frozenset({"kind", "requestId", "toolUseId", "toolName", "category", "reason"})
_PERMISSION_KEYS = {
    "tool_permission": _PERMISSION_COMMON | {"args", "rememberForTurnAllowed"},
    "additional_permissions": _PERMISSION_COMMON
    | {
        "additionalPermissions",
        "cwd",
        "justification",
        "intentHash",
        "permissionsHash",
        "risk",
        "alsoApprovesToolExecution",
        "availableDecisions",
    },
    "sandbox_escalation": _PERMISSION_COMMON
    | {
        "command",
        "cwd",
        "justification",
        "intentHash",
        "commandHash",
        "trigger",
        "risk",
        "alsoApprovesToolExecution",
        "availableDecisions",
    },
}
_TOOL_PERMISSION_REASONS = frozenset(
    {
        "shell_dangerous",
        "file_write",
        "fs_destructive",
        "network",
        "git_destructive",
        "privileged",
        "browser",
        "computer_use",
        "custom",
    }
)
_SANDBOX_RISK = frozenset(
    {"unsandboxedExecution", "unrestrictedFileSystem", "unrestrictedNetwork", "protectedMetadataExposed"}
)


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _opt(value: Any, test: Any) -> bool:
    return value is None or bool(test(value))


_CHANGE_REASON_KEYS = ("prefixChangeReason", "requestShapeChangeReason")


def _token_usage_ok(usage: Any) -> bool:
    if not isinstance(usage, dict) or not set(usage) <= _TOKEN_KEYS:
        return False
    if not (_number(usage.get("input")) and _number(usage.get("output"))):
        return False
    segments = usage.get("promptSegments")
    budget = usage.get("contextBudget")
    return (
        all(_opt(usage.get(k), _number) for k in _TOKEN_NUMBERS)
        and all(_opt(usage.get(k), lambda v: isinstance(v, str)) for k in _TOKEN_STRINGS)
        and usage.get("cacheMissInputSource") in (None, "explicit", "derived")
        and all(
            usage.get(k) in _PREFIX_REASONS | {None}
            for k in ("prefixChangeReason", "requestShapeChangeReason")
        )
        and _opt(segments, lambda v: isinstance(v, list) and all(_segment_ok(s) for s in v))
        and _opt(
            budget,
            lambda v: (
                isinstance(v, dict)
                and isinstance(v.get("enabled"), bool)
                and all(_number(v.get(k)) for k in _BUDGET_REQUIRED)
            ),
        )
    )


def _segment_ok(segment: Any) -> bool:
    return (
        isinstance(segment, dict)
        and {"kind", "chars", "estimatedTokens"} <= set(segment)
        and set(segment) <= {"kind", "chars", "estimatedTokens", "messageCount", "eventCount", "toolCount"}
        and segment["kind"] in _SEGMENT_KINDS
        and all(_opt(segment.get(k), _number) for k in set(segment) - {"kind"})
    )


def _permission_request_ok(request: Any) -> bool:
    if not isinstance(request, dict):
        return False
    kind = request.get("kind")
    keys = _PERMISSION_KEYS.get(str(kind))
    if keys is None or not (keys <= set(request) <= keys | {"hint"}):
        return False
    strings = ("requestId", "toolUseId", "toolName", "category")
    if not all(isinstance(request[k], str) for k in strings) or not _opt(request.get("hint"), _is_str):
        return False
    if kind == "tool_permission":
        return request["reason"] in _TOOL_PERMISSION_REASONS and isinstance(
            request["rememberForTurnAllowed"], bool
        )
    risk = request["risk"]
    common = (
        all(isinstance(request[k], str) for k in ("cwd", "justification", "intentHash"))
        and isinstance(request["alsoApprovesToolExecution"], bool)
        and request["availableDecisions"] == ["allow_once", "deny"]
        and isinstance(risk, dict)
    )
    if kind == "additional_permissions":
        return (
            common
            and request["reason"] == "additional_permissions"
            and isinstance(request["permissionsHash"], str)
            and isinstance(request["additionalPermissions"], dict)
            and set(risk) == {"outsideWorkspace", "protectedMetadata", "networkEnabled"}
            and all(isinstance(v, bool) for v in risk.values())
        )
    return (
        common
        and request["toolName"] == "Bash"
        and request["reason"] == "sandbox_escalation"
        and isinstance(request["command"], str)
        and isinstance(request["commandHash"], str)
        and request["trigger"] in ("proactive", "sandbox_denial")
        and set(risk) == _SANDBOX_RISK
        and all(v is True for v in risk.values())
    )


def _is_str(value: Any) -> bool:
    return isinstance(value, str)


def _permission_decision_ok(decision: Any) -> bool:
    optional = {"rememberForTurn", "reviewer", "rationale", "riskLevel", "toolName"}
    return (
        isinstance(decision, dict)
        and {"requestId", "decision"} <= set(decision) <= {"requestId", "decision"} | optional
        and isinstance(decision["requestId"], str)
        and decision["decision"] in ("allow", "deny")
        and _opt(decision.get("rememberForTurn"), lambda v: isinstance(v, bool))
        and _opt(decision.get("reviewer"), _is_str)
        and _opt(decision.get("rationale"), _is_str)
        and _opt(decision.get("riskLevel"), _is_str)
        and _opt(decision.get("toolName"), lambda v: isinstance(v, str) and v != "")
    )


def _user_question_ok(request: Any) -> bool:
    def option_ok(option: Any) -> bool:
        return (
            isinstance(option, dict)
            and "label" in option
            and set(option) <= {"label", "description"}
            and all(isinstance(v, str) for v in option.values())
        )

    def question_ok(question: Any) -> bool:
        return (
            isinstance(question, dict)
            and set(question) == {"question", "options"}
            and isinstance(question["question"], str)
            and isinstance(question["options"], list)
            and all(option_ok(o) for o in question["options"])
        )

    return (
        isinstance(request, dict)
        and set(request) == {"requestId", "toolUseId", "questions"}
        and isinstance(request["requestId"], str)
        and isinstance(request["toolUseId"], str)
        and isinstance(request["questions"], list)
        and all(question_ok(q) for q in request["questions"])
    )


_ACTION_CHECKS = {
    "tokenUsage": ("token_usage", _token_usage_ok),
    "permissionRequest": ("permission_request", _permission_request_ok),
    "permissionDecision": ("permission_decision", _permission_decision_ok),
    "userQuestionRequest": ("user_question_request", _user_question_ok),
}


def check_action_payloads(data: dict[str, Any]) -> None:
    """Refuse the action payloads the reference's ``isRuntimeEventActions`` refuses."""
    for wire, (name, test) in _ACTION_CHECKS.items():
        value = data.get(wire, data.get(name))
        if value is not None and not test(value):
            raise ValueError(f"{wire} does not have the reference's shape")
