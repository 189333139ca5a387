"""What the histories say and what the ledger says, normalized for the audit (no temporalio here).

``workers/client/audit.py`` reads Temporal histories into ``Execution``/``ActivityFact``; ``read_ledger``
gathers the ledger's side through the store's public reads. The checks compare the two; neither
side is trusted to explain the other.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from maka_core.checkpoints.git_carrier import GitCheckpointProvider
from maka_core.facts.claims import ContinuationClaim
from maka_core.facts.events import RuntimeEvent
from maka_core.facts.run_header import RunHeader
from maka_core.runtime.workspace_continuity import provider_at, referenced_refs
from maka_core.workspace import IDENTITY_PREFIX, Workspace

#: How one activity (all its attempts under one schedule) ended in a history.
#: ``deferred``: a local tool attempt that handed its call to the regular activity before T1.
ActivityOutcome = Literal["completed", "failed", "timed_out", "cancelled", "pending", "deferred"]
#: A Temporal execution's status as the audit reports it.
ExecutionStatus = Literal[
    "running", "completed", "failed", "cancelled", "terminated", "continued_as_new", "timed_out", "unknown"
]


@dataclass(frozen=True)
class ActivityFact:
    """One activity schedule in a history: its attempts, the ids its input names, how it ended.

    ``attempt`` is the last attempt the history shows (Temporal records one started event per
    schedule, carrying the final attempt number: attempts 1..attempt all ran).
    """

    activity_type: str
    activity_id: str
    seq: int
    outcome: ActivityOutcome
    attempt: int = 1
    local: bool = False
    scheduled_at: int | None = None
    closed_at: int | None = None
    identity: str | None = None
    run_id: str | None = None
    operation_id: str | None = None
    tool_call_id: str | None = None
    inputs: Mapping[str, Any] = field(default_factory=dict)
    result: Mapping[str, Any] = field(default_factory=dict)
    failure: str | None = None


@dataclass(frozen=True)
class Execution:
    """One Temporal execution (one run id) of the session's workflow id."""

    workflow_id: str
    run_id: str
    status: ExecutionStatus
    start_ms: int | None = None
    close_ms: int | None = None
    continued_from: str | None = None
    continued_to: str | None = None
    history_available: bool = True
    unavailable_reason: str | None = None
    activities: tuple[ActivityFact, ...] = ()
    #: Workflow tasks this history shows started and never completed (timed out, failed, or cut
    #: off by the execution's close): the local activity markers of each were lost with it.
    lost_workflow_tasks: int = 0

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "workflowId": self.workflow_id,
            "runId": self.run_id,
            "status": self.status,
            "startTime": self.start_ms,
            "closeTime": self.close_ms,
            "historyAvailable": self.history_available,
            "activities": len(self.activities),
        }
        if self.continued_from:
            out["continuedFrom"] = self.continued_from
        if self.continued_to:
            out["continuedTo"] = self.continued_to
        if self.unavailable_reason:
            out["unavailableReason"] = self.unavailable_reason
        return out


@dataclass(frozen=True)
class LedgerFacts:
    """Everything the ledger says about one session, read once."""

    session_id: str
    events: tuple[RuntimeEvent, ...]
    headers: tuple[RunHeader, ...]
    attempts: tuple[Mapping[str, Any], ...]
    claims: Mapping[str, ContinuationClaim | None]
    verify_problems: tuple[str, ...] = ()
    #: Every checkpoint ref a committed fact of the session names (``<ref> of workspace <id>``: each
    #: workspace has its own store and numbering) -> whether this host's Maka store
    #: holds it (True), lacks it (False) or has no store for its workspace at all (None).
    checkpoint_refs: Mapping[str, bool | None] = field(default_factory=dict)


def read_ledger(
    store: Any,
    session_id: str,
    *,
    verify_problems: Sequence[str] | None = None,
    checkpoints: GitCheckpointProvider | None = None,
) -> LedgerFacts:
    """The session's side of the ledger through the store's public reads (never writes).

    ``store.verify()`` rebuilds the whole ledger's projections in a scratch database (check
    ``ledger_verify``); a caller auditing many sessions passes its one result as ``verify_problems``.
    """
    events = tuple(store.events(session_id=session_id))
    headers = tuple(store.list_runs(session_id=session_id))
    ops = {e.refs.operation_id for e in events if e.refs is not None and e.refs.operation_id}
    ops |= {
        e.actions.tool_dispatch.operation_id
        for e in events
        if e.actions is not None and e.actions.tool_dispatch is not None
    }
    attempts = tuple(a for a in store.attempts() if a["operation_id"] in ops)
    claims: dict[str, ContinuationClaim | None] = {}
    for event in events:
        start = event.actions.continuation_start if event.actions is not None else None
        if start is not None:
            claims[start.claim_id] = store.continuation_claim(start.claim_id)
    problems = tuple(store.verify() if verify_problems is None else verify_problems)
    refs = checkpoint_presence(events, checkpoints or provider_at())
    return LedgerFacts(session_id, events, headers, attempts, claims, problems, refs)


def checkpoint_presence(
    events: Sequence[RuntimeEvent], provider: GitCheckpointProvider
) -> dict[str, bool | None]:
    """Each checkpoint ref the facts name, looked up in the Maka store of its workspace (read only)."""
    out: dict[str, bool | None] = {}
    for workspace_id, refs in referenced_refs(events).items():
        handle = Workspace(root=provider.state_dir, identity=f"{IDENTITY_PREFIX}{workspace_id}")
        held = provider.refs(handle) if (provider.store(handle) / "HEAD").exists() else None
        for ref in refs:
            out[f"{ref} of workspace {workspace_id}"] = None if held is None else ref in held
    return out
