"""The provider replay of a continuation: what the model sees again, and nothing it must not.

Per segment (one run's immutable prefix) the Resolver must have settled every tool operation;
then the committed events project to provider items (``maka-continuation-facts.md`` §5.5).
Calls that never settled are dropped, but only from the unstable suffix: one followed by any
replayed item is a gap in history and blocks the continuation. The suffix after the last user
text or tool result is trimmed, so a continuation always resumes at a user or tool boundary
and never re-sends a user message.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Literal

from maka_core.facts import canonical_json
from maka_core.facts.events import RuntimeEvent
from maka_core.ledger.digests import (
    PROVIDER_PROJECTION_VERSION,
    Prefix,
    build_cursor,
    provider_replay_digest,
)
from maka_core.ledger.resolver import FOR_OPERATOR, resolve

BlockReason = Literal[
    "tool_recovery_corruption",
    "tool_recovery_unsettled",
    "provider_replay_unsupported",
    "provider_replay_non_suffix_gap",
]

STEERING_TEMPLATE: Final[str] = (
    "The user sent a message while you were working:\n<user_query>\n{}\n</user_query>"
)
_HUNK = re.compile(r"^@@ -\d+(?:,(\d+))? \+\d+(?:,(\d+))? @@")
_SHELL_STATUS_EXIT: Final[dict[str, int]] = {"completed": 0, "timed_out": 124, "cancelled": 130}
_DIFF_VERBS: Final[dict[str, str]] = {"Write": "Overwrote", "Edit": "Edited", "FormatJson": "Formatted"}


class _Unsupported(Exception):
    pass


@dataclass(frozen=True)
class SegmentReplay:
    """One segment's projection: blocked (``block`` set) or its items and replay events."""

    block: BlockReason | None
    items: tuple[dict[str, Any], ...] = ()
    replay_events: tuple[dict[str, Any], ...] = ()


@dataclass(frozen=True)
class ReplayPlan:
    """The composite replay over every segment, oldest first."""

    block: BlockReason | None
    items: tuple[dict[str, Any], ...] = ()
    runtime_context: tuple[dict[str, Any], ...] = ()
    segment_contexts: tuple[tuple[dict[str, Any], ...], ...] = ()
    boundary: dict[str, Any] = field(default_factory=dict)
    provider_replay_digest: str = ""

    @property
    def manifest_digest(self) -> str:
        return str(self.boundary.get("manifestDigest", ""))


#: Operator resolutions the replay honours: operation id -> the resolution's replay view
#: ``{decision, resolvedBy, reason, eventId, ts}`` (``maka_core.runtime.resolution``).
Resolutions = Mapping[str, Mapping[str, Any]]


def build_replay_plan(prefixes: Sequence[Prefix], resolutions: Resolutions | None = None) -> ReplayPlan:
    """The composite replay plan of a lineage (oldest first), stopping at the first blocked
    segment.

    Raises:
        PrefixUnreadable: ``boundary_cursor_invalid`` when the segments repeat an id.
    """
    items: list[dict[str, Any]] = []
    context: list[dict[str, Any]] = []
    per_segment: list[tuple[dict[str, Any], ...]] = []
    for prefix in prefixes:
        segment = replay_segment(prefix, resolutions)
        if segment.block is not None:
            return ReplayPlan(block=segment.block)
        items.extend(segment.items)
        context.extend(segment.replay_events)
        per_segment.append(segment.replay_events)
    return ReplayPlan(
        block=None,
        items=tuple(items),
        runtime_context=tuple(context),
        segment_contexts=tuple(per_segment),
        boundary=build_cursor(prefixes),
        provider_replay_digest=provider_replay_digest(items),
    )


def replay_segment(prefix: Prefix, resolutions: Resolutions | None = None) -> SegmentReplay:
    """Project one immutable prefix to provider items (§5.5) and its replay events (§5.6).

    ``resolutions`` (not in the reference; absent = the reference's behaviour) settles an
    unsettled operation an operator resolved: its call stays, followed by a result that says
    what the operator decided, so the model sees the decision and nothing is re-run.
    """
    recovery = resolve(prefix.events)
    if recovery.issues or any(d.status == "corruption" for d in recovery.operations):
        return SegmentReplay(block="tool_recovery_corruption")
    given = resolutions or {}
    resolved = {
        d.call_event_id: (d, given[d.operation_id])
        for d in recovery.operations
        if d.status in FOR_OPERATOR and d.operation_id is not None and d.operation_id in given
    }
    if any(d.status in FOR_OPERATOR and d.call_event_id not in resolved for d in recovery.operations):
        return SegmentReplay(block="tool_recovery_unsettled")

    events = prefix.events
    unsigned_call_turns = {
        e.turn_id
        for e in events
        if not e.hidden
        and e.content is not None
        and e.content.kind == "function_call"
        and (e.refs is None or e.refs.step_id is None)
    }
    items: list[tuple[float, dict[str, Any]]] = []
    calls: dict[str, tuple[int, str]] = {}
    settled: set[str] = set()
    try:
        for index, event in enumerate(events):
            item = _item(event, unsigned_call_turns, calls, settled, index)
            if item is not None:
                items.append((index, item))
            if event.id in resolved and item is not None:
                op, resolution = resolved[event.id]
                settled.add(op.tool_call_id)
                items.append((index + 0.5, resolution_item(op.tool_call_id, op.tool_name or "", resolution)))
    except _Unsupported:
        return SegmentReplay(block="provider_replay_unsupported")

    unmatched = {idx for call_id, (idx, _) in calls.items() if call_id not in settled}
    kept = [(i, item) for i, item in items if i not in unmatched]
    if unmatched and any(i > min(unmatched) for i, _ in kept):
        return SegmentReplay(block="provider_replay_non_suffix_gap")
    stable = max(
        (
            i
            for i, item in kept
            if item["kind"] == "tool_result" or (item["kind"] == "text" and item["role"] == "user")
        ),
        default=-1,
    )
    trimmed = {i for i, _ in kept if i > stable} | {i for i in unmatched if i > stable}
    final_items = tuple(item for i, item in kept if i <= stable)
    replay = tuple(
        canonical
        for i, (event, canonical) in enumerate(zip(events, prefix.canonical, strict=True))
        if not event.hidden and i not in trimmed
    )
    return SegmentReplay(block=None, items=final_items, replay_events=replay)


def _item(
    event: RuntimeEvent,
    unsigned_call_turns: set[str],
    calls: dict[str, tuple[int, str]],
    settled: set[str],
    index: int,
) -> dict[str, Any] | None:
    content = event.content
    if event.hidden or content is None or content.kind == "error":
        return None
    if content.kind == "text" and content.text == "":
        if event.role == "model":
            return None
        raise _Unsupported("empty text")
    if event.role == "system" and content.kind in ("text", "thinking"):
        return None
    base = {"eventId": event.id, "ts": event.ts}
    refs = event.refs
    step_id = None if refs is None else (refs.provider_event_id or refs.stored_message_id)
    if content.kind == "text":
        if event.role not in ("user", "model"):
            raise _Unsupported("text role")
        text = _message_text(content.text, content.quotes or [], content.attachments or [])
        item: dict[str, Any] = {
            "kind": "text",
            "role": "user" if event.role == "user" else "assistant",
            **base,
        }
        if event.role == "user" and content.steering:
            text = STEERING_TEMPLATE.format(text)
            item["steering"] = {"eventId": event.id}
        item["content"] = text
        if content.attachments:
            item["attachments"] = content.attachments
        if event.role == "model" and step_id is not None:
            item["stepId"] = step_id
        return item
    if content.kind == "thinking":
        if event.role != "model":
            raise _Unsupported("thinking role")
        if content.signature and event.turn_id in unsigned_call_turns:
            return None
        item = {"kind": "thinking", "text": content.text, **base}
        if content.signature:
            item["signature"] = content.signature
        if content.provider_options is not None:
            item["providerOptions"] = content.provider_options
        if step_id is not None:
            item["stepId"] = step_id
        return item
    if content.kind == "function_call":
        calls[content.id] = (index, content.name)
        item = {
            "kind": "tool_call",
            "toolCallId": content.id,
            "toolName": content.name,
            "input": content.args,
        }
        item.update(base)
        if content.provider_options is not None:
            item["providerOptions"] = content.provider_options
        if content.provider_executed is not None:
            item["providerExecuted"] = content.provider_executed
        if refs is not None and refs.step_id is not None:
            item["stepId"] = refs.step_id
        return item
    # function_response
    wire = content.to_wire()
    output = (
        wire["providerOutput"]
        if content.provider_executed is True and "providerOutput" in wire
        else content.result
    )
    result = content.result
    if isinstance(result, dict) and result.get("kind") in ("terminal", "shell_run"):
        if not _shell_result_ok(result):
            raise _Unsupported("shell result")
        output = result
    output = _display_output(content.name, output)
    call = calls.get(content.id)
    if call is None:
        raise _Unsupported("unmatched_tool_result")
    if call[1] != content.name:
        raise _Unsupported("tool_id_mismatch")
    settled.add(content.id)
    item = {"kind": "tool_result", "toolCallId": content.id, "toolName": content.name, "output": output}
    item["isError"] = content.is_error is True
    if content.provider_executed is not None:
        item["providerExecuted"] = content.provider_executed
    item.update(base)
    return item


def resolution_item(tool_call_id: str, tool_name: str, resolution: Mapping[str, Any]) -> dict[str, Any]:
    """The tool result an operator's resolution stands for (an applied effect counts as done)."""
    decision = resolution.get("decision")
    return {
        "kind": "tool_result",
        "toolCallId": tool_call_id,
        "toolName": tool_name,
        "output": {
            "kind": "operator_resolution",
            "decision": decision,
            "resolvedBy": resolution.get("resolvedBy"),
            "reason": resolution.get("reason"),
        },
        "isError": decision != "applied",
        "eventId": resolution.get("eventId"),
        "ts": resolution.get("ts"),
    }


def _message_text(text: str, quotes: list[Any], attachments: list[Any]) -> str:
    blocks: list[str] = []
    for quote in quotes:
        label = quote.get("label")
        attr = f' label="{label.replace(chr(34), chr(39))}"' if label else ""
        blocks.append(f"<quoted_excerpt{attr}>\n{quote['text']}\n</quoted_excerpt>")
    if attachments:
        blocks.append(" ".join(f"[attachment: {a['name']} ({a['mimeType']})]" for a in attachments))
    return text if not blocks else text + "\n\n" + "\n".join(blocks)


def _shell_result_ok(result: dict[str, Any]) -> bool:
    if result.get("kind") == "shell_run":
        return isinstance(result.get("ref"), str)
    required = {"kind", "cwd", "cmd", "status", "output"}
    if not required <= set(result) <= required | {"exitCode", "failureMessage", "sandboxDenial"}:
        return False
    if not (
        isinstance(result["cwd"], str)
        and isinstance(result["cmd"], str)
        and isinstance(result["output"], dict)
    ):
        return False
    status, exit_code, message = result["status"], result.get("exitCode"), result.get("failureMessage")
    if status == "failed":
        return (isinstance(exit_code, int) and exit_code != 0) or (isinstance(message, str) and message != "")
    return status in _SHELL_STATUS_EXIT and exit_code == _SHELL_STATUS_EXIT[status]


def _display_output(tool_name: str, output: Any) -> Any:
    if not isinstance(output, dict):
        return output
    if tool_name == "Bash" and output.get("kind") == "terminal":
        return {k: v for k, v in output.items() if k != "cmd"}
    if tool_name not in _DIFF_VERBS:
        return output
    kind = output.get("kind")
    if kind == "file_write" and isinstance(output.get("path"), str):
        number = output.get("bytes")
        if isinstance(number, int | float) and not isinstance(number, bool):
            return f"Wrote {canonical_json.format_number(number)} bytes to {output['path']}"
    if kind == "file_diff" and isinstance(output.get("paths"), list) and isinstance(output.get("diff"), str):
        paths, diff = output["paths"], output["diff"]
        path = paths[0] if paths and isinstance(paths[0], str) else "file"
        added, deleted = _diff_counts(diff)
        if tool_name == "Write" and diff.startswith("--- /dev/null"):
            return f"Created {path} (+{added})"
        return f"{_DIFF_VERBS[tool_name]} {path} (+{added} -{deleted})"
    return output


def _diff_counts(diff: str) -> tuple[int, int]:
    added = deleted = 0
    old_left = new_left = 0
    for line in diff.split("\n"):
        if old_left <= 0 and new_left <= 0:
            match = _HUNK.match(line)
            if match is not None:
                old_left = int(match.group(1) or "1")
                new_left = int(match.group(2) or "1")
            continue
        if line.startswith("\\"):
            continue
        if line.startswith("+"):
            added += 1
            new_left -= 1
        elif line.startswith("-"):
            deleted += 1
            old_left -= 1
        else:
            old_left -= 1
            new_left -= 1
    return added, deleted


__all__ = [
    "PROVIDER_PROJECTION_VERSION",
    "ReplayPlan",
    "SegmentReplay",
    "build_replay_plan",
    "replay_segment",
]
