"""A session as people and scripts see it: status and transcript, assembled from the ledger.

Views only: everything here is derived from committed RuntimeEvents and run headers, so it can be
rebuilt at any time and never overrides a fact. The session's live state (``idle``, ``running``,
``parked``, ``failed``) comes from the workflow when it is reachable; ``derive_state`` gives the
same answer from the ledger alone (the last run's header), for when it is not.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from maka_core.facts.events import RuntimeEvent
from maka_core.facts.printable import printable
from maka_core.facts.usage import USAGE_COUNTS, Usage, add_usage, sum_usage
from maka_core.ledger.session_state import (
    OperationView,
    derive_state,
    operations,
)
from maka_core.runtime.approval_lines import approval_line
from maka_core.runtime.compaction import CompactionFact
from maka_core.runtime.contracts import SessionState
from maka_core.runtime.governed import SessionGovernance
from maka_core.runtime.resolution import is_resolution_run, resolution_payload, resolutions_of
from maka_core.runtime.usage_limits import CAPS, limits_in_force, raise_payload, raises_of
from maka_core.runtime.workspace_continuity import transition_of

if TYPE_CHECKING:
    from maka_core.store.writer import LedgerStore

__all__ = [
    "OperationView",
    "SessionView",
    "TurnView",
    "derive_state",
    "operations",
    "session_view",
    "transcript_lines",
    "usage_by_run",
    "usage_text",
]


def usage_by_run(events: list[RuntimeEvent]) -> dict[str, Usage]:
    """Each run's summed ``tokenUsage`` (every model step commits its own), by run id; a run no
    step of which recorded usage is absent (a scripted provider reports none: unknown is not zero)."""
    totals: dict[str, Usage] = {}
    for e in events:
        usage = e.actions.token_usage if e.actions is not None else None
        if usage:
            add_usage(totals.setdefault(e.run_id, {}), usage)
    return totals


@dataclass(frozen=True)
class TurnView:
    turn_id: str
    run_id: str
    status: str
    park_reason: str | None
    #: The turn's token usage, summed over its model steps (``None``: none recorded).
    usage: Usage | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "turnId": self.turn_id,
            "runId": self.run_id,
            "status": self.status,
            "parkReason": self.park_reason,
            "usage": self.usage,
        }


@dataclass(frozen=True)
class SessionView:
    session_id: str
    workflow_id: str
    state: SessionState
    park_reason: str | None
    turns: tuple[TurnView, ...]
    operations: tuple[OperationView, ...]
    event_count: int
    #: Operator resolutions, beside the parks they answer (operation id -> what was recorded).
    resolutions: dict[str, dict[str, Any]] | None = None
    #: The session's token usage over all its turns (``None``: none recorded).
    usage: Usage | None = None
    #: The token caps in force (the policy's, raised by an operator), by policy field; None: none.
    usage_limits: dict[str, int] | None = None
    #: The operator's limit raises, in ledger order (``maka session raise-limit``).
    limit_raises: tuple[dict[str, Any], ...] = ()

    def to_json(self) -> dict[str, Any]:
        """The ``maka session status --json`` contract object."""
        return {
            "sessionId": self.session_id,
            "workflowId": self.workflow_id,
            "state": self.state,
            "parkReason": self.park_reason,
            "turns": [t.to_json() for t in self.turns],
            "operations": [o.to_json() for o in self.operations],
            "eventCount": self.event_count,
            "usage": self.usage,
            **({"resolutions": self.resolutions} if self.resolutions else {}),
            **({"usageLimits": self.usage_limits} if self.usage_limits else {}),
            **({"limitRaises": list(self.limit_raises)} if self.limit_raises else {}),
        }


def session_view(
    store: LedgerStore,
    session_id: str,
    *,
    workflow_id: str,
    state: SessionState | None = None,
    park_reason: str | None = None,
) -> SessionView:
    """Status of one session from the ledger; ``state``/``park_reason`` from the workflow win."""
    events = store.events(session_id=session_id)
    runs = sorted(store.list_runs(session_id=session_id), key=lambda r: (r.created_at, r.updated_at))
    ops = operations(events)
    derived, derived_reason = derive_state(runs, ops, events)
    if state is None:
        state, park_reason = derived, derived_reason
    usage = usage_by_run(events)
    turns = tuple(
        TurnView(
            turn_id=r.turn_id,
            run_id=r.run_id,
            status="parked" if r.park_reason else r.status,
            park_reason=r.park_reason,
            usage=usage.get(r.run_id),
        )
        for r in runs
        if not is_resolution_run(r.run_id)
    )
    return SessionView(
        session_id=session_id,
        workflow_id=workflow_id,
        state=state,
        park_reason=park_reason,
        turns=turns,
        operations=tuple(ops),
        event_count=len(events),
        resolutions=resolutions_of(events) or None,
        usage=sum_usage(usage.values()),
        usage_limits=_limits(store, session_id, events),
        limit_raises=tuple(raises_of(events)),
    )


def _limits(store: LedgerStore, session_id: str, events: list[RuntimeEvent]) -> dict[str, int] | None:
    """The token caps the session's next step is checked against (policy field -> cap)."""
    record = store.session_policy(session_id)
    limits = limits_in_force(SessionGovernance.from_record(record).policy.usage, events) if record else None
    if limits is None:
        return None
    out = {field: getattr(limits, attr) for field, attr in CAPS.items()}
    return {k: v for k, v in out.items() if v is not None} or None


def _brief(value: Any, limit: int = 160) -> str:
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, sort_keys=True)
    text = text.replace("\n", "\\n")
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _one_line(value: Any, limit: int = 2000) -> str:
    """A recorded field of a one-line fact (a tool name, an operator's name or reason), inert:
    every control character, newline and tab included, and every bidi control is shown escaped
    (``printable``), so text a model or an old ledger stored cannot forge a line of the transcript."""
    text = printable(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _result_text(result: Any) -> Any:
    if isinstance(result, dict) and result.get("kind") == "text":
        return result.get("text", "")
    if isinstance(result, dict) and result.get("kind") == "json":
        return result.get("value")
    return result


def usage_text(usage: Usage) -> str:
    """``total 52 (input 41, output 11, cacheRead 20)``: the counts a step or sum recorded."""
    parts = [f"{key} {usage[key]}" for key in USAGE_COUNTS if key in usage and key != "total"]
    total = usage.get("total")
    head = f"total {total}" if total is not None else "tokens"
    return f"{head} ({', '.join(parts)})" if parts else head


def _transition_line(moved: Mapping[str, Any]) -> str:
    """An operator's workspace choice (its note to the model is not a user message)."""
    source = _one_line(moved.get("fromCheckpointRef"))
    if moved.get("kind") == "isolated_restore":
        return (
            f"-- operator restore isolated of {source}: {_one_line(moved.get('fromCwd'))} -> "
            f"{_one_line(moved.get('cwd'))} --"
        )
    by_kind = moved.get("changedPaths")
    lists = by_kind.values() if isinstance(by_kind, Mapping) else ()
    count = sum(len(v) for v in lists if isinstance(v, list))
    return (
        f"-- operator rebaseline from {source}: workspace epoch {_one_line(moved.get('workspaceEpoch'))}, "
        f"{count} changed path(s) named to the model --"
    )


def transcript_lines(events: list[RuntimeEvent], *, width: int = 160) -> list[str]:
    """A readable transcript: user and model text, tool calls, results, recovery and run ends;
    each ended turn's token usage under its end, and the session's at the bottom."""
    lines: list[str] = []
    usage = usage_by_run(events)
    for e in events:
        fact = CompactionFact.of(e)
        if fact is not None:
            lines.append(
                f"-- compacted {fact.covered_events} events through {fact.last_event_id} "
                f"({fact.trigger}): {_one_line(fact.summary, width)} --"
            )
        raised = raise_payload(e)
        if raised is not None:  # hidden from the model, shown to the operator
            by, reason = _one_line(raised.get("raisedBy")), _one_line(raised.get("reason"))
            # An imported ledger's raise is not checked by ``raise_limit``: any shape prints inertly.
            caps, before = raised.get("caps"), raised.get("previous")
            before = before if isinstance(before, Mapping) else {}
            what = (
                ", ".join(
                    f"usage.{_one_line(k)} {_one_line(before.get(k))} -> {_one_line(v)}"
                    for k, v in caps.items()
                )
                if isinstance(caps, Mapping)
                else f"caps {_one_line(caps)}"
            )
            lines.append(f"-- operator {by} raised {what}: {reason} --")
        if e.partial:
            continue
        asked = approval_line(e)  # hidden from the model, shown to the operator
        if asked is not None:
            lines.append(asked)
            continue
        if e.hidden:
            continue
        c = e.content
        resolution = resolution_payload(e) if is_resolution_run(e.run_id) else None
        if resolution is not None:
            by, op, tool, decision, reason = (
                _one_line(resolution.get(k))
                for k in ("resolvedBy", "operationId", "toolName", "decision", "reason")
            )
            lines.append(f"-- operator {by} resolved {op} ({tool}): {decision}: {reason} --")
        elif (moved := transition_of(e)) is not None:
            lines.append(_transition_line(moved))
        elif e.actions is not None and e.actions.continuation_start is not None:
            src = e.actions.continuation_start.immediate_source
            lines.append(f"-- continues run {src.run_id} from high-water {src.high_water} --")
        elif e.actions is not None and e.actions.tool_dispatch is not None:
            d = e.actions.tool_dispatch
            lines.append(f"  [T1] {_one_line(d.tool_name)} dispatched  op={d.operation_id}  event={e.id}")
        elif e.actions is not None and e.actions.tool_recovery is not None:
            p = e.actions.tool_recovery.payload
            detail = _one_line(getattr(p, "observation", None) or getattr(p, "reason_code", ""))
            lines.append(f"  [recovery] {e.actions.tool_recovery.kind} {detail}  op={p.operation_id}")
        elif c is not None and c.kind == "text" and e.role == "user":
            lines.append(f"user: {c.text}")
        elif c is not None and c.kind == "text":
            lines.append(f"model: {c.text}")
        elif c is not None and c.kind == "function_call":
            lines.append(f"model -> {_one_line(c.name)}({_brief(c.args, width)})")
        elif c is not None and c.kind == "function_response":
            tag = "error" if c.is_error else "result"
            lines.append(f"  {tag} <- {_one_line(c.name)}: {_brief(_result_text(c.result), width)}")
        elif e.is_terminal:
            if e.status == "completed":
                lines.append("-- turn completed --")
            else:
                why = c.message if c is not None and c.kind == "error" else e.status
                delta = e.actions.state_delta if e.actions is not None else None
                # The wire format ends a parked run "failed"; its failure class says it parked.
                parked = isinstance(delta, dict) and delta.get("failureClass") == "parked"
                lines.append(f"-- turn {'parked' if parked else e.status or 'ended'}: {_one_line(why)} --")
            if e.run_id in usage:
                lines.append(f"   usage: {usage_text(usage[e.run_id])}")
    session = sum_usage(usage.values())
    if session is not None:
        lines.append(f"-- session usage: {usage_text(session)} --")
    return lines
