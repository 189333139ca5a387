"""The audit report: per execution, per run, per operation, then the findings (``--json`` shape)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from maka_core.audit.checks import CHECK_FUNCTIONS
from maka_core.audit.findings import Finding
from maka_core.audit.index import BEGINS, AuditIndex, build_index
from maka_core.audit.model import Execution, LedgerFacts
from maka_core.errors import CheckpointError
from maka_core.facts.claims import ContinuationClaim
from maka_core.facts.events import RuntimeEvent
from maka_core.runtime.contracts import EXECUTE_TOOL, EXECUTE_TOOL_LOCAL, RECOVER_OPERATION
from maka_core.runtime.settle import park_reason_of
from maka_core.runtime.usage_limits import RAISE_PROTOCOL
from maka_core.runtime.workspace_continuity import bundle_of


@dataclass(frozen=True)
class AuditReport:
    session_id: str
    executions: tuple[dict[str, Any], ...]
    runs: tuple[dict[str, Any], ...]
    operations: tuple[dict[str, Any], ...]
    findings: tuple[Finding, ...]

    @property
    def ok(self) -> bool:
        return not any(f.severity == "drift" for f in self.findings)

    @property
    def drift(self) -> list[Finding]:
        return [f for f in self.findings if f.severity == "drift"]

    def to_json(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "sessionId": self.session_id,
            "executions": list(self.executions),
            "runs": list(self.runs),
            "operations": list(self.operations),
            "findings": [f.to_json() for f in self.findings],
        }


def audit(ledger: LedgerFacts, executions: Sequence[Execution]) -> AuditReport:
    """Run every check over one session's ledger facts and the histories of its executions."""
    ix = build_index(ledger, executions)
    findings: list[Finding] = []
    for check in CHECK_FUNCTIONS:
        findings.extend(check(ix))
    return AuditReport(
        session_id=ledger.session_id,
        executions=tuple(_execution(ix, e) for e in ix.executions),
        runs=tuple(_run(ix, run_id) for run_id in ix.run_events),
        operations=tuple(_operations(ix)),
        findings=tuple(findings),
    )


def _execution(ix: AuditIndex, execution: Execution) -> dict[str, Any]:
    out = execution.to_json()
    out["runs"] = sorted({f.run_id for f in execution.activities if f.run_id and f.activity_type in BEGINS})
    out["toolActivities"] = sum(f.activity_type == EXECUTE_TOOL for f in execution.activities)
    local = sum(f.activity_type == EXECUTE_TOOL_LOCAL for f in execution.activities)
    if local:
        out["localToolAttempts"] = local
    if execution.lost_workflow_tasks:
        out["lostWorkflowTasks"] = execution.lost_workflow_tasks
    return out


def _run(ix: AuditIndex, run_id: str) -> dict[str, Any]:
    events = ix.run_events[run_id]
    header = ix.headers.get(run_id)
    terminal = next((e for e in reversed(events) if e.is_terminal), None)
    continuation = next(
        (e.actions.continuation_start for e in events if e.actions and e.actions.continuation_start), None
    )
    out: dict[str, Any] = {
        "runId": run_id,
        "turnId": events[0].turn_id,
        "invocationId": events[0].invocation_id,
        "status": header.status if header else ("terminal" if terminal else "running"),
        "parkReason": park_reason_of(terminal) if terminal else None,
        "workflowId": header.workflow_id if header else None,
        "workflowRunId": header.workflow_run_id if header else None,
        "events": len(events),
        "startTs": events[0].ts,
        "endTs": events[-1].ts,
        "operations": sum(1 for key in ix.ops_by_call if key[0] == run_id),
        "executions": sorted({p.execution.run_id for p in ix.by_run.get(run_id, ())}),
    }
    resolution = ix.operator_resolution(run_id)
    if resolution is not None and resolution.get("protocol") == RAISE_PROTOCOL:
        out["usageLimitRaise"] = {
            k: resolution.get(k) for k in ("caps", "previous", "used", "raisedBy", "reason")
        }
    elif resolution is not None:
        out["operatorResolution"] = {
            k: resolution.get(k) for k in ("operationId", "runId", "decision", "resolvedBy", "reason")
        }
    bound = _bound(terminal)
    if bound is not None:
        out["workspaceCheckpoint"] = bound
    transition = ix.workspace_transition(run_id)
    if transition is not None:
        out["workspaceTransition"] = {
            k: transition[k]
            for k in (
                "kind",
                "sourceRunId",
                "fromCheckpointRef",
                "cwd",
                "workspaceIdentity",
                "workspaceEpoch",
            )
            if k in transition
        } | {"changedPaths": transition.get("changedPaths") or {}}
    if continuation is not None:
        src = continuation.immediate_source
        out["continuationSource"] = {
            "runId": src.run_id,
            "highWater": src.high_water,
            "claimId": continuation.claim_id,
        }
        checked = _gate_checked(ix.ledger.claims.get(continuation.claim_id))
        if checked is not None:
            out["continuationSource"]["workspaceGate"] = checked
    return out


def _gate_checked(claim: ContinuationClaim | None) -> dict[str, Any] | None:
    """What the workspace gate checked before this continuation's claim (None: a claim from before
    the claim recorded it, or a planner without the gate)."""
    header = claim.target_run_header_json if claim is not None else None
    snapshot = header.get("safetySnapshot") if isinstance(header, Mapping) else None
    checked = snapshot.get("workspaceGate") if isinstance(snapshot, Mapping) else None
    return dict(checked) if isinstance(checked, Mapping) else None


def _bound(terminal: RuntimeEvent | None) -> dict[str, Any] | None:
    """The workspace boundary a run's terminal fact commits (Phase 4), as the report shows it."""
    try:
        bundle = bundle_of(terminal) if terminal is not None else None
    except CheckpointError as bad:
        return {"unreadable": bad.code}
    if bundle is None:
        return None
    out: dict[str, Any] = {
        "workspaceEpoch": bundle.boundary.workspace_epoch,
        "highWater": bundle.boundary.immutable_runtime_high_water,
    }
    if bundle.checkpoint is not None:
        out |= {"checkpointRef": bundle.checkpoint.ref, "files": bundle.checkpoint.file_count}
    elif bundle.no_checkpoint is not None:
        out["noCheckpoint"] = bundle.no_checkpoint.code
    return out
_PATH_NAMES = {EXECUTE_TOOL: "tool", EXECUTE_TOOL_LOCAL: "local"}


def _operations(ix: AuditIndex) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for key, facts in ix.ops_by_call.items():
        decision = ix.decisions.get(key)
        op_id = facts.operation_id
        placed = sorted(
            (
                p
                for p in ix.by_call.get(key, ())
                if p.fact.activity_type in (EXECUTE_TOOL, EXECUTE_TOOL_LOCAL, RECOVER_OPERATION)
            ),
            key=lambda p: p.order,
        )
        activities = [
            {
                "executionRunId": p.execution.run_id,
                "type": p.fact.activity_type,
                "activityId": p.fact.activity_id,
                "attempt": p.fact.attempt,
                "outcome": p.fact.outcome,
                "identity": p.fact.identity,
                "result": p.fact.result.get("status"),
                "scheduledAt": p.fact.scheduled_at,
                "closedAt": p.fact.closed_at,
            }
            for p in placed
        ]
        attempts = [
            {
                "phase": r["phase"],
                "workflowRunId": r["workflow_run_id"],
                "activityId": r["activity_id"],
                "attempt": r["attempt"],
                "identity": _identity(ix, r),
            }
            for r in ix.attempts_by_op.get(op_id or "", [])
        ]
        path = [
            f"{_PATH_NAMES.get(str(a['type']), 'recover')}:{a['result'] or a['outcome']}"
            for a in activities
        ]
        out.append(
            {
                "operationId": op_id,
                "toolCallId": facts.tool_call_id,
                "toolName": facts.tool_name,
                "runId": facts.run_id,
                "status": decision.status if decision else None,
                "reason": decision.reason if decision else None,
                "settlementOrigin": decision.settlement_origin if decision else None,
                "t1": facts.dispatch.ts if facts.dispatch else None,
                "t2": facts.response.ts if facts.response else None,
                "recovered": facts.decision is not None,
                "attempts": attempts,
                "activities": activities,
                "recoveryPath": " -> ".join(path),
            }
        )
    return out


def _identity(ix: AuditIndex, row: dict[str, Any]) -> str | None:
    fact = ix.known_attempts.get((row["workflow_run_id"] or "", str(row["activity_id"])))
    return fact.identity if fact else None
