"""Semantic lanes: which authoritative tool fact an event is, and which writer may carry it.

A RuntimeEvent's schema lets content and actions coexist; the tool ledger does not. A call, a
dispatch, a response and each recovery fact are distinct facts, each in exactly one lane with a
fixed envelope, so one physical row can never be read two ways by online projection, rebuild and
recovery (reference ``validateToolLedgerEventLane``). The transition shapes say which lanes each
dedicated writer commits together.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, Literal

from maka_core.errors import CodecError
from maka_core.facts.codec import canonical_args_hash
from maka_core.facts.events import RuntimeEvent

Transition = Literal["generic_append", "t1_prepare", "t2_outcome", "recovery_bundle"]
Lane = Literal[
    "ordinary", "function_call", "tool_dispatch", "function_response", "reconcile_result", "recovery_decision"
]

_CALL_STATE_DELTA_KEYS = frozenset({"activityKind", "displayName", "intent"})
_DISPATCH_REFS = (
    frozenset({"operation_id", "tool_call_id"}),
    frozenset({"operation_id", "tool_call_id", "parent_tool_call_id", "parent_operation_id"}),
)
_RECOVERY_REFS = frozenset({"operation_id", "tool_call_id"})


def event_lane(event: RuntimeEvent) -> Lane | None:
    """The one semantic lane an event falls in; None when it claims a lane it cannot hold."""
    lanes: list[Lane] = []
    content_kind = event.content.kind if event.content is not None else None
    actions = event.actions
    if content_kind == "function_call":
        lanes.append("function_call")
    if actions is not None and actions.tool_dispatch is not None:
        lanes.append("tool_dispatch")
    if content_kind == "function_response":
        lanes.append("function_response")
    if actions is not None and actions.tool_recovery is not None:
        kind = actions.tool_recovery.kind
        lanes.append("reconcile_result" if kind == "maka.tool.reconcile_result" else "recovery_decision")
    if not lanes:
        return "ordinary"
    if len(lanes) != 1 or not _lane_envelope_ok(event, lanes[0]):
        return None
    return lanes[0]


def _present(model: Any) -> frozenset[str]:
    """Python names of the fields actually present on a wire model (absent is never null)."""
    if model is None:
        return frozenset()
    return frozenset(n for n in model.model_fields_set if getattr(model, n) is not None)


def _lane_envelope_ok(event: RuntimeEvent, lane: Lane) -> bool:
    if event.partial or event.status is not None or event.branch is not None:
        return False
    if lane == "function_call":
        return event.role == "model" and event.author == "agent" and _call_actions_ok(event)
    if lane == "function_response":
        return event.role == "tool" and event.author == "tool" and _response_actions_ok(event)
    if event.content is not None or event.role != "system" or event.author != "system":
        return False
    refs = _present(event.refs)
    if lane == "tool_dispatch":
        return _present(event.actions) == {"tool_dispatch"} and refs in _DISPATCH_REFS
    return _present(event.actions) == {"tool_recovery"} and refs == _RECOVERY_REFS


def _call_actions_ok(event: RuntimeEvent) -> bool:
    if event.actions is None:
        return True
    if _present(event.actions) != {"state_delta"}:
        return False
    delta = event.actions.state_delta or {}
    return bool(delta) and all(k in _CALL_STATE_DELTA_KEYS and isinstance(v, str) for k, v in delta.items())


def _response_actions_ok(event: RuntimeEvent) -> bool:
    if event.actions is None:
        return True
    if _present(event.actions) != {"state_delta"}:
        return False
    delta = event.actions.state_delta or {}
    duration = delta.get("durationMs")
    return (
        set(delta) == {"durationMs"}
        and isinstance(duration, int | float)
        and not isinstance(duration, bool)
        and math.isfinite(duration)
    )


def generic_append_code(event: RuntimeEvent) -> str | None:
    """Why the generic append path may not carry ``event``, or None when it may."""
    lane = event_lane(event)
    if lane is None:
        return "semantic_lane_conflict"
    if lane in ("reconcile_result", "recovery_decision"):
        return "reserved_recovery_fact"
    if lane == "tool_dispatch" or (
        lane == "function_response" and event.refs is not None and event.refs.operation_id is not None
    ):
        return "reserved_tool_boundary_fact"
    return None


def same_execution(first: RuntimeEvent | None, second: RuntimeEvent) -> bool:
    return (
        first is not None
        and first.session_id == second.session_id
        and first.invocation_id == second.invocation_id
        and first.run_id == second.run_id
        and first.turn_id == second.turn_id
    )


def args_hash_or_none(name: str, args: Any) -> str | None:
    try:
        return canonical_args_hash(name, args)
    except (CodecError, ValueError, TypeError):
        # A provider call that is not strict JSON cannot authenticate T1.
        return None


def transition_shape_code(events: Sequence[RuntimeEvent], transition: Transition) -> tuple[str, str] | None:
    """``(code, eventId)`` when ``events`` cannot be one ``transition``, else None."""
    if not events:
        return None
    lanes = [event_lane(e) for e in events]
    for event, lane in zip(events, lanes, strict=True):
        if lane is None:
            return ("semantic_lane_conflict", event.id)
    if transition == "generic_append":
        for event in events:
            code = generic_append_code(event)
            if code is not None:
                return (code, event.id)
        return None
    shape = tuple(lanes)
    if transition == "t1_prepare":
        ok = shape in (("function_call", "tool_dispatch"), ("tool_dispatch",))
    elif transition == "t2_outcome":
        refs = events[0].refs
        ok = shape == ("function_response",) and refs is not None and refs.operation_id is not None
    else:
        ok = shape in (
            ("reconcile_result", "recovery_decision"),
            ("reconcile_result", "function_response", "recovery_decision"),
        )
    return None if ok else ("transition_shape_conflict", events[0].id)


def group_transitions(events: Sequence[RuntimeEvent]) -> list[tuple[Transition, list[RuntimeEvent]]]:
    """Split a ledger into the writer transactions that would have produced it.

    A call immediately followed by its own dispatch is one T1; a lone dispatch is a T1; an
    operation-bound response is a T2; reconcile [+ response] + decision is one bundle; every
    other event is a generic append of its own.
    """
    groups: list[tuple[Transition, list[RuntimeEvent]]] = []
    lanes = [event_lane(e) for e in events]
    i, n = 0, len(events)
    while i < n:
        event, lane = events[i], lanes[i]
        if lane == "function_call" and i + 1 < n and lanes[i + 1] == "tool_dispatch":
            nxt = events[i + 1]
            td = nxt.actions.tool_dispatch if nxt.actions is not None else None
            content = event.content
            if (
                td is not None
                and content is not None
                and content.kind == "function_call"
                and td.provider_tool_call_id == content.id
                and nxt.invocation_id == event.invocation_id
            ):
                groups.append(("t1_prepare", [event, nxt]))
                i += 2
                continue
        if lane == "tool_dispatch":
            groups.append(("t1_prepare", [event]))
        elif lane == "function_response" and event.refs is not None and event.refs.operation_id is not None:
            groups.append(("t2_outcome", [event]))
        elif lane == "reconcile_result":
            size = 1
            if i + 1 < n and lanes[i + 1] == "recovery_decision":
                size = 2
            elif i + 2 < n and lanes[i + 1] == "function_response" and lanes[i + 2] == "recovery_decision":
                size = 3
            groups.append(("recovery_bundle", list(events[i : i + size])))
            i += size
            continue
        elif lane == "recovery_decision":
            groups.append(("recovery_bundle", [event]))
        else:
            groups.append(("generic_append", [event]))
        i += 1
    return groups
