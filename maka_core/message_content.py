"""What the reference accepts inside a text message: attachments, quotes, inline references, origin.

The RuntimeEvent decoder refuses a text content whose optional parts do not have these shapes
(reference ``isMessageContent`` in ``packages/core/src/events.ts`` and ``decodeTurnOrigin`` in
``turn-origin.ts``). Offsets and lengths count UTF-16 code units, as JavaScript strings do.
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
